#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-3.0-or-later
"""Molecule helper: the `gpufleet_servers` group for a sandbox fleet, built by tools/gpufleet_ci/sandbox.py. Test-only.

    servers_inventory.py --fleet-state DIR --out FILE [--vars JSON]

Reads the fleet's DIR/fleet.json (host names, host python) and writes FILE (JSON, which is YAML) with every
host in `gpufleet_servers` and the demo server definition of sandbox.server_vars() (the pcie_only NCCL
profile, adopting the stale server by command line), with the quick timeouts of the rollout tests, then
`--vars` on top. It also sets `molecule_stale_server_cmd` (sandbox.stale_server_cmd()) for prepare.yml.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from gpufleet_ci import sandbox  # noqa: E402

# Quick on 2 cores; the same values as tests/rollout (the demo server stops on TERM at once).
QUICK = {"gpufleet_server_kill_grace": 2, "gpufleet_server_clean_timeout": 5, "gpufleet_server_start_timeout": 30,
         "gpufleet_server_ready_interval": 0.1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fleet-state", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vars", default="{}", help="JSON object of group vars merged last")
    a = ap.parse_args()
    with open(os.path.join(a.fleet_state, "fleet.json")) as f:
        state = json.load(f)
    python = state["python"]
    gv = sandbox.server_vars(python)
    gv.update(QUICK)
    gv.update(json.loads(a.vars))
    gv["molecule_stale_server_cmd"] = sandbox.stale_server_cmd(python)
    text = "# Written by molecule/shared/servers_inventory.py (create.yml). Test-only.\n"
    text += sandbox.servers_inventory([h["name"] for h in state["host_info"]], gv)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
