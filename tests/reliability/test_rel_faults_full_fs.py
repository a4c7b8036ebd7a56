# SPDX-License-Identifier: GPL-3.0-or-later
"""A full state or run filesystem on a sandbox host (issue 24, item 6): a real 64 KiB tmpfs mounted over
/var/lib/gpufleet or /run/gpufleet inside the host's own mount namespace, filled with dd, under real rollouts.

Before: the restart succeeded, then `record: unexpected error: [Errno 28] No space left on device` (no file named),
the summary said workers_verified 0, a demo.json.<pid>.tmp was left, and every later rollout killed the healthy
server again; a full /run/gpufleet left a 0-byte lock and a .lock.<pid>.tmp.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))

from rollout_helpers import ROLE_DEFAULT, BalancerRecorder, RolloutFleet  # noqa: E402

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

H = "host1"
STATE_DIR, RUN_DIR = "/var/lib/gpufleet", "/run/gpufleet"


@pytest.fixture(scope="module")
def rf(sandbox_fleet_module, tmp_path_factory):
    fleet = sandbox_fleet_module(hosts=1, gpus=2)
    r = RolloutFleet(fleet, tmp_path_factory.mktemp("full-fs"))
    r.rolled_out()  # a tagged, verified server, as after any rollout
    yield r
    fleet.ssh(H, "pkill -f gpufleet-filler; umount %s %s 2>/dev/null; true" % (STATE_DIR, RUN_DIR))
    r.reset()


def _mount_small(rf, d: str, fill: bool) -> None:
    rf.fleet.ssh(H, "mkdir -p {d} && mount -t tmpfs -o size=64k tmpfs {d}{fill}".format(
        d=d, fill=" && (dd if=/dev/zero of=%s/filler bs=4096 2>/dev/null; true)" % d if fill else ""), check=True)


def _ls(rf, d: str) -> list:
    return sorted(rf.fleet.ssh(H, "ls -A %s" % d, check=True).stdout.split())


def _server(snap) -> set:
    return {(p["pid"], p["start"]) for p in snap.tagged(H)}


@pytest.mark.reliability(
    section="fault", case="Full state or run filesystem before a restart",
    provoked="a 64 KiB tmpfs over /var/lib/gpufleet, filled with dd, under a running verified server: "
             "gpufleet.serving.rollout, then gpufleet.serving.restart (forced); then the same tmpfs over /run/gpufleet "
             "(lock, pidfile) and a forced restart",
    outcome="the rollout keeps the server (it carries this definition's fingerprint; the record that cannot be written "
            "is a warning and a line after the summary's table, 'record still missing, server kept', naming the file), "
            "rc 0; the forced restart fails in preflight naming 'directory /var/lib/gpufleet "
            "(record.state_file) has 0 bytes free', the server untouched (same processes); the full /run/gpufleet "
            "fails the lock with 'cannot write /run/gpufleet/demo.lock: No space left on device', nothing stopped; no "
            "temp file and no 0-byte lock left in either directory")
def test_a_full_state_or_run_filesystem_fails_before_the_kill_and_leaves_nothing(rf):
    before = _server(rf.snapshot())
    assert before
    _mount_small(rf, STATE_DIR, fill=True)
    try:
        run = rf.playbook("rollout")
        assert run.rc == 0, run.tail()
        assert run.summary[H]["restart"] == "no", run.summary[H]
        assert "its record still cannot be written" in run.out, run.tail()
        assert "(cannot write %s/demo.json: No space left on device)" % STATE_DIR in run.summary[H]["record_missing"], \
            run.summary[H]
        assert "record still missing, server kept: %s (" % H in run.out, run.tail()
        assert _server(rf.snapshot()) == before

        run = rf.playbook("restart")
        assert run.rc == 2, run.tail()
        row = run.summary[H]
        assert row["phase"] == "preflight" and row["restart"] == "no", row
        assert "directory /var/lib/gpufleet (record.state_file) has 0 bytes free" in row["failure"], row
        assert _server(rf.snapshot()) == before
        assert _ls(rf, STATE_DIR) == ["filler"]
    finally:
        rf.fleet.ssh(H, "umount %s" % STATE_DIR, check=True)

    _mount_small(rf, RUN_DIR, fill=True)  # hides the pidfile too: the check finds no server and wants a restart
    try:
        run = rf.playbook("restart")
        assert run.rc == 2, run.tail()
        assert "cannot write /run/gpufleet/demo.lock: No space left on device" in run.summary[H]["failure"], run.summary
        assert _server(rf.snapshot()) == before
        assert _ls(rf, RUN_DIR) == ["filler"]  # no 0-byte demo.lock, no demo.lock.<pid>.tmp
    finally:
        rf.fleet.ssh(H, "umount %s" % RUN_DIR, check=True)


@pytest.mark.reliability(
    section="fault", case="Full state filesystem before a restart behind a balancer",
    provoked="a 64 KiB tmpfs over /var/lib/gpufleet, filled with dd, under a running verified server in rotation in an "
             "`http` balancer (a recording HTTP API on the controller); gpufleet.serving.restart (forced)",
    outcome="the check refuses before the drain: 'cannot run this server, nothing was stopped: directory "
            "/var/lib/gpufleet (record.state_file, drain_record) has 0 bytes free', phase preflight, the balancer "
            "got no call (the host never left rotation), out of rotation: none, the server untouched (same processes), "
            "no drain record and no temp file left")
def test_a_full_disk_refuses_a_restart_behind_a_balancer_before_its_drain(rf):
    before = _server(rf.snapshot())
    rec = BalancerRecorder(add_status=204)
    http = {"type": "http", "name": "lb-api", "remove": {"url": rec.url, "method": "DELETE"},
            "add": {"url": rec.url, "method": "PUT", "body": "{}"}}
    _mount_small(rf, STATE_DIR, fill=True)
    try:
        run = rf.playbook("restart", vars_override=dict(rf.server_vars(), gpufleet_server_balancers=[http]))
        assert run.rc == 2, run.tail()
        row = run.summary[H]
        assert row["phase"] == "preflight" and row["restart"] == "no", row
        assert ("cannot run this server, nothing was stopped: directory /var/lib/gpufleet (record.state_file, "
                "drain_record) has 0 bytes free") in row["failure"], row
        assert not row["out_of_rotation"], row
        assert rec.calls == [], rec.calls
        assert _server(rf.snapshot()) == before
        assert _ls(rf, STATE_DIR) == ["filler"]
    finally:
        rec.close()
        rf.fleet.ssh(H, "umount %s" % STATE_DIR, check=True)


def _pending(rf) -> tuple:
    """(mode, content) of the last known good generation put aside in /run/gpufleet, (None, None) when none is."""
    out = rf.fleet.ssh(H, "f=/run/gpufleet/demo.last_good-pending.json; [ -e $f ] && stat -c %a $f && cat $f; true",
                       check=True).stdout
    if not out.strip():
        return None, None
    mode, _sep, text = out.partition("\n")
    return mode, json.loads(text)


# Fills /var/lib/gpufleet once the restart has written its new pidfile: after the preflight and the launch, before
# the record.
FILLER = """#!/bin/sh
old=$(cat /run/gpufleet/demo.pid)
while [ "$(cat /run/gpufleet/demo.pid)" = "$old" ]; do sleep 0.02; done
dd if=/dev/zero of=/var/lib/gpufleet/filler bs=4096 2>/dev/null
true
"""


@pytest.mark.reliability(
    section="fault", case="State filesystem fills during a restart (the record fails after the verify)",
    provoked="a 64 KiB tmpfs over /var/lib/gpufleet, filled by a process on the host as soon as the forced restart "
             "(gpufleet.serving.restart) has launched the new server; then gpufleet.serving.rollout with the filesystem "
             "still full, and again after the filler files are deleted",
    outcome="the restart fails in phase record naming /var/lib/gpufleet/demo.json and 'No space left on device', the "
            "summary keeps workers_verified 2 and restarted yes; no temp file left; the next rollout does not kill the "
            "new server (same processes, rc 0, warning that the record still cannot be written, and 'record still "
            "missing, server kept' after the summary's table); once there is room the next rollout records it "
            "(fingerprint and pid of the running server) without a restart, and says nothing is missing; the verified "
            "server's last known good generation, put aside in /run/gpufleet (0600) while the record could not be "
            "written, is then the newest in demo.last_good.json, and the pending file is gone")
def test_a_record_that_fails_after_a_good_restart_does_not_get_the_server_killed_again(rf):
    _mount_small(rf, STATE_DIR, fill=False)
    try:
        old = _server(rf.snapshot())
        rf.fleet.ssh(H, "cat > /tmp/gpufleet-filler && chmod 755 /tmp/gpufleet-filler", input=FILLER, check=True)
        rf.fleet.ssh(H, "nohup setsid /tmp/gpufleet-filler >/dev/null 2>&1 </dev/null &", check=True)
        run = rf.playbook("restart")
        assert run.rc == 2, run.tail()
        row = run.summary[H]
        assert row["phase"] == "record" and row["restart"] == "yes" and row["workers_verified"] == 2, row
        assert "/var/lib/gpufleet/demo.json" in row["failure"] and "No space left on device" in row["failure"], row
        assert _ls(rf, STATE_DIR) == ["filler"]  # no demo.json.<pid>.tmp, and the unverified mark is gone
        server = _server(rf.snapshot())
        assert server and not server & old, (server, old)  # the new server
        # Its last known good generation waits beside the pidfile (the state filesystem is full), root-only.
        mode, pending = _pending(rf)
        assert mode == "600" and pending["launcher"][0] == rf.snapshot().launcher(H), pending
        assert pending["generation"]["fingerprint"] and pending["generation"]["command"], pending

        # The removed mark freed a block: fill it too, so the record still cannot be written.
        rf.fleet.ssh(H, "dd if=/dev/zero of=%s/filler2 bs=1024 2>/dev/null; true" % STATE_DIR, check=True)
        run = rf.playbook("rollout")
        assert run.rc == 0, run.tail()
        assert run.summary[H]["restart"] == "no" and "its record still cannot be written" in run.out, run.tail()
        assert "[WARNING]: the running server (pid" in " ".join(run.out.split()), run.tail()  # a warning too
        assert "record still missing, server kept: %s (" % H in run.out, run.tail()
        assert "/demo.json: No space left on device" in run.summary[H]["record_missing"], run.summary[H]
        assert _server(rf.snapshot()) == server
        assert _ls(rf, STATE_DIR) == ["filler", "filler2"]
        assert _pending(rf)[1] == pending  # still aside

        rf.fleet.ssh(H, "rm %s/filler %s/filler2" % (STATE_DIR, STATE_DIR), check=True)
        run = rf.playbook("rollout")
        assert run.rc == 0 and run.summary[H]["restart"] == "no", run.tail()
        assert not run.summary[H]["record_missing"] and "record still missing" not in run.out, run.tail()
        snap = rf.snapshot()
        assert _server(snap) == server
        state = snap.state(H)
        assert state and state["fingerprint"] and state.get("verified") is not False, state
        assert state["pid"] == snap.launcher(H) and (state["pid"], state["start_time"]) in server, state
        # The generation put aside is now the newest last known good (a rollback would not go back past it).
        gens = json.loads(rf.fleet.ssh(H, "cat %s/demo.last_good.json" % STATE_DIR, check=True).stdout)["generations"]
        assert gens[0] == pending["generation"] and gens[0]["fingerprint"] == state["fingerprint"], gens
        assert _pending(rf) == (None, None)
    finally:
        rf.fleet.ssh(H, "pkill -f gpufleet-filler; umount %s; true" % STATE_DIR)


@pytest.mark.reliability(
    section="fault", case="A failed restart goes back to the server whose record could not be written",
    provoked="an empty 64 KiB tmpfs over /var/lib/gpufleet, filled as soon as a forced restart launched its new server "
             "(the record fails; the verified server's last known good is put aside in /run/gpufleet); the filler "
             "removed, a rollout of a definition whose server dies at start-up, with gpufleet_server_rollback as the role "
             "has it by default (on)",
    outcome="before the kill the generation put aside becomes the newest last known good (the only one: the state "
            "directory was empty), so the failed restart goes back to it: rc 2, 'rolled back to the last known good "
            "<its fingerprint>', the record then names it, the server runs again (a new process, its fingerprint), "
            "demo.last_good.json's newest generation is it, and the pending file is gone")
def test_a_failed_restart_goes_back_to_the_server_whose_record_could_not_be_written(rf):
    _mount_small(rf, STATE_DIR, fill=False)
    try:
        rf.fleet.ssh(H, "cat > /tmp/gpufleet-filler && chmod 755 /tmp/gpufleet-filler", input=FILLER, check=True)
        rf.fleet.ssh(H, "nohup setsid /tmp/gpufleet-filler >/dev/null 2>&1 </dev/null &", check=True)
        run = rf.playbook("restart")
        assert run.rc == 2 and run.summary[H]["phase"] == "record", run.tail()
        verified = _server(rf.snapshot())
        _mode, pending = _pending(rf)
        fp = pending["generation"]["fingerprint"]
        rf.fleet.ssh(H, "pkill -f '[g]pufleet-filler'; rm -f %s/filler; true" % STATE_DIR, check=True)  # [g]: not this shell

        bad = {"gpufleet_server_command": rf.server_vars()["gpufleet_server_command"] + ["--fail-at-startup"],
               "gpufleet_server_rollback": ROLE_DEFAULT}
        run = rf.playbook("rollout", vars_override=bad)
        assert run.rc == 2, run.tail()
        row = run.summary[H]
        assert row["failure"].startswith("rolled back to the last known good %s" % fp[:12]), row
        assert row["rolled_back"]["fingerprint"] == fp and row["workers_verified"] == 2, row
        snap = rf.snapshot()
        state = snap.state(H)
        assert state and state["fingerprint"] == fp and state["pid"] == snap.launcher(H), state
        assert _server(snap) and not _server(snap) & verified  # relaunched: the failed restart had killed it
        gens = json.loads(rf.fleet.ssh(H, "cat %s/demo.last_good.json" % STATE_DIR, check=True).stdout)["generations"]
        assert [g["fingerprint"] for g in gens] == [fp], gens
        assert _pending(rf) == (None, None)
    finally:
        rf.fleet.ssh(H, "pkill -f gpufleet-filler; umount %s; true" % STATE_DIR)
