# SPDX-License-Identifier: GPL-3.0-or-later
"""server_state main() in-process: check (fingerprint, launcher, GPU holders, worker env), record, lock/unlock.

Real tagged processes hold the fake NVML's GPUs; the fake NVML is the only double.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from helpers import FAKE_NVML_DIR, wait_for

from ansible_collections.gpufleet.serving.plugins.module_utils import _hostlock, _proc, _state, _statefile
from ansible_collections.gpufleet.serving.plugins.modules import server_state


# Unique per test process: other test sessions on this machine run tagged "demo" servers too.
NAME = "ut-%s" % uuid.uuid4().hex[:10]


class Server:
    """A tagged "server" process holding both fake GPUs, with a pidfile; env holds NCCL_PROTO and a secret."""

    def __init__(self, nvml, tmp_path, env=None, tag=("GPUFLEET_SERVICE", None)):
        ready = tmp_path / ("ready-%d" % len(os.listdir(tmp_path)))
        e = dict(nvml.env, NCCL_PROTO="LL", HF_TOKEN="hf_secret", **(env or {}))
        if tag:
            e[tag[0]] = tag[1] or NAME
        self.p = subprocess.Popen([sys.executable, str(FAKE_NVML_DIR / "fake_gpu.py"), "hold", "--gpu", "0", "--gpu", "1",
                                   "--mib", "100", "--ready-file", str(ready)], env=e)
        wait_for(ready.exists, 10, "server holding the GPUs")
        self.pid = self.p.pid
        self.start = _proc.read_proc(self.pid).start_time

    def write_pidfile(self, path):
        path.write_text("%d %d\n" % (self.pid, self.start))

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait()


@pytest.fixture
def servers(nvml, tmp_path):
    made = []

    def make(**kw):
        s = Server(nvml, tmp_path, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.kill()


@pytest.fixture
def paths(tmp_path):
    return {"state_file": str(tmp_path / "lib" / "demo.json"), "pidfile": str(tmp_path / "run" / "demo.pid"),
            "lock_file": str(tmp_path / "run" / "demo.lock")}


def check_args(paths, **kw):
    a = {"action": "check", "name": NAME, "state_file": paths["state_file"], "pidfile": paths["pidfile"],
         "fingerprint": "f" * 64, "expected_env": {"NCCL_PROTO": "LL"}}
    a.update(kw)
    return a


def running(servers, paths, run_module):
    """A tagged server holding the GPUs, launched and recorded with fingerprint f*64."""
    s = servers()
    os.makedirs(os.path.dirname(paths["pidfile"]))
    s.write_pidfile(Path(paths["pidfile"]))
    r = run_module(server_state.main, {"action": "record", "name": NAME, "state_file": paths["state_file"],
                                       "pidfile": paths["pidfile"], "fingerprint": "f" * 64, "timings": {"kill_s": 0.5}})
    assert r["changed"] is True
    return s


def test_nothing_running_needs_a_restart(nvml, paths, run_module):
    r = run_module(server_state.main, check_args(paths))
    assert r["changed"] is False and r["needs_restart"] is True and r["running"] is False
    assert r["reasons"] == ["server is not running", "desired state changed (fingerprint none -> ffffffffffff)",
                            "GPU 0 is not held by a %s worker" % NAME, "GPU 1 is not held by a %s worker" % NAME]
    assert r["workers"] == [] and r["strays"] == [] and r["fingerprint_recorded"] is None


def test_up_to_date_server_needs_nothing_and_record_is_idempotent(servers, paths, run_module):
    s = running(servers, paths, run_module)
    r = run_module(server_state.main, check_args(paths))
    assert r["needs_restart"] is False and r["reasons"] == [], r
    assert r["running"] is True and r["fingerprint_recorded"] == "f" * 64
    assert [(w["pid"], w["holds_gpu"]) for w in r["workers"]] == [(s.pid, True)]
    assert r["gpu_holders"] == {"0": [s.pid], "1": [s.pid]}
    assert "hf_secret" not in json.dumps(r)
    again = run_module(server_state.main, {"action": "record", "name": NAME, "state_file": paths["state_file"],
                                           "pidfile": paths["pidfile"], "fingerprint": "f" * 64})
    assert again["changed"] is False
    st = json.loads(open(paths["state_file"]).read())
    assert st["pid"] == s.pid and st["start_time"] == s.start and st["timings"] == {"kill_s": 0.5}


def test_drift_reasons(servers, paths, run_module):
    s = running(servers, paths, run_module)
    stray = servers(tag=None)
    expected = {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring"}
    r = run_module(server_state.main, check_args(paths, fingerprint="a" * 64, expected_env=expected))
    assert r["needs_restart"] is True
    assert "desired state changed (fingerprint ffffffffffff -> aaaaaaaaaaaa)" in r["reasons"]
    assert "GPUs held by 2 process(es) without this server's launch tag" in r["reasons"]
    assert r["env_problems"] == {str(s.pid): ["NCCL_ALGO", "NCCL_PROTO"]}
    assert "workers lack the expected environment: pid %d: NCCL_ALGO NCCL_PROTO" % s.pid in r["reasons"]
    assert sorted((x["gpu"], x["pid"]) for x in r["strays"]) == [(0, stray.pid), (1, stray.pid)]
    assert "Simple" not in json.dumps(r["workers"]) and "hf_secret" not in json.dumps(r)


def test_orphans_without_their_launcher(servers, paths, run_module):
    s = running(servers, paths, run_module)
    orphan = servers()  # tagged, holding the GPUs, but the pidfile names the dead launcher
    s.kill()
    r = run_module(server_state.main, check_args(paths))
    assert r["running"] is False and "server is not running" in r["reasons"]
    assert "1 tagged process(es) alive without their launcher (orphans)" in r["reasons"]
    assert [w["pid"] for w in r["workers"]] == [orphan.pid]


def test_check_with_lock_takes_and_releases_it_when_nothing_is_to_do(servers, paths, run_module):
    running(servers, paths, run_module)
    r = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"], owner="ctl:1:a"))
    # Taken and released in the same call: the host is as it was.
    assert r["needs_restart"] is False and r["locked"] is False and r["changed"] is False
    assert not os.path.exists(paths["lock_file"])
    kept = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"], owner="ctl:1:a", keep_lock=True))
    assert kept["locked"] is True and json.load(open(paths["lock_file"]))["owner"] == "ctl:1:a"
    assert kept["changed"] is True  # the lock file it leaves behind


def test_check_needing_a_restart_keeps_the_lock_and_another_run_is_refused(nvml, paths, run_module):
    r = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"], owner="ctl:1:a"))
    assert r["needs_restart"] is True and r["locked"] is True and r["changed"] is True
    other = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"], owner="ctl:2:b"))
    assert other["failed"] is True and other["holder"] == "ctl:1:a"
    assert "locked by another gpufleet run (ctl:1:a)" in other["msg"]
    broke = run_module(server_state.main,
                       check_args(paths, lock_file=paths["lock_file"], owner="ctl:2:b", break_owner="ctl:1:a"))
    assert "failed" not in broke and broke["locked"] is True
    assert json.load(open(paths["lock_file"]))["owner"] == "ctl:2:b"


def _dead_runs_lock_with_worker(paths, seconds):
    """The lock of dead run ctl:1:a, under which a real host process (a restart going on) works for `seconds`."""
    os.makedirs(os.path.dirname(paths["lock_file"]), exist_ok=True)
    _hostlock.acquire_lock(paths["lock_file"], "ctl:1:a", 600, 0)
    w = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(%s)" % seconds])
    assert _hostlock.mark_lock(paths["lock_file"], "ctl:1:a", (w.pid, _proc.read_proc(w.pid).start_time))
    assert not _hostlock.mark_lock(paths["lock_file"], "ctl:9:z", (w.pid, 0)), "marked another run's lock"
    return w


def test_takeover_waits_for_the_dead_runs_restart_still_running_on_the_host(nvml, paths, run_module):
    import threading
    import time

    # 3 s: the check must find the worker still running even on a loaded CI machine.
    w = _dead_runs_lock_with_worker(paths, 3.0)
    threading.Thread(target=w.wait).start()  # reaped when it exits, like a module whose parent is sshd
    t0 = time.monotonic()
    r = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"], owner="ctl:2:b",
                                                 break_owner="ctl:1:a"))
    assert "failed" not in r, r
    assert time.monotonic() - t0 >= 2.0 and w.poll() is not None, "took over while the restart still ran"
    # The warning naming the worker is asserted through a real rollout (test_rel_faults_lock): in the whole suite's
    # one process, module warnings are not always in this in-process result.
    if "warnings" in r:
        assert "still running on this host as pid %d" % w.pid in json.dumps(r["warnings"]), r["warnings"]
    assert r["locked"] is True and json.load(open(paths["lock_file"]))["owner"] == "ctl:2:b"


def test_takeover_gives_up_after_the_lock_ttl_and_leaves_the_lock(nvml, paths, run_module):
    w = _dead_runs_lock_with_worker(paths, 30)
    try:
        r = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"], owner="ctl:2:b",
                                                     break_owner="ctl:1:a", lock_ttl=0.3))
        assert r["failed"] is True and "still running on this host (pid %d)" % w.pid in r["msg"], r
        assert r["holder"] == "ctl:1:a" and json.load(open(paths["lock_file"]))["owner"] == "ctl:1:a"
        assert w.poll() is None
    finally:
        w.kill()
        w.wait()


def test_check_mode_check_takes_no_lock(nvml, paths, run_module):
    r = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"], owner="ctl:1:a"), check_mode=True)
    # No lock taken, but `changed` predicts the real call, which keeps the lock for the restart.
    assert r["needs_restart"] is True and r["locked"] is False and r["changed"] is True
    assert not os.path.exists(paths["lock_file"])


def test_lock_unlock_actions_and_their_check_mode(paths, run_module):
    lk = {"name": NAME, "state_file": paths["state_file"], "lock_file": paths["lock_file"]}
    r = run_module(server_state.main, dict(lk, action="lock", owner="ctl:1:a"), check_mode=True)
    assert r["changed"] is True and not os.path.exists(paths["lock_file"])
    r = run_module(server_state.main, dict(lk, action="lock", owner="ctl:1:a"))
    assert r["changed"] is True and r["locked"] is True and r["acquired"] is True
    r = run_module(server_state.main, dict(lk, action="lock", owner="ctl:1:a"))
    assert r["changed"] is False and r["locked"] is True  # its own lock again: nothing changes
    r = run_module(server_state.main, dict(lk, action="lock", owner="ctl:2:b"))
    assert r["failed"] is True and r["holder"] == "ctl:1:a"
    r = run_module(server_state.main, dict(lk, action="unlock", owner="ctl:2:b"))
    assert r["released"] is False and r["changed"] is False and os.path.exists(paths["lock_file"])
    r = run_module(server_state.main, dict(lk, action="unlock", owner="ctl:1:a"), check_mode=True)
    assert r["released"] is False and r["changed"] is True and os.path.exists(paths["lock_file"])
    r = run_module(server_state.main, dict(lk, action="unlock", owner="ctl:1:a"))
    assert r["released"] is True and r["changed"] is True and not os.path.exists(paths["lock_file"])


@pytest.mark.parametrize("args, msg", [
    ({"action": "record", "name": NAME, "state_file": "/tmp/x.json"}, "action is record but all of the following are missing: fingerprint, pidfile"),
    ({"action": "lock", "name": NAME, "state_file": "/tmp/x.json"}, "action is lock but all of the following are missing: lock_file, owner"),
    ({"action": "nope", "name": NAME, "state_file": "/tmp/x.json"}, "value of action must be one of: check, record, lock, unlock, got: nope"),
])
def test_bad_input(run_module, args, msg):
    r = run_module(server_state.main, args)
    assert r["failed"] is True and msg in r["msg"], r["msg"]


@pytest.mark.parametrize("kw, msg", [
    ({"lock_ttl": -5}, "lock_ttl must be a number of seconds > 0, got -5.0"),
    ({"lock_ttl": 0}, "lock_ttl must be a number of seconds > 0"),
    ({"lock_ttl": "nan"}, "lock_ttl must be a number of seconds > 0, got nan"),
    ({"lock_ttl": "inf"}, "lock_ttl must be a number of seconds > 0, got inf"),
    ({"lock_wait": -5}, "lock_wait must be a number of seconds >= 0, got -5.0"),
    ({"lock_wait": "nan"}, "lock_wait must be a number of seconds >= 0, got nan"),
    ({"owner": " "}, "owner must not be empty"),
])
def test_a_lock_that_excludes_nobody_is_refused_and_nothing_is_written(paths, run_module, kw, msg):
    for action in ("lock", "check"):
        args = dict(check_args(paths), action=action, lock_file=paths["lock_file"], owner="ctl:1:a")
        r = run_module(server_state.main, dict(args, **kw))
        assert r["failed"] is True and msg in r["msg"], r["msg"]
        assert not os.path.exists(paths["lock_file"])


def test_a_lock_file_that_is_a_directory_is_named(paths, run_module):
    os.makedirs(paths["lock_file"])
    r = run_module(server_state.main, {"action": "lock", "name": NAME, "state_file": paths["state_file"],
                                       "lock_file": paths["lock_file"], "owner": "ctl:1:a"})
    assert r["failed"] is True and "lock_file %s is a directory" % paths["lock_file"] in r["msg"], r["msg"]


def test_check_keeps_a_lock_this_run_already_held_and_reports_no_change_for_it(servers, paths, run_module):
    running(servers, paths, run_module)
    lk = dict(lock_file=paths["lock_file"], owner="ctl:1:a")
    assert run_module(server_state.main, dict(check_args(paths), action="lock", **lk))["changed"] is True
    # Up to date: the run's own lock, taken before, is not dropped (it was dropped, reported unchanged).
    for check_mode in (True, False):
        r = run_module(server_state.main, check_args(paths, **lk), check_mode=check_mode)
        assert r["needs_restart"] is False and r["changed"] is False and r["locked"] is True, r
        assert os.path.exists(paths["lock_file"])
    run_module(server_state.main, dict(check_args(paths), action="unlock", **lk))
    # Restart needed: the first check takes the lock (changed), a second identical one changes nothing more, and
    # check mode predicted both.
    drift = check_args(paths, fingerprint="e" * 64, **lk)
    predicted = run_module(server_state.main, drift, check_mode=True)
    first = run_module(server_state.main, drift)
    predicted2 = run_module(server_state.main, drift, check_mode=True)
    second = run_module(server_state.main, drift)
    assert predicted["changed"] is True and first["changed"] is True and first["locked"] is True
    assert predicted2["changed"] is False and second["changed"] is False and second["locked"] is True


@pytest.mark.parametrize("launchable, problems", [
    ({"command": "/nonexistent/python3"}, ["command[0] /nonexistent/python3 is not an executable file"]),
    ({"command": "/usr/bin"}, ["command[0] /usr/bin is not an executable file"]),
    ({"command": "NOTEXEC"}, ["command[0] NOTEXEC is not an executable file"]),  # a file, mode 0644
    ({"command": sys.executable, "user": "no-such-user-ut", "workdir": "/nonexistent/dir"},
     ["user no-such-user-ut does not exist", "workdir /nonexistent/dir is not a directory"]),
])
def test_check_refuses_an_unlaunchable_server_before_taking_the_lock(servers, paths, run_module, tmp_path, launchable,
                                                                     problems):
    plain = tmp_path / "plain.py"
    plain.write_text("print(1)\n")
    plain.chmod(0o644)
    launchable = {k: v.replace("NOTEXEC", str(plain)) for k, v in launchable.items()}
    problems = [x.replace("NOTEXEC", str(plain)) for x in problems]
    running(servers, paths, run_module)
    r = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"], owner="ctl:1:a", launchable=launchable))
    assert r["failed"] and r["launch_problems"] == problems, r
    assert r["msg"] == "cannot run this server: %s." % "; ".join(problems)
    assert not os.path.exists(paths["lock_file"])


def test_check_accepts_a_launchable_server(servers, paths, run_module, tmp_path):
    running(servers, paths, run_module)
    for la in ({"command": sys.executable, "user": "root", "workdir": str(tmp_path)},
               {"command": "python3", "user": "0"}):  # a bare name is resolved on PATH at launch; a uid works
        r = run_module(server_state.main, check_args(paths, launchable=la))
        assert "failed" not in r and r["needs_restart"] is False, r


def test_nccl_layers_up_to_date_only_when_the_layer_module_would_change_nothing(servers, paths, run_module, tmp_path):
    from ansible_collections.gpufleet.serving.plugins.modules import nccl_conf

    running(servers, paths, run_module)
    conf = tmp_path / "nccl.conf"
    layer = {"path": str(conf), "env": {"NCCL_P2P_LEVEL": "SYS"}, "name": "nccl", "nccl_names": "ignore"}
    applied = run_module(nccl_conf.main, layer)
    assert applied["changed"] is True
    text = conf.read_text()

    r = run_module(server_state.main, check_args(paths, nccl_layers={"nccl_conf": layer}))
    assert r["needs_restart"] is False and r["up_to_date"] is True, r
    assert r["nccl_layers"]["up_to_date"] is True and r["nccl_layers"]["nccl_conf"]["up_to_date"] is True

    # Another value: the layer would change, so the host is not up to date; nothing is written by the check.
    r = run_module(server_state.main, check_args(paths, nccl_layers={"nccl_conf": dict(layer, env={"NCCL_P2P_LEVEL": "PHB"})}))
    assert r["needs_restart"] is False and r["up_to_date"] is False and r["nccl_layers"]["nccl_conf"]["up_to_date"] is False
    assert conf.read_text() == text
    # A layer the module would refuse: not up to date, with its error; the check itself does not fail.
    r = run_module(server_state.main, check_args(paths, nccl_layers={"nccl_conf": dict(layer, state="bogus")}))
    assert "failed" not in r and r["up_to_date"] is False
    assert "state" in r["nccl_layers"]["nccl_conf"]["error"], r["nccl_layers"]
    r = run_module(server_state.main, check_args(paths, nccl_layers={"nccl_conf": dict(layer, env={"NCCL_ALGO": "Ring\nX"})}))
    assert "failed" not in r and r["up_to_date"] is False and r["nccl_layers"]["nccl_conf"]["error"], r["nccl_layers"]
    assert conf.read_text() == text


def test_up_to_date_is_false_when_a_restart_is_needed_even_with_the_layers_right(nvml, paths, run_module, tmp_path):
    layer = {"path": str(tmp_path / "nccl.conf"), "env": {}, "state": "absent", "name": "nccl"}
    r = run_module(server_state.main, check_args(paths, nccl_layers={"nccl_conf": layer}))
    assert r["nccl_layers"]["up_to_date"] is True and r["needs_restart"] is True and r["up_to_date"] is False


def test_pid_only_pidfile_is_the_server_only_with_the_launch_tag(servers, paths, run_module):
    """Issue 13: a pidfile (a pid, or gpufleet's 'PID START_TIME') names the server only when that process carries the
    launch tag; an unrelated process it names (the server stopped by hand, or a pid and start time written by hand) is
    never reported as the server running."""
    s = running(servers, paths, run_module)
    r = run_module(server_state.main, check_args(paths))
    # gpufleet's own 'PID START_TIME' pidfile: the start time matches, yet the launch tag is what confirms
    assert r["running"] is True and r["pidfile"]["confirmed_by"] == "tag", r["pidfile"]
    unrelated = subprocess.Popen(["sleep", "600"], start_new_session=True)
    # Its exec done (an empty /proc/PID/cmdline in between read as '[sleep]' on a loaded machine).
    deadline = time.monotonic() + 60
    while Path("/proc/%d/cmdline" % unrelated.pid).read_bytes() != b"sleep\x00600\x00":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        s.kill()
        Path(paths["pidfile"]).write_text("%d\n" % unrelated.pid)
        r = run_module(server_state.main, check_args(paths))
        assert r["running"] is False and "server is not running" in r["reasons"] and r["needs_restart"] is True
        pf = r["pidfile"]
        assert pf["pid"] == unrelated.pid and pf["status"] == "unconfirmed" and pf["cmdline"] == "sleep 600", pf
        # its pid AND its real start time: a matching start time alone confirms nothing
        Path(paths["pidfile"]).write_text("%d %d\n" % (unrelated.pid, _proc.read_proc(unrelated.pid).start_time))
        r = run_module(server_state.main, check_args(paths))
        assert r["running"] is False and "server is not running" in r["reasons"] and r["needs_restart"] is True
        pf = r["pidfile"]
        assert pf["pid"] == unrelated.pid and pf["status"] == "unconfirmed" and pf["confirmed_by"] is None, pf
        tagged = servers()
        Path(paths["pidfile"]).write_text("%d\n" % tagged.pid)
        r = run_module(server_state.main, check_args(paths))
        assert r["running"] is True and r["pidfile"]["confirmed_by"] == "tag", r["pidfile"]
        Path(paths["pidfile"]).write_text("garbage")
        r = run_module(server_state.main, check_args(paths))
        assert r["running"] is False and r["pidfile"]["status"] == "unreadable", r["pidfile"]
    finally:
        unrelated.kill()
        unrelated.wait()


def test_an_nccl_layer_other_users_cannot_read_is_not_up_to_date(servers, paths, run_module, tmp_path):
    """Issue 16 item 4: root reads a 0600 nccl.conf, the server's user does not; the fast check must not call such a
    host up to date (the roles make the file readable)."""
    from ansible_collections.gpufleet.serving.plugins.modules import nccl_conf

    running(servers, paths, run_module)
    conf = tmp_path / "nccl.conf"
    layer = {"path": str(conf), "env": {"NCCL_P2P_LEVEL": "SYS"}, "name": "nccl", "nccl_names": "ignore"}
    assert run_module(nccl_conf.main, layer)["changed"] is True
    os.chmod(conf, 0o600)
    r = run_module(server_state.main, check_args(paths, nccl_layers={"nccl_conf": layer}))
    assert r["needs_restart"] is False and r["up_to_date"] is False, r
    assert r["nccl_layers"]["nccl_conf"]["access"] == ["%s is not readable by every user (mode 0600)" % conf]
    assert os.stat(conf).st_mode & 0o777 == 0o600  # the check writes nothing
    assert run_module(nccl_conf.main, layer)["changed"] is True and os.stat(conf).st_mode & 0o777 == 0o644
    r = run_module(server_state.main, check_args(paths, nccl_layers={"nccl_conf": layer}))
    assert r["up_to_date"] is True and "access" not in r["nccl_layers"]["nccl_conf"], r


def test_check_without_an_owner_only_looks_at_the_lock(servers, paths, run_module):
    """The rollout's up-to-date check: an up-to-date host that another run holds is not "already right", and the
    check neither takes, changes nor breaks the lock; a free or expired lock does not count."""
    running(servers, paths, run_module)
    free = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"]))
    assert free["up_to_date"] is True and "lock_holder" not in free and "locked" not in free
    assert not os.path.exists(paths["lock_file"])

    _hostlock.acquire_lock(paths["lock_file"], "ctl:9:z", 600, 0)
    before = open(paths["lock_file"]).read()
    held = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"]))
    assert held["needs_restart"] is False and held["up_to_date"] is False and held["lock_holder"] == "ctl:9:z", held
    assert open(paths["lock_file"]).read() == before

    lock = json.loads(before)
    lock["expires"] = 1.0  # long past
    with open(paths["lock_file"], "w") as f:
        json.dump(lock, f)
    expired = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"]))
    assert expired["up_to_date"] is True and "lock_holder" not in expired
    assert json.load(open(paths["lock_file"]))["owner"] == "ctl:9:z"  # left for its owner or the next locker


def test_check_reads_the_drain_record_in_the_same_call(servers, paths, run_module, tmp_path):
    """The rollout's fast path reads the host's drain record in its one server_state call (issue 25: one round trip per
    no-op host): no record is none, a record is returned as rotation_record reads it, an unreadable one makes the host
    not up to date and says why. The file is never written, in check mode neither."""
    from ansible_collections.gpufleet.serving.plugins.modules import rotation_record

    running(servers, paths, run_module)
    rec = tmp_path / "rotation" / "demo.json"
    none = run_module(server_state.main, check_args(paths, rotation_file=str(rec)))
    assert none["up_to_date"] is True and none["drain_records"] == {} and not rec.exists(), none
    added = run_module(rotation_record.main, {"path": str(rec), "action": "add", "balancer": "haproxy", "found": "UP",
                                              "server": "host1", "run": "ctl:1:x"})
    for check_mode in (False, True):
        r = run_module(server_state.main, check_args(paths, rotation_file=str(rec)), check_mode=check_mode)
        assert r["up_to_date"] is True and r["drain_records"] == added["records"] and "haproxy" in r["drain_records"], r
    before = rec.read_bytes()
    rec.write_text("[]")
    bad = run_module(server_state.main, check_args(paths, rotation_file=str(rec)))
    assert bad["up_to_date"] is False and "drain_records" not in bad, bad
    assert bad["drain_record_error"].startswith("drain record %s: " % rec) and "not a gpufleet drain record" in \
        bad["drain_record_error"], bad
    assert rec.read_text() == "[]" and before  # read, never written


def test_a_server_that_is_not_the_verified_launch_on_record_needs_a_restart(servers, paths, run_module):
    """A relaunch whose checks failed (not ready, workers without the environment) is not recorded; the server it
    left running under the pidfile must not pass for the recorded one when the fingerprint goes back to the record."""
    verified = running(servers, paths, run_module)
    ok = run_module(server_state.main, check_args(paths, expected_env={}))
    assert ok["needs_restart"] is False, ok["reasons"]
    verified.kill()
    unverified = servers()  # launched afterwards, its checks failed: the pidfile names it, the record does not
    unverified.write_pidfile(Path(paths["pidfile"]))

    r = run_module(server_state.main, check_args(paths, expected_env={}))

    assert r["running"] is True and r["needs_restart"] is True, r
    assert ("the running server (pid %d) is not the verified launch on record (pid %d)" % (unverified.pid, verified.pid)
            in r["reasons"]), r["reasons"]
    assert not [x for x in r["reasons"] if "fingerprint" in x or "not running" in x], r["reasons"]


def test_the_state_file_is_root_only_under_umask_000_and_the_check_reads_it(servers, paths, run_module):
    """The state file's fingerprint is an unsalted digest over the definition, secret env values included: readable
    by others it would let a local user test guesses of a secret. It is 0600 whatever the umask; the check (the audit,
    the rollout's fast check) still reads it, and the lock stays 0644."""
    old = os.umask(0)
    try:
        running(servers, paths, run_module)
        r = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"], owner="ctl:1:a",
                                                     keep_lock=True))
    finally:
        os.umask(old)
    assert os.stat(paths["state_file"]).st_mode & 0o7777 == 0o600
    assert r["fingerprint_recorded"] == "f" * 64 and r["needs_restart"] is False and r["locked"] is True, r
    assert os.stat(paths["lock_file"]).st_mode & 0o7777 == 0o644


