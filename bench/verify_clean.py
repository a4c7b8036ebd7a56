#!/usr/bin/env python
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark 1: verify-clean latency after the holder of GPU memory dies (real NVML; run on a GPU host).

    python3 bench/verify_clean.py --sizes 20,60,100 --repeats 3 --json bench/results/verify_clean.json

For each size a real process allocates that many GiB with torch, then gets SIGKILL. Three observers,
all started before the kill, timed on CLOCK_MONOTONIC (shared by all processes):
  - driver:   a tight NVML loop (no sleep): when the driver first reports the memory free (the reference);
  - gpu_wait: gpufleet's wait() (module_utils/_gpuwait.py, 20 ms poll), as the gpu_wait module runs it;
  - seed:     `sleep 3 && nvidia-smi --query-gpu=index,memory.used`: 3 s + one nvidia-smi call, looking once.
Also times the whole gpu_wait module through `ansible localhost -m gpufleet.serving.gpu_wait` (process start,
AnsiballZ, nvmlInit included) when ansible is importable. Prints a table of medians and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = sys.executable

OBSERVER = r"""
import sys, time, json
sys.path.insert(0, sys.argv[3])
mode, gpu = sys.argv[1], int(sys.argv[2])
if mode == "driver":
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    base = float(sys.argv[4])
    print("ready", flush=True)
    n = 0
    while True:
        n += 1
        m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        if m.used / 2**20 <= base and not pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            print(json.dumps({"t": time.monotonic(), "reads": n}), flush=True)
            break
else:
    from ansible_collections.gpufleet.serving.plugins.module_utils import _gpuwait, _nvml
    b = _nvml.open_backend()
    print("ready", flush=True)
    r = _gpuwait.wait(b, [gpu], timeout=60, poll_interval=0.02)
    print(json.dumps({"t": time.monotonic(), "polls": r["polls"], "ok": r["ok"]}), flush=True)
"""

HOLDER = r"""
import sys, time, torch
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda:%s" % sys.argv[2])
x.fill_(1); torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(3600)
"""


def used_mib(gpu: int) -> float:
    import pynvml
    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(gpu), version=pynvml.nvmlMemory_v2).used / 2**20
    finally:
        pynvml.nvmlShutdown()


def start(code: str, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([PY, "-c", code] + list(args), stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    if line != "ready":
        raise SystemExit("child did not start: %r" % line)
    return p


def smi_call_s() -> float:
    t0 = time.monotonic()
    subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                   stdout=subprocess.DEVNULL, check=True)
    return time.monotonic() - t0


def one(size: float, gpu: int, coll: str, base: float, module: bool) -> dict:
    holder = start(HOLDER, str(size), str(gpu))
    drv = start(OBSERVER, "driver", str(gpu), coll, str(base + 16))
    gw = start(OBSERVER, "gpu_wait", str(gpu), coll)
    time.sleep(0.2)
    t_kill = time.monotonic()
    os.kill(holder.pid, signal.SIGKILL)
    mod_s = None
    if module:
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
        r = subprocess.run([PY, "-m", "ansible.cli.adhoc", "localhost", "-c", "local", "-i", "localhost,",
                            "-e", "ansible_python_interpreter=" + PY, "-m", "gpufleet.serving.gpu_wait",
                            "-a", "gpus=%d timeout=60" % gpu], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        mod_s = time.monotonic() - t_kill if r.returncode == 0 else None
    d = json.loads(drv.stdout.readline())
    g = json.loads(gw.stdout.readline())
    holder.wait()
    for p in (drv, gw):
        p.wait()
    smi = smi_call_s()
    return {"gib": size, "driver_s": d["t"] - t_kill, "driver_reads": d["reads"], "gpu_wait_s": g["t"] - t_kill,
            "gpu_wait_polls": g["polls"], "seed_s": 3.0 + smi, "module_s": mod_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="20,60,100")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--collections", default=os.path.join(ROOT, "collections"))
    ap.add_argument("--no-module", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    base = used_mib(a.gpu)
    runs = []
    for size in [float(s) for s in a.sizes.split(",")]:
        for _ in range(a.repeats):
            r = one(size, a.gpu, a.collections, base, not a.no_module)
            runs.append(r)
            print(json.dumps(r), flush=True)
    rows = []
    print("\n| GiB | driver frees (s) | gpu_wait returns (s) | gpu_wait - driver (ms) | gpu_wait module via ansible (s) | seed sleep 3 + nvidia-smi (s) | seed / gpu_wait |")
    print("|---|---|---|---|---|---|---|")
    for size in sorted({r["gib"] for r in runs}):
        rs = [r for r in runs if r["gib"] == size]
        med = {k: statistics.median([r[k] for r in rs if r[k] is not None]) if any(r[k] is not None for r in rs) else None
               for k in ("driver_s", "gpu_wait_s", "seed_s", "module_s")}
        row = dict(gib=size, n=len(rs), **med)
        row["gap_ms"] = (med["gpu_wait_s"] - med["driver_s"]) * 1000
        row["seed_ratio"] = med["seed_s"] / med["gpu_wait_s"]
        rows.append(row)
        print("| %g | %.3f | %.3f | %.1f | %s | %.3f | %.1fx |" % (
            size, med["driver_s"], med["gpu_wait_s"], row["gap_ms"],
            "%.2f" % med["module_s"] if med["module_s"] is not None else "-", med["seed_s"], row["seed_ratio"]))
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"runs": runs, "medians": rows, "baseline_used_mib": base}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
