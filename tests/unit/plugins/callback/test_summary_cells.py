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


def test_the_audits_nccl_drift_note_does_not_blame_tags():
    from ansible_collections.gpufleet.serving.plugins.callback.rollout_summary import nccl_stale

    rows = [{"host": "h1", "status": "ok", "nccl_stale": ["sitecustomize"]}]
    assert nccl_stale(rows, "audit") == ("NCCL layers not as the inventory asks (the audit changes nothing; the next "
                                         "rollout writes them and restarts the servers onto them): h1 (sitecustomize)")
    assert "the run's tags left the nccl_tuning role out" in nccl_stale(rows, "rollout")  # helper-45: said in the audit


def test_the_title_is_the_command_lines_playbook_else_the_last_of_the_collections_that_ran():
    cb = CallbackModule()
    cb.cli_playbooks, cb.playbook_names = ["restart"], ["restart", "rollout"]  # restart.yml imports rollout
    assert cb.playbook() == "restart"
    cb.cli_playbooks, cb.playbook_names = ["site"], ["site", "clean", "rollout"]  # helper-45: it said CLEAN
    assert cb.playbook() == "rollout"
    cb.cli_playbooks, cb.playbook_names = ["mine"], ["mine"]
    assert cb.playbook() == "rollout"


def test_a_refused_restart_of_a_host_an_earlier_run_left_out_lists_it_as_left_out():
    from ansible_collections.gpufleet.serving.plugins.callback.rollout_summary import out_of_rotation

    class Res:
        def __init__(self):
            self.result = {"msg": "cannot run this server, nothing was stopped: port 30000 is held by pid 7",
                           "launch_problems": ["x"], "left_out_of_rotation": ["haproxy", "smg"]}
            self.host = type("H", (), {"get_name": lambda s: "h1"})()
            self.task = type("T", (), {"get_name": lambda s: "check", "action": "gpufleet.serving.rollout_check"})()

    cb = CallbackModule()
    cb.inventory_hosts = ["h1"]
    cb.v2_runner_on_failed(Res())
    (row,) = cb.rows()
    assert row["status"] == "failed" and row["out_of_rotation"] == ["haproxy", "smg"], row
    assert out_of_rotation([row]).startswith("left out of rotation: h1 (haproxy, smg); the next rollout puts it back")
