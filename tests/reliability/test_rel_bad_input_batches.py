# SPDX-License-Identifier: GPL-3.0-or-later
"""Batch settings the rollout refuses (issue 24): refused by name, as the run's settings, not as a host failing.

The check runs once on the batch's first host before anything else (gpu_server tasks/batch_begin.yml); the hosts here
use the local connection, and nothing on them is read or changed before the refusal."""
from __future__ import annotations

import json
import os

import pytest

from collection_copy import private_collections
from helpers import PY, run_playbook


@pytest.mark.reliability(
    section="input", case="A batch setting that is not a number (or not a boolean)",
    provoked="gpufleet.serving.rollout with -e gpufleet_rollout_max_fail_percentage=abc on two hosts (gpu1, gpu2); "
             "then with -e gpufleet_rollout_fast_check=maybe (read as false by the bool filter, silently, before); "
             "then gpufleet_rollout_serial [] (one batch of every host, no canary, before) and null (ansible-core "
             "crashed, rc 250, before)",
    outcome="the run fails before any host is touched; the summary says 'rollout refused before any host was "
            "touched: gpufleet_rollout_max_fail_percentage must be a number from 0 to 100 (got str abc)' and lists "
            "gpu1 and gpu2 as not run, neither as failed (before: gpu1 was reported failing and the rollout 'halted: "
            "1 of 1 host(s) of the batch failed (gpu1)'); the same for 'gpufleet_rollout_fast_check must be true or false "
            "(got maybe)'; the same for 'gpufleet_rollout_serial must be a batch size ... (got [] (an empty list))' and '(got "
            "None)'")
@pytest.mark.parametrize("setting, value, want", [
    ("gpufleet_rollout_max_fail_percentage", "abc",
     "gpufleet_rollout_max_fail_percentage must be a number from 0 to 100 (got str abc)"),
    ("gpufleet_rollout_fast_check", "maybe", "gpufleet_rollout_fast_check must be true or false (got maybe)"),
    # An empty list made one batch of every host, no canary; null crashed ansible-core (rc 250): helper-37.
    ("gpufleet_rollout_serial", [], 'gpufleet_rollout_serial must be a batch size (a number of hosts >= 1 or a '
     'percentage such as "50%"), or a list of them (got [] (an empty list))'),
    ("gpufleet_rollout_serial", None, 'gpufleet_rollout_serial must be a batch size (a number of hosts >= 1 or a '
     'percentage such as "50%"), or a list of them (got None)'),
], ids=["max_fail-abc", "fast_check-maybe", "serial-empty", "serial-null"])
def test_a_bad_max_fail_percentage_is_refused_by_name_not_as_a_host_failure(tmp_path, setting, value, want):
    inv = tmp_path / "inv.ini"
    inv.write_text("[gpufleet_servers]\n" + "".join(
        "%s ansible_connection=local ansible_python_interpreter=%s\n" % (h, PY) for h in ("gpu1", "gpu2")))
    out = tmp_path / "summary"
    env = dict(os.environ, GPUFLEET_SUMMARY_DIR=str(out), ANSIBLE_COLLECTIONS_PATH=str(private_collections()))
    r = run_playbook("gpufleet.serving.rollout", inventory=str(inv), env=env, timeout=120, extra_vars={
        setting: value, "gpufleet_server_name": "demo",
        "gpufleet_server_command": ["/bin/true"], "gpufleet_server_health_url": "http://127.0.0.1:9/health"})
    assert r.returncode != 0, r.stdout
    data = json.loads((out / "rollout-summary.json").read_text())
    want = "rollout refused before any host was touched: " + want
    assert data["halted"]["msg"] == want and data["halted"]["refused"] is True, data["halted"]
    assert {h["host"]: h["status"] for h in data["hosts"]} == {"gpu1": "not run", "gpu2": "not run"}, data["hosts"]
    table = r.stdout[r.stdout.index("GPUFLEET ROLLOUT SUMMARY"):]
    assert want in table and "failed (gpu1)" not in table, table
