# SPDX-License-Identifier: GPL-3.0-or-later
"""Batch semantics on a 4-host sandbox fleet: a batch that fails beyond gpufleet_rollout_max_fail_percentage stops
the rollout, whatever phase the failing host failed in, and later batches are untouched.

ansible-core ignores max_fail_percentage for a host that fails inside a rescue when the block also has an always
(ansible/ansible#86574), and never counts unreachable hosts; the rollout's own batch gate must hold anyway. Each case
fails host2, in the second batch of [1, 2, 1] (host1 | host2, host3 | host4), in one phase of the cycle, then checks:
exit code 2, the summary's `halted` record, host4 not touched at all (same processes, files and sitecustomize, no
lock), and no host left holding a lock of this run.
"""
from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))

from rel_helpers import CliRun, wait_for  # noqa: E402
from rollout_helpers import LOCK_FILE, RolloutFleet, parse_recap, private_collections, run_playbook, workers  # noqa: E402

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

HOSTS = ["host1", "host2", "host3", "host4"]
SHAPE = [1, 2, 1]


@pytest.fixture(scope="module")
def rf4(sandbox_fleet_module, tmp_path_factory) -> RolloutFleet:
    fleet = sandbox_fleet_module(hosts=4, gpus=2)
    r = RolloutFleet(fleet, tmp_path_factory.mktemp("batches"))
    r.rolled_out()
    yield r
    r.reset()


@pytest.fixture
def fleet4(rf4: RolloutFleet) -> RolloutFleet:
    """Every host runs a tagged server (host2 may be down after an earlier case: a forced restart does not mind)."""
    yield rf4
    # Undo what a case provoked on host2.
    rf4.fleet.ssh("host2", "umount /var/lib/gpufleet 2>/dev/null; rm -f %s; pkill -f fake_gpu.py; true" % LOCK_FILE)


def _other_runs_lock(rf: RolloutFleet, host: str) -> str:
    # An earlier run of another controller (its id ends with its start): refused at once (wait-die).
    owner = "other-controller:4242:0000.1.x:%.6f" % (time.time() - 60)
    lock = {"owner": owner, "acquired": time.time(), "expires": time.time() + 3600}
    rf.fleet.ssh(host, "mkdir -p /run/gpufleet && cat > %s" % LOCK_FILE, input=json.dumps(lock), check=True)
    return json.dumps(lock)


def _holder(rf: RolloutFleet, host: str) -> str:
    rf.start_holder(host, gpu=0, mib=1000)
    return "GPUs not clean"


def _read_only_state_dir(rf: RolloutFleet, host: str) -> str:
    # The record step writes /var/lib/gpufleet/demo.json: a read-only mount there is refused by the check.
    rf.fleet.ssh(host, "mkdir -p /var/lib/gpufleet && mount -t tmpfs -o ro tmpfs /var/lib/gpufleet", check=True)
    # The check before the drain finds the directory not writable (the restart's own preflight words) and refuses,
    # nothing stopped; a record that fails after a good launch is test_rel_faults_full_fs's case.
    return "record.state_file cannot be written: directory /var/lib/gpufleet is not writable"


# phase -> (host2's variables, set-up on host2 returning a text its failure must contain)
CASES = {
    "preflight": ({"gpufleet_server_start_timeout": -1}, lambda rf, h: "gpufleet_server_start_timeout must be > 0"),
    "nccl": ({"gpufleet_nccl_env": {"NCCL_PROTOCOL": "LL"}, "gpufleet_nccl_unknown_vars": "fail"},
             lambda rf, h: "NCCL_PROTOCOL"),
    "lock": ({}, lambda rf, h: (_other_runs_lock(rf, h), "locked by an earlier gpufleet run")[1]),
    "clean": ({}, _holder),
    "ready": ({"__extra_args": ["--fail-at-startup"]}, lambda rf, h: "exited during start-up"),
    "verify_env": ({"gpufleet_server_expected_env": {"GPUFLEET_MUST_HAVE": "1"}}, lambda rf, h: "GPUFLEET_MUST_HAVE"),
    "record": ({}, _read_only_state_dir),
}


def _host_vars(rf: RolloutFleet, over: dict) -> dict:
    over = dict(over)
    extra = over.pop("__extra_args", None)
    if extra:
        over["gpufleet_server_command"] = rf.server_vars()["gpufleet_server_command"] + extra
    return over


