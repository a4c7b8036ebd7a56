# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""Hold fake GPU memory, then SIGKILL ourselves when DIE_FILE appears (or after --after seconds).

    python holder_then_die.py --gpu 0 --mib 40000 --ready READY [--die-file F] [--after S]

Writes the wall-clock time of death (just before SIGKILL) to READY + ".died".
"""
import argparse
import os
import signal
import time

import fake_gpu  # tests/fakes/nvml on PYTHONPATH (FakeGpus.env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--mib", type=int, default=1000)
    ap.add_argument("--ready", required=True)
    ap.add_argument("--die-file")
    ap.add_argument("--after", type=float)
    a = ap.parse_args()
    fake_gpu.hold(a.gpu, a.mib)
    open(a.ready, "w").close()
    start = time.monotonic()
    while True:
        if (a.die_file and os.path.exists(a.die_file)) or (a.after is not None and time.monotonic() - start >= a.after):
            with open(a.ready + ".died", "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.002)


if __name__ == "__main__":
    main()
