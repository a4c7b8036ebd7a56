# SPDX-License-Identifier: GPL-3.0-or-later
"""The README demo: a rollout against a local 3-host sandbox fleet.

1. brings up 3 sandbox hosts (sshd in network/pid/mount namespaces, 2 fake GPUs each; host3 has NVLink);
2. starts a stale, untuned demo server on each by hand (no launch tag), holding GPU memory;
3. puts a real HAProxy (tests/sandbox/balancer.py, in the fleet's hub namespace) in front of every server; the
   rollout's gpufleet_server_balancers names it, so each host the rollout restarts is drained first;
4. runs gpufleet.serving.rollout through ansible-runner (python -m gpufleet_ci) while the bounded load generator
   (tests/sandbox/loadgen.py) sends requests through HAProxy: take the host out of rotation, wait for its requests
   in flight, adopt + kill the stale server, verify the GPUs clean, write the NCCL block into each host's system
   sitecustomize.py, launch, wait for /health and a real /generate, verify the NCCL env in every spawn worker, put
   the host back and wait until HAProxy reports it UP; the load generator's last line, `N requests during the
   rollout, 0 failed`, is the proof that no request was dropped (any failed request fails the demo);
5. runs it again: nothing to do (changed=0), nothing drained;
6. tears HAProxy and the fleet down.

HAProxy is required (./scripts/setup installs it): without it the demo says so and fails before bringing anything up.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from gpufleet_ci import sandbox  # noqa: E402

FLEET = os.path.join(ROOT, "tests", "sandbox", "fleet.py")
BALANCER = os.path.join(ROOT, "tests", "sandbox", "balancer.py")
LOADGEN = os.path.join(ROOT, "tests", "sandbox", "loadgen.py")
PY = sys.executable
# The load through HAProxy during the rollout: 4 clients, each request 0.25 s on the server (so requests are in flight
# whenever a host is drained), bounded in time and count (the load generator's own limits).
LOAD_CLIENTS = 4
LOAD_DELAY = 0.25


def _load_module(name: str, path: str):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_fleet():
    return _load_module("gpufleet_sandbox_fleet", FLEET)


def load_balancer():
    return _load_module("gpufleet_sandbox_balancer", BALANCER)


def missing_for_drain() -> str:
    """Why the demo's drain cannot run here ('' when it can): real HAProxy (gpufleet.serving.balancer speaks its admin
    socket itself)."""
    try:
        load_balancer()._haproxy_bin()
    except Exception as e:  # BalancerError: not installed
        return str(e)
    return ""


class Load:
    """tests/sandbox/loadgen.py in the fleet's hub namespace, through HAProxy, until stop()."""

    def __init__(self, hub: str, url: str, sock: str, state: str) -> None:
        self.out = os.path.join(state, "load.json")
        self.stop_file = os.path.join(state, "load.stop")
        self.p = subprocess.Popen(["ip", "netns", "exec", hub, PY, LOADGEN, "--url", url + "/generate",
                                   "--clients", str(LOAD_CLIENTS), "--delay", str(LOAD_DELAY), "--tp", "2",
                                   "--duration", "400", "--max-requests", "20000", "--timeout", "60",
                                   "--stop-file", self.stop_file, "--json", self.out, "--haproxy-socket", sock],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def stop(self, timeout: float = 90) -> tuple:
        """Stop (the requests in flight finish); returns (rc, printed lines, the JSON summary or None)."""
        with open(self.stop_file, "w"):
            pass
        try:
            out = self.p.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            self.p.kill()
            out = self.p.communicate()[0]
        res = None
        if os.path.exists(self.out):
            with open(self.out) as f:
                res = json.load(f)
        return self.p.returncode, out.strip().splitlines(), res


def step(msg: str) -> None:
    print("\n\033[1m==> %s\033[0m" % msg if sys.stdout.isatty() else "\n==> %s" % msg, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="leave the fleet up (tear down with tests/sandbox/fleet.py down)")
    args = ap.parse_args()
    why = missing_for_drain()
    if why:
        print("demo: %s.\ndemo: the demo drains each host out of a real HAProxy under load and cannot run without it;"
              " run ./scripts/setup (or ./scripts/demo, which runs it first)." % why, file=sys.stderr)
        print("\ndemo FAILED")
        return 1
    state = tempfile.mkdtemp(prefix="gpufleet-demo-")
    print("demo state directory (removed at the end unless --keep): %s" % state, flush=True)
    rc = 1
    haproxy = None
    load = None
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
        step("Put a real HAProxy in front of every server (in the fleet's hub namespace)")
        bal = load_balancer()
        haproxy = bal.Balancer(state, "haproxy")
        haproxy.up()
        deadline = time.monotonic() + 30
        while {s["status"] for s in haproxy.status().values()} != {"UP"} and time.monotonic() < deadline:
            time.sleep(0.2)
        print("haproxy: %s/generate -> %s" % (haproxy.url, ", ".join(
            "%s %s" % (n, s["status"]) for n, s in sorted(haproxy.status().items()))))
        inv_dir = os.path.join(state, "rollout-inventory")
        os.makedirs(inv_dir, exist_ok=True)
        subprocess.run(["cp", fleet_inv, os.path.join(inv_dir, "fleet.yml")], check=True)
        server_vars = sandbox.server_vars(python)
        # Drain each host the rollout restarts out of HAProxy (its admin socket, from the controller), wait for its
        # requests in flight (the server's /metrics), and put it back once verified (docs/concepts.md, "Draining").
        server_vars.update({"gpufleet_server_balancers": [{"type": "haproxy", "delegate_to": "localhost",
                                                           "socket": haproxy.sock, "backend": bal.BACKEND}],
                            "gpufleet_server_drain_timeout": 30, "gpufleet_server_drain_interval": 0.1,
                            "gpufleet_server_balancer_up_timeout": 30})
        with open(os.path.join(inv_dir, "servers.yml"), "w") as f:
            f.write(sandbox.servers_inventory(hosts, server_vars))
        ci = [PY, "-m", "gpufleet_ci", "rollout", "--inventory", inv_dir, "-e", json.dumps({"gpufleet_rollout_serial": [1, "100%"]})]
        audit = [PY, "-m", "gpufleet_ci", "audit", "--inventory", inv_dir]
        step("Audit (read-only): the stale servers hold the GPUs untuned and untagged, so every host drifts")
        a1 = subprocess.run(audit, cwd=ROOT)
        step("Rollout: canary host1, then the rest (drain -> kill -> verify clean -> tune -> launch -> verify -> "
             "back in rotation), under load through HAProxy")
        load = Load(fl.hub, haproxy.url, haproxy.sock, state)
        time.sleep(1.5)  # requests in flight on every host before the rollout starts
        r1 = subprocess.run(ci + ["--json", os.path.join(state, "rollout-1.json")], cwd=ROOT)
        load_rc, load_lines, load_res = load.stop()
        load = None
        print("\nload generator (%d clients through HAProxy, each request %s s):" % (LOAD_CLIENTS, LOAD_DELAY))
        for line in load_lines:
            print(line)
        load_ok = load_rc == 0 and load_res is not None and load_res["requests"] > 0 and load_res["failed"] == 0
        if not load_ok:
            print("load: requests failed during the rollout (or the load generator did not run): %s"
                  % (json.dumps((load_res or {}).get("failures", [])[:5]) if load_res else "rc %s" % load_rc))
        step("Rollout again: everything is already right, nothing restarts")
        r2 = subprocess.run(ci + ["--json", os.path.join(state, "rollout-2.json")], cwd=ROOT)
        step("Audit again: every host is as desired")
        a2 = subprocess.run(audit, cwd=ROOT)
        with open(os.path.join(state, "rollout-2.json")) as f:
            again = json.load(f)
        restarted = [h["host"] for h in again["hosts"] if h.get("restarted")]
        print("\nsecond rollout restarted: %s" % (", ".join(restarted) or "nothing"))
        rc = 0 if (a1.returncode != 0 and r1.returncode == 0 and r2.returncode == 0 and a2.returncode == 0
                   and not restarted and load_ok) else 1
    finally:
        if load is not None:
            load.stop()
        if args.keep:
            print("fleet left up: %s %s down --state-dir %s; %s %s down --fleet-dir %s; rm -rf %s"
                  % (PY, FLEET, state, PY, BALANCER, state, state))
        else:
            step("Tear the fleet down")
            if haproxy is not None:
                haproxy.down()
            subprocess.run([PY, FLEET, "down", "--state-dir", state], check=False)
            # Its logs, HAProxy's configuration and the load generator's results: nothing of the demo is left behind.
            shutil.rmtree(state, ignore_errors=True)
    print("\ndemo %s" % ("OK" if rc == 0 else "FAILED"))
    return rc


if __name__ == "__main__":
    sys.exit(main())
