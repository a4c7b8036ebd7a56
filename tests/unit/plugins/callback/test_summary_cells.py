# SPDX-License-Identifier: GPL-3.0-or-later
"""The summary's restarted cell for the clean playbook's stops (rollout_summary's rows)."""
from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.callback.rollout_summary import CallbackModule


def _cell(**host) -> str:
    cb = CallbackModule()
    cb.inventory_hosts = ["h"]
    cb.hosts = {"h": {"": dict({"host": "h", "status": "ok", "stopped": True}, **host)}}
    return cb.rows()[0]["restart"]


def test_a_stop_that_failed_before_its_kill_says_not_stopped():
    # The clean playbook refused by its drain (a balancer entry naming another host's server): its server still runs,
    # which "nothing to stop" would deny (helper-36).
    assert _cell(status="failed", killed=0) == "not stopped"
    assert _cell(killed=0) == "nothing to stop"
    assert _cell(killed=3) == "stopped"
    assert _cell(status="failed", killed=3) == "stopped"
    assert _cell(would_stop=True) == "would stop"


def test_an_entry_put_back_to_an_operators_drain_is_not_said_to_be_in_rotation():
    from ansible_collections.gpufleet.serving.plugins.callback.rollout_summary import left_as_found, returned

    rows = [{"host": "host3", "status": "ok", "returned_to_service": ["lb", "smg"], "left_as_found": {"lb": "DRAIN"}},
            {"host": "host1", "status": "ok", "returned_to_service": ["lb"]}]
    assert returned(rows) == ("put back into rotation, left out by an earlier run (drain record): host3 (lb back to "
                              "DRAIN as found, smg); host1 (lb)")
    assert left_as_found(rows) == "left as found, taken out by someone else, not by gpufleet: host3 (lb DRAIN)"