def test_a_launch_marked_unverified_needs_a_restart_until_recorded(servers, paths, run_module):
    """server_restart marks the record before each launch; a launch that failed its checks (or a run cut short) leaves
    the mark, and the same server then needs a restart although its pid and fingerprint are the record's."""
    running(servers, paths, run_module)
    assert run_module(server_state.main, check_args(paths))["needs_restart"] is False
    _statefile.mark_unverified(paths["state_file"])
    assert os.stat(paths["state_file"]).st_mode & 0o777 == 0o600
    r = run_module(server_state.main, check_args(paths))
    assert r["needs_restart"] is True
    assert "the last launch by gpufleet did not pass its checks (or its run was interrupted)" in r["reasons"]
    run_module(server_state.main, {"action": "record", "name": NAME, "state_file": paths["state_file"],
                                   "pidfile": paths["pidfile"], "fingerprint": "f" * 64})
    assert run_module(server_state.main, check_args(paths))["needs_restart"] is False


def test_record_refuses_a_pidfile_naming_an_untagged_or_reused_process(paths, run_module, tmp_path):
    os.makedirs(os.path.dirname(paths["pidfile"]))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # not tagged: not the server
    try:
        st = int(open("/proc/%d/stat" % other.pid).read().rsplit(")", 1)[1].split()[19])
        rec = {"action": "record", "name": NAME, "state_file": paths["state_file"], "pidfile": paths["pidfile"],
               "fingerprint": "f" * 64}
        Path(paths["pidfile"]).write_text("%d %d\n" % (other.pid, st))
        r = run_module(server_state.main, rec)
        assert r["failed"] and "does not carry the launch tag GPUFLEET_SERVICE=%s; not recorded" % NAME in r["msg"], r
        Path(paths["pidfile"]).write_text("%d %d\n" % (other.pid, st + 7))
        r = run_module(server_state.main, rec)
        assert r["failed"] and "which is another process now" in r["msg"], r
        assert not os.path.exists(paths["state_file"])
    finally:
        other.kill()
        other.wait()