def _locks(rf: RolloutFleet, snap) -> dict:
    return {h: snap[h]["files"]["lock"] for h in rf.hosts}


HOW = ("batches [1, 2, 1] of 4 hosts, max_fail_percentage 0, a forced restart (gpufleet.serving.restart); host2 "
       "(batch 2, with host3) fails ")
HALTS = ("exit code 2; host2 failed with %s in the summary; the summary and stdout say 'rollout halted: 1 of 2 host(s) "
         "of the batch failed (host2)', halted.not_started = [host4]; host1 restarted; host3 %s; host4 is untouched (no "
         "task, same processes, files and sitecustomize); no lock of the run is left on any host")
# Where host2 fails before any host of its batch changed (validation, NCCL layers), ansible-core stops host3 at its
# next task; a failure inside host2's restart step comes when host3's restart is done.
BEFORE_ANY_CHANGE = ("preflight", "nccl")
PHASES = {
    "preflight": ("in the validation before anything changes: gpufleet_server_start_timeout -1",
                  "'gpufleet_server_start_timeout must be > 0'"),
    "nccl": ("in the NCCL layer: gpufleet_nccl_env NCCL_PROTOCOL with gpufleet_nccl_unknown_vars fail", "NCCL_PROTOCOL"),
    "lock": ("at the lock: the fresh lock file of an earlier run of another controller on host2",
             "'locked by an earlier gpufleet run' (the other run's lock left as it was)"),
    "clean": ("at the clean gate: an untagged process holds GPU 0", "'GPUs not clean'"),
    "ready": ("at start-up: the server exits (--fail-at-startup)", "'exited during start-up'"),
    "verify_env": ("at the workers' environment check: gpufleet_server_expected_env GPUFLEET_MUST_HAVE=1",
                   "GPUFLEET_MUST_HAVE"),
    "record": ("at the check before the drain: /var/lib/gpufleet (the record's directory) mounted read-only",
               "'record.state_file cannot be written: directory /var/lib/gpufleet is not writable' (nothing stopped, "
               "the lock still released)"),
}


@pytest.mark.parametrize("phase", [
    pytest.param(ph, marks=pytest.mark.reliability(
        section="fault", case="A batch fails beyond max_fail_percentage: at " + ph,
        provoked=HOW + how, outcome=HALTS % (what, "stopped before any change (same processes)" if ph in BEFORE_ANY_CHANGE
                                             else "restarted (its restart was done)")), id=ph)
    for ph, (how, what) in PHASES.items()])
def test_a_failed_batch_stops_the_rollout_whatever_phase_failed(fleet4, phase):
    rf = fleet4
    hv, provoke = CASES[phase]
    expect = provoke(rf, "host2")
    before = rf.snapshot()
    assert before.tagged("host4") and before.state("host4"), before["host4"]

    run = rf.playbook("restart", host_vars={"host2": _host_vars(rf, hv)},
                      extra_vars={"gpufleet_rollout_serial": SHAPE, "gpufleet_rollout_max_fail_percentage": 0})

    assert run.rc == 2, run.tail()
    after = rf.snapshot()
    # host2 failed, and says why.
    assert run.summary["host2"]["status"] == "failed", run.summary["host2"]
    assert expect in run.summary["host2"]["failure"], run.summary["host2"]
    if phase == "verify_env":  # the new workers were not verified (not the old server's count)
        assert run.summary["host2"]["workers_verified"] == 0, run.summary["host2"]
    # The run says it halted, and why.
    halted = json.loads((rf.workdir / ("summary-%d" % rf.runs) / "rollout-summary.json").read_text())["halted"]
    assert halted and halted["failed"] == ["host2"] and halted["not_started"] == ["host4"], halted
    assert "rollout halted: 1 of 2 host(s) of the batch failed (host2)" in run.out, run.tail()
    # The canary was restarted; host3 too unless host2 failed before any host of the batch changed.
    restarted = ("host1",) if phase in BEFORE_ANY_CHANGE else ("host1", "host3")
    for h in restarted:
        assert run.summary[h]["status"] == "ok" and run.summary[h]["restarted"] is True, run.summary[h]
        assert after.tagged(h) and not {p["pid"] for p in after.tagged(h)} & {p["pid"] for p in before.tagged(h)}
    if phase in BEFORE_ANY_CHANGE:
        assert run.summary["host3"]["status"] == "stopped" and run.summary["host3"]["restarted"] is False
        assert after.identities("host3") == before.identities("host3")
        assert after["host3"]["sitecustomize_sha"] == before["host3"]["sitecustomize_sha"]
    # The later batch was not touched at all: no task ran there, same processes, files and NCCL layer.
    assert run.summary["host4"]["status"] == "not run", run.summary["host4"]
    assert "host4" not in run.recap, run.recap
    assert after.identities("host4") == before.identities("host4")
    assert after["host4"]["files"] == before["host4"]["files"]
    assert after["host4"]["sitecustomize_sha"] == before["host4"]["sitecustomize_sha"]
    # No lock of this run is left anywhere; another run's lock is left as it was.
    locks = _locks(rf, after)
    if phase == "lock":
        assert locks.pop("host2") == before["host2"]["files"]["lock"]
    assert all(v is None for v in locks.values()), locks


