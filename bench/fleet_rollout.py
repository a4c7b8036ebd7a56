#!/usr/bin/env python
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmarks 3 and 4 on the sandbox fleet (real sshd hosts, real spawn-worker demo servers, fake NVML).

    .venv/bin/python bench/fleet_rollout.py --sizes 2,4,8 --json bench/results/fleet.json

3. Fleet restart: `gpufleet.serving.restart` with every host in one batch, versus the seed's method as a
   sequential ssh loop per host: kill -9, sleep 3, read GPU memory (the nvidia-smi step; the sandbox hosts
   have the fake NVML, so a pynvml read stands in), relaunch, poll /health.
4. No-op rollout (`gpufleet.serving.rollout` when everything is already right) versus bare `ansible -m ping`
   on the same hosts; what the fast path buys (the same no-op with gpufleet_rollout_fast_check=false, through the
   full roles); and what the ansible settings buy: the same no-op rollout with ansible's defaults
   (no pipelining, forks 5, implicit fact gathering) versus the repo's ansible.cfg.
Needs root. Prints a Markdown table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from gpufleet_ci import sandbox  # noqa: E402

PY = sys.executable
BIN = os.path.dirname(PY)
FLEET = os.path.join(ROOT, "tests", "sandbox", "fleet.py")


def load_fleet():
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpufleet_sandbox_fleet", FLEET)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def timed(argv, env=None, check=True):
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    dt = time.monotonic() - t0
    if check and r.returncode != 0:
        sys.stderr.write(r.stdout[-3000:])
        raise SystemExit("failed: %s" % " ".join(argv[:4]))
    return dt, r.stdout


SEED = (
    "pkill -9 -f '[d]emo_server.py'; pkill -9 -f '[m]ultiprocessing.spawn'; sleep 3; "
    "{py} -c 'import pynvml as n; n.nvmlInit(); "
    "print([n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(i)).used for i in range(n.nvmlDeviceGetCount())])'; "
    "cd /; nohup setsid {py} /opt/gpufleet-fake/demo_serv''er.py --port 30000 --tp 2 --gpus 0,1 --mib 20000 "
    "--state-dir /var/lib/demo-seed > /var/log/demo-seed.log 2>&1 < /dev/null & "
    "for i in $(seq 1 200); do {py} -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:30000/health\", timeout=1)' "
    "2>/dev/null && break; sleep 0.25; done"
)


def bench_size(n: int, repeats: int) -> dict:
    state = tempfile.mkdtemp(prefix="gpufleet-bench-")
    fl = load_fleet()
    try:
        subprocess.run([PY, FLEET, "up", "--hosts", str(n), "--gpus", "2", "--state-dir", state], check=True,
                       stdout=subprocess.DEVNULL)
        f = fl.Fleet(state)
        python = f.load()["python"]
        hosts = ["host%d" % i for i in range(1, n + 1)]
        inv = os.path.join(state, "inv")
        os.makedirs(inv)
        subprocess.run(["cp", os.path.join(state, "inventory.yml"), os.path.join(inv, "fleet.yml")], check=True)
        with open(os.path.join(inv, "servers.yml"), "w") as fh:
            fh.write(sandbox.servers_inventory(hosts, sandbox.server_vars(python)))
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        pb = [os.path.join(BIN, "ansible-playbook"), "-i", inv, "-e", json.dumps({"gpufleet_rollout_serial": ["100%"]})]
        timed(pb + ["gpufleet.serving.rollout"], env)  # first rollout: tune + launch everywhere
        res = {"hosts": n, "restart_s": [], "seed_s": [], "noop_s": [], "ping_s": [], "noop_full_roles_s": [],
               "noop_ansible_defaults_s": []}
        for _ in range(repeats):
            res["restart_s"].append(timed(pb + ["gpufleet.serving.restart"], env)[0])
            res["noop_s"].append(timed(pb + ["gpufleet.serving.rollout"], env)[0])
            # What the fast path buys: the same no-op through the full roles.
            res["noop_full_roles_s"].append(timed(pb + ["-e", '{"gpufleet_rollout_fast_check": false}',
                                                        "gpufleet.serving.rollout"], env)[0])
            res["ping_s"].append(timed([os.path.join(BIN, "ansible"), "all", "-i", inv, "-m", "ansible.builtin.ping"], env)[0])
            plain = dict(env, ANSIBLE_PIPELINING="False", ANSIBLE_FORKS="5", ANSIBLE_GATHERING="implicit")
            res["noop_ansible_defaults_s"].append(timed(pb + ["gpufleet.serving.rollout"], plain)[0])
        # The seed's way (the quotes in demo_serv''er.py keep pkill -f from matching this shell itself): one host after the other.
        for _ in range(repeats):
            t0 = time.monotonic()
            for h in hosts:
                r = subprocess.run(f.ssh_argv(h, SEED.format(py=python)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                if r.returncode != 0:
                    raise SystemExit("seed loop failed on %s: %s" % (h, r.stdout[-500:]))
            res["seed_s"].append(time.monotonic() - t0)
            for h in hosts:  # leave the hosts as gpufleet expects for the next repeat
                subprocess.run(f.ssh_argv(h, "pkill -9 -f '[d]emo_server.py'; pkill -9 -f '[m]ultiprocessing.spawn'; true"))
            timed(pb + ["gpufleet.serving.rollout"], env)
        return res
    finally:
        subprocess.run([PY, FLEET, "down", "--state-dir", state], stdout=subprocess.DEVNULL)


def med(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="2,4,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (sandbox fleet)")
    results = []
    for n in [int(s) for s in a.sizes.split(",")]:
        r = bench_size(n, a.repeats)
        results.append(r)
        print(json.dumps(r), flush=True)
    print("\n| hosts | gpufleet restart, one batch (s) | seed ssh loop (s) | seed / gpufleet | no-op rollout (s) | ansible ping (s) | no-op / ping | no-op, full roles (s) | no-op with ansible defaults (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        m = {k: med(v) for k, v in r.items() if isinstance(v, list)}
        r["medians"] = m
        print("| %d | %.1f | %.1f | %.2fx | %.1f | %.1f | %.2fx | %.1f | %.1f |" % (
            r["hosts"], m["restart_s"], m["seed_s"], m["seed_s"] / m["restart_s"], m["noop_s"], m["ping_s"],
            m["noop_s"] / m["ping_s"], m["noop_full_roles_s"], m["noop_ansible_defaults_s"]))
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as fh:
            json.dump({"machine": "%d cores" % os.cpu_count(), "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
