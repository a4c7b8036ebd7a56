# SPDX-License-Identifier: GPL-3.0-or-later
"""balancer_idents: the server each entry names for a host, as the balancer module names it (the same function), which
the role's check compares with a drain record's server (helper-39)."""
from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.filter.balancer_idents import FilterModule

idents = FilterModule().filters()["balancer_idents"]


def test_each_entry_names_the_host_as_its_balancer_does():
    entries = [{"type": "haproxy", "name": "lb"},
               {"type": "haproxy", "name": "lb2", "server": "gpu-a"},
               {"type": "sglang_router", "name": "smg", "url": "http://10.0.0.9:8081"},
               {"type": "sglang_router", "name": "smg2", "url": "http://10.0.0.9:8081", "worker_url": "http://w:1"},
               {"type": "http", "name": "hook", "remove": {"url": "https://u:secret@lb/pool/h1?token=abc"},
                "add": {"url": "https://lb/pool/h1"}}]
    got = idents(entries, "host1", "http://10.0.0.1:30000")
    assert got == {"lb": "host1", "lb2": "gpu-a", "smg": "http://10.0.0.1:30000", "smg2": "http://w:1",
                   "hook": got["hook"]}, got
    # The remove URL without its credentials or query: no secret goes into the check's arguments.
    assert "secret" not in got["hook"] and "abc" not in got["hook"] and got["hook"].endswith("/pool/h1"), got
    assert idents([], "h", "u") == {} and idents(None, "h", "u") == {}
