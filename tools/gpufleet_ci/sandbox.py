# SPDX-License-Identifier: GPL-3.0-or-later
"""Inventory for running gpufleet against the sandbox fleet (tests/sandbox/fleet.py) with the demo server.

The fleet writes the hosts (ssh settings, fake GPUs); this adds the `gpufleet_servers` group with a
server definition, so `-i fleet/inventory.yml -i servers.yml` is a complete rollout inventory.
"""
from __future__ import annotations

import json
import typing as t

DEMO_SERVER = "/opt/gpufleet-fake/demo_server.py"
PORT = 30000


def server_vars(python: str, gpus: int = 2, mib: int = 20000, extra_args: t.Sequence[str] = ()) -> t.Dict[str, t.Any]:
    return {
        "gpufleet_server_name": "demo",
        "gpufleet_server_command": [python, DEMO_SERVER, "--port", str(PORT), "--tp", str(gpus),
                                    "--gpus", ",".join(str(i) for i in range(gpus)), "--mib", str(mib),
                                    "--state-dir", "/var/lib/demo"] + list(extra_args),
        "gpufleet_server_env": {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"},
        "gpufleet_server_health_url": "http://127.0.0.1:%d/health" % PORT,
        "gpufleet_server_health_request": {
            "url": "http://127.0.0.1:%d/generate" % PORT, "method": "POST",
            "headers": {"Content-Type": "application/json"},
            "body": json.dumps({"text": "ping", "max_new_tokens": 1}), "timeout": 5},
        # Adopt the stale server that was started by hand (no launch tag).
        "gpufleet_server_adopt_cmdline_regex": r"demo_server\.py",
        "gpufleet_server_kill_grace": 3,
        "gpufleet_server_clean_timeout": 10,
        "gpufleet_server_start_timeout": 30,
        "gpufleet_server_nccl_log": "/var/log/gpufleet/demo.log",
        "gpufleet_nccl_profile": "pcie_only",
    }


def servers_inventory(hosts: t.Sequence[str], group_vars: t.Mapping[str, t.Any],
                      host_vars: t.Optional[t.Mapping[str, t.Mapping[str, t.Any]]] = None) -> str:
    """YAML (JSON is YAML) putting `hosts` into gpufleet_servers with the given vars."""
    hv = host_vars or {}
    inv = {"gpufleet_servers": {"hosts": {h: dict(hv.get(h, {})) or None for h in hosts}, "vars": dict(group_vars)}}
    return json.dumps(inv, indent=1) + "\n"


def stale_server_cmd(python: str, gpus: int = 2, mib: int = 20000) -> str:
    """Shell command that starts an untagged, untuned demo server the way people do by hand."""
    return ("mkdir -p /var/log; cd /; nohup setsid %s %s --port %d --tp %d --gpus %s --mib %d "
            "--state-dir /var/lib/demo-stale > /var/log/demo-stale.log 2>&1 < /dev/null &"
            % (python, DEMO_SERVER, PORT, gpus, ",".join(str(i) for i in range(gpus)), mib))