@pytest.mark.reliability(
    section="fault", case="A batch fails within max_fail_percentage",
    provoked="batches [1, 2, 1] of 4 hosts, max_fail_percentage 50, a forced restart; host2 (batch 2) exits at start-up",
    outcome="1 of 2 is not above 50 %: host4 (batch 3) is restarted; no 'halted' record; exit code 2 (host2 failed); "
            "no lock left")
def test_a_batch_within_max_fail_percentage_lets_the_rollout_go_on(fleet4):
    rf = fleet4
    before = rf.snapshot()

    # 1 of 2 hosts of batch 2 fails: 50 % is not above 50, so batch 3 runs.
    run = rf.playbook("restart", host_vars={"host2": _host_vars(rf, CASES["ready"][0])},
                      extra_vars={"gpufleet_rollout_serial": SHAPE, "gpufleet_rollout_max_fail_percentage": 50})

    assert run.rc == 2, run.tail()  # a failed host still fails the run
    assert run.summary["host2"]["status"] == "failed"
    summary = json.loads((rf.workdir / ("summary-%d" % rf.runs) / "rollout-summary.json").read_text())
    assert summary["halted"] is None and "rollout halted" not in run.out
    after = rf.snapshot()
    for h in ("host1", "host3", "host4"):
        assert run.summary[h]["status"] == "ok" and run.summary[h]["restarted"] is True, run.summary[h]
        assert after.identities(h) != before.identities(h)
    assert all(v is None for v in _locks(rf, after).values())


@pytest.mark.reliability(
    section="fault", case="A failed batch in a plain rollout (the report: ansible/ansible#86574)",
    provoked="4 hosts, serial [1, '50%'], max_fail_percentage 0, a fleet-wide NCCL change; host2's GPU 0 held by an "
             "unrelated process (fails at the clean gate, inside the role's rescue/always block)",
    outcome="exit code 2; host4 (batch 3) not run: same processes and sitecustomize; no lock left on any host")
def test_the_reported_case_a_dirty_gpu_in_batch_two_of_a_canary_rollout_stops_batch_three(fleet4):
    """The report: 4 hosts, serial [1, "50%"], max_fail 0, host2's GPU held by an unrelated process: batch 2 failed,
    yet batch 3 ran and host4 was restarted. A plain (not forced) rollout, so the fast path runs first."""
    rf = fleet4
    rf.start_holder("host2", gpu=0, mib=1000)
    before = rf.snapshot()

    # A fleet-wide NCCL change: every host would restart.
    run = rf.playbook("rollout", vars_override={"gpufleet_nccl_env": {"NCCL_NTHREADS": "256"}},
                      extra_vars={"gpufleet_rollout_serial": [1, "50%"], "gpufleet_rollout_max_fail_percentage": 0})

    assert run.rc == 2, run.tail()
    assert "GPUs not clean" in run.summary["host2"]["failure"], run.summary["host2"]
    assert run.summary["host4"]["status"] == "not run" and "host4" not in run.recap
    after = rf.snapshot()
    assert after.identities("host4") == before.identities("host4")
    assert after["host4"]["sitecustomize_sha"] == before["host4"]["sitecustomize_sha"]
    assert all(v is None for v in _locks(rf, after).values())


@pytest.mark.reliability(
    section="fault", case="A failed host beside an up-to-date one in a batch",
    provoked="batches [1, 2, 1]; every host already right, then an unrelated GPU holder on host2; a plain rollout "
             "(the fast path skips the roles on host1 and host3)",
    outcome="host2 fails at the clean gate; the rollout halts before host4 (not run, same processes); host3 untouched")
