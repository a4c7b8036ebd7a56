#!/usr/bin/env python
# SPDX-License-Identifier: GPL-3.0-or-later
"""Task executions per host (issue 25's contract): a no-op rollout and a forced restart behind HAProxy, on N sandbox
hosts, counted by bench/callback/task_counts.py (one task on one host: a worker fork and a result, skipped included).

    .venv/bin/python bench/task_counts.py [--hosts 8] [--json docs/evidence/task-counts.json]

The sandbox fleet (tests/sandbox/fleet.py) runs the demo server on each host behind a real HAProxy
(tests/sandbox/balancer.py, gpufleet_server_balancers naming it). A first rollout makes every host right; then:
- `noop`: `gpufleet.serving.rollout` again (serial [1, "100%"], the fast path: nothing to do);
- `restart`: the same rollout with gpufleet_server_force_restart (each host drained, restarted, put back).
Per host: the executions of that host (a run_once task counts for the host it ran on, so one host has a few more:
`max` against `per_host`, the count most hosts have). The targets are issue 25's (no-op <= 3, restart <= 10); the
script reports, it does not judge: it exits 0 when the runs succeed whatever the counts. Needs root.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import typing as t
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT / "tests", ROOT / "tests" / "rollout", ROOT / "tests" / "sandbox", ROOT / "tests" / "unit", ROOT / "tools"):
    sys.path.insert(0, str(p))

from sandbox.fixtures import SandboxFleet  # noqa: E402
from drain_helpers import DrainFleet  # noqa: E402
from balancer import Balancer  # noqa: E402

TARGETS = {"noop": 3, "restart": 10}
CALLBACK_DIR = ROOT / "bench" / "callback"


def counted(df: DrainFleet, name: str, extra_vars: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
    """One playbook run with the counting callback on; its per-host counts and the task list of a typical host."""
    out = df.workdir / ("task-counts-%s-%d.json" % (name, df.runs))
    env = {"GPUFLEET_TASK_COUNTS": str(out), "ANSIBLE_CALLBACK_PLUGINS": str(CALLBACK_DIR),
           "ANSIBLE_CALLBACKS_ENABLED": "gpufleet.serving.rollout_summary,task_counts"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # DrainFleet.playbook passes os.environ on to ansible-playbook
    try:
        r = df.playbook("rollout", vars_override=dict(df.server_vars(), gpufleet_server_balancers=df.balancers()[:1]),
                        extra_vars=dict({"gpufleet_rollout_serial": [1, "100%"]}, **extra_vars))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if r.rc != 0:
        raise SystemExit("%s: rollout rc=%s\n%s" % (name, r.rc, r.tail(3000)))
    hosts = json.loads(out.read_text())["hosts"]
    counts = {h: v["executions"] for h, v in hosts.items()}
    per_host = collections.Counter(counts.values()).most_common(1)[0][0]
    typical = next(h for h, n in counts.items() if n == per_host)
    return {"per_host": per_host, "max": max(counts.values()), "min": min(counts.values()), "hosts": counts,
            "target": TARGETS[name], "wall_s": round(r.took, 1), "tasks": hosts[typical]["tasks"],
            "summary": {h: {"restarted": s.get("restarted"), "status": s.get("status")} for h, s in r.summary.items()}}


def measure(hosts: int, work: Path) -> t.Dict[str, t.Any]:
    fleet = SandboxFleet(work / "fleet")
    try:
        fleet.up(hosts=hosts, gpus=2)
        df = DrainFleet(fleet, work / "runs")
        df.reset()
        df.start_stale()
        df.haproxy.up()
        first = df.playbook("rollout", vars_override=dict(df.server_vars(), gpufleet_server_balancers=df.balancers()[:1]),
                            extra_vars={"gpufleet_rollout_serial": ["100%"]})
        if first.rc != 0:
            raise SystemExit("first rollout rc=%s\n%s" % (first.rc, first.tail(3000)))
        return {"hosts": hosts, "noop": counted(df, "noop", {}),
                "restart": counted(df, "restart", {"gpufleet_server_force_restart": True})}
    finally:
        Balancer(work / "fleet", "haproxy").down()
        fleet.down()


def table(res: t.Mapping[str, t.Any]) -> str:
    rows = ["| %d hosts | task executions per host | most on one host (run_once) | issue 25 target | wall |" % res["hosts"],
            "|---|---|---|---|---|"]
    for name, label in (("noop", "no-op `rollout`"), ("restart", "forced restart behind HAProxy")):
        r = res[name]
        rows.append("| %s | %d | %d | <= %d | %.0f s |" % (label, r["per_host"], r["max"], r["target"], r["wall_s"]))
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = measure(a.hosts, Path(tempfile.mkdtemp(prefix="gftaskcounts-")))
    print(table(res))
    for name in ("noop", "restart"):
        print("\n%s, one host's task executions:" % name)
        for task, status in res[name]["tasks"]:
            print("  %-8s %s" % (status, task))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
