# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""TEST DOUBLE helper: make the current (real, live) process hold fake GPU memory.

    import fake_gpu; fake_gpu.hold(gpu=0, mib=20000)          # from a worker
    python fake_gpu.py hold --gpu 0 --mib 20000 [--ignore-term] # a standalone holder

The memory is "freed" by the fake pynvml once this process is gone (plus its release delay).
"""

import argparse
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pynvml  # noqa: E402  (the fake beside this file)


def _start_time(pid):
    with open("/proc/%d/stat" % pid) as f:
        data = f.read()
    return int(data[data.rindex(")") + 2:].split()[19])


def hold(gpu, mib, pid=None):
    pid = pid or os.getpid()
    d = pynvml._config()["state_dir"]
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "hold-%d-%d-%d" % (gpu, pid, _start_time(pid)))
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(int(mib)))
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("hold")
    h.add_argument("--gpu", type=int, action="append", required=True)
    h.add_argument("--mib", type=int, default=1024)
    h.add_argument("--ignore-term", action="store_true")
    h.add_argument("--ready-file")
    a = ap.parse_args(argv)
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for g in a.gpu:
        hold(g, a.mib)
    if a.ready_file:
        open(a.ready_file, "w").close()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