def test_an_expired_lock_of_this_run_is_taken_anew_so_no_other_run_can_break_it(paths, run_module):
    os.makedirs(os.path.dirname(paths["lock_file"]))
    Path(paths["lock_file"]).write_text(json.dumps({"owner": "ctl:1:a", "acquired": 1, "expires": 2}))
    lk = {"name": NAME, "state_file": paths["state_file"], "lock_file": paths["lock_file"]}
    r = run_module(server_state.main, dict(lk, action="lock", owner="ctl:1:a"))
    assert r["changed"] is False and r["locked"] is True, r  # its own lock: no new owner
    assert json.loads(Path(paths["lock_file"]).read_text())["expires"] > 2
    r = run_module(server_state.main, dict(lk, action="lock", owner="ctl:2:b"))
    assert r["failed"] is True and r["holder"] == "ctl:1:a", r


def test_check_mode_predicts_the_failure_on_another_runs_live_lock(servers, paths, run_module):
    running(servers, paths, run_module)
    assert run_module(server_state.main, dict(check_args(paths), action="lock", lock_file=paths["lock_file"],
                                              owner="ctl:2:b"))["changed"] is True
    for check_mode in (True, False):
        r = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"], owner="ctl:1:a"),
                       check_mode=check_mode)
        assert r["failed"] is True and "locked by another gpufleet run (ctl:2:b)" in r["msg"], (check_mode, r)
        assert r["holder"] == "ctl:2:b"