def test_an_up_to_date_host_does_not_hide_a_failed_one_in_its_batch(fleet4):
    """Batch 2 = host2 (fails) + host3 (already right, skipped by the fast path): still halts before host4."""
    rf = fleet4
    rf.playbook("rollout", extra_vars={"gpufleet_rollout_serial": ["100%"]})  # every host right again
    rf.start_holder("host2", gpu=0, mib=1000)  # host2 now needs a restart (an untagged GPU holder) and will fail
    before = rf.snapshot()

    run = rf.playbook("rollout", extra_vars={"gpufleet_rollout_serial": SHAPE,
                                             "gpufleet_rollout_max_fail_percentage": 0})

    assert run.rc == 2, run.tail()
    assert run.summary["host2"]["status"] == "failed"
    assert run.summary["host3"]["status"] == "ok" and run.summary["host3"]["restarted"] is False
    assert run.summary["host4"]["status"] == "not run" and "host4" not in run.recap, run.summary
    after = rf.snapshot()
    assert after.identities("host4") == before.identities("host4")
    assert after.identities("host3") == before.identities("host3")


@pytest.mark.reliability(
    section="input", case="Bad input on a host that is already right, and a name that is not a name",
    provoked="every host already right; a plain rollout with gpufleet_server_start_timeout -1 on host2 and "
             "gpufleet_server_name '../../tmp/evil' on host3 (the rollout's fast path would end an up-to-date host)",
    outcome="host2 and host3 fail in the validation, before any host call: 'gpufleet_server_start_timeout must be > 0' "
            "(only the broken rule), 'gpufleet_server_name must be a string of 1 to 200 letters, digits...'; exit code 2; no lock "
            "file anywhere (/run/gpufleet, /tmp), processes and files unchanged")
def test_bad_input_fails_before_the_fast_path_and_takes_no_lock(fleet4):
    rf = fleet4
    rf.playbook("rollout", extra_vars={"gpufleet_rollout_serial": ["100%"]})  # every host right
    before = rf.snapshot()

    run = rf.playbook("rollout", host_vars={"host2": {"gpufleet_server_start_timeout": -1},
                                            "host3": {"gpufleet_server_name": "../../tmp/evil"}},
                      extra_vars={"gpufleet_rollout_serial": ["100%"]})

    assert run.rc == 2, run.tail()
    f2, f3 = run.summary["host2"]["failure"], run.summary["host3"]["failure"]
    assert "gpufleet_server_start_timeout must be > 0" in f2 and "clean_timeout" not in f2, f2
    assert "gpufleet_server_name must be a string of 1 to 200 letters, digits" in f3, f3
    assert run.recap["host2"]["changed"] == run.recap["host3"]["changed"] == 0
    after = rf.snapshot()
    for h in ("host2", "host3"):
        assert after.identities(h) == before.identities(h)
        assert after[h]["files"] == before[h]["files"]
        listing = rf.fleet.ssh(h, "ls -A /run/gpufleet /tmp", check=True).stdout
        assert ".lock" not in listing and "evil" not in listing, listing


@pytest.mark.reliability(
    section="input", case="Bad input in a forced restart: validated once per host, before any host is touched",
    provoked="gpufleet.serving.restart (forced, one batch of 4, max_fail_percentage 50) with gpufleet_nccl_env LD_PRELOAD on host2 and a "
             "gpufleet_server_env name with a space on host3",
    outcome="host2 and host3 fail in the rollout's validation with the role's messages ('LD_PRELOAD (the dynamic loader "
            "...) is never written host-wide', 'invalid variable name(s) \"BAD NAME\"'), processes and files unchanged; "
            "host1 and host4 restarted; the roles, which the rollout tells its checks already ran, run neither check "
            "again (each check's task runs once in the output)")
