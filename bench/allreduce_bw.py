#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-3.0-or-later
"""NCCL all_reduce bus bandwidth under each of gpufleet's NCCL profiles, in one run (needs >= 2 GPUs).

    python3 bench/allreduce_bw.py [--profiles none,pcie_only,nvlink] [--repeats 2] [--json out.json]

The profiles are read from roles/nccl_tuning/vars/main.yml (what the role writes), so the table shows what
choosing a profile costs or buys on this machine. Each (repeat, profile) runs in fresh processes (NCCL reads
its environment once, at communicator creation): one rank a GPU, started with multiprocessing spawn, all
NCCL_* variables of this shell removed and NCCL_NVLS_ENABLE=0 set for every profile (NVLink multicast off).
Every rank reports the NCCL_* variables it actually saw, so a leftover sitecustomize block that added
variables shows up (and fails the run) instead of skewing a column. busbw = bytes / time * 2(n-1)/n, the
nccl-tests convention; time = the slowest rank's mean over --iters calls after --warmup calls.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import typing as t

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = [1 << 16, 1 << 20, 1 << 24, 1 << 28, 1 << 30]
ALWAYS = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def load_profiles() -> t.Dict[str, t.Dict[str, str]]:
    import yaml  # PyYAML: ansible-core's own dependency

    with open(os.path.join(ROOT, "roles", "nccl_tuning", "vars", "main.yml")) as f:
        return {k: {n: str(v) for n, v in (d or {}).items()} for k, d in yaml.safe_load(f)["_gpufleet_nccl_profiles"].items()}


def rank_main(rank: int, world: int, store: str, sizes: t.List[int], warmup: int, iters: int, q: t.Any) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="file://" + store, rank=rank, world_size=world)
    rows = []
    for nbytes in sizes:
        x = torch.zeros(nbytes // 4, dtype=torch.float32, device="cuda")
        for _ in range(warmup):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(x)
        end.record()
        torch.cuda.synchronize()
        secs = torch.tensor([start.elapsed_time(end) / 1000.0 / iters], device="cuda", dtype=torch.float64)
        dist.all_reduce(secs, op=dist.ReduceOp.MAX)
        s = float(secs.item())
        rows.append({"bytes": nbytes, "time_us": round(s * 1e6, 2),
                     "busbw_gbs": round(nbytes / s * 2 * (world - 1) / world / 1e9, 2)})
        del x
    nccl_env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_") and not k.startswith("NCCL_DEBUG")}
    q.put({"rank": rank, "pid": os.getpid(), "nccl_env": nccl_env, "rows": rows})
    dist.destroy_process_group()


def run_profile(world: int, sizes: t.List[int], warmup: int, iters: int) -> t.Dict[str, t.Any]:
    """Child mode: this process's environment is the profile's; spawn one rank a GPU."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=rank_main, args=(r, world, d + "/store", sizes, warmup, iters, q)) for r in range(world)]
        for p in procs:
            p.start()
        out = [q.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(60)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise SystemExit("ranks exited with %s" % bad)
    return {"ranks": sorted(out, key=lambda o: o["rank"])}


def gpu_count() -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", default="none,pcie_only,nvlink")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="message sizes in bytes")
    ap.add_argument("--gpus", type=int, default=0, help="ranks (default: every GPU NVML sees)")
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    world = a.gpus or gpu_count()
    if world < 2:
        print("allreduce_bw: needs at least 2 GPUs, found %d" % world, file=sys.stderr)
        return 2
    if a.child:
        print(json.dumps(run_profile(world, sizes, a.warmup, a.iters)))
        return 0

    profiles = load_profiles()
    names = a.profiles.split(",")
    unknown = [n for n in names if n not in profiles]
    if unknown:
        print("allreduce_bw: unknown profile(s) %s; known: %s" % (unknown, sorted(profiles)), file=sys.stderr)
        return 2
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    runs: t.Dict[str, t.List[t.Dict[str, t.Any]]] = {n: [] for n in names}
    ok = True
    for rep in range(a.repeats):
        for n in names:  # interleaved, so drift over the run hits every profile alike
            env = dict(base, **ALWAYS, **profiles[n])
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--gpus", str(world), "--sizes",
                                a.sizes, "--warmup", str(a.warmup), "--iters", str(a.iters)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900, check=False)
            if p.returncode != 0:
                print("profile %s repeat %d failed (rc %d): %s" % (n, rep, p.returncode, p.stderr[-3000:]), file=sys.stderr)
                return 1
            res = json.loads(p.stdout.strip().splitlines()[-1])
            want = dict({k: v for k, v in ALWAYS.items() if k.startswith("NCCL_")}, **profiles[n])  # ranks report NCCL_*
            seen = [r["nccl_env"] for r in res["ranks"]]
            if any(s != want for s in seen):
                print("profile %s: ranks saw NCCL variables %s, expected %s (a leftover sitecustomize block?)"
                      % (n, seen, want), file=sys.stderr)
                ok = False
            runs[n].append(res)
            print("repeat %d %-10s %s" % (rep, n, " ".join("%s=%.1f" % (_size(r["bytes"]), r["busbw_gbs"])
                                                           for r in res["ranks"][0]["rows"])), flush=True)

    table = []
    for i, nbytes in enumerate(sizes):
        row: t.Dict[str, t.Any] = {"bytes": nbytes, "size": _size(nbytes)}
        for n in names:
            row[n] = round(statistics.median(r["ranks"][0]["rows"][i]["busbw_gbs"] for r in runs[n]), 2)
        table.append(row)
    ref = names[0]
    lines = ["| message | " + " | ".join("%s busbw GB/s" % n for n in names) + " | "
             + " | ".join("%s / %s" % (n, ref) for n in names[1:]) + " |",
             "|---" * (1 + 2 * len(names) - 1) + "|"]
    for row in table:
        lines.append("| %s | " % row["size"] + " | ".join("%.1f" % row[n] for n in names) + " | "
                     + " | ".join("%.2f×" % (row[n] / row[ref]) if row[ref] else "-" for n in names[1:]) + " |")
    md = "\n".join(lines)
    print(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"world": world, "profiles": {n: dict(ALWAYS, **profiles[n]) for n in names},
                       "repeats": a.repeats, "warmup": a.warmup, "iters": a.iters, "table": table,
                       "markdown": md, "runs": runs, "env_ok": ok}, f, indent=1)
    return 0 if ok else 1


def _size(n: int) -> str:
    for unit, b in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= b:
            return "%g %s" % (n / b, unit)
    return "%d B" % n


if __name__ == "__main__":
    sys.exit(main())
