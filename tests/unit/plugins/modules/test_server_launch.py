# SPDX-License-Identifier: GPL-3.0-or-later
"""server_launch main() in-process (patch_module_args): real processes started, read back from /proc."""
from __future__ import annotations

import os
import pwd
import signal
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _proc, _server
from ansible_collections.gpufleet.serving.plugins.modules import server_launch

DEMO = Path(__file__).resolve().parents[3] / "sandbox" / "demo_server.py"
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
    assert _server.pidfile_identity(args(tmp_path)["pidfile"]) == (r["pid"], r["start_time"])
    with open("/proc/%d/environ" % r["pid"], "rb") as f:
        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if kv)
    env = {k.decode(): v.decode() for k, v in env.items()}
    assert env["GPUFLEET_SERVICE"] == "demo"
    assert env["NCCL_PROTO"] == "LL" and env["NCCL_MAX_NCHANNELS"] == "16"
    assert env["CUDA_HOME"] == "/usr/local/cuda"
    assert set(env) == {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "CUDA_HOME", "GPUFLEET_SERVICE",
                        "NCCL_PROTO", "NCCL_MAX_NCHANNELS"}
    assert env["PATH"] == _server.SAFE_PATH
    assert os.readlink("/proc/%d/cwd" % r["pid"]) == str(tmp_path)
    log = tmp_path / "log" / "demo.log"
    deadline = time.monotonic() + 10
    while "server up" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    text = log.read_text()
    assert text.startswith("==== gpufleet launch ") and "server up" in text
    assert "hf_secret" not in text and "hf_secret" not in repr(r)


def test_second_run_finds_it_running_and_changes_nothing(tmp_path, run_module, launched):
    first = run_module(server_launch.main, args(tmp_path))
    launched.append(first["pid"])
    again = run_module(server_launch.main, args(tmp_path))
    assert again["changed"] is False and again["already_running"] is True and again["pid"] == first["pid"]
    checked = run_module(server_launch.main, args(tmp_path), check_mode=True)
    assert checked["changed"] is False and checked["pid"] == first["pid"]


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
    ({"user": "no-such-user-gpufleet"}, "launch of demo failed: user 'no-such-user-gpufleet' does not exist"),
    ({"workdir": "/nonexistent/dir"}, "launch of demo failed: workdir /nonexistent/dir does not exist"),
    ({"command": ["/nonexistent/python"]}, "launch of demo failed: cannot start /nonexistent/python: "),
])
def test_bad_input_fails_with_the_field_and_starts_nothing(tmp_path, run_module, kw, msg):
    r = run_module(server_launch.main, args(tmp_path, **kw))
    assert r["failed"] is True and msg in r["msg"], r["msg"]
    assert not (tmp_path / "run" / "demo.pid").exists()


# -- wait_clean / wait_ready: the gate, the launch and the readiness wait in one call ---------------------------

def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_wait_clean_refuses_a_dirty_gpu_and_launches_nothing(tmp_path, run_module, nvml):
    holder = nvml.hold(gpu=1, mib=4096)
    r = run_module(server_launch.main, args(tmp_path, wait_clean={"gpus": [0, 1], "timeout": 0.3}))
    assert r["failed"] and r["phase"] == "clean" and r["changed"] is False and r.get("pid") is None
    assert r["msg"].startswith("GPUs not clean after 0.3 s") and "GPU 1 pid %d" % holder.pid in r["msg"], r["msg"]
    assert [h["pid"] for h in r["clean"]["holders"]] == [holder.pid]
    assert not (tmp_path / "run" / "demo.pid").exists() and not (tmp_path / "log" / "demo.log").exists()
    assert holder.poll() is None
    # A GPU the gate was not asked about does not block it.
    ok = run_module(server_launch.main, args(tmp_path, wait_clean={"gpus": [0], "timeout": 0.3}))
    try:
        assert ok["changed"] is True and ok["clean"]["holders"] == [] and ok["clean"]["backend"] == "nvml"
    finally:
        os.kill(ok["pid"], signal.SIGKILL)
        os.waitpid(ok["pid"], 0)


def test_wait_clean_launches_right_after_the_holder_dies(tmp_path, run_module, nvml, launched):
    import threading

    holder = nvml.hold(gpu=0, mib=60000)
    died = {}

    def kill() -> None:
        time.sleep(0.4)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        died["at"] = time.clock_gettime(time.CLOCK_BOOTTIME)  # the clock of /proc/PID/stat's start time

    threading.Thread(target=kill).start()
    r = run_module(server_launch.main, args(tmp_path, wait_clean={"timeout": 20}))
    launched.append(r["pid"])
    assert r["changed"] is True and r["clean"]["waited_s"] >= 0.4 and r["clean"]["polls"] > 1
    # Launched after the holder died (the fake driver frees its memory ~0.15 s later), not before.
    started = _proc.read_proc(r["pid"]).start_time / os.sysconf("SC_CLK_TCK")
    assert started >= died["at"] - 0.01, (started, died["at"])


def test_wait_ready_waits_for_a_real_http_server(tmp_path, run_module, launched):
    port = _free_port()
    cmd = [sys.executable, "-c", "import time, http.server as h; time.sleep(0.5); "
           "h.ThreadingHTTPServer(('127.0.0.1', %d), h.SimpleHTTPRequestHandler).serve_forever()" % port]
    r = run_module(server_launch.main, args(tmp_path, command=cmd, workdir=str(tmp_path),
                                            wait_ready={"health_url": "http://127.0.0.1:%d/" % port, "timeout": 30,
                                                        "interval": 0.05}))
    launched.append(r["pid"])
    assert r["changed"] is True and r["ready"]["ready_s"] >= 0.5 and r["ready"]["attempts"] > 1, r
    # Idempotent: found running, still answers, no launch.
    again = run_module(server_launch.main, args(tmp_path, command=cmd, wait_ready={"health_url": "http://127.0.0.1:%d/" % port}))
    assert again["changed"] is False and again["already_running"] is True and again["ready"]["ready_s"] < 5


