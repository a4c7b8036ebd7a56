#!/usr/bin/env python
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the rollout_summary callback's fork_gc_freeze saves: the controller's CPU-seconds of the same rollouts with it
on (the default) and off (GPUFLEET_FORK_GC_FREEZE=false), interleaved, on one sandbox fleet, in one run.

    .venv/bin/python bench/fork_gc.py [--hosts 4] [--repeats 5] [--json docs/evidence/fork-gc.json]

Per repeat and setting: `gpufleet.serving.restart` (every host restarted in one batch) and a no-op
`gpufleet.serving.rollout`, each in its own cgroup (bench/controller_cpu.py: ansible-playbook, its forked workers, the
ssh clients), with no ssh connection open at its start; the on and off runs alternate, so that both see the same
machine. Reported: the medians per host, the main process / forks / ssh split, and on / off as ratios. Needs root.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fleet_rollout as fr  # noqa: E402

KINDS = ("restart", "noop")
SETTINGS = ("on", "off")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = {"hosts": a.hosts, "repeats": a.repeats, "load_before": os.getloadavg()[0]}
    base = {k: v for k, v in os.environ.items() if k != "GPUFLEET_FORK_GC_FREEZE"}
    with fr.sandbox_fleet(a.hosts, 2, base) as (_fleet, _python, _hosts, run, pb):
        env = {"on": run.env, "off": dict(run.env, GPUFLEET_FORK_GC_FREEZE="false")}
        run.run(pb + ["gpufleet.serving.rollout"])  # first rollout: tune + launch everywhere
        for k in KINDS:
            for s in SETTINGS:
                res["%s_%s" % (k, s)] = []
        for i in range(a.repeats):
            order = SETTINGS if i % 2 == 0 else SETTINGS[::-1]
            for s in order:
                res["restart_" + s].append(run.run(pb + ["gpufleet.serving.restart"], env[s]))
                res["noop_" + s].append(run.run(pb + ["gpufleet.serving.rollout"], env[s]))
        res["load_after"] = os.getloadavg()[0]
    n = a.hosts
    out = ["| %d hosts, median of %d | CPU s per host, on | off | on / off | forks on / off | main process on / off |"
           % (n, a.repeats), "|---|---|---|---|---|---|"]
    ratios = {}
    for k in KINDS:
        on, off = res[k + "_on"], res[k + "_off"]
        c_on, c_off = fr.med([r["cpu_s"] for r in on]) / n, fr.med([r["cpu_s"] for r in off]) / n
        f_on = fr.med([r["cpu_s"] - r["main_cpu_s"] - r["ssh_cpu_s"] for r in on]) / n
        f_off = fr.med([r["cpu_s"] - r["main_cpu_s"] - r["ssh_cpu_s"] for r in off]) / n
        m_on, m_off = fr.med([r["main_cpu_s"] for r in on]) / n, fr.med([r["main_cpu_s"] for r in off]) / n
        ratios[k] = {"cpu": round(c_on / c_off, 3), "forks": round(f_on / f_off, 3), "main": round(m_on / m_off, 3)}
        out.append("| `%s` | %.3f | %.3f | **%.2f×** | %.3f / %.3f (%.2f×) | %.3f / %.3f (%.2f×) |" % (
            k, c_on, c_off, c_on / c_off, f_on, f_off, f_on / f_off, m_on, m_off, m_on / m_off))
    res["ratios"] = ratios
    print("\n".join(out))
    print("load (1 min) %.1f -> %.1f" % (res["load_before"], res["load_after"]))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
