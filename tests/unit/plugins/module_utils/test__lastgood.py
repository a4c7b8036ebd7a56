# SPDX-License-Identifier: GPL-3.0-or-later
"""The last known good generations beside a service's state file."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from helpers import wait_for

from ansible_collections.gpufleet.serving.plugins.module_utils import _lastgood, _proc

P = {"launcher": "process", "command": ["python3", "-m", "sglang.launch_server"], "env": {"HF_TOKEN": "hf_secret"},
     "env_passthrough": [], "user": "root", "workdir": "/", "umask": "0022", "tag_name": "GPUFLEET_SERVICE",
     "systemd": None, "name": "ignored"}


def test_the_file_lies_beside_the_state_file():
    assert _lastgood.path_for("/var/lib/gpufleet/sglang.json") == "/var/lib/gpufleet/sglang.last_good.json"
    assert _lastgood.path_for("/var/lib/gpufleet/state") == "/var/lib/gpufleet/state.last_good.json"


def test_generations_newest_first_one_per_fingerprint_bounded_and_root_only(tmp_path):
    path = str(tmp_path / "sglang.last_good.json")
    for fp in ("a", "b", "a", "c", "d"):
        gens = _lastgood.keep(path, _lastgood.generation(P, fp, {"median": 1.0}, {"nccl_conf": {"env": {}}}), 3)
    assert [g["fingerprint"] for g in gens] == ["d", "c", "a"]
    assert json.loads(open(path).read())["generations"] == gens
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    g = gens[0]
    assert g["command"] == P["command"] and g["env"] == {"HF_TOKEN": "hf_secret"} and g["layers"] and "name" not in g
    shown = _lastgood.summary(gens)
    assert shown[0] == {"fingerprint": "d", "recorded_at": g["recorded_at"], "gate_median": 1.0}
    assert "hf_secret" not in json.dumps(shown)


def test_the_same_definition_verified_again_keeps_when_it_was_first_recorded(tmp_path):
    path = str(tmp_path / "sglang.last_good.json")
    first = dict(_lastgood.generation(P, "a", {"median": 1.0}, None), recorded_at="2026-12-01T10:00:00+0000")
    _lastgood.keep(path, first, 3)
    _lastgood.keep(path, _lastgood.generation(P, "b", None, None), 3)
    gens = _lastgood.keep(path, _lastgood.generation(P, "a", {"median": 2.0}, None), 3)
    assert [g["fingerprint"] for g in gens] == ["a", "b"]
    assert gens[0]["recorded_at"] == "2026-12-01T10:00:00+0000" and gens[0]["gate"] == {"median": 2.0}
    assert gens[1]["recorded_at"] != gens[0]["recorded_at"]  # another definition: its own time


def test_an_unreadable_file_is_no_generations_and_is_replaced(tmp_path):
    path = tmp_path / "x.last_good.json"
    for text in ("not json", '{"generations": "x"}', "[1]"):
        path.write_text(text)
        assert _lastgood.read(str(path)) == []
    gens = _lastgood.keep(str(path), _lastgood.generation(P, "a", None, None), 3)
    assert [g["fingerprint"] for g in gens] == ["a"] and gens[0]["gate"] is None and gens[0]["layers"] is None


def _gens(*fps, launcher="process"):
    return [dict(_lastgood.generation(dict(P, launcher=launcher, command=None if launcher == "systemd" else P["command"]),
                                      fp, None, None), recorded_at="2026-12-0%dT10:00:00+0000" % (9 - i))
            for i, fp in enumerate(fps)]


A, B, C = "a" * 64, "b" * 64, "c" * 64


@pytest.mark.parametrize("running, to, marker, want", [
    (C, "", None, B),   # after a passing rollout of C (the newest): the one before it
    (B, "", None, C),   # the host runs an older one (rolled back by hand before, no record of it): the newest other
    (None, "", None, C),  # no verified server runs (a failed restart left none): the newest
    ("d" * 64, "", None, C),  # a failed launch of an unknown definition runs: the newest
    (C, A, None, A),    # named in full
    (C, A[:12], None, A),  # by the 12 characters the summary and the audit show
    (C, C, None, C),    # the running one named: nothing to do (the caller sees it runs it)
    (B, "", {"from": C, "to": B}, B),  # rolled back by hand to what it runs: stays (the rollback again is a no-op)
    (B, C[:12], {"from": C, "to": B}, C),  # ... and goes forward only when named
    (A, "", {"from": C, "to": B}, C),  # it runs another one than the rollback went to: the rule again
])
def test_the_rollback_goes_to_the_newest_generation_it_does_not_run_or_the_one_named(running, to, marker, want):
    assert _lastgood.choose(_gens(C, B, A), running, to, marker)["fingerprint"] == want


@pytest.mark.parametrize("gens, running, to, said", [
    ([], C, "", "this host has no last known good generation (/x.last_good.json)"),
    ("C", C, "", "no last known good generation other than the one it runs (cccccccccccc (recorded "),
    ("CB", C, "d" * 64, "%s is not a last known good generation of this host (/x.last_good.json); known: cccccccccccc "
                        "(recorded 2026-12-09T10:00:00+0000), bbbbbbbbbbbb (recorded 2026-12-08T10:00:00+0000)" % ("d" * 64)),
    ("CB", C, "bbbb", "'bbbb' is not a fingerprint of a last known good generation of this host and too short for a "
                      "prefix of one (at least 12 characters"),
    ("CB", C, "d" * 12, "dddddddddddd is not a last known good generation"),
])
def test_no_generation_to_go_back_to_is_refused_naming_what_the_host_has(gens, running, to, said):
    gens = _gens(*[{"C": C, "B": B}[x] for x in gens])
    with pytest.raises(_lastgood.TargetError) as e:
        _lastgood.choose(gens, running, to, None, "/x.last_good.json")
    assert said in str(e.value), str(e.value)
    assert "hf_secret" not in str(e.value)


def test_an_ambiguous_prefix_and_a_systemd_generation_are_refused():
    twins = [dict(g, fingerprint="ab" * 6 + x) for g, x in zip(_gens(C, B), ("1" * 52, "2" * 52))]
    with pytest.raises(_lastgood.TargetError, match="names 2 last known good generations of this host; give more"):
        _lastgood.choose(twins, None, "ab" * 6)
    assert _lastgood.choose(twins, None, "ab" * 6 + "2")["fingerprint"] == "ab" * 6 + "2" * 52
    # A systemd generation without its unit's files (recorded before gpufleet kept them): nothing to launch again.
    with pytest.raises(_lastgood.TargetError, match=r"holds nothing to launch again \(it was recorded before gpufleet "
                                                    r"kept a systemd unit's files\)"):
        _lastgood.choose(_gens(C, B, launcher="systemd"), C)


def test_a_restored_generation_is_the_newest_again_and_the_file_remembers_the_rollback_until_another_is_kept(tmp_path):
    path = str(tmp_path / "s.last_good.json")
    for fp in (A, B, C):
        _lastgood.keep(path, _lastgood.generation(P, fp, None, None), 3)
    recorded = {g["fingerprint"]: g["recorded_at"] for g in _lastgood.read(path)}
    gens = _lastgood.restored(path, B, C)
    assert [g["fingerprint"] for g in gens] == [B, C, A] and gens[0]["recorded_at"] == recorded[B]
    assert gens[0]["restored_at"] and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    f = _lastgood.read_file(path)
    assert f["generations"] == gens and f["rolled_back"]["from"] == C and f["rolled_back"]["to"] == B
    # The rollback again: a no-op; then the same definition restarted by a rollout keeps the note...
    assert _lastgood.choose(f["generations"], B, "", f["rolled_back"])["fingerprint"] == B
    _lastgood.keep(path, _lastgood.generation(P, B, None, None), 3)
    assert _lastgood.read_file(path)["rolled_back"]["to"] == B
    # ... and another one kept (a rollout forward) forgets it.
    _lastgood.keep(path, _lastgood.generation(P, C, None, None), 3)
    assert _lastgood.read_file(path)["rolled_back"] is None


def test_what_the_host_runs_is_what_its_launcher_carries_else_the_verified_launch_on_record():
    me = _proc.read_proc(os.getpid())
    rec = {"fingerprint": A, "pid": me.pid, "start_time": me.start_time}
    key = "GPUFLEET_TEST_NO_SUCH_TAG"
    assert _lastgood.running_fingerprint(rec, (me.pid, me.start_time), key, True) == A
    assert _lastgood.running_fingerprint(dict(rec, verified=False), (me.pid, me.start_time), key, True) is None
    assert _lastgood.running_fingerprint(rec, (me.pid, me.start_time), key, False) is None
    assert _lastgood.running_fingerprint(dict(rec, pid=1), (me.pid, me.start_time), key, True) is None
    # A launcher carrying its fingerprint (/proc/PID/environ holds what a process started with: a child's).
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                             env=dict(os.environ, **{key + "_FINGERPRINT": B}))
    try:
        wait_for(lambda: _proc.read_environ(child.pid, [key + "_FINGERPRINT"]), 10, "the child's environment")
        ident = (child.pid, _proc.read_proc(child.pid).start_time)
        assert _lastgood.running_fingerprint(dict(rec, verified=False), ident, key, True) == B
    finally:
        child.kill()
        child.wait()


def test_a_generation_put_aside_counts_only_for_its_definition_and_launcher_and_is_root_only(tmp_path):
    pidfile = str(tmp_path / "sglang.pid")
    assert _lastgood.pending_path(pidfile) == str(tmp_path / "sglang.last_good-pending.json")
    assert _lastgood.pending_for(pidfile, "a", (100, 7)) is None  # nothing put aside
    _lastgood.keep_pending(pidfile, _lastgood.generation(P, "a", {"median": 2.5}, None), 4, (100, 7))
    assert stat.S_IMODE(os.stat(_lastgood.pending_path(pidfile)).st_mode) == 0o600  # it holds the env's secrets
    assert _lastgood.pending_for(pidfile, "b", (100, 7)) is None  # another definition
    assert _lastgood.pending_for(pidfile, "a", (101, 7)) is None  # another launcher
    assert _lastgood.pending_for(pidfile, "a", (100, 8)) is None  # its pid reused by another process
    assert _lastgood.pending_for(pidfile, "a", None) is None
    got = _lastgood.pending_for(pidfile, "a", (100, 7))
    assert got["generations"] == 4 and got["generation"]["fingerprint"] == "a", got
    assert got["generation"]["gate"] == {"median": 2.5} and got["generation"]["env"] == {"HF_TOKEN": "hf_secret"}
    _lastgood.drop_pending(pidfile)
    assert not os.path.exists(_lastgood.pending_path(pidfile))
    _lastgood.drop_pending(pidfile)  # none there is fine


def test_a_generation_put_aside_for_the_running_server_is_kept_before_a_restart_whatever_it_brings(tmp_path):
    """The running server (a live process carrying the launch tag) was verified but not recorded: its pending
    generation becomes the newest last known good before a restart of another definition, so a failed restart goes
    back to it, not past it."""
    pidfile, state = str(tmp_path / "run" / "sglang.pid"), str(tmp_path / "state" / "sglang.json")
    os.makedirs(os.path.dirname(pidfile))
    os.makedirs(os.path.dirname(state))
    _lastgood.keep(_lastgood.path_for(state), _lastgood.generation(P, "f0", None, None), 3)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env=dict(os.environ, GPUFLEET_SERVICE="sglang"))
    try:
        ident = (proc.pid, _proc.read_proc(proc.pid).start_time)
        with open(pidfile, "w") as f:
            f.write("%d %d\n" % ident)
        _lastgood.keep_pending(pidfile, _lastgood.generation(P, "f1", None, None), 3, (proc.pid, ident[1] + 1))
        assert _lastgood.promote_running_pending(pidfile, state, "GPUFLEET_SERVICE", "sglang") is None  # pid reused
        _lastgood.keep_pending(pidfile, _lastgood.generation(P, "f1", None, None), 3, ident)
        assert _lastgood.promote_running_pending(pidfile, state, "GPUFLEET_SERVICE", "other") is None  # not its tag
        gens = _lastgood.promote_running_pending(pidfile, state, "GPUFLEET_SERVICE", "sglang")
        assert [g["fingerprint"] for g in gens] == ["f1", "f0"] and not os.path.exists(_lastgood.pending_path(pidfile))
    finally:
        proc.kill()
        proc.wait()
    assert _lastgood.promote_running_pending(pidfile, state, "GPUFLEET_SERVICE", "sglang") is None  # nothing left


def test_a_generation_whose_files_are_gone_is_no_rollback_target(tmp_path):
    script, model = tmp_path / "serve.py", tmp_path / "model"
    script.write_text("")
    model.mkdir()
    p = dict(P, command=["python3", str(script), "--model-path=%s" % model, "--log", str(tmp_path / "never")])
    assert _lastgood.argv_paths(p["command"]) == [str(script), str(model), str(tmp_path / "never")]
    g = _lastgood.generation(p, "f0", None, None)
    assert g["paths"] == [str(script), str(model)]  # what existed when it passed
    assert _lastgood.rollback_target([g], "f1", "process") == g and _lastgood.missing_paths(g) == []
    script.unlink()
    assert _lastgood.missing_paths(g) == [str(script)]
    assert _lastgood.rollback_target([g], "f1", "process") is None


UNIT_FILES = [{"path": "/etc/systemd/system/gpufleet-sglang.service", "mode": "0644", "content": "[Service]\n"},
              {"path": "/etc/gpufleet/sglang.env", "mode": "0600", "content": "HF_TOKEN=hf_secret\n"}]


def test_a_systemd_generation_is_a_rollback_target_only_with_its_unit_files_and_for_the_same_launcher():
    s = dict(P, launcher="systemd", command=None, env=None, systemd={"unit": "gpufleet-sglang.service"})
    with_files = _lastgood.generation(s, "f0", None, None, UNIT_FILES)
    assert with_files["systemd_files"] == UNIT_FILES and with_files["systemd_unit"] == "gpufleet-sglang.service"
    assert _lastgood.rollback_target([with_files], "f1", "systemd") == with_files
    # Recorded before gpufleet kept a unit's files (or they could not be read then): nothing to launch again.
    without = _lastgood.generation(s, "f0", None, None)
    assert without["systemd_files"] is None and not _lastgood.relaunchable(without)
    assert _lastgood.rollback_target([without], "f1", "systemd") is None
    # The failed restart moved the server to the other launcher: its generations are the old launcher's.
    assert _lastgood.rollback_target([with_files], "f1", "process") is None
    assert _lastgood.rollback_target([_lastgood.generation(P, "f0", None, None)], "f1", "systemd") is None
    # What a result may show of them: never the files (the environment file's values are secret).
    assert "hf_secret" not in json.dumps(_lastgood.summary([with_files]))