def test_wait_die_an_earlier_runs_lock_fails_at_once_in_check_mode_too_and_a_later_one_is_waited_for(
        servers, paths, run_module):
    """Wait-die (issue 24): with a long lock_wait, an earlier run's lock still fails the call at once, and check mode
    predicts it; a later run's lock is waited for, and the wait is reported."""
    running(servers, paths, run_module)
    early, late = "ctl-a:1:b.1.u:1000.000000", "ctl-b:2:b.2.u:2000.000000"
    assert run_module(server_state.main, dict(check_args(paths), action="lock", lock_file=paths["lock_file"],
                                              owner=early))["locked"] is True
    for check_mode in (True, False):
        t0 = time.monotonic()
        r = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"], owner=late, lock_wait=60),
                       check_mode=check_mode)
        assert time.monotonic() - t0 < 10
        assert r["failed"] is True and r["holder"] == early, (check_mode, r)
        assert r["msg"].startswith("host is locked by an earlier gpufleet run %s (started " % early), r["msg"]
    run_module(server_state.main, dict(check_args(paths), action="unlock", lock_file=paths["lock_file"], owner=early))
    run_module(server_state.main, dict(check_args(paths), action="lock", lock_file=paths["lock_file"], owner=late))
    th = threading.Timer(0.5, os.unlink, (paths["lock_file"],))
    th.start()
    try:
        r = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"], owner=early, lock_wait=30))
    finally:
        th.join()
    assert not r.get("failed") and r["lock_waited"]["for"] == late and r["lock_waited"]["s"] >= 0.4, r
    # The warning (how long, for whom) is asserted through a real rollout (test_rel_faults_lock): in-process module
    # warnings are not always in this result.
    if "warnings" in r:
        assert "for the host lock of a later gpufleet run %s" % late in json.dumps(r["warnings"]), r["warnings"]