def test_a_forced_restart_validates_each_host_once_before_any_host_is_touched(fleet4):
    rf = fleet4
    before = rf.snapshot()

    run = rf.playbook("restart", host_vars={"host2": {"gpufleet_nccl_env": {"LD_PRELOAD": "/tmp/evil.so"}},
                                            "host3": {"gpufleet_server_env": {"BAD NAME": "1"}}},
                      extra_vars={"gpufleet_rollout_serial": ["100%"], "gpufleet_rollout_max_fail_percentage": 50})

    assert run.rc == 2, run.tail()
    f2, f3 = run.summary["host2"]["failure"], run.summary["host3"]["failure"]
    assert "LD_PRELOAD (the dynamic loader or the C library reads it in every program) is never written host-wide" in f2, f2
    assert 'invalid variable name(s) "BAD NAME"' in f3, f3
    after = rf.snapshot()
    for h in ("host2", "host3"):
        assert run.recap[h]["changed"] == 0, run.recap
        assert after.identities(h) == before.identities(h)
        assert after[h]["files"] == before[h]["files"]
        assert after[h]["sitecustomize_sha"] == before[h]["sitecustomize_sha"]
    for h in ("host1", "host4"):
        assert run.summary[h]["restarted"] is True, run.summary[h]
        assert after.identities(h) != before.identities(h)
    # The checks ran in the rollout's pre-tasks only, in one task per host (gpu_server's rollout_check, issue 25); the
    # roles' entry into the lifecycle (gpu_server's rollout entry point, and the layers written by the gpu_server role
    # for the explicit profile) validates nothing again: no argument specs, no checks, not even a skipped include.
    assert run.out.count("TASK [gpufleet.serving.gpu_server : Validate the host's input and check in one call") == 1
    for task in ("gpufleet.serving.gpu_server : Assert the server definition is usable",
                 "gpufleet.serving.nccl_tuning : Assert the NCCL tuning variables are valid",
                 "gpufleet.serving.gpu_server : Validate the server definition",
                 "gpufleet.serving.nccl_tuning : Check the NCCL tuning input"):
        assert "TASK [%s]" % task not in run.out, task
    assert "arg spec" not in run.out


def _launches(rf: RolloutFleet, host: str) -> int:
    out = rf.fleet.ssh(host, "cat /var/log/gpufleet/demo.log 2>/dev/null").stdout
    return out.count("==== gpufleet launch")


@pytest.mark.reliability(
    section="fault", case="Two controllers roll out the same definition at once, in batches (wait-die)",
    provoked="4 hosts, serial [1, '50%'], a fleet-wide NCCL change; two real ansible-playbook runs of "
             "gpufleet.serving.rollout with the same inventory started at the same moment (default "
             "gpufleet_server_lock_wait, 900 s)",
    outcome="the earlier run (by its start) finishes every host with exit code 0, waiting where the later run held a "
            "host ('waited N s for the host lock of a later gpufleet run'); the later run either stops where it meets "
            "the earlier run's lock ('host is locked by an earlier gpufleet run ... this later run stops here', exit "
            "code 2, 'rollout halted') with changed=0 on that host, or finishes first; every host's server was launched "
            "exactly once; every host runs the new tuning; no lock left")
def test_two_rollouts_at_once_in_batches_the_earlier_finishes_the_fleet(fleet4, tmp_path):
    rf = fleet4
    rf.playbook("rollout", extra_vars={"gpufleet_rollout_serial": ["100%"]})  # every host right
    launches = {h: _launches(rf, h) for h in HOSTS}
    inv = rf.inventory({"gpufleet_nccl_env": {"NCCL_NTHREADS": "256"}})
    ev = {"gpufleet_rollout_serial": [1, "50%"], "gpufleet_rollout_max_fail_percentage": 0}
    runs = [CliRun(tmp_path, name, "gpufleet.serving.rollout", [inv], ev) for name in ("one", "two")]
    # The order of the two runs: their processes' start (clock ticks), ties broken by the run id (host:pid:...).
    me = socket.gethostname()
    earlier, later = sorted(runs, key=lambda r: (_ticks(r.pid), "%s:%d:" % (me, r.pid)))
    rc_e, rc_l = earlier.wait(400), later.wait(400)

    out_e, out_l = " ".join(earlier.text().split()), " ".join(later.text().split())
    assert rc_e == 0, out_e[-4000:]
    assert "host is locked by an earlier" not in out_e, out_e[-3000:]
    refused = re.findall(r"fatal: \[(host\d)\]", later.text())
    if rc_l != 0:
        assert rc_l == 2, out_l[-4000:]
        assert "host is locked by an earlier gpufleet run %s:%d:" % (me, earlier.pid) in out_l, out_l[-4000:]
        assert "this later run stops here, the earlier one goes on; run again after it" in out_l
        assert refused, out_l[-3000:]
        recap = parse_recap(later.text())
        for h in refused:  # nothing written there by the run that did not hold the lock
            assert recap[h]["changed"] == 0, (h, recap)
        if refused[-1] != HOSTS[-1]:
            assert "rollout halted" in out_l, out_l[-3000:]
    else:  # the later run was ahead on every host: the earlier waited for it where they met
        assert not refused, out_l[-3000:]
    print("later run: rc %s, stopped on %s; earlier run waited: %s" % (rc_l, refused, "waited" in out_e))
    after = rf.snapshot()
    for h in HOSTS:
        assert _launches(rf, h) == launches[h] + 1, (h, _launches(rf, h), launches[h])
        for w in workers(after, h):
            assert w["env"].get("NCCL_NTHREADS") == "256", (h, w)
    assert all(v is None for v in _locks(rf, after).values())
    # A third run agrees that nothing is left to do.
    again = rf.playbook("rollout", vars_override={"gpufleet_nccl_env": {"NCCL_NTHREADS": "256"}})
    assert again.rc == 0 and all(again.recap[h]["changed"] == 0 for h in HOSTS), again.tail()


