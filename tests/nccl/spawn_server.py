# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""A stand-in tensor-parallel server: a launcher that starts workers with multiprocessing 'spawn'.

    python spawn_server.py --ready FILE [--workers 2] [--fork-child] [--nccl-log FILE]

Like SGLang/vLLM, the launcher is a plain Python process (its sitecustomize, if any, runs at start-up),
and each worker is a fresh interpreter started by 'spawn' from the launcher's os.environ. Each worker
holds fake GPU memory (the fake pynvml's registry; the process is real). With --nccl-log each worker
appends, for every NCCL_* variable in its environment, the line NCCL writes when it reads one
("HOST:PID:TID [DEV] NCCL INFO NAME set by environment to VALUE", integers ending with '.').
With --fork-child the launcher also fork()s a child without exec (a fork-started helper).
FILE receives {"launcher": pid, "workers": [pids], "fork_child": pid|null} once all are ready.
"""
import argparse
import json
import multiprocessing
import os
import socket
import sys
import threading
import time


def worker(index, gpu, mib, ready_dir, nccl_log):
    import fake_gpu  # on PYTHONPATH (tests/fakes/nvml)

    fake_gpu.hold(gpu, mib)
    if nccl_log:
        host = socket.gethostname()
        lines = []
        for k in sorted(os.environ):
            if k.startswith("NCCL_") and k != "NCCL_DEBUG":
                v = os.environ[k]
                lines.append("%s:%d:%d [%d] NCCL INFO %s set by environment to %s%s\n" % (
                    host, os.getpid(), threading.get_native_id(), gpu, k, v, "." if v.isdigit() else ""))
        with open(nccl_log, "a") as f:
            f.write("".join(lines))
    tmp = os.path.join(ready_dir, "w%d.tmp" % index)
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.rename(tmp, os.path.join(ready_dir, "w%d" % index))
    while True:
        time.sleep(3600)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ready", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mib", type=int, default=1000)
    ap.add_argument("--fork-child", action="store_true")
    ap.add_argument("--nccl-log")
    a = ap.parse_args()
    ready_dir = a.ready + ".d"
    os.makedirs(ready_dir, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(i, i, a.mib, ready_dir, a.nccl_log), daemon=True) for i in range(a.workers)]
    for p in procs:
        p.start()
    fork_child = None
    if a.fork_child:
        fork_child = os.fork()
        if fork_child == 0:
            while True:
                time.sleep(3600)
    deadline = time.monotonic() + 60
    while len([n for n in os.listdir(ready_dir) if not n.endswith(".tmp")]) < a.workers:
        if time.monotonic() > deadline:
            sys.exit("workers not ready")
        time.sleep(0.01)
    tmp = a.ready + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"launcher": os.getpid(), "workers": [p.pid for p in procs], "fork_child": fork_child}, f)
    os.rename(tmp, a.ready)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
