# SPDX-License-Identifier: GPL-3.0-or-later
"""--tags and --skip-tags never change the desired state: a run that leaves the NCCL tuning out records the same
fingerprint and checks the same worker environment as a full run, so tag runs and plain runs do not restart each
other's hosts (docs/concepts.md, "Tags")."""
from __future__ import annotations

import json
import re

import pytest

from rollout_helpers import PCIE_ONLY, nccl, workers

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

ALL = ["host1", "host2", "host3"]
# Every documented selection (docs/concepts.md "Tags").
SELECTIONS = [("--tags", "gpufleet_server"), ("--skip-tags", "nccl_tuning"), ("--tags", "nccl_tuning"),
              ("--skip-tags", "gpufleet_server"), ("--tags", "preflight"), ("--tags", "configure")]
# A row of docs/reliability.md (tests/reliability/gen_table.py's OUTSIDE names this case).
NCCL_ONLY = pytest.mark.reliability(
    section="fault", case="--tags nccl_tuning on an up-to-date fleet (no server checked)",
    provoked="the rollout playbook with --tags nccl_tuning on three up-to-date sandbox hosts, then a plain rollout",
    outcome="no server task runs (nor the rollout's fast check), nothing changes (same server processes, state files "
            "and sitecustomize.py); the summary still lists every host, nccl_only and nccl_changed false, and says "
            "'NCCL layers only, servers not checked or restarted'; the plain rollout after it changes nothing")


def _selection(s):
    return pytest.param(s, id="%s-%s" % (s[0].strip("-"), s[1]), marks=NCCL_ONLY if s == ("--tags", "nccl_tuning") else ())


def _unchanged(rf, before, run):
    assert run.rc == 0, run.tail()
    after = rf.snapshot()
    for h in ALL:
        assert run.recap[h]["changed"] == 0, (run.recap, run.tail())
        assert after.identities(h) == before.identities(h), "%s was restarted" % h
        assert after[h]["files"]["state"] == before[h]["files"]["state"]
        assert after[h]["sitecustomize_sha"] == before[h]["sitecustomize_sha"]


@pytest.mark.parametrize("selection", [_selection(s) for s in SELECTIONS])
def test_a_tag_selection_on_an_up_to_date_fleet_changes_nothing_and_a_plain_rollout_agrees(rolled_out, selection):
    rf = rolled_out("clean")
    before = rf.snapshot()
    # An earlier run's report where this one writes its own (GPUFLEET_SUMMARY_DIR).
    reports = rf.workdir / ("reports-%s" % "-".join(selection).strip("-"))
    reports.mkdir(exist_ok=True)
    (reports / "rollout-summary.json").write_text('{"hosts": []}')

    run = rf.playbook("rollout", *selection, env={"GPUFLEET_SUMMARY_DIR": str(reports)})
    _unchanged(rf, before, run)
    if selection == ("--tags", "preflight"):
        # helper-42: no step of the roles ran; the run says so, and the earlier run's report is gone, not left to be
        # read as this run's.
        assert "no host was checked, tuned or restarted: the run's tags selected none of the roles' steps" in run.out
        assert not (reports / "rollout-summary.json").exists()
    else:
        assert json.loads((reports / "rollout-summary.json").read_text())["hosts"], run.tail()
    if selection == ("--tags", "nccl_tuning"):
        # Issue 24: no server task ran (nor the untagged fast check, which --skip-tags runs), and the summary still
        # lists every host, saying its server was not checked.
        assert all(run.summary[h]["nccl_only"] and run.summary[h]["nccl_changed"] is False for h in ALL), run.summary
        assert "NCCL layers only, servers not checked or restarted" in run.out, run.tail()
    # No flapping: a plain rollout after the tag run agrees that nothing is to be done.
    _unchanged(rf, before, rf.playbook("rollout"))
    rf.state = "clean"


