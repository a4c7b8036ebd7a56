# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet.serving.rollout on 3 sandbox hosts with the demo server (spawn workers on fake GPUs): issue 4's "Done when".

Real sshd hosts, real ansible-playbook runs by FQCN, real processes; what the tests assert is read back from
the hosts (/proc, the fake NVML's holders, gpufleet's files) and from the PLAY RECAP / rollout summary.
"""
from __future__ import annotations

import re

import pytest

from rollout_helpers import PCIE_ONLY, TAG, nccl, tasks_run, workers

pytestmark = pytest.mark.sandbox

ALL = ["host1", "host2", "host3"]


def assert_tuned_server(snap, host, nccl_env=None):
    """The launcher of the pidfile and its spawn workers carry the tag; the workers alone hold the GPUs, tuned."""
    launcher = snap.launcher(host)
    assert launcher is not None, "%s has no pidfile" % host
    tagged = {p["pid"]: p for p in snap.tagged(host)}
    assert launcher in tagged, "launcher %s on %s lacks %s=%s" % (launcher, host, *TAG)
    ws = workers(snap, host)
    assert len(ws) == 2, "%s: expected 2 spawn workers, got %s" % (host, snap.procs(host))
    for w in ws:
        assert nccl(w["env"]) == dict(nccl_env or PCIE_ONLY, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ENV"), (host, w)
    per_gpu = snap.holders_per_gpu(host)
    assert sorted(per_gpu) == ["0", "1"]
    assert all(len(v) == 1 for v in per_gpu.values()), per_gpu
    assert snap.holders(host) == {w["pid"] for w in ws}, "GPU holders on %s are not exactly the new workers" % host


def test_first_rollout_replaces_the_stale_server_on_every_host(stale):
    rf = stale
    before = rf.snapshot()
    stale_ids = {h: before.identities(h) for h in ALL}
    assert all(before.holders(h) and not before.tagged(h) for h in ALL)

    run = rf.playbook("rollout")

    assert run.rc == 0, run.tail()
    assert set(run.recap) == set(ALL)
    after = rf.snapshot()
    for h in ALL:
        assert run.recap[h]["failed"] == 0 and run.recap[h]["changed"] > 0, run.recap
        assert not stale_ids[h] & after.identities(h), "stale processes survive on %s" % h
        assert_tuned_server(after, h)
        assert after.state(h)["pid"] == after.launcher(h)
        assert set(after.state(h)["timings"]) >= {"kill_s", "clean_s", "launch_s", "ready_s"}
        s = run.summary[h]
        assert s["status"] == "ok" and s["restarted"] is True and s["workers_verified"] == 2, s
        assert s["clean_s"] is not None and s["clean_s"] >= 0, s
        assert any("launch tag" in r for r in s["reasons"]), s
    rf.state = "clean"


# The rollout's one task per host before the roles: validation, and the fast path's read-only check.
FAST_CHECK = "TASK [gpufleet.serving.gpu_server : Validate the host's input and check in one call whether it is already right]"
# Tasks of the roles' own steps (not the rollout's validation and up-to-date check, which run on every host).
ROLE_STEPS = ("gpufleet.serving.nccl_tuning : Manage", "gpufleet.serving.gpu_server : Check the running server",
              "gpufleet.serving.gpu_server : Restart")
# An explicit profile: the gpu_server role writes the layers the rollout computed under the host lock, in its check's
# call (the server_state action's tune), before the check.
NCCL_APPLY = "TASK [gpufleet.serving.gpu_server : Check the running server against the desired state (and take the host lock)]"


@pytest.mark.parametrize("fast_check", [True, False])
def test_second_rollout_reports_changed_0_and_restarts_nothing(rolled_out, fast_check):
    rf = rolled_out("clean")
    before = rf.snapshot()

    run = rf.playbook("rollout", extra_vars={"gpufleet_rollout_fast_check": fast_check})

    assert run.rc == 0, run.tail()
    after = rf.snapshot()
    for h in ALL:
        assert run.recap[h]["changed"] == 0, "%s: %s\n%s" % (h, run.recap, run.tail())
        assert run.recap[h]["failed"] == 0
        assert after.identities(h) == before.identities(h), "processes changed on %s" % h
        assert after[h]["files"]["state"] == before[h]["files"]["state"]
        assert after[h]["sitecustomize_sha"] == before[h]["sitecustomize_sha"]
        assert run.summary[h]["restarted"] is False and run.summary[h]["reasons"] == []
        assert run.summary[h]["workers_verified"] == 2, run.summary[h]
    if fast_check:
        # One read-only check per host, then the roles are skipped for it: none of their steps runs.
        assert FAST_CHECK in run.out and NCCL_APPLY not in run.out and "Check the running server" not in run.out
        for h in ALL:
            assert not [n for n in tasks_run(run.out, h) if n.startswith(ROLE_STEPS)], tasks_run(run.out, h)
    else:
        assert FAST_CHECK in run.out and NCCL_APPLY in run.out
    rf.state = "clean"


def test_fast_check_sends_a_drifted_host_through_the_full_roles(rolled_out):
    rf = rolled_out("clean")
    before = rf.snapshot()
    path = before["host2"]["sitecustomize_path"]
    # Someone edits the managed block on host2 by hand: the file no longer says what the inventory says.
    rf.fleet.ssh("host2", "sed -i 's/16777216/4194304/' %s" % path, check=True)
    assert rf.snapshot()["host2"]["sitecustomize_sha"] != before["host2"]["sitecustomize_sha"]

    run = rf.playbook("rollout")

    assert run.rc == 0, run.tail()
    after = rf.snapshot()
    assert after["host2"]["sitecustomize_sha"] == before["host2"]["sitecustomize_sha"], "the block was not restored"
    assert run.recap["host2"]["changed"] == 1, run.recap  # the file; the running workers already had the values
    assert after.identities("host2") == before.identities("host2")
    # host2 went through the full roles (their skipped steps show in the recap); the others ended after the check.
    assert NCCL_APPLY in run.out and run.recap["host2"]["skipped"] > 0, run.recap
    for h in ("host1", "host3"):
        assert run.recap[h]["changed"] == 0, run.recap
        assert not [n for n in tasks_run(run.out, h) if n.startswith(ROLE_STEPS)], tasks_run(run.out, h)
        assert after.identities(h) == before.identities(h)
    rf.state = "clean"


def test_changing_one_nccl_value_for_one_host_restarts_exactly_that_host(rolled_out):
    rf = rolled_out("clean")
    before = rf.snapshot()

    run = rf.playbook("rollout", host_vars={"host2": {"gpufleet_nccl_env": {"NCCL_MAX_NCHANNELS": "8"}}})

    assert run.rc == 0, run.tail()
    after = rf.snapshot()
    for h in ("host1", "host3"):
        assert run.recap[h]["changed"] == 0, run.recap
        assert after.identities(h) == before.identities(h)
        assert after[h]["sitecustomize_sha"] == before[h]["sitecustomize_sha"]
        assert run.summary[h]["restarted"] is False
    assert run.recap["host2"]["changed"] > 0
    assert run.summary["host2"]["restarted"] is True
    assert not before.identities("host2") & after.identities("host2")
    assert after["host2"]["sitecustomize_sha"] != before["host2"]["sitecustomize_sha"]
    assert_tuned_server(after, "host2", dict(PCIE_ONLY, NCCL_MAX_NCHANNELS="8"))
    rf.state = "host2-override"


def test_a_dirty_gpu_fails_the_host_at_the_clean_gate_before_the_kill_until_strays_may_be_killed(rolled_out):
    # host1 and host3 run the default definition; host2 runs a tagged server (any definition: it is forced).
    rf = rolled_out("clean", "host2-override")
    assert rf.snapshot().tagged("host2")
    holder = rf.start_holder("host2", gpu=0, mib=1000)
    before = rf.snapshot()

    run = rf.playbook("rollout", host_vars={"host2": {"gpufleet_server_force_restart": True}},
                      extra_vars={"gpufleet_rollout_serial": ["100%"]})

    assert run.rc == 2, run.tail()
    assert run.recap["host2"]["failed"] == 1, run.recap
    after = rf.snapshot()
    # The holder would have failed the gate after the kill for sure: the healthy server was not stopped (bug E).
    assert after.identities("host2") == before.identities("host2"), "the old server must keep serving"
    assert holder in after.holders("host2"), "the untagged holder is not the service's to kill"
    failure = run.summary["host2"]["failure"]
    s = run.summary["host2"]
    assert s["status"] == "failed" and s["restarted"] is False and s["restart"] == "no", s
    assert s["killed"] == 0 and s["phase"] == "clean", s
    assert failure.startswith("fails at the clean gate, before the kill: GPUs not clean after "), failure
    assert "pid %d" % holder in failure and "nothing was stopped" in failure, failure
    assert "pid %d" % holder in run.out
    assert after.state("host2") == before.state("host2"), "a failed host must not record a launch"
    assert after["host2"]["files"]["lock"] is None, "the host lock must be released after a failure"
    for h in ("host1", "host3"):
        assert run.recap[h]["failed"] == 0 and run.recap[h]["changed"] == 0, run.recap
        assert after.identities(h) == before.identities(h)

    # The same rollout with the seed's `fuser -k /dev/nvidia*`, made safe: strays on the server's GPUs are killed.
    run = rf.playbook("rollout", vars_override={"gpufleet_server_kill_gpu_strays": True})

    assert run.rc == 0, run.tail()
    after = rf.snapshot()
    assert holder not in after.pids("host2")
    assert_tuned_server(after, "host2")
    assert run.summary["host2"]["restarted"] is True
    for h in ("host1", "host3"):
        assert run.recap[h]["changed"] == 0 and after.identities(h) == before.identities(h)
    rf.state = "clean"


def test_orphaned_workers_of_a_hand_started_server_fail_the_host_safely_until_strays_may_be_killed(rf):
    # docs/runbook.md quotes this failure: a server started by hand whose launcher died leaves untagged spawn
    # workers that the adopt regex (demo_server\.py) does not match.
    rf.state = "unknown"
    rf.reset()
    snap = rf.start_stale(["host1"])
    launcher = [p["pid"] for p in snap.procs("host1") if "demo_server.py" in " ".join(p["cmdline"])]
    assert len(launcher) == 1, snap.procs("host1")
    rf.kill("host1", launcher)
    snap = rf.wait(lambda s: launcher[0] not in s.pids("host1"), 10, "the hand-started launcher gone")
    orphans = snap.holders("host1")
    assert len(orphans) == 2 and not snap.tagged("host1")

    # --check predicts the failure, from the same holders, and touches nothing.
    run = rf.playbook("rollout", "--limit", "host1", check=True)
    assert run.rc == 2, run.tail()
    s = run.summary["host1"]
    assert s["status"] == "failed", s
    assert re.match(r"would fail at the clean gate, before the kill: GPUs not clean after \d+\.\d s, held by processes "
                    r"the kill would not end: GPU 0 pid ", s["failure"]), s["failure"]
    assert s["failure"].endswith("None is gpufleet's and kill.cmdline_regex (gpufleet_server_adopt_cmdline_regex) does "
                                 "not match them: kill.gpu_strays (gpufleet_server_kill_gpu_strays) ends them"), s["failure"]
    assert rf.snapshot().holders("host1") == orphans

    run = rf.playbook("rollout", "--limit", "host1")

    assert run.rc == 2, run.tail()
    s = run.summary["host1"]
    assert s["status"] == "failed" and s["restarted"] is False and s["restart"] == "no", s
    assert s["killed"] == 0 and s["phase"] == "clean", s
    assert re.match(r"fails at the clean gate, before the kill: GPUs not clean after \d+\.\d s, held by processes the "
                    r"kill would not end: GPU 0 pid ", s["failure"]), s["failure"]
    for pid in orphans:
        assert "pid %d (root, 20000 MiB): " % pid in s["failure"], s["failure"]
    assert "--multiprocessing-fork" in s["failure"]
    # The summary keeps the failure's end, which says how to end such workers (as docs/runbook.md quotes it): the adopt
    # regex is set and does not match them.
    assert s["failure"].endswith("None is gpufleet's and kill.cmdline_regex (gpufleet_server_adopt_cmdline_regex) does "
                                 "not match them: kill.gpu_strays (gpufleet_server_kill_gpu_strays) ends them"), s["failure"]
    after = rf.snapshot()
    assert after.holders("host1") == orphans and after.tagged("host1") == [], "nothing of theirs is killed"

    run = rf.playbook("rollout", "--limit", "host1", vars_override={"gpufleet_server_kill_gpu_strays": True})

    assert run.rc == 0, run.tail()
    after = rf.snapshot()
    assert not orphans & after.pids("host1")
    assert_tuned_server(after, "host1")
    assert run.summary["host1"]["restarted"] is True


def test_a_server_that_logs_to_its_own_file_fails_with_that_files_tail(rolled_out):
    rf = rolled_out("clean", "host1-down")
    own = "/var/log/demo-own.log"
    # The RuntimeError goes to --log only; the launch log (stdout/stderr) gets gpufleet's launch line.
    cmd = rf.server_vars()["gpufleet_server_command"] + ["--fail-at-startup", "--log", own]

    run = rf.playbook("rollout", "--limit", "host1",
                      host_vars={"host1": {"gpufleet_server_command": cmd, "gpufleet_server_log_tail_path": own}})

    assert run.rc == 2, run.tail()
    failure = run.summary["host1"]["failure"]
    assert "exited during start-up" in failure and "log tail (%s): " % own in failure, failure
    assert "RuntimeError: demo failure at startup" in failure, failure
    rf.state = "host1-down"


def test_a_failed_canary_stops_the_rollout_and_leaves_the_other_hosts_untouched(rolled_out):
    rf = rolled_out("clean", "host2-override")
    before = rf.snapshot()
    assert before.tagged("host3") and before.state("host2") and before.state("host3")
    canary_cmd = rf.server_vars()["gpufleet_server_command"] + ["--fail-at-startup"]

    # A fleet-wide NCCL change: every host would restart; the canary's new server dies at start-up.
    run = rf.playbook("rollout", vars_override={"gpufleet_nccl_env": {"NCCL_NTHREADS": "256"}},
                      host_vars={"host1": {"gpufleet_server_command": canary_cmd}},
                      extra_vars={"gpufleet_rollout_serial": [1, 1, 1]})

    assert run.rc == 2, run.tail()
    assert run.recap["host1"]["failed"] == 1
    assert "host2" not in run.recap and "host3" not in run.recap, run.recap
    assert run.summary["host1"]["status"] == "failed"
    failure = run.summary["host1"]["failure"]
    assert "exited during start-up" in failure, failure
    assert "--fail-at-startup" in run.out  # the log tail is in the failure
    assert [run.summary[h]["status"] for h in ("host2", "host3")] == ["not run", "not run"]
    after = rf.snapshot()
    for h in ("host2", "host3"):
        assert after.identities(h) == before.identities(h), "%s was touched" % h
        assert after[h]["files"]["state"] == before[h]["files"]["state"]
        assert after[h]["sitecustomize_sha"] == before[h]["sitecustomize_sha"]
        assert after.holders(h) == before.holders(h)
    assert after.tagged("host1") == [] and after.holders("host1") == set()
    # The canary's record keeps the previous fingerprint, pid and timings (they change only after a verified launch),
    # marked unverified: its launch failed, so the next rollout restarts the host whatever runs there.
    rec_before, rec_after = before.state("host1"), after.state("host1")
    assert rec_after.pop("verified") is False and rec_after == rec_before, (rec_before, rec_after)
    rf.state = "host1-down"


def test_a_server_env_override_of_one_nccl_variable_wins_on_that_host_and_stays_idempotent(rolled_out):
    # Any state where host2 and host3 run the default definition (host1 may be down after the canary test).
    rf = rolled_out("clean", "host1-down")
    before = rf.snapshot()
    env = dict(rf.server_vars()["gpufleet_server_env"], NCCL_PROTO="Simple")
    hv = {"host1": {"gpufleet_server_env": env}}

    first = rf.playbook("rollout", host_vars=hv)

    assert first.rc == 0, first.tail()
    after = rf.snapshot()
    assert first.summary["host1"]["restarted"] is True and first.summary["host1"]["workers_verified"] == 2
    assert_tuned_server(after, "host1", dict(PCIE_ONLY, NCCL_PROTO="Simple"))
    for h in ("host2", "host3"):
        assert first.recap[h]["changed"] == 0 and after.identities(h) == before.identities(h)

    again = rf.playbook("rollout", host_vars=hv)

    assert again.rc == 0, again.tail()
    assert all(again.recap[h]["changed"] == 0 for h in ALL), again.recap
    assert rf.snapshot().identities("host1") == after.identities("host1")
    rf.state = "host1-override"


@pytest.mark.parametrize("max_fail, later_batch_runs", [(50, True), (49, False)])
def test_max_fail_percentage_must_be_exceeded_in_a_batch(stale, max_fail, later_batch_runs):
    rf = stale
    before = rf.snapshot()

    # One host of the first batch of 2 fails (a typo in its NCCL variables): 1/2 = 50 % fails.
    run = rf.playbook("rollout",
                      host_vars={"host2": {"gpufleet_nccl_env": {"NCCL_PROTOCOL": "LL"},
                                           "gpufleet_nccl_unknown_vars": "fail"}},
                      extra_vars={"gpufleet_rollout_serial": [2, 1], "gpufleet_rollout_max_fail_percentage": max_fail})

    assert run.rc == 2, run.tail()
    assert run.recap["host2"]["failed"] == 1, run.recap
    assert "NCCL_PROTOCOL" in run.summary["host2"]["failure"], run.summary["host2"]
    after = rf.snapshot()
    assert after.identities("host2") == before.identities("host2")
    if later_batch_runs:
        for h in ("host1", "host3"):
            assert run.summary[h]["restarted"] is True, run.summary
            assert_tuned_server(after, h)
        assert "rollout halted" not in run.out
    else:
        assert "rollout halted: 1 of 2 host(s) of the batch failed (host2)" in run.out, run.tail()
        # host2 failed before any host of its batch changed: ansible-core stops host1 at its next task.
        assert run.summary["host1"]["status"] == "stopped" and run.summary["host1"]["restarted"] is False, run.summary
        assert after.identities("host1") == before.identities("host1")
        assert run.summary["host3"]["status"] == "not run", run.summary
        assert after.identities("host3") == before.identities("host3"), "host3 was restarted after the batch failed"
        assert after.tagged("host3") == []