@pytest.mark.reliability(
    section="fault", case="A later controller's rollout meets an earlier one on its canary (wait-die)",
    provoked="4 hosts, serial [1, '50%'], a fleet-wide NCCL change (NCCL_NTHREADS 256), the canary's server taking 30 s to "
             "start; rollout A starts; as soon as A restarts host1 (its canary, under its lock), rollout B starts with "
             "the same inventory",
    outcome="B stops on host1 at once: 'host is locked by an earlier gpufleet run <A's id> (started HH:MM:SS); this "
            "later run stops here, the earlier one goes on; run again after it', changed=0 there, exit code 2, no "
            "later batch and no other host touched by B; A finishes every host, exit code 0; each server launched once")
def test_a_later_rollout_stops_on_the_earlier_ones_canary_and_its_batch_gate_halts_it(fleet4, tmp_path):
    rf = fleet4
    rf.playbook("rollout", extra_vars={"gpufleet_rollout_serial": ["100%"]})  # every host right
    launches = {h: _launches(rf, h) for h in HOSTS}
    # A changes every host's NCCL_NTHREADS (the profile's is 512), and its canary takes 30 s to start: B (its own
    # start-up, validation, fast check) meets A's lock on host1. The later batches start at once (B stops at the canary).
    inv = rf.inventory({"gpufleet_nccl_env": {"NCCL_NTHREADS": "256"}, "gpufleet_server_start_timeout": 150},
                       {"host1": {"gpufleet_server_command": rf.server_vars()["gpufleet_server_command"] +
                                  ["--startup-delay", "30"]}})
    ev = {"gpufleet_rollout_serial": [1, "50%"], "gpufleet_rollout_max_fail_percentage": 0}
    a = CliRun(tmp_path, "a", "gpufleet.serving.rollout", [inv], ev)
    wait_for(lambda: "Restart the server (kill" in a.text() or a.proc.poll() is not None, 240, "A to restart its canary")
    b = CliRun(tmp_path, "b", "gpufleet.serving.rollout", [inv], ev)
    rc_a, rc_b = a.wait(400), b.wait(400)

    me = socket.gethostname()
    out_b = " ".join(b.text().split())
    assert rc_a == 0, a.text()[-4000:]
    assert rc_b == 2, out_b[-4000:]
    assert "host is locked by an earlier gpufleet run %s:%d:" % (me, a.pid) in out_b, out_b[-4000:]
    assert "this later run stops here, the earlier one goes on; run again after it" in out_b
    # Its canary batch failed entirely: ansible-core ends the play there (no later batch, no other host in its recap).
    recap = parse_recap(b.text())
    assert list(recap) == ["host1"] and recap["host1"]["changed"] == 0, recap
    after = rf.snapshot()
    for h in HOSTS:
        assert _launches(rf, h) == launches[h] + 1, h
        for w in workers(after, h):
            assert w["env"].get("NCCL_NTHREADS") == "256", (h, w)
    assert all(v is None for v in _locks(rf, after).values())


def _ticks(pid: int) -> int:
    stat = open("/proc/%d/stat" % pid).read()
    return int(stat[stat.rfind(")") + 2:].split()[19])