def test_record_of_a_missing_or_garbage_pidfile_warns_and_records_no_pid(paths, run_module):
    os.makedirs(os.path.dirname(paths["pidfile"]))
    rec = {"action": "record", "name": NAME, "state_file": paths["state_file"], "pidfile": paths["pidfile"],
           "fingerprint": "f" * 64}
    for content in (None, "garbage\n", "%d\n" % os.getpid()):
        if content is not None:
            Path(paths["pidfile"]).write_text(content)
        r = run_module(server_state.main, rec)
        assert not r.get("failed") and r["state"]["pid"] is None, r
        # The warning's text when the in-process result carries warnings (the whole suite's process may drop them).
        assert "warnings" not in r or "recorded without a pid" in json.dumps(r["warnings"]), r


@pytest.mark.parametrize("record", ["missing", "old", "unverified"])
def test_a_server_carrying_this_fingerprint_is_kept_unless_its_launch_is_marked_unverified(servers, paths, run_module,
                                                                                           record):
    """Issue 24: a verified restart whose record could not be written (a full state filesystem). Its launcher carries
    the fingerprint (server_restart sets GPUFLEET_SERVICE_FINGERPRINT at the launch): the check keeps it and, with the
    lock, records it. A record marking the launch unverified (it failed its checks) still restarts it."""
    s = servers(env={"GPUFLEET_SERVICE_FINGERPRINT": "f" * 64})
    os.makedirs(os.path.dirname(paths["pidfile"]))
    s.write_pidfile(Path(paths["pidfile"]))
    os.makedirs(os.path.dirname(paths["state_file"]))
    if record == "old":  # the record of the server before this restart
        Path(paths["state_file"]).write_text(json.dumps({"fingerprint": "e" * 64, "pid": 1, "start_time": 1}))
    elif record == "unverified":
        Path(paths["state_file"]).write_text(json.dumps({"verified": False}))
    args = check_args(paths, lock_file=paths["lock_file"], owner="ctl:1:run")
    r = run_module(server_state.main, args)
    if record == "unverified":
        assert r["needs_restart"] is True and "did not pass its checks" in " ".join(r["reasons"]), r
        return
    assert r["needs_restart"] is False and r["reasons"] == [] and r["unrecorded"] is True, r
    assert r["up_to_date"] is False and r["recorded"] is True and r["changed"] is True, r
    assert "kept, and recorded again" in r["notes"][0]
    st = json.loads(open(paths["state_file"]).read())
    assert (st["fingerprint"], st["pid"], st["start_time"]) == ("f" * 64, s.pid, s.start)
    again = run_module(server_state.main, args)
    assert again["needs_restart"] is False and again["up_to_date"] is True and "unrecorded" not in again, again


def test_a_record_that_still_cannot_be_written_is_said_in_the_result_and_a_warning(
        servers, paths, run_module, monkeypatch):
    """Bug F: the rerun while the state filesystem stays full keeps the server and says the record is still missing,
    in a result key the role passes to the rollout summary (a warning alone scrolls by)."""
    s = servers(env={"GPUFLEET_SERVICE_FINGERPRINT": "f" * 64})
    os.makedirs(os.path.dirname(paths["pidfile"]))
    s.write_pidfile(Path(paths["pidfile"]))
    os.makedirs(os.path.dirname(paths["state_file"]))

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_statefile, "record_state", full)
    r = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"], owner="ctl:1:run"))
    assert r["needs_restart"] is False and r["unrecorded"] is True and "recorded" not in r, r
    assert r["record_missing"] == (
        "the running server (pid %d) is up to date and kept, but its record still cannot be written (%s: No space left "
        "on device): the record is still missing; the next run writes it once there is room" % (s.pid, paths["state_file"]))
    # The warning beside it is checked in a real run (test_rel_faults_full_fs): in-process, with other tests run in the
    # same worker first, this harness returned none.
    assert not os.path.exists(paths["state_file"])


