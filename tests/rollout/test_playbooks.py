# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet.serving.{restart,clean,audit} and rollout --check on 3 sandbox hosts with the demo server."""
from __future__ import annotations

import json
import time

import pytest

from rollout_helpers import PCIE_ONLY, nccl, workers

pytestmark = pytest.mark.sandbox

ALL = ["host1", "host2", "host3"]


def unchanged(before, after):
    """Nothing on the hosts moved: processes, sitecustomize, gpufleet's state/pid/lock files, GPU holders."""
    for h in ALL:
        assert after.identities(h) == before.identities(h), "processes changed on %s" % h
        assert after[h]["sitecustomize_sha"] == before[h]["sitecustomize_sha"], "sitecustomize changed on %s" % h
        assert after[h]["files"] == before[h]["files"], "gpufleet files changed on %s" % h
        assert after.holders(h) == before.holders(h)


def test_rollout_in_check_mode_reports_would_restart_and_touches_nothing(stale):
    rf = stale
    before = rf.snapshot()
    assert not any(before[h]["sitecustomize_has_nccl"] for h in ALL)

    run = rf.playbook("rollout", check=True)

    assert run.rc == 0, run.tail()
    for h in ALL:
        s = run.summary[h]
        assert s["status"] == "ok" and s["would_restart"] is True and s["restarted"] is False, s
        assert "server is not running" in s["reasons"]
        # Nothing was killed: no kill time (not 0.00).
        assert s["kill_s"] is None and s["killed"] == 0, s
    table = run.out.split("GPUFLEET ROLLOUT SUMMARY")[1]
    assert "would" in table and "0.00" not in table, table
    unchanged(before, rf.snapshot())
    assert not any(rf.snapshot()[h]["sitecustomize_has_nccl"] for h in ALL)
    rf.state = "stale"


def test_audit_of_a_hand_started_server_says_what_answers_on_the_health_url(rf):
    if rf.state != "stale":
        rf.reset()
        rf.start_stale()
    before = rf.snapshot()

    # host1 does not adopt the hand-started server; host2 and host3 do (the sandbox's definition).
    run = rf.playbook("audit", host_vars={"host1": {"gpufleet_server_adopt_cmdline_regex": ""}})

    assert run.rc == 2, run.tail()
    found = "no gpufleet-launched server running, but something answers HTTP 200 on http://127.0.0.1:30000/health (%s)"
    hint = {"host1": "an untagged server? adopt it with gpufleet_server_adopt_cmdline_regex"}
    for h in ALL:
        why = found % hint.get(h, "a server started outside gpufleet? the next rollout replaces it if "
                                  "gpufleet_server_adopt_cmdline_regex matches its command line")
        assert "%s drifted: %s; " % (h, why) in run.out, run.tail()
        assert run.summary[h]["reasons"][0] == why, run.summary[h]
    assert "GPUFLEET AUDIT SUMMARY" in run.out and "ROLLOUT SUMMARY" not in run.out
    unchanged(before, rf.snapshot())
    rf.state = "stale"


@pytest.mark.parametrize("check", [False, True], ids=["real", "check"])
def test_audit_passes_on_a_rolled_out_fleet_and_changes_nothing(rolled_out, check):
    rf = rolled_out("clean")
    before = rf.snapshot()
    # Another run's live host lock on host1 (helper-47: the audit said nothing of it): named in the verdict's notes,
    # not drift, and left as it is.
    lock = json.dumps({"owner": "ctl:7:other-run", "acquired": time.time(), "expires": time.time() + 600})
    rf.fleet.ssh("host1", "mkdir -p /run/gpufleet && cat > /run/gpufleet/demo.lock", input=lock, check=True)
    try:
        run = rf.playbook("audit", check=check)
        assert rf.fleet.ssh("host1", "cat /run/gpufleet/demo.lock", check=True).stdout == lock
    finally:
        rf.fleet.ssh("host1", "rm -f /run/gpufleet/demo.lock", check=True)

    assert run.rc == 0, run.tail()
    assert all(run.recap[h]["failed"] == 0 and run.recap[h]["changed"] == 0 for h in ALL), run.recap
    said = " ".join(run.out.split())
    assert "the host lock is held by another run (ctl:7:other-run): it may be changing this host now" in said, run.tail()
    assert said.count("the host lock is held by another run") == 1, run.tail()
    unchanged(before, rf.snapshot())
    rf.state = "clean"


def test_restart_cycles_every_host_even_when_up_to_date(rolled_out):
    rf = rolled_out("clean")
    before = rf.snapshot()

    run = rf.playbook("restart")

    assert run.rc == 0, run.tail()
    after = rf.snapshot()
    for h in ALL:
        assert run.summary[h]["restarted"] is True and run.summary[h]["reasons"] == ["forced"], run.summary[h]
        assert run.recap[h]["changed"] > 0
        assert not before.identities(h) & after.identities(h), "%s kept old processes" % h
        ws = workers(after, h)
        assert len(ws) == 2 and after.holders(h) == {w["pid"] for w in ws}
        assert all(nccl(w["env"]).items() >= PCIE_ONLY.items() for w in ws)
        assert after.state(h)["fingerprint"] == before.state(h)["fingerprint"]
        assert after[h]["sitecustomize_sha"] == before[h]["sitecustomize_sha"]
    rf.state = "clean"


