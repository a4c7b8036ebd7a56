# SPDX-License-Identifier: GPL-3.0-or-later
"""The README demo: a rollout against a local 3-host sandbox fleet.

1. brings up 3 sandbox hosts (sshd in network/pid/mount namespaces, 2 fake GPUs each; host3 has NVLink);
2. starts a stale, untuned demo server on each by hand (no launch tag), holding GPU memory;
3. runs gpufleet.serving.rollout through ansible-runner (python -m gpufleet_ci): adopt + kill the stale
   server, verify the GPUs clean, write the NCCL block into each host's system sitecustomize.py, launch,
   wait for /health and a real /generate, verify the NCCL env in every spawn worker;
4. runs it again: nothing to do (changed=0);
5. tears the fleet down.
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

FLEET = os.path.join(ROOT, "tests", "sandbox", "fleet.py")
PY = sys.executable


def load_fleet():
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpufleet_sandbox_fleet", FLEET)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def step(msg: str) -> None:
    print("\n\033[1m==> %s\033[0m" % msg if sys.stdout.isatty() else "\n==> %s" % msg, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="leave the fleet up (tear down with tests/sandbox/fleet.py down)")
    args = ap.parse_args()
    state = tempfile.mkdtemp(prefix="gpufleet-demo-")
    rc = 1
    try:
        step("Bring up %d sandbox hosts" % args.hosts)
        nvl = "host%d" % args.hosts
        subprocess.run([PY, FLEET, "up", "--hosts", str(args.hosts), "--gpus", "2", "--nvlink", nvl,
                        "--state-dir", state], check=True)
        fleet_inv = os.path.join(state, "inventory.yml")
        hosts = ["host%d" % i for i in range(1, args.hosts + 1)]
        python = load_fleet().Fleet(state).load()["python"]
        step("Start a stale, untuned server on every host by hand (no launch tag)")
        fl = load_fleet().Fleet(state)
        for h in hosts:
            subprocess.run(fl.ssh_argv(h, sandbox.stale_server_cmd(python)), check=True)
        time.sleep(1.5)
        inv_dir = os.path.join(state, "rollout-inventory")
        os.makedirs(inv_dir, exist_ok=True)
        subprocess.run(["cp", fleet_inv, os.path.join(inv_dir, "fleet.yml")], check=True)
        with open(os.path.join(inv_dir, "servers.yml"), "w") as f:
            f.write(sandbox.servers_inventory(hosts, sandbox.server_vars(python)))
        ci = [PY, "-m", "gpufleet_ci", "rollout", "--inventory", inv_dir, "-e", json.dumps({"gpufleet_rollout_serial": [1, "100%"]})]
        audit = [PY, "-m", "gpufleet_ci", "audit", "--inventory", inv_dir]
        step("Audit (read-only): the stale servers hold the GPUs untuned and untagged, so every host drifts")
        a1 = subprocess.run(audit, cwd=ROOT)
        step("Rollout: canary host1, then the rest (kill -> verify clean -> tune -> launch -> verify)")
        r1 = subprocess.run(ci + ["--json", os.path.join(state, "rollout-1.json")], cwd=ROOT)
        step("Rollout again: everything is already right, nothing restarts")
        r2 = subprocess.run(ci + ["--json", os.path.join(state, "rollout-2.json")], cwd=ROOT)
        step("Audit again: every host is as desired")
        a2 = subprocess.run(audit, cwd=ROOT)
        with open(os.path.join(state, "rollout-2.json")) as f:
            again = json.load(f)
        restarted = [h["host"] for h in again["hosts"] if h.get("restarted")]
        print("\nsecond rollout restarted: %s" % (", ".join(restarted) or "nothing"))
        rc = 0 if a1.returncode != 0 and r1.returncode == 0 and r2.returncode == 0 and a2.returncode == 0 and not restarted else 1
    finally:
        if args.keep:
            print("fleet left up: %s %s down --state-dir %s" % (PY, FLEET, state))
        else:
            step("Tear the fleet down")
            subprocess.run([PY, FLEET, "down", "--state-dir", state], check=False)
    print("\ndemo %s" % ("OK" if rc == 0 else "FAILED"))
    return rc


if __name__ == "__main__":
    sys.exit(main())