def test_a_server_without_this_fingerprint_is_restarted_when_the_record_is_missing(servers, paths, run_module):
    s = servers(env={"GPUFLEET_SERVICE_FINGERPRINT": "e" * 64})
    os.makedirs(os.path.dirname(paths["pidfile"]))
    s.write_pidfile(Path(paths["pidfile"]))
    r = run_module(server_state.main, check_args(paths))
    assert r["needs_restart"] is True and "desired state changed (fingerprint none -> ffffffffffff)" in r["reasons"]


# ------------------------------------------------- issue 24: what the restart's preflight refuses, refused before the drain

LISTEN = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], " \
         "flush=True); time.sleep(600)"


def _restart_wanted(paths, url, **kw):
    """A check that finds a restart needed (another fingerprint) under the lock, with the restart's listener check."""
    return check_args(paths, fingerprint="a" * 64, lock_file=paths["lock_file"], owner="ctl:1:a",
                      launchable=dict({"command": sys.executable, "urls": [url, ""]}, **kw))


def test_a_foreign_listener_on_the_servers_port_refuses_a_wanted_restart_in_the_check(
        servers, paths, run_module, http_server):
    """The restart's own preflight (_restart.port_preflight) refused it after the drain; the check, before the drain
    and the kill, refuses it with the same words (this test process's HTTP server is the foreign listener)."""
    running(servers, paths, run_module)
    url = http_server.url + "/health"
    port = int(http_server.url.rsplit(":", 1)[1])
    for check_mode in (True, False):
        r = run_module(server_state.main, _restart_wanted(paths, url), check_mode=check_mode)
        assert r["failed"] and r["phase"] == "preflight", r
        assert r["msg"].startswith("port %d of %s is held by pid %d (" % (port, url, os.getpid())), r["msg"]
        assert "Nothing was stopped" in r["msg"] and r["port_holders"][0]["pid"] == os.getpid(), r
        assert "launch_problems" not in r and not os.path.exists(paths["lock_file"])
    # Only a restart that is wanted is refused: the up-to-date server is left alone, and so is a check without URLs.
    up = dict(_restart_wanted(paths, url), fingerprint="f" * 64)
    r = run_module(server_state.main, up)
    assert "failed" not in r and r["needs_restart"] is False, r
    r = run_module(server_state.main, dict(_restart_wanted(paths, url), launchable={"command": sys.executable}))
    assert "failed" not in r and r["needs_restart"] is True, r
    # Nor a check without an owner (the rollout's read-only fast path, the audit): the locked check refuses it.
    r = run_module(server_state.main, dict(_restart_wanted(paths, url), owner=None, lock_file=None))
    assert "failed" not in r and r["needs_restart"] is True, r


def test_an_ipv6_wildcard_listener_is_refused_saying_it_may_reach_the_url(servers, paths, run_module):
    """helper-39 (Low): a socket on [::] with IPV6_V6ONLY was refused 'where http://127.0.0.1:PORT/health would reach
    it', which that socket does not. /proc does not show the option: the refusal stays, the reason says 'may'."""
    import socket
    running(servers, paths, run_module)
    s6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s6.bind(("::", 0))
        s6.listen(1)
        url = "http://127.0.0.1:%d/health" % s6.getsockname()[1]
        r = run_module(server_state.main, _restart_wanted(paths, url))
        assert r["failed"] and r["phase"] == "preflight", r
        assert "it listens on ::, where %s may reach it (an IPv6 wildcard socket takes IPv4 connections unless it " \
            "set IPV6_V6ONLY" % url in r["msg"], r["msg"]
    finally:
        s6.close()


def test_a_listener_on_another_address_of_the_port_is_refused_before_the_kill(servers, paths, run_module):
    """helper-47 (Medium): a process listening on the port on the host's own address (not the URL's 127.0.0.1) was not
    seen; the new server then died on EADDRINUSE after the kill. Any address of the port counts."""
    import socket
    running(servers, paths, run_module)
    other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        other.bind(("127.0.0.2", 0))
        other.listen(1)
        port = other.getsockname()[1]
        url = "http://127.0.0.1:%d/health" % port
        r = run_module(server_state.main, _restart_wanted(paths, url))
        assert r["failed"] and r["phase"] == "preflight", r
        assert r["msg"].startswith("port %d of %s is held by pid %d (" % (port, url, os.getpid())), r["msg"]
        assert ("it listens on 127.0.0.2, where %s does not reach it, but a new server that binds every address cannot "
                "listen on the port while it does (EADDRINUSE; the old server, whose own sockets would say where it "
                "binds, is not listening: for a server bound to another address, which runs beside it, set "
                "gpufleet_server_check_listener false). Nothing was stopped" % url) in r["msg"], r["msg"]
    finally:
        other.close()


def test_the_servers_own_listener_on_its_port_does_not_refuse_a_restart(servers, paths, run_module, nvml):
    """The port held by what the kill ends (a process carrying this service's launch tag) is the old server's: fine."""
    running(servers, paths, run_module)
    own = subprocess.Popen([sys.executable, "-c", LISTEN], env=dict(nvml.env, GPUFLEET_SERVICE=NAME),
                           stdout=subprocess.PIPE, text=True)
    try:
        port = int(own.stdout.readline())
        r = run_module(server_state.main, _restart_wanted(paths, "http://127.0.0.1:%d/health" % port))
        assert "failed" not in r and r["needs_restart"] is True and r["locked"] is True, r
    finally:
        own.kill()
        own.wait()


def test_a_gpu_index_the_host_lacks_fails_the_check_with_the_restarts_words_before_the_lock(servers, paths, run_module):
    running(servers, paths, run_module)
    for check_mode in (True, False):
        r = run_module(server_state.main, dict(_restart_wanted(paths, ""), gpus=[0, 7]), check_mode=check_mode)
        assert r["failed"] and r["phase"] == "preflight", r
        assert r["msg"] == "gpus: GPU index 7 does not exist on this host (it has 2 GPUs: 0..1); nothing was stopped"
        assert not os.path.exists(paths["lock_file"])


def test_gpu_holders_no_kill_would_end_refuse_a_wanted_restart_in_the_check(servers, paths, run_module):
    """The restart's refuse_unended refused them after the drain (test_drain: the host drained for nothing); the check
    refuses them before it, after the clean gate's timeout, with the restart's words. Nothing is signalled."""
    s = running(servers, paths, run_module)
    stray = servers(tag=None)  # untagged, holding both GPUs: neither the kill nor (gpu_strays off) the stray kill ends it
    for check_mode in (True, False):
        args = _restart_wanted(paths, "", clean_timeout=0.3)
        r = run_module(server_state.main, args, check_mode=check_mode)
        # The restart's phase and result shape: the clean gate, before the kill, its holders under `clean`.
        assert r["failed"] and r["phase"] == "clean" and r["clean"]["before_kill"] is True, r
        assert [h["pid"] for h in r["clean"]["holders"]] == [stray.pid, stray.pid], r["clean"]
        assert r["msg"].startswith("%s at the clean gate, before the kill: GPUs not clean after 0." % (
            "would fail" if check_mode else "fails")), r["msg"]
        assert "held by processes the kill would not end: " in r["msg"] and "pid %d" % stray.pid in r["msg"], r["msg"]
        assert "; nothing was stopped. None is gpufleet's" in r["msg"], r["msg"]
        assert not os.path.exists(paths["lock_file"])
        assert stray.p.poll() is None and s.p.poll() is None
    # The stray kill would end it: nothing to refuse.
    r = run_module(server_state.main, _restart_wanted(paths, "", clean_timeout=0.3, kill={"gpu_strays": True}))
    assert "failed" not in r and r["needs_restart"] is True, r


