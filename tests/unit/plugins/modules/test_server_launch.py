# SPDX-License-Identifier: GPL-3.0-or-later
"""server_launch main() in-process (patch_module_args): real processes started, read back from /proc."""
from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _proc, _server, _statefile
from ansible_collections.gpufleet.serving.plugins.modules import server_launch

SLEEPER = [sys.executable, "-c", "import sys, time; print('server up', flush=True); time.sleep(60)"]


@pytest.fixture
def launched():
    """Pids started by the module under test; killed and reaped afterwards."""
    pids = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def args(tmp_path, **kw):
    a = {"name": "demo", "command": SLEEPER, "log_path": str(tmp_path / "log" / "demo.log"),
         "pidfile": str(tmp_path / "run" / "demo.pid")}
    a.update(kw)
    return a


def test_launch_in_a_new_session_tagged_with_a_clean_env_pidfile_and_log(tmp_path, run_module, launched, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")  # in the controller env: must not leak into the server
    r = run_module(server_launch.main, args(tmp_path, env={"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": 16},
                                            env_passthrough=["CUDA_HOME", "NOT_SET_ANYWHERE"], workdir=str(tmp_path)))
    launched.append(r["pid"])
    assert r["changed"] is True and r["already_running"] is False and r["launch_s"] >= 0
    p = _proc.read_proc(r["pid"])
    assert (p.pid, p.start_time) == (r["pid"], r["start_time"])
    assert p.sid == p.pid and p.pgid == p.pid, "not in its own session"
    assert p.ppid == os.getpid()
    assert _statefile.pidfile_identity(args(tmp_path)["pidfile"]) == (r["pid"], r["start_time"])
    with open("/proc/%d/environ" % r["pid"], "rb") as f:
        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if kv)
    env = {k.decode(): v.decode() for k, v in env.items()}
    assert env["GPUFLEET_SERVICE"] == "demo"
    assert env["NCCL_PROTO"] == "LL" and env["NCCL_MAX_NCHANNELS"] == "16"
    assert env["CUDA_HOME"] == "/usr/local/cuda"
    # The tag also under its fixed name (another service with another tag name still knows this one's processes).
    assert env["GPUFLEET_LAUNCH_TAG"] == "GPUFLEET_SERVICE=demo"
    assert set(env) == {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "CUDA_HOME", "GPUFLEET_SERVICE",
                        "GPUFLEET_LAUNCH_TAG", "NCCL_PROTO", "NCCL_MAX_NCHANNELS"}
    assert env["PATH"] == _server.SAFE_PATH
    assert os.readlink("/proc/%d/cwd" % r["pid"]) == str(tmp_path)
    log = tmp_path / "log" / "demo.log"
    deadline = time.monotonic() + 10
    while "server up" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    text = log.read_text()
    assert text.startswith("==== gpufleet launch ") and "server up" in text
    assert "hf_secret" not in text and "hf_secret" not in repr(r)


def test_check_mode_starts_nothing(tmp_path, run_module):
    r = run_module(server_launch.main, args(tmp_path), check_mode=True)
    assert r["changed"] is True and r["pid"] is None and r["already_running"] is False
    assert not (tmp_path / "run").exists() and not (tmp_path / "log").exists()


def test_stale_pidfile_of_a_dead_process_launches_anew(tmp_path, run_module, launched):
    pf = tmp_path / "run" / "demo.pid"
    pf.parent.mkdir()
    me = _proc.read_proc(os.getpid())
    pf.write_text("%d %d\n" % (me.pid, me.start_time + 1))  # same pid, other start time: a reused pid
    r = run_module(server_launch.main, args(tmp_path))
    launched.append(r["pid"])
    assert r["changed"] is True and r["pid"] != os.getpid()


def test_runs_as_the_given_user(tmp_path, run_module, launched):
    if os.geteuid() != 0:
        pytest.skip("needs root to switch users")
    nobody = pwd.getpwnam("nobody")
    os.chmod(tmp_path, 0o755)
    r = run_module(server_launch.main, args(tmp_path, user="nobody", command=["/bin/sleep", "60"]))
    assert "failed" not in r, r
    launched.append(r["pid"])
    with open("/proc/%d/status" % r["pid"]) as f:
        uid = [line.split()[1:] for line in f if line.startswith("Uid:")][0]
    assert uid == [str(nobody.pw_uid)] * 4
    assert os.stat(tmp_path / "log" / "demo.log").st_uid == nobody.pw_uid


@pytest.mark.parametrize("kw, msg", [
    ({"env": {"BAD-NAME": "x"}}, "env: invalid variable name 'BAD-NAME'"),
    ({"env": {"A": "x\0y"}}, "env: value of A contains a NUL byte"),
    ({"command": []}, "command must be a non-empty argument list"),
    ({"command": [""]}, "command must be a non-empty argument list"),
    ({"tag_name": "GPUFLEET-SERVICE"}, "tag_name: invalid variable name 'GPUFLEET-SERVICE'"),
    ({"user": "no-such-user-gpufleet"}, "launch of demo failed: cannot run this server: user no-such-user-gpufleet does not exist"),
    ({"workdir": "/nonexistent/dir"}, "launch of demo failed: cannot run this server: workdir /nonexistent/dir is not a directory"),
    ({"command": ["/nonexistent/python"]}, "launch of demo failed: cannot run this server: command[0] /nonexistent/python is not an executable file"),
])
def test_bad_input_fails_with_the_field_and_starts_nothing(tmp_path, run_module, kw, msg):
    r = run_module(server_launch.main, args(tmp_path, **kw))
    assert r["failed"] is True and msg in r["msg"], r["msg"]
    assert not (tmp_path / "run" / "demo.pid").exists()


def test_a_pidfile_naming_an_untagged_process_is_stale_and_the_server_is_launched(tmp_path, run_module, launched):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # alive, not the server
    try:
        st = _proc.read_proc(other.pid).start_time
        os.makedirs(tmp_path / "run")
        (tmp_path / "run" / "demo.pid").write_text("%d %d\n" % (other.pid, st))
        r = run_module(server_launch.main, args(tmp_path))
        launched.append(r["pid"])
        assert r["changed"] is True and r["already_running"] is False and r["pid"] != other.pid, r
        again = run_module(server_launch.main, args(tmp_path))
        assert again["changed"] is False and again["already_running"] is True and again["pid"] == r["pid"]
        assert other.poll() is None  # never touched
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("kw, msg", [
    ({"command": ["nosuchcmd-gpufleet"]}, "command[0] nosuchcmd-gpufleet is not found on the server's PATH"),
    ({"command": ["/nonexistent-gpufleet/python3"]}, "command[0] /nonexistent-gpufleet/python3 is not an executable file"),
    ({"log_path": "/tmp"}, "log_path /tmp is a directory"),
    ({"pidfile": "/etc/passwd/demo.pid"}, "pidfile /etc/passwd/demo.pid lies under /etc/passwd, which is not a directory"),
])
def test_a_launch_that_could_not_start_fails_the_same_in_check_mode_and_starts_nothing(tmp_path, run_module, kw, msg):
    for check_mode in (True, False):
        r = run_module(server_launch.main, args(tmp_path, **kw), check_mode=check_mode)
        assert r["failed"] is True and r["phase"] == "launch" and msg in r["msg"], (check_mode, r)
    assert not (tmp_path / "run").exists()