@pytest.mark.reliability(
    section="fault", case="strategy free in the user's configuration (ANSIBLE_STRATEGY=free)",
    provoked="ANSIBLE_STRATEGY=free; 4 hosts, serial [1, '50%'], max_fail_percentage 0, a fleet-wide NCCL change; "
             "host2's GPU 0 held by an unrelated process (fails at the clean gate in batch 2)",
    outcome="the shipped rollout runs its plays with strategy linear whatever the configuration: exit code 2, host2 "
            "failed with 'GPUs not clean', 'rollout halted' in stdout and the summary's halted record, host4 (batch 3) "
            "not run: same processes and sitecustomize; no lock left")
def test_the_rollout_keeps_its_batches_under_a_configured_free_strategy(fleet4, monkeypatch):
    rf = fleet4
    rf.start_holder("host2", gpu=0, mib=1000)
    before = rf.snapshot()
    monkeypatch.setenv("ANSIBLE_STRATEGY", "free")

    run = rf.playbook("rollout", vars_override={"gpufleet_nccl_env": {"NCCL_NTHREADS": "128"}},
                      extra_vars={"gpufleet_rollout_serial": [1, "50%"], "gpufleet_rollout_max_fail_percentage": 0})

    assert run.rc == 2, run.tail()
    assert "GPUs not clean" in run.summary["host2"]["failure"], run.summary["host2"]
    assert "rollout halted: 1 of 2 host(s) of the batch failed (host2)" in run.out, run.tail()
    halted = json.loads((rf.workdir / ("summary-%d" % rf.runs) / "rollout-summary.json").read_text())["halted"]
    assert halted and halted["not_started"] == ["host4"], halted
    assert run.summary["host4"]["status"] == "not run" and "host4" not in run.recap
    after = rf.snapshot()
    assert after.identities("host4") == before.identities("host4")
    assert after["host4"]["sitecustomize_sha"] == before["host4"]["sitecustomize_sha"]
    assert all(v is None for v in _locks(rf, after).values())


USER_PLAY = """
- name: My own rollout
  hosts: gpufleet_servers
  serial: [1, "50%"]
  gather_facts: false
  tasks:
    - name: Restart the server
      ansible.builtin.include_role:
        name: gpufleet.serving.gpu_server
"""


@pytest.mark.reliability(
    section="input", case="A play of the user's including gpu_server under strategy free",
    provoked="ANSIBLE_STRATEGY=free; the user's own play (serial [1, '50%'], no strategy keyword) includes the "
             "gpu_server role; every host needs a restart (a changed server env)",
    outcome="each host that the play reaches is refused at the role's first host call, before the lock: 'gpufleet's "
            "roles cannot keep their batch semantics under the play's strategy free ... Set 'strategy: linear' "
            "on the play'; exit code 2; no process, file or lock changed on any host")
def test_a_users_play_with_the_role_under_free_is_refused_before_anything_is_touched(fleet4, monkeypatch):
    rf = fleet4
    rf.playbook("rollout", extra_vars={"gpufleet_rollout_serial": ["100%"]})  # every host right
    before = rf.snapshot()
    inv = rf.inventory({"gpufleet_server_env": {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV", "DEMO_X": "1"}})
    # The user's inventory without NCCL tuning: their play does not include the nccl_tuning role.
    servers = json.loads((inv / "servers.yml").read_text())
    servers["gpufleet_servers"]["vars"].pop("gpufleet_nccl_profile")
    (inv / "servers.yml").write_text(json.dumps(servers))
    pb = rf.workdir / "my-play.yml"
    pb.write_text(USER_PLAY)
    env = dict(os.environ, ANSIBLE_STRATEGY="free", ANSIBLE_COLLECTIONS_PATH=str(private_collections()))

    cp = run_playbook(pb, inventory=str(inv), env=env, timeout=240)

    out = " ".join(cp.stdout.split())
    assert cp.returncode == 2, out[-4000:]
    assert "gpufleet's roles cannot keep their batch semantics under the play's strategy free" in out, out[-3000:]
    assert "Set 'strategy: linear' on the play" in out
    assert "Restart the server (kill" not in cp.stdout
    after = rf.snapshot()
    for h in HOSTS:
        assert after.identities(h) == before.identities(h), h
        assert after[h]["files"] == before[h]["files"], h
        assert after[h]["sitecustomize_sha"] == before[h]["sitecustomize_sha"], h