def _last_good_file(paths, *fingerprints, launcher="process"):
    """The host's last known good generations, newest first (as server_restart keeps them), with a secret env value."""
    from ansible_collections.gpufleet.serving.plugins.module_utils import _lastgood
    gens = [dict(_lastgood.generation({"launcher": launcher, "command": ["/bin/true"], "env": {"HF_TOKEN": "hf_secret"},
                                       "verify_env": {"expected": {"NCCL_PROTO": "LL"}}}, fp,
                                      {"median": 100.0 + i, "metric": "output_tokens_per_s"}, None),
                 recorded_at="2026-12-0%dT10:00:00+0000" % (9 - i)) for i, fp in enumerate(fingerprints)]
    path = paths["state_file"][:-len(".json")] + ".last_good.json"
    Path(path).write_text(json.dumps({"generations": gens}))
    return path


def test_the_check_reports_what_runs_the_last_known_good_and_the_gate_never_a_definition(servers, paths, run_module):
    running(servers, paths, run_module)
    r = run_module(server_state.main, check_args(paths))
    assert r["running_fingerprint"] == "f" * 64
    assert r["last_good"] == {"newest": None, "generations": [], "rolled_back": None, "gate": None}, r["last_good"]
    _last_good_file(paths, "f" * 64, "e" * 64)
    st = json.loads(open(paths["state_file"]).read())
    st["gate"] = {"median": 412.5, "metric": "output_tokens_per_s", "measured_at": "T", "fingerprint": "f" * 64}
    Path(paths["state_file"]).write_text(json.dumps(st))
    r = run_module(server_state.main, check_args(paths))
    lg = r["last_good"]
    assert lg["newest"] == {"fingerprint": "f" * 64, "recorded_at": "2026-12-09T10:00:00+0000", "gate_median": 100.0}
    assert [g["fingerprint"] for g in lg["generations"]] == ["f" * 64, "e" * 64]
    assert lg["gate"] == {"median": 412.5, "metric": "output_tokens_per_s", "unit": "output tokens/s",
                          "measured_at": "T", "fingerprint": "f" * 64}
    assert "hf_secret" not in json.dumps(r) and "/bin/true" not in json.dumps(r)


def test_the_rollback_check_compares_the_host_with_the_generation_it_goes_back_to(servers, paths, run_module):
    """Running f (the newest generation): the rollback goes to e, the one before; a restart is needed, and the reason
    says so; named by 12 characters, the running one is a no-op; an unknown one fails before the lock, naming the
    generations the host has; the inventory's fingerprint differing from the target is warned about."""
    running(servers, paths, run_module)
    _last_good_file(paths, "f" * 64, "e" * 64)
    lock = {"lock_file": paths["lock_file"], "owner": "ctl:1:run"}
    r = run_module(server_state.main, check_args(paths, fingerprint="f" * 64, rollback={}, **lock))
    assert r["needs_restart"] is True and r["locked"] is True, r
    assert r["rollback"] == {"fingerprint": "e" * 64, "recorded_at": "2026-12-08T10:00:00+0000", "from": "f" * 64,
                             "inventory_fingerprint": "f" * 64}
    assert "roll back to the last known good eeeeeeeeeeee (recorded 2026-12-08T10:00:00+0000) from ffffffffffff" \
        in r["reasons"], r["reasons"]
    # Warnings are strings or (2.19) structured events: their text is in the JSON either way. In-process, after other
    # modules ran in the same process, a result does not always carry them (as above); the sandbox test reads the run.
    if "warnings" in r:
        assert ("but the inventory still describes ffffffffffff: the next rollout restarts it to that definition again"
                in json.dumps(r["warnings"])), r["warnings"]
    os.unlink(paths["lock_file"])

    r = run_module(server_state.main, check_args(paths, rollback={"to": "f" * 12}, **lock))
    assert r["needs_restart"] is False and r["reasons"] == [] and r["locked"] is False, r
    assert r["rollback"]["fingerprint"] == "f" * 64 and not os.path.exists(paths["lock_file"])

    r = run_module(server_state.main, check_args(paths, rollback={"to": "d" * 64}, **lock))
    assert r["failed"] and r["msg"].startswith("rollback: %s is not a last known good generation of this host (" % ("d" * 64))
    assert "known: ffffffffffff (recorded 2026-12-09T10:00:00+0000), eeeeeeeeeeee (recorded " in r["msg"], r["msg"]
    assert r["msg"].endswith("nothing was changed") and not os.path.exists(paths["lock_file"])
    assert "hf_secret" not in json.dumps(r)


def test_a_rollback_to_a_generation_whose_files_are_gone_is_refused_before_anything(servers, paths, run_module, tmp_path):
    """A new-user pass (issue 26): the script a generation ran was deleted; the rollback by hand stopped the healthy
    server for it. The check refuses it first, naming the file, and takes no lock."""
    running(servers, paths, run_module)
    path = _last_good_file(paths, "f" * 64, "e" * 64)
    script = tmp_path / "old_server.py"
    data = json.loads(Path(path).read_text())
    data["generations"][1]["paths"] = [str(script)]  # recorded when it existed
    Path(path).write_text(json.dumps(data))
    lock = {"lock_file": paths["lock_file"], "owner": "ctl:1:run"}
    r = run_module(server_state.main, check_args(paths, rollback={}, **lock))
    assert r["failed"] and r["msg"] == ("rollback: the last known good eeeeeeeeeeee names %s, which no longer exists on "
                                        "this host; nothing was changed" % script), r["msg"]
    assert not os.path.exists(paths["lock_file"])
    script.write_text("")
    r = run_module(server_state.main, check_args(paths, rollback={}, **lock))
    assert "failed" not in r and r["rollback"]["fingerprint"] == "e" * 64, r


def test_a_rollback_with_no_other_generation_or_one_of_the_other_launcher_is_refused(servers, paths, run_module):
    running(servers, paths, run_module)
    r = run_module(server_state.main, check_args(paths, rollback={}))
    assert r["failed"] and "this host has no last known good generation (" in r["msg"], r["msg"]
    _last_good_file(paths, "f" * 64)
    r = run_module(server_state.main, check_args(paths, rollback={}))
    assert r["failed"] and "no last known good generation other than the one it runs (ffffffffffff (recorded " in r["msg"]
    # A process launch's generation for a service that runs under systemd now (and the reverse): refused by name.
    r = run_module(server_state.main, check_args(paths, rollback={"to": "f" * 12},
                                                 systemd={"unit": "x.service", "unit_path": "/x"}))
    assert r["failed"] and r["msg"] == ("rollback: the last known good ffffffffffff was launched by the process launcher, "
                                        "and this service's is systemd (gpufleet_server_launcher): roll out that "
                                        "definition instead; nothing was changed"), r["msg"]
    # A systemd generation recorded without its unit's files: nothing to launch again.
    _last_good_file(paths, "e" * 64, launcher="systemd")
    r = run_module(server_state.main, check_args(paths, rollback={"to": "e" * 12},
                                                 systemd={"unit": "x.service", "unit_path": "/x"}))
    assert r["failed"] and "eeeeeeeeeeee holds nothing to launch again (it was recorded before gpufleet kept a " \
        "systemd unit's files)" in r["msg"], r["msg"]