def test_a_tag_run_on_a_drifted_host_records_what_a_plain_rollout_records(rolled_out):
    rf = rolled_out("clean")
    before = rf.snapshot()
    drift = {"host1": {"gpufleet_server_env": dict(rf.server_vars()["gpufleet_server_env"], DEMO_DRIFT="1")}}

    run = rf.playbook("rollout", "--tags", "gpufleet_server", host_vars=drift)

    assert run.rc == 0, run.tail()
    assert run.summary["host1"]["restarted"] is True, run.summary
    mid = rf.snapshot()
    # The restarted workers were checked for, and carry, the tuning the tag run did not apply.
    for w in workers(mid, "host1"):
        assert nccl(w["env"]) == dict(PCIE_ONLY, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ENV"), w
    for h in ("host2", "host3"):
        assert mid.identities(h) == before.identities(h)

    # A plain rollout with the same inventory: host1 already right (same fingerprint), nothing restarts.
    again = rf.playbook("rollout", host_vars=drift)
    assert again.rc == 0, again.tail()
    assert all(again.recap[h]["changed"] == 0 for h in ALL), again.recap
    after = rf.snapshot()
    assert after.identities("host1") == mid.identities("host1")
    assert after.state("host1")["fingerprint"] == mid.state("host1")["fingerprint"]

    # And a forced restart that skips the tuning records that same fingerprint.
    forced = rf.playbook("restart", "--skip-tags", "nccl_tuning", host_vars=drift)
    assert forced.rc == 0, forced.tail()
    final = rf.snapshot()
    for h in ALL:
        assert final.state(h)["fingerprint"] == after.state(h)["fingerprint"], h
    rf.state = "host1-drift"


def test_the_auto_profile_is_resolved_in_the_pre_flight_so_a_run_without_the_tuning_knows_its_variables(rolled_out):
    """profile auto resolves on the host (gpu_info) in the rollout's pre-flight, tagged always: a selection that leaves
    the tuning out still knows the NCCL variables the fingerprint and the workers' check need. These PCIe-only hosts
    resolve to pcie_only, what they run: nothing is refused, restarted or rewritten. (It was refused before: the
    nccl_tuning role resolved auto, and --tags gpufleet_server left it out.)"""
    rf = rolled_out("clean")
    before = rf.snapshot()

    run = rf.playbook("rollout", "--tags", "gpufleet_server", vars_override={"gpufleet_nccl_profile": "auto"})

    assert run.rc == 0, run.tail()
    after = rf.snapshot()
    for h in ALL:
        assert run.summary[h]["status"] == "ok" and run.summary[h]["restarted"] is False, run.summary[h]
        assert after.identities(h) == before.identities(h)
        assert after[h]["sitecustomize_sha"] == before[h]["sitecustomize_sha"]
    rf.state = "clean"


def test_a_run_without_the_tuning_never_restarts_onto_layers_it_did_not_apply(rolled_out):
    """A changed NCCL value with --tags gpufleet_server: the layers still hold the old value, so a restart would
    launch workers without the tuning; the check refuses before the lock is kept and before the kill."""
    rf = rolled_out("clean")
    before = rf.snapshot()
    changed = {"gpufleet_nccl_env": {"NCCL_BUFFSIZE": "4194304"}}

    run = rf.playbook("rollout", "--tags", "gpufleet_server", vars_override=changed)

    assert run.rc == 2, run.tail()
    for h in ALL:
        failure = run.summary[h]["failure"] if h in run.summary else ""
        assert "a restart now would launch workers without the tuning" in failure or run.summary[h]["status"] in (
            "stopped", "not run"), run.summary[h]
    assert "a restart now would launch workers without the tuning" in run.summary["host1"]["failure"]
    # The refusal's only change was the host lock, released again: nothing is reported changed (helper-42).
    refused = re.search(r"TASK \[[^]]*Check the running server against the desired state.*?"
                        r"^fatal: \[host1\]: FAILED! => *\n\s+changed: (\w+)$", run.out, re.M | re.S)
    assert refused and refused.group(1) == "false", run.tail()
    after = rf.snapshot()
    for h in ALL:
        assert after.identities(h) == before.identities(h), "%s was restarted" % h
        assert after[h]["files"] == before[h]["files"]  # no record, no lock left
        assert after[h]["sitecustomize_sha"] == before[h]["sitecustomize_sha"]
    rf.state = "clean"


def test_layers_left_stale_by_a_tag_run_are_said_not_silent(rolled_out):
    """A new-user pass found this drift silent: rc 0, 'restarted no', and only the audit told."""
    rf = rolled_out("clean")
    before = rf.snapshot()
    changed = {"host1": {"gpufleet_nccl_env": {"NCCL_BUFFSIZE": "4194304"}}}

    run = rf.playbook("rollout", "--tags", "nccl_tuning", host_vars=changed)
    assert run.rc == 0 and run.summary["host1"]["nccl_changed"] is True, run.tail()
    assert rf.snapshot()["host1"]["sitecustomize_sha"] != before["host1"]["sitecustomize_sha"]

    run = rf.playbook("rollout", "--tags", "gpufleet_server")

    assert run.rc == 0, run.tail()
    assert [run.summary[h]["nccl_stale"] for h in ALL] == [["sitecustomize"], [], []], run.summary
    assert all(run.summary[h]["restarted"] is False for h in ALL), run.summary
    assert ("NCCL layers not as the inventory asks, left as they are (the run's tags left the nccl_tuning role out; the "
            "servers run on as checked; a run with the nccl_tuning tag writes them): host1 (sitecustomize)"
            in " ".join(run.out.split())), run.tail()
    after = rf.snapshot()
    assert all(after.identities(h) == before.identities(h) for h in ALL)

    # A plain run puts the layers back as the inventory asks; the servers already run with those values.
    run = rf.playbook("rollout")
    assert run.rc == 0 and not any(run.summary[h]["restarted"] for h in ALL), run.tail()
    assert all(not run.summary[h]["nccl_stale"] for h in ALL), run.summary
    final = rf.snapshot()
    assert all(final[h]["sitecustomize_sha"] == before[h]["sitecustomize_sha"] for h in ALL)
    assert all(final.identities(h) == before.identities(h) for h in ALL)
    rf.state = "clean"


def test_the_audit_audits_the_server_and_the_layers_whatever_the_tags(rolled_out):
    """A system sitecustomize other users cannot read: the audit fails naming it with any selection (a selection
    that left the layers' comparison out passed it as up to date), and an explicit profile is never refused."""
    rf = rolled_out("clean")
    path = rf.snapshot()["host2"]["sitecustomize_path"]
    rf.fleet.ssh("host2", "chmod 0600 %s" % path, check=True)
    try:
        for selection in ((), ("--tags", "gpufleet_server"), ("--skip-tags", "nccl_tuning"), ("--tags", "preflight")):
            run = rf.playbook("audit", "--check", *selection)
            assert run.rc == 2, (selection, run.tail())
            assert "host2 drifted" in run.out and "not readable by every user" in run.out, (selection, run.tail())
            assert "does not know its NCCL variables" not in run.out, (selection, run.tail())
            assert "host1 drifted" not in run.out and "host3 drifted" not in run.out, (selection, run.tail())
    finally:
        rf.fleet.ssh("host2", "chmod 0644 %s" % path)
    rf.state = "clean"