def test_wait_ready_fails_at_once_with_the_log_tail_when_the_server_dies(tmp_path, run_module, launched):
    cmd = [sys.executable, "-c", "import sys; print('RuntimeError: weights not found', flush=True); sys.exit(3)"]
    t0 = time.monotonic()
    r = run_module(server_launch.main, args(tmp_path, command=cmd,
                                            wait_ready={"health_url": "http://127.0.0.1:9/", "timeout": 120}))
    launched.append(r["pid"])
    assert r["failed"] and r["phase"] == "startup" and r["changed"] is True and r["pid"] > 0
    assert "exited during start-up" in r["msg"] and "RuntimeError: weights not found" in r["msg"], r["msg"]
    assert "RuntimeError: weights not found" in r["log_tail"]
    assert time.monotonic() - t0 < 20


def test_a_server_logging_to_its_own_file_fails_with_that_files_tail(tmp_path, run_module, launched):
    # The demo server with --log writes its RuntimeError only to its own file: the launch log gets gpufleet's
    # launch line and nothing else.
    own = tmp_path / "demo-own.log"
    cmd = [sys.executable, str(DEMO), "--port", str(_free_port()), "--fail-at-startup", "--log", str(own)]
    ready = {"health_url": "http://127.0.0.1:9/", "timeout": 60}

    r = run_module(server_launch.main, args(tmp_path, command=cmd, wait_ready=ready))
    launched.append(r["pid"])
    assert r["failed"] and r["phase"] == "startup"
    assert "RuntimeError" not in r["msg"] and "name that file in log_tail_path" in r["msg"], r["msg"]

    r = run_module(server_launch.main, args(tmp_path, command=cmd, wait_ready=dict(ready, log_tail_path=str(own))))
    launched.append(r["pid"])
    assert r["failed"] and r["phase"] == "startup"
    assert "log tail (%s): " % own in r["msg"] and "RuntimeError: demo failure at startup" in r["msg"], r["msg"]
    assert "RuntimeError: demo failure at startup" in r["log_tail"]

    # A start that wrote nothing there: the file's old lines are not passed off as this start's cause.
    quiet = [sys.executable, "-c", "import sys; print('ImportError: no module named torch', flush=True); sys.exit(1)"]
    r = run_module(server_launch.main, args(tmp_path, command=quiet, wait_ready=dict(ready, log_tail_path=str(own))))
    launched.append(r["pid"])
    assert "nothing new in %s" % own in r["msg"] and "ImportError: no module named torch" in r["msg"], r["msg"]
    assert "RuntimeError" not in r["msg"]


@pytest.mark.parametrize("extra, msg", [
    ({"wait_clean": {"timeout": 0}}, "wait_clean: timeout and poll_interval must be greater than 0 seconds"),
    ({"wait_clean": {"poll_interval": -1}}, "wait_clean: timeout and poll_interval must be greater than 0 seconds"),
    ({"wait_ready": {}}, "wait_ready: set health_url or request (or both)"),
    ({"wait_ready": {"request": {"body": "{}"}}}, "wait_ready: request.url is required when request is set"),
    ({"wait_ready": {"health_url": "http://x/", "interval": 0}}, "wait_ready: interval must be greater than 0 seconds"),
])
def test_bad_wait_options_fail_before_anything_runs(tmp_path, run_module, nvml, extra, msg):
    r = run_module(server_launch.main, args(tmp_path, **extra))
    assert r["failed"] and r["msg"].startswith(msg), r["msg"]
    assert not (tmp_path / "run" / "demo.pid").exists() and not (tmp_path / "log" / "demo.log").exists()


def test_check_mode_with_waits_reads_nothing_and_starts_nothing(tmp_path, run_module, nvml):
    nvml.hold(gpu=0, mib=4096)
    r = run_module(server_launch.main, args(tmp_path, wait_clean={"timeout": 0.2}, wait_ready={"health_url": "http://127.0.0.1:9/"}),
                   check_mode=True)
    assert r["changed"] is True and r["pid"] is None and "clean" not in r and "ready" not in r
    assert not (tmp_path / "run" / "demo.pid").exists()


def test_a_secret_cut_by_the_start_up_message_does_not_leak(tmp_path, run_module, launched):
    """The start-up failure message keeps the last 297 characters of the log tail, which can cut through a token the
    server printed; the part left (24 of its characters here) is masked like the whole token."""
    token = "hf_PVbYcfn9Nvx65ZRgpczxWICGmwo2kM"
    cmd = ["/bin/sh", "-c", 'echo "loading with token=$HF_TOKEN"; printf "A%.0s" $(seq 270); echo; exit 1']
    r = run_module(server_launch.main, args(tmp_path, command=cmd, env={"HF_TOKEN": token, "HF_HUB_OFFLINE": "1"},
                                            wait_ready={"health_url": "http://127.0.0.1:9/", "timeout": 60}))
    launched.append(r["pid"])
    assert r["failed"] and r["phase"] == "startup" and "exited during start-up" in r["msg"], r["msg"]
    assert token in (tmp_path / "log" / "demo.log").read_text()  # the server did print it
    assert "..." in r["msg"] and "********" in r["msg"] and "A" * 200 in r["msg"], r["msg"]
    text = str(r)
    assert not [token[i:i + 8] for i in range(len(token) - 7) if token[i:i + 8] in text], text
