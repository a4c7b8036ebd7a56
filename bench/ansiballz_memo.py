#!/usr/bin/env python
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the suite's AnsiballZ dependency memo (tests/accel/_gpufleet_ansiballz_memo.py) saves, with the memo warm and
without it, alternating, in one run.

    .venv/bin/python bench/ansiballz_memo.py [--repeats 5] [--json docs/evidence/ansiballz-memo.json]
    .venv/bin/python bench/ansiballz_memo.py --test tests/reliability/test_rel_two_services.py   # a whole test file

By default each repeat builds the AnsiballZ payload of every gpufleet module once with GPUFLEET_ANSIBALLZ_MEMO empty
(off) and once with a memo that a first, unmeasured build filled (warm), each in a fresh interpreter
(tests/foundation/ansiballz_payloads.py, ansible-core's own recursive_finder). With --test, each repeat runs that test
file instead (needs root: the sandbox fleet). CPU is the child's and everything it waited for (RUSAGE_CHILDREN);
host_cpu_s is the whole machine's busy time over the run (/proc/stat), which also counts what the sandbox hosts' sshd
ran (the modules on the targets, whose start the memo's bytecode shortens): run it on an otherwise idle machine.
Reported: the medians and warm / off as ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _host_busy_s() -> float:
    with open("/proc/stat", encoding="ascii") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...: all but idle and iowait is busy
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _run(test: str, memo: str) -> dict:
    env = dict(os.environ, GPUFLEET_ANSIBALLZ_MEMO=memo)
    py = os.path.join(ROOT, ".venv", "bin", "python")
    if test:
        cmd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", test]
    else:
        cmd = [py, os.path.join(ROOT, "tests", "foundation", "ansiballz_payloads.py"), os.path.join(ROOT, "collections")]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy = _host_busy_s()
    start = time.monotonic()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": round(cpu, 2), "host_cpu_s": round(_host_busy_s() - busy, 2), "wall_s": round(time.monotonic() - start, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--test", default="", help="a test file to run instead of building the payloads")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    runs: dict = {"off": [], "warm": []}
    with tempfile.TemporaryDirectory() as memo:
        _run(a.test, memo)  # fills the memo
        for _ in range(a.repeats):
            runs["off"].append(_run(a.test, ""))
            runs["warm"].append(_run(a.test, memo))
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("cpu_s", "host_cpu_s", "wall_s")} for k, v in runs.items()}
    out = {"measured": a.test or "the AnsiballZ payload of every gpufleet module (tests/foundation/ansiballz_payloads.py)",
           "repeats": a.repeats, "runs": runs, "median": med,
           "cpu_ratio_warm_to_off": round(med["warm"]["cpu_s"] / med["off"]["cpu_s"], 3),
           "host_cpu_ratio_warm_to_off": round(med["warm"]["host_cpu_s"] / med["off"]["host_cpu_s"], 3),
           "wall_ratio_warm_to_off": round(med["warm"]["wall_s"] / med["off"]["wall_s"], 3)}
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