def test_audit_fails_with_the_drift_reason_and_changes_nothing(rolled_out):
    rf = rolled_out("clean")
    # host1: the NCCL block was removed from the system sitecustomize.py by hand.
    path, content = rf.original_sitecustomize("host1")
    rf.fleet.ssh("host1", "cat > %s" % path, input=content, check=True)
    # host3: the server is down (launcher and workers killed by hand).
    rf.kill("host3", [p["pid"] for p in rf.snapshot().tagged("host3")])
    rf.wait(lambda s: not s.tagged("host3") and not s.holders("host3"), 10, "host3's server gone")
    before = rf.snapshot()
    # host2: the workers lack a variable the operator now expects.
    hv = {"host2": {"gpufleet_server_expected_env": {"NCCL_SOCKET_IFNAME": "eth0"}}}
    w2 = sorted(w["pid"] for w in workers(before, "host2"))

    for check in (True, False):
        run = rf.playbook("audit", host_vars=hv, check=check)

        assert run.rc == 2, run.tail()
        assert all(run.recap[h]["failed"] == 1 for h in ALL), run.recap
        assert "host1 drifted: NCCL layers differ from the profile" in run.out
        # host1's NCCL layer is compared in check mode: "changed" there means "would write", and nothing is
        # written (compared byte for byte below).
        assert run.recap["host2"]["changed"] == 0 and run.recap["host3"]["changed"] == 0, run.recap
        assert "host2 drifted: workers lack the expected environment: pid %d: NCCL_SOCKET_IFNAME" % w2[0] in run.out
        assert "host3 drifted: server is not running" in run.out
        assert "eth0" not in run.out.split("drifted")[1].split("\n")[0]  # names, not values
        unchanged(before, rf.snapshot())
    rf.state = "drifted"


def test_clean_kills_the_service_and_leaves_the_gpus_clean_without_launching(rolled_out):
    rf = rolled_out("clean", "drifted")
    before = rf.snapshot()
    assert before.tagged("host1")

    run = rf.playbook("clean")

    assert run.rc == 0, run.tail()
    after = rf.snapshot()
    for h in ALL:
        assert after.procs(h) == [], "%s still runs %s" % (h, after.procs(h))
        assert after.holders(h) == set()
        assert all(g["used_mib"] == 0 for g in after[h]["gpus"].values()), after[h]["gpus"]
        assert after[h]["sitecustomize_sha"] == before[h]["sitecustomize_sha"]
    # The summary says what a stop did: each host's server stopped (killed, not relaunched), nothing "restarted".
    assert "GPUFLEET CLEAN SUMMARY" in run.out and "ROLLOUT SUMMARY" not in run.out
    for h in ALL:
        assert run.summary[h]["restarted"] is False and run.summary[h]["stopped"] is True, run.summary[h]
        if before.procs(h):  # what an earlier test left may have no server on a host
            assert run.summary[h]["restart"] == "stopped" and run.summary[h]["killed"] >= 1, run.summary[h]
        else:
            assert run.summary[h]["restart"] == "nothing to stop" and run.summary[h]["killed"] == 0, run.summary[h]
    assert run.summary["host1"]["restart"] == "stopped"
    assert all(after[h]["files"]["lock"] is None for h in ALL)
    # Issue 24: the pidfile of the stopped server is removed (left, it named a pid the next process could reuse).
    assert all(after[h]["files"]["pidfile"] is None for h in ALL), {h: after[h]["files"]["pidfile"] for h in ALL}
    rf.state = "down"


def test_clean_respects_another_runs_lock_and_refuses_a_bad_definition(rolled_out):
    """The clean playbook stops a server the same careful way a restart does: never under another run's lock,
    never on a definition the rollout would refuse."""
    import json as _json
    import time as _time

    rf = rolled_out("clean", "drifted")
    # An earlier run of another controller (its id ends with its start): refused at once (wait-die).
    owner = "other-controller:4242:0000.1.x:%.6f" % (_time.time() - 60)
    lock = {"owner": owner, "acquired": _time.time(), "expires": _time.time() + 3600}
    rf.fleet.ssh("host1", "mkdir -p /run/gpufleet && cat > /run/gpufleet/demo.lock", input=_json.dumps(lock), check=True)
    try:
        before = rf.snapshot()

        # max_fail 100: host2's refusal must not stop host1 before its own lock check.
        run = rf.playbook("clean", "--limit", "host1,host2",
                          host_vars={"host2": {"gpufleet_server_name": "../../tmp/evil"}},
                          extra_vars={"gpufleet_rollout_max_fail_percentage": 100})

        assert run.rc == 2, run.tail()
        assert "locked by an earlier gpufleet run" in run.summary["host1"]["failure"], run.summary["host1"]
        assert "gpufleet_server_name must be a string of 1 to 200 letters" in run.summary["host2"]["failure"], run.summary
        after = rf.snapshot()
        for h in ("host1", "host2", "host3"):
            assert after.identities(h) == before.identities(h), "%s: a server was stopped" % h
        assert _json.loads(after["host1"]["files"]["lock"])["owner"] == owner
        assert "evil" not in rf.fleet.ssh("host2", "ls -A /tmp /run/gpufleet", check=True).stdout
    finally:
        rf.fleet.ssh("host1", "rm -f /run/gpufleet/demo.lock")
    rf.state = "clean"
