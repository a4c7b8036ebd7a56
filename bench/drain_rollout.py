#!/usr/bin/env python
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark 6 (issue 17): failed requests and latency during a restart of the sandbox fleet under load, through a real
HAProxy, for (a) the manual method (a kill -9 loop), (b) gpufleet without a balancer integration (the kill order of
before: every process at once) and (c) gpufleet with the drain (gpufleet_server_balancers, the launcher-first kill).

    .venv/bin/python bench/drain_rollout.py [--hosts 4] [--clients 8] [--json docs/evidence/drain-bench.json]

4 sandbox hosts (tests/sandbox/fleet.py), each running the demo server with 0.5 s requests (--generate-delay), behind
HAProxy (tests/sandbox/balancer.py: health check GET /health every 200 ms, rise 2, fall 2, retries on connection
failures only); tests/sandbox/loadgen.py sends --clients concurrent POST /generate through it for the whole restart
and checks every answer. (a) per host in turn: kill -9 of the server's processes, sleep 3, relaunch, wait for /health;
(b) and (c): `gpufleet.serving.rollout` forced, serial [1, "25%"]. One run each. Needs root. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT / "tests", ROOT / "tests" / "rollout", ROOT / "tests" / "sandbox", ROOT / "tests" / "unit", ROOT / "tools"):
    sys.path.insert(0, str(p))

from sandbox.fixtures import SandboxFleet  # noqa: E402
from drain_helpers import DrainFleet  # noqa: E402
from gpufleet_ci import sandbox  # noqa: E402
from balancer import Balancer  # noqa: E402


def manual(df: DrainFleet) -> None:
    """The hand procedure, host by host: kill -9 everything of the server, sleep 3, relaunch, poll /health."""
    for h in df.hosts:
        s = df.snapshot()
        # `ps aux | grep python3 | xargs kill -9`: the launcher and its spawn workers (by pid, inside the host).
        df.kill(h, [p["pid"] for p in s.procs(h) if "python" in p["cmdline"][0]], "KILL")
        time.sleep(3)
        cmd = sandbox.stale_server_cmd(df.python).replace(" > /var/log/", " --generate-delay 0.5 > /var/log/")
        df.fleet.ssh(h, cmd, check=True)
        df.fleet.ssh(h, "for i in $(seq 300); do curl -sf -o /dev/null http://127.0.0.1:30000/health && exit 0; "
                        "sleep 0.1; done; exit 1", check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--json")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gfdrain-"))
    fleet = SandboxFleet(work / "fleet")
    rows = []
    try:
        fleet.up(hosts=a.hosts, gpus=2)
        df = DrainFleet(fleet, work / "runs")
        df.reset()
        df.start_stale()
        df.haproxy.up()
        scenarios = [
            ("(a) manual kill -9 loop", None),
            ("(b) gpufleet, no balancer integration, old kill order", {"gpufleet_server_balancers": [],
                                                                      "gpufleet_server_kill_order": "all_at_once"}),
            ("(c) gpufleet with drain (HAProxy)", {"gpufleet_server_balancers": df.balancers()[:1]}),
        ]
        for name, over in scenarios:
            _wait_up(df)
            load = df.load("haproxy", "bench-%d" % len(rows), clients=a.clients)
            t0 = time.monotonic()
            if over is None:
                manual(df)
                rc = 0
            else:
                r = df.playbook("rollout", vars_override=dict(df.server_vars(), **over),
                                extra_vars={"gpufleet_rollout_serial": [1, "25%"], "gpufleet_server_force_restart": True})
                rc = r.rc
                if rc != 0:
                    print("rollout rc=%s: %s" % (rc, {h: v.get("failure") for h, v in r.summary.items() if v.get("failure")}))
                    print(r.tail(3000))
            took = time.monotonic() - t0
            res = load.stop()
            rows.append({"scenario": name, "rc": rc, "restart_s": round(took, 1), "requests": res["requests"],
                         "failed": res["failed"], "statuses": res["statuses"], "p50_s": res["p50"], "p99_s": res["p99"],
                         "min_in_service": res["min_in_service"]})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        Balancer(work / "fleet", "haproxy").down()
        fleet.down()
    print("\n| scenario | hosts | requests during the restart | failed | statuses | p50 | p99 | fewest UP | wall |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %d | %d | **%d** | %s | %.2f s | %.2f s | %s | %.0f s |" % (
            r["scenario"], a.hosts, r["requests"], r["failed"], ", ".join("%s: %s" % kv for kv in r["statuses"].items()),
            r["p50_s"] or 0, r["p99_s"] or 0, r["min_in_service"], r["restart_s"]))
    if a.json:
        Path(a.json).write_text(json.dumps({"hosts": a.hosts, "clients": a.clients, "rows": rows}, indent=1) + "\n")
    return 0


def _wait_up(df: DrainFleet, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while set(df.haproxy_states().values()) != {"UP"}:
        if time.monotonic() > deadline:
            raise SystemExit("not every server UP in HAProxy: %s" % df.haproxy_states())
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