@pytest.mark.parametrize("over, problem", [
    ({"launchable": {"command": "no-such-server-ut"}},
     "command[0] no-such-server-ut is not found on the server's PATH (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)"),
    ({"launchable": {"command": "python3", "path": "/nonexistent/bin"}},  # the server's env's value, hidden
     "command[0] python3 is not found on the server's PATH (********)"),
    ({"launchable": {"log_path": "PLAIN/log/demo.log"}}, "log_path PLAIN/log/demo.log lies under PLAIN, which is not a directory"),
    # The check's own paths are the restart's (the same role variables): checked as the restart's files.
    ({"pidfile": "PLAIN/demo.pid"}, "pidfile PLAIN/demo.pid lies under PLAIN, which is not a directory"),
    ({"state_file": "PLAIN/s/demo.json"}, "record.state_file PLAIN/s/demo.json lies under PLAIN, which is not a directory"),
])
def test_what_the_restart_refuses_about_its_files_and_path_refuses_a_wanted_restart_in_the_check(
        servers, paths, run_module, tmp_path, over, problem):
    """server_restart's preflight refused these after the drain; the check refuses them before it, with the words of
    _server.restart_problems, which both call. An up-to-date server is left alone."""
    plain = tmp_path / "plain"
    plain.write_text("")
    running(servers, paths, run_module)
    la = dict({"command": sys.executable}, **over.get("launchable", {}))
    if la.get("log_path"):
        la["log_path"] = la["log_path"].replace("PLAIN", str(plain))
    own = {k: over[k].replace("PLAIN", str(plain)) for k in ("pidfile", "state_file") if k in over}
    problem = problem.replace("PLAIN", str(plain))
    for check_mode in (True, False):
        r = run_module(server_state.main, dict(_restart_wanted(paths, "", **la), **own), check_mode=check_mode)
        assert r["failed"] and r["phase"] == "preflight" and r["launch_problems"] == [problem], r
        assert r["msg"] == "cannot run this server, nothing was stopped: %s" % problem, r
        assert not os.path.exists(paths["lock_file"])
    if not own:  # (with its own paths elsewhere the check does not find the running server)
        r = run_module(server_state.main, dict(_restart_wanted(paths, "", **la), fingerprint="f" * 64))
        assert "failed" not in r and r["needs_restart"] is False, r
    # The systemd launcher: its unit runs the command, the restart looks no bare name up.
    if "command" in over.get("launchable", {}):
        full = dict({"user": "root", "workdir": "/", "path": None, "log_path": None}, **la)
        assert _state.restart_problems({"launchable": full, "systemd": {"unit": "x"}, "rotation_file": None,
                                        "state_file": None, "pidfile": None, "lock_file": None}) == []


def test_another_users_process_carrying_the_tag_is_no_worker(servers, paths, run_module):
    """Found by the new-user pass (issue 24): the audit called a nobody process carrying the service's launch tag a
    worker lacking the expected environment. It is not the server's (its kill leaves it alone): no worker, and no
    environment problem of the server."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as nobody")
    running(servers, paths, run_module)
    forged = subprocess.Popen(["/bin/sleep", "600"], env={"GPUFLEET_SERVICE": NAME, "PATH": "/usr/bin:/bin"}, user=65534,
                              group=65534, cwd="/", start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (_proc.read_proc(forged.pid).uid == 65534 and _proc.read_environ(forged.pid, ["GPUFLEET_SERVICE"])):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = run_module(server_state.main, check_args(paths))
        assert "failed" not in r, r.get("msg")
        assert forged.pid not in [w["pid"] for w in r["workers"]] and str(forged.pid) not in r["env_problems"], r
        assert r["needs_restart"] is False, r["reasons"]
    finally:
        forged.kill()
        forged.wait()


def test_a_generation_left_aside_for_the_running_server_is_kept_by_the_next_locked_check(servers, paths, run_module):
    """Found by the new-user pass (issue 24, a full state filesystem): the record was written again but the last known
    good file was still too full, and the generation put aside for the running server stayed aside for good (kept only
    at the next kill). The read-only check says the host is not up to date; the locked check keeps the generation."""
    from ansible_collections.gpufleet.serving.plugins.module_utils import _lastgood
    s = running(servers, paths, run_module)
    g = _lastgood.generation({"launcher": "process", "command": [sys.executable], "env": {}}, "f" * 64, None, None)
    _lastgood.keep_pending(paths["pidfile"], g, 3, (s.pid, s.start))
    fast = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"]))
    assert fast["up_to_date"] is False and fast["last_good_pending"] is True and fast["needs_restart"] is False, fast
    assert fast["changed"] is False and os.path.exists(_lastgood.pending_path(paths["pidfile"]))
    r = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"], owner="ctl:1:a"))
    assert "failed" not in r and r["needs_restart"] is False and r["last_good_kept"] is True and r["changed"] is True, r
    assert r["last_good"]["newest"]["fingerprint"] == "f" * 64, r["last_good"]
    assert not os.path.exists(_lastgood.pending_path(paths["pidfile"])) and not os.path.exists(paths["lock_file"])
    again = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"]))
    assert again["up_to_date"] is True and "last_good_pending" not in again, again


def test_check_keeps_the_lock_of_a_host_that_goes_back_into_rotation(servers, paths, run_module, tmp_path):
    """helper-47: an up-to-date host an earlier run left drained goes back into its balancers in this run; its put-back
    is under the lock (the return to service releases it), as one outside it raced another run's drain of the host."""
    running(servers, paths, run_module)
    record = tmp_path / "demo.rotation.json"
    record.write_text(json.dumps({"drains": {"haproxy": {"found": "UP", "server": "h1", "run": "ctl:9:old",
                                                         "at": "2026-12-06T13:00:00+0000"}}}))
    os.chmod(str(record), 0o600)
    args = check_args(paths, lock_file=paths["lock_file"], owner="ctl:1:a", rotation_file=str(record))
    other = run_module(server_state.main, dict(args, decide={"balancers": ["smg"]}))
    assert other["needs_restart"] is False and other["locked"] is False and not os.path.exists(paths["lock_file"])
    back = run_module(server_state.main, dict(args, decide={"balancers": ["haproxy", "smg"]}))
    assert back["needs_restart"] is False and back["locked"] is True and back["changed"] is True, back
    assert json.load(open(paths["lock_file"]))["owner"] == "ctl:1:a"
    _hostlock.release_lock(paths["lock_file"], "ctl:1:a")
    predicted = run_module(server_state.main, dict(args, decide={"balancers": ["haproxy"]}), check_mode=True)
    assert predicted["changed"] is True and predicted["locked"] is False and not os.path.exists(paths["lock_file"])
