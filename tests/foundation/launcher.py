# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""A stand-in inference server for tests: a launcher that starts workers with multiprocessing spawn.

Like SGLang/vLLM: the launcher spawns N workers (fresh interpreters, `multiprocessing.spawn`), each
holds fake GPU memory through fake_gpu.hold (the fake pynvml's registry; the process is real), and
everyone inherits the launcher's environment, so a launch tag (GPUFLEET_SERVICE=...) reaches them.

    python launcher.py --ready FILE [--workers 2] [--mib 1000] [--gpus 2] [--ignore-term]
                       [--worker-ignore-term] [--pidfile PATH] [--marker TEXT]

FILE receives {"launcher": pid, "workers": [pids]} once every worker holds its memory.
"""
import argparse
import json
import multiprocessing
import os
import signal
import sys
import time


def _start_time(pid):
    with open("/proc/%d/stat" % pid) as f:
        data = f.read()
    return int(data[data.rindex(")") + 2:].split()[19])


def worker(index, gpu, mib, ignore_term, ready_dir):
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import fake_gpu  # on PYTHONPATH through FakeGpus.env

    if mib:
        fake_gpu.hold(gpu, mib)
    tmp = os.path.join(ready_dir, "w%d.tmp" % index)
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.rename(tmp, os.path.join(ready_dir, "w%d" % index))
    while True:
        time.sleep(3600)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--ready", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mib", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--ignore-term", action="store_true", help="the launcher ignores SIGTERM")
    ap.add_argument("--worker-ignore-term", action="store_true", help="the workers ignore SIGTERM")
    ap.add_argument("--pidfile")
    ap.add_argument("--marker", default="")
    a = ap.parse_args(argv)
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if a.pidfile:
        with open(a.pidfile, "w") as f:
            f.write("%d %d\n" % (os.getpid(), _start_time(os.getpid())))
    ready_dir = a.ready + ".d"
    os.makedirs(ready_dir, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    procs = []
    for i in range(a.workers):
        p = ctx.Process(target=worker, args=(i, i % max(a.gpus, 1), a.mib, a.worker_ignore_term, ready_dir), daemon=False)
        p.start()
        procs.append(p)
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(ready_dir, "w%d" % i)) for i in range(a.workers)):
        if time.monotonic() > deadline:
            sys.exit("workers did not start")
        time.sleep(0.01)
    with open(a.ready + ".tmp", "w") as f:
        json.dump({"launcher": os.getpid(), "workers": [p.pid for p in procs]}, f)
    os.rename(a.ready + ".tmp", a.ready)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
