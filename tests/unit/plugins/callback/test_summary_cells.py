# SPDX-License-Identifier: GPL-3.0-or-later
"""The summary's restarted cell for the clean playbook's stops (rollout_summary's rows)."""
from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.callback.rollout_summary import CallbackModule


def _cell(**host) -> str:
    cb = CallbackModule()
    cb.inventory_hosts = ["h"]
    cb.hosts = {"h": dict({"host": "h", "status": "ok", "stopped": True}, **host)}
    return cb.rows()[0]["restart"]


def test_a_stop_that_failed_before_its_kill_says_not_stopped():
    # The clean playbook refused by its drain (a balancer entry naming another host's server): its server still runs,
    # which "nothing to stop" would deny (helper-36).
    assert _cell(status="failed", killed=0) == "not stopped"
    assert _cell(killed=0) == "nothing to stop"
    assert _cell(killed=3) == "stopped"
    assert _cell(status="failed", killed=3) == "stopped"
    assert _cell(would_stop=True) == "would stop"
