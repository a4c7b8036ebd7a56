# SPDX-License-Identifier: GPL-3.0-or-later
"""server_restart main() in-process: a real server (launcher + a worker holding fake GPU memory, HTTP health)
killed, the GPUs waited clean, relaunched, its worker's environ and the state file read back."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _hostlock, _proc, _restart, _statefile
from ansible_collections.gpufleet.serving.plugins.modules import server_restart

from helpers import FAKE_NVML_DIR, HTTP_OK_SCRIPT, pid_alive, wait_for

# A launcher that starts one worker (which inherits its environment, the launch tag included) holding fake GPU
# memory on GPU 0, then answers /health once the worker holds it.
SERVER = r"""
import http.server, os, subprocess, sys, time
port, ready = int(sys.argv[1]), sys.argv[2]
w = subprocess.Popen([sys.executable, os.path.join(os.environ["FAKE_DIR"], "fake_gpu.py"), "hold", "--gpu", "0",
                      "--mib", "2000", "--ready-file", ready])
while not os.path.exists(ready):
    time.sleep(0.01)
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


# The service's name is this process's own too: the same file runs at once in other processes (ansible-test units'
# workers beside the suite's own), and a launch tag names the service whatever the tag name (GPUFLEET_LAUNCH_TAG=NAME=demo),
# so another process's adopt regex would rightly take a "demo" of this one for its own.
SERVICE = "demo-%d" % os.getpid()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path, nvml):
    """Arguments for a restart of the demo server; kills whatever carries its tag afterwards."""
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    port = _free_port()
    a = {
        "name": SERVICE, "tag_name": "GPUFLEET_TEST_SERVICE_%d" % os.getpid(),
        "command": [sys.executable, str(script), str(port), str(tmp_path / "worker-ready")],
        "env": {"FAKE_NVML_CONFIG": str(nvml.config), "PYTHONPATH": str(FAKE_NVML_DIR), "FAKE_DIR": str(FAKE_NVML_DIR),
                "NCCL_P2P_LEVEL": "SYS"},
        "log_path": str(tmp_path / "log" / "demo.log"), "pidfile": str(tmp_path / "run" / "demo.pid"),
        "gpus": [0],
        "kill": {"grace": 2, "final_wait": 2},
        "wait_clean": {"timeout": 10},
        "wait_ready": {"health_url": "http://127.0.0.1:%d/health" % port, "timeout": 30, "interval": 0.05},
        "wait_busy": {"timeout": 10},
        "verify_env": {"expected": {"NCCL_P2P_LEVEL": "SYS"}},
        "record": {"state_file": str(tmp_path / "state" / "demo.json"), "fingerprint": "f" * 64},
        "release_lock": {"lock_file": str(tmp_path / "run" / "demo.lock"), "owner": "ctl:1:run"},
    }
    yield a
    for pid in [pid for pid in _proc.snapshot() if _proc.environ_has(pid, a["tag_name"], SERVICE)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in list(_proc.snapshot()):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _tagged(a):
    return sorted(pid for pid in _proc.snapshot() if _proc.environ_has(pid, a["tag_name"], SERVICE))


def _lock(a):
    os.makedirs(os.path.dirname(a["release_lock"]["lock_file"]), exist_ok=True)
    _hostlock.acquire_lock(a["release_lock"]["lock_file"], a["release_lock"]["owner"], 60, 0)


def test_full_cycle_kills_the_old_server_relaunches_verifies_records_and_unlocks(server, run_module):
    a = server
    first = run_module(server_restart.main, a)
    assert "failed" not in first, first.get("msg")
    old = _tagged(a)
    assert first["pid"] in old and len(old) == 2, old  # launcher + worker

    _lock(a)
    r = run_module(server_restart.main, a)
    assert "failed" not in r, r.get("msg")
    assert r["changed"] is True and r["kill"]["signalled"] == 2 and r["killed"] == 2
    assert sorted(p["pid"] for p in r["kill"]["processes"]) == old
    assert r["kill"]["pidfile"]["status"] == "confirmed" and r["kill"]["pidfile"]["confirmed_by"] == "tag"
    assert not any(pid_alive(pid) for pid in old)
    new = _tagged(a)
    assert r["pid"] in new and not set(new) & set(old)
    assert _statefile.pidfile_identity(a["pidfile"]) == (r["pid"], r["start_time"])
    # The gate saw the old worker's memory released; the busy wait saw the new worker holding GPU 0.
    worker = [pid for pid in new if pid != r["pid"]]
    assert r["clean"]["holders"] == [] and [p["pid"] for p in r["busy"]["gpus"][0]["processes"]] == worker
    assert r["ready"]["ready_s"] > 0
    env = r["env"]
    assert env["checked"] == 1 and env["ok"] == 1 and env["wrong"] == []
    assert env["processes"][0]["env"] == {"NCCL_P2P_LEVEL": "SYS"} and [env["processes"][0]["pid"]] == worker
    state = json.loads(open(a["record"]["state_file"]).read())
    assert state["fingerprint"] == "f" * 64 and state["pid"] == r["pid"]
    # Every phase that ran is timed, in the record as in the result: the restart's overhead broken down (gpu-run.md).
    assert set(state["timings"]) == set(r["timings"]) == {"preflight_s", "kill_s", "clean_s", "launch_s", "ready_s",
                                                          "cycle_s", "busy_s", "verify_env_s"}
    assert r["timings"]["busy_s"] == r["busy"]["waited_s"] and r["timings"]["preflight_s"] > 0
    assert r["timings"]["cycle_s"] >= r["timings"]["ready_s"]
    assert r["lock_released"] is True and not os.path.exists(a["release_lock"]["lock_file"])


@pytest.mark.parametrize("with_start_time", [False, True], ids=["pid", "pid-and-real-start-time"])
def test_pid_only_pidfile_of_an_unrelated_process_is_left_alone(server, run_module, with_start_time):
    """Issue 13: the server stopped by hand, its pidfile rewritten with the pid of an older, unrelated process (the
    pidfile is newer than it), or with its pid AND real start time: nothing confirms it (a matching start time alone
    does not), so the restart leaves it alone, says so, and launches."""
    a = server
    unrelated = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        ident = _proc.read_proc(unrelated.pid).identity
        os.makedirs(os.path.dirname(a["pidfile"]))
        with open(a["pidfile"], "w") as f:
            f.write("%d %d\n" % ident if with_start_time else "%d\n" % unrelated.pid)
        r = run_module(server_restart.main, a)
        assert "failed" not in r, r.get("msg")
        assert unrelated.pid not in [p["pid"] for p in r["kill"]["processes"]] and _proc.is_alive(ident)
        pf = r["kill"]["pidfile"]
        assert pf["pid"] == unrelated.pid and pf["status"] == "unconfirmed" and pf["confirmed_by"] is None, pf
        assert any("unconfirmed" in n for n in r["kill"]["notes"]), r["kill"]["notes"]
        assert _statefile.pidfile_identity(a["pidfile"]) == (r["pid"], r["start_time"])
    finally:
        unrelated.kill()
        unrelated.wait()


def test_dirty_gpu_stops_at_the_gate_launches_nothing_records_nothing_and_still_unlocks(server, run_module, nvml):
    a = server
    stray = nvml.hold(gpu=0, mib=4096)  # untagged: not the server's, and gpu_strays is off
    _lock(a)
    a["wait_clean"] = {"timeout": 0.3}
    r = run_module(server_restart.main, a)
    assert r["failed"] and r["phase"] == "clean" and r["changed"] is False and r.get("pid") is None
    # Refused before the kill (with no server to stop, nothing was stopped either), after the gate's timeout.
    assert re.match(r"fails at the clean gate, before the kill: GPUs not clean after \d+\.\d s", r["msg"]), r["msg"]
    assert "pid %d" % stray.pid in r["msg"] and r["killed"] == 0, r["msg"]
    # It says how to take over a server started by hand (the holder carries no launch tag).
    assert "None is gpufleet's: adopt a server started by hand with kill.cmdline_regex" in r["msg"], r["msg"]
    assert "gpufleet_server_adopt_cmdline_regex" in r["msg"] and "gpufleet_server_kill_gpu_strays" in r["msg"], r["msg"]
    assert [h["pid"] for h in r["clean"]["holders"]] == [stray.pid]
    assert stray.poll() is None and _tagged(a) == []
    assert not os.path.exists(a["pidfile"]) and not os.path.exists(a["record"]["state_file"])
    assert r["lock_released"] is True and not os.path.exists(a["release_lock"]["lock_file"])


def test_the_clean_gate_says_what_would_end_each_holder_and_suggests_the_stray_kill_only_where_it_would(
        server, run_module, nvml):
    a = server
    stray = nvml.hold(gpu=0, mib=256)  # a hand-started server's worker: no launch tag
    other = nvml.hold(gpu=0, mib=1024, extra_env={a["tag_name"]: "other"})  # another gpufleet service's process
    agent = nvml.hold(gpu=0, mib=512)  # excluded below, as GPU agents are by default
    # This service's tag on an excluded process: no kill ends it, so it is named as excluded, not as a service's.
    own = nvml.hold(gpu=0, mib=512, extra_env={a["tag_name"]: SERVICE})
    a["kill"] = dict(a["kill"], exclude_regex=["--mib 512 "])
    a["wait_clean"] = {"timeout": 0.3}
    r = run_module(server_restart.main, a)
    assert r["failed"] and r["phase"] == "clean", r
    msg = r["msg"]
    assert "None is gpufleet's" not in msg, msg
    assert ("pid %d: no gpufleet service's: adopt a server started by hand with kill.cmdline_regex "
            "(gpufleet_server_adopt_cmdline_regex), or kill.gpu_strays (gpufleet_server_kill_gpu_strays) ends them"
            % stray.pid) in msg, msg
    assert ("pid %d: gpufleet service %s=other, stop it first or give each service its own GPUs (gpufleet_server_gpus)"
            % (other.pid, a["tag_name"])) in msg, msg
    assert "pid %s: never killed (excluded by '--mib 512 '), stop it by hand" % ", ".join(
        str(x) for x in sorted((agent.pid, own.pid))) in msg, msg
    assert "=" + SERVICE not in msg, msg
    assert all(h.poll() is None for h in (stray, other, agent, own))
    own.kill()
    own.wait()

    # An adopt regex is set and does not match the untagged holder: only the stray kill would end it.
    r = run_module(server_restart.main, dict(a, kill=dict(a["kill"], cmdline_regex="no-such-server")))
    assert ("pid %d: no gpufleet service's and kill.cmdline_regex (gpufleet_server_adopt_cmdline_regex) does not match "
            "them: kill.gpu_strays (gpufleet_server_kill_gpu_strays) ends them" % stray.pid) in r["msg"], r["msg"]
    assert "adopt a server started by hand" not in r["msg"], r["msg"]

    # With the stray kill on, what it would end is not named and what it never ends is, without suggesting it again;
    # the run is refused before either kill, so the stray is left running too.
    other.kill()
    other.wait()
    a["kill"] = dict(a["kill"], gpu_strays=True)
    r = run_module(server_restart.main, a)
    assert r["failed"] and r["phase"] == "clean" and r["killed"] == 0, r
    assert stray.poll() is None and agent.poll() is None
    assert "pid %d " % stray.pid not in r["msg"], r["msg"]
    assert r["msg"].endswith("pid %d: never killed (excluded by '--mib 512 '), stop it by hand" % agent.pid), r["msg"]
    assert "gpu_strays" not in r["msg"] and "adopt" not in r["msg"], r["msg"]


def test_a_failure_after_the_kill_reports_what_was_killed_and_how_long_it_took(server, run_module, nvml):
    # The rollout summary reads these: a host that failed at the gate no longer runs its old server.
    a = server
    run_module(server_restart.main, a)
    old = _tagged(a)
    # Only the old server holds the GPU (the kill ends it, so the cycle goes on), but the driver frees its memory
    # later than the gate waits.
    nvml.configure(release_delay_s=30)
    # A holder NVML lists that this pid namespace does not show (exited; or in another namespace): whether the kill
    # would end it cannot be told before, so it is left to the gate, as before.
    gone = nvml.hold(gpu=0, mib=64)
    gone.kill()
    gone.wait()
    a["wait_clean"] = {"timeout": 0.3}
    r = run_module(server_restart.main, a)
    assert r["failed"] and r["phase"] == "clean", r
    assert r["msg"].startswith("GPUs not clean after "), r["msg"]
    assert gone.pid in [h["pid"] for h in r["clean"]["holders"]], r["clean"]
    assert r["killed"] == len(old) == 2 and not any(pid_alive(pid) for pid in old)
    assert r["timings"]["kill_s"] > 0 and "launch_s" not in r["timings"]


def test_a_server_logging_to_its_own_file_fails_with_that_files_tail(server, run_module, tmp_path):
    a = server
    own = tmp_path / "own.log"
    demo = FAKE_NVML_DIR.parents[1] / "sandbox" / "demo_server.py"
    a["command"] = [sys.executable, str(demo), "--port", "9", "--fail-at-startup", "--log", str(own)]
    a["wait_ready"] = dict(a["wait_ready"], log_tail_path=str(own))
    r = run_module(server_restart.main, a)
    assert r["failed"] and r["phase"] == "startup", r
    assert "log tail (%s): " % own in r["msg"] and "RuntimeError: demo failure at startup" in r["msg"], r["msg"]
    assert "RuntimeError: demo failure at startup" in r["log_tail"]

    # A start that wrote nothing there: the file's old lines are not passed off as this start's cause.
    a["command"] = [sys.executable, "-c", "import sys; print('ImportError: no module named torch', flush=True); sys.exit(1)"]
    r = run_module(server_restart.main, a)
    assert r["failed"] and r["phase"] == "startup", r
    assert "nothing new in %s" % own in r["msg"] and "ImportError: no module named torch" in r["msg"], r["msg"]
    assert "RuntimeError" not in r["msg"]

    # Without log_tail_path, a launch log that holds only gpufleet's launch line says where to look.
    a["command"] = [sys.executable, str(demo), "--port", "9", "--fail-at-startup", "--log", str(own)]
    a["wait_ready"] = dict(a["wait_ready"], log_tail_path=None)
    r = run_module(server_restart.main, a)
    assert r["failed"] and r["phase"] == "startup", r
    assert "RuntimeError" not in r["msg"] and "name that file in log_tail_path" in r["msg"], r["msg"]


def test_a_secret_cut_by_the_start_up_message_does_not_leak(server, run_module):
    """The start-up failure message keeps the last 297 characters of the log tail, which can cut through a token the
    server printed; the part left (24 of its characters here) is masked like the whole token."""
    a = server
    token = "hf_PVbYcfn9Nvx65ZRgpczxWICGmwo2kM"
    a["command"] = ["/bin/sh", "-c", 'echo "loading with token=$HF_TOKEN"; printf "A%.0s" $(seq 270); echo; exit 1']
    a["env"] = dict(a["env"], HF_TOKEN=token)
    r = run_module(server_restart.main, a)
    assert r["failed"] and r["phase"] == "startup" and "exited during start-up" in r["msg"], r["msg"]
    with open(a["log_path"]) as f:
        assert token in f.read()  # the server did print it
    assert "..." in r["msg"] and "********" in r["msg"] and "A" * 200 in r["msg"], r["msg"]
    text = str(r)
    assert not [token[i:i + 8] for i in range(len(token) - 7) if token[i:i + 8] in text], text


def test_gpu_strays_kills_the_untagged_holder_then_launches(server, run_module, nvml):
    a = server
    stray = nvml.hold(gpu=0, mib=4096)
    other = nvml.hold(gpu=1, mib=4096)  # on a GPU this server does not use
    a["kill"] = dict(a["kill"], gpu_strays=True)
    r = run_module(server_restart.main, a)
    assert "failed" not in r, r.get("msg")
    assert [p["pid"] for p in r["strays"]["processes"]] == [stray.pid] and r["strays"]["signalled"] == 1
    stray.wait(timeout=5)
    assert other.poll() is None
    assert r["pid"] in _tagged(a)


def test_an_adopt_regex_matching_another_services_server_leaves_it_alone(server, run_module, nvml, tmp_path):
    """Issue 24 item 1: two services on one host, one adopt regex (group_vars) matching both servers' command lines.
    The restart of one kills its own server only; the other service's process (its launch tag, another value), matched
    by the regex and leading its own session, is listed as excluded, naming its service, and keeps running."""
    a = server
    first = run_module(server_restart.main, a)
    assert "failed" not in first, first.get("msg")
    other = nvml.hold(gpu=1, mib=1024, extra_env={a["tag_name"]: "sgb"}, start_new_session=True)
    ident = _proc.read_proc(other.pid).identity
    # Only this test's processes (their ready files lie under its tmp_path): a regex matching any fake holder on the
    # machine would adopt, and kill, the untagged holders other tests start beside this one (the sandbox hosts share
    # this machine's processes).
    a["kill"] = dict(a["kill"], cmdline_regex=r"fake_gpu\.py hold .*" + re.escape(str(tmp_path)), gpu_strays=True)
    r = run_module(server_restart.main, a)
    assert "failed" not in r, r.get("msg")
    assert other.pid not in [p["pid"] for p in r["kill"]["processes"]], r["kill"]
    # Contained, not equal: the adopt regex also matches other tests' tagged processes running beside this one, and
    # those are (rightly) excluded as other services too.
    assert (other.pid, "a process of gpufleet service sgb (%s=sgb), not of %s: another service's launch tag"
            % (a["tag_name"], SERVICE)) in [(x["pid"], x["reason"]) for x in r["kill"]["excluded"]], r["kill"]["excluded"]
    assert all("another service's launch tag" in x["reason"] for x in r["kill"]["excluded"]), r["kill"]["excluded"]
    assert other.poll() is None and _proc.is_alive(ident)
    assert r["pid"] in _tagged(a) and first["pid"] not in _tagged(a)


def _as_nobody(a, argv):
    """A process of user nobody carrying this service's launch tag, in a session of its own."""
    return subprocess.Popen(argv, env={a["tag_name"]: SERVICE, "PATH": "/usr/bin:/bin"}, user=65534, group=65534,
                            cwd="/", start_new_session=True)


@pytest.mark.reliability(
    section="security", case="A process of another user carrying the service's launch tag",
    provoked="a server launched as root (gpufleet_server_user), then a `sleep` of user nobody and one of root, each in "
             "a session of its own with the launch tag in its environment; a forced restart",
    outcome="the restart ends root's tagged process (an orphaned worker) and leaves nobody's running, listed under the "
            "kill's excluded with 'carries the launch tag ... but runs as user nobody, not as the server's user "
            "(root)'; holding the GPUs, such a process is named in the refusal before the kill ('never killed, stop it "
            "by hand')")
def test_the_launch_tag_selects_only_the_servers_users_processes(server, run_module):
    """Issue 24 (new-user pass): anyone can put the launch tag into a process's environment. The restart's kill takes
    a tagged process only when it runs as the server's user (gpufleet_server_user, root here): a root process carrying
    the tag (an orphaned worker) is ended, one of user nobody is left alone, listed as excluded with the reason."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as nobody")
    a = server
    first = run_module(server_restart.main, a)
    assert "failed" not in first, first.get("msg")
    forged = _as_nobody(a, ["/bin/sleep", "600"])
    orphan = subprocess.Popen(["/bin/sleep", "600"], env={a["tag_name"]: SERVICE}, start_new_session=True)
    try:
        wait_for(lambda: _proc.read_proc(forged.pid) is not None and _proc.read_proc(forged.pid).uid == 65534
                 and "sleep" in _proc.read_proc(forged.pid).command, 30, "the forged process as nobody")
        _lock(a)
        r = run_module(server_restart.main, a)
        assert "failed" not in r, r.get("msg")
        killed = [p["pid"] for p in r["kill"]["processes"]]
        assert orphan.pid in killed and forged.pid not in killed, r["kill"]
        reasons = {x["pid"]: x["reason"] for x in r["kill"]["excluded"]}
        assert reasons.get(forged.pid) == (
            "carries the launch tag %s=%s but runs as user %s, not as the server's user (root): anyone can put the tag "
            "into a process's environment; left alone" % (a["tag_name"], SERVICE, _proc.user_name(65534))), reasons
        assert forged.poll() is None and orphan.wait(timeout=10) is not None
    finally:
        for p in (forged, orphan):
            p.kill()
            p.wait()


def test_a_gpu_holder_carrying_the_tag_as_another_user_is_named_in_the_refusal(server):
    """The refusal before the kill (refuse_unended's hint) says why such a holder is not ended: its user."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as nobody")
    a = dict(server, user="root", kill=dict(cmdline_regex=None, gpu_strays=False, exclude_regex=None))
    forged = _as_nobody(a, ["/bin/sleep", "600"])
    try:
        wait_for(lambda: (_proc.read_proc(forged.pid) or _proc.read_proc(os.getpid())).uid == 65534, 30, "nobody")
        hint = _restart.holders_hint(a, [forged.pid])
        assert hint == ("pid %d: this service's launch tag as user %s, not the server's user (root): never killed, "
                        "stop it by hand" % (forged.pid, _proc.user_name(65534))), hint
    finally:
        forged.kill()
        forged.wait()


def test_another_services_tag_on_a_process_of_a_user_that_service_does_not_run_as_is_said_to_be_no_server(server):
    """Found by the new-user pass (issue 24): a nobody GPU holder carrying service sgb's tag, sgb not running; the
    refusal said "gpufleet service sgb, stop it first", and stopping sgb (gpufleet.serving.clean) stopped nothing."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as nobody")
    a = dict(server, user="root", kill=dict(cmdline_regex=None, gpu_strays=False, exclude_regex=None))
    forged = subprocess.Popen(["/bin/sleep", "600"], env={a["tag_name"]: "sgb", "PATH": "/usr/bin:/bin"}, user=65534,
                              group=65534, cwd="/", start_new_session=True)
    root_sgb = subprocess.Popen(["/bin/sleep", "600"], env={a["tag_name"]: "sgb"}, start_new_session=True)
    try:
        wait_for(lambda: (_proc.read_proc(forged.pid) or _proc.read_proc(os.getpid())).uid == 65534
                 and _proc.read_environ(root_sgb.pid, [a["tag_name"]]), 30, "the tagged processes")
        run_dir = os.path.dirname(a["pidfile"])
        hint = _restart.holders_hint(a, [forged.pid, root_sgb.pid])
        assert hint == ("pid %d: the launch tag of service sgb as user %s, and no sgb server of that user runs from %s: "
                        "not that service's server; never killed for that tag, stop it by hand; pid %d: gpufleet "
                        "service %s=sgb, stop it first or give each service its own GPUs (gpufleet_server_gpus)"
                        % (forged.pid, _proc.user_name(65534), run_dir, root_sgb.pid, a["tag_name"])), hint
    finally:
        for p in (forged, root_sgb):
            p.kill()
            p.wait()


def test_an_adopt_regex_leaves_a_hand_started_server_on_other_gpus_alone(server, run_module, nvml, tmp_path):
    """Issue 24: two services on one host, both servers started by hand (no launch tag yet), one adopt regex in
    group_vars matching both. The restart of the service on GPU 0 adopts and kills its own hand-started server and a
    match that holds no GPU (a server still loading), and leaves alone the match whose processes hold GPU 1 only:
    another server. Without gpus (every GPU is this server's) the regex takes every match, as documented."""
    a = server
    mine = nvml.hold(gpu=0, mib=1024, start_new_session=True)
    theirs = nvml.hold(gpu=1, mib=1024, start_new_session=True)
    loading = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "fake_gpu.py", "hold",
                                str(tmp_path)], start_new_session=True)
    # Until its exec the child's command line is this process's: wait for the one the regex matches.
    deadline = time.monotonic() + 60
    while "fake_gpu.py" not in _proc.read_proc(loading.pid).command:
        assert time.monotonic() < deadline, "the loading stand-in never ran"
        time.sleep(0.01)
    theirs_ident = _proc.read_proc(theirs.pid).identity
    a["kill"] = dict(a["kill"], cmdline_regex=r"fake_gpu\.py hold .*" + re.escape(str(tmp_path)))
    try:
        for check_mode in (True, False):
            r = run_module(server_restart.main, a, check_mode=check_mode)
            assert "failed" not in r, r.get("msg")
            killed = {p["pid"] for p in r["kill"]["processes"]}
            assert {mine.pid, loading.pid} <= killed and theirs.pid not in killed, r["kill"]
            assert (theirs.pid, "matched by the adopt regex, but it holds GPU 1 and none of this service's GPUs (0): "
                    "another server, started by hand, left alone") in [(x["pid"], x["reason"]) for x in r["kill"]["excluded"]]
        assert mine.wait(timeout=10) is not None and loading.wait(timeout=10) is not None
        assert theirs.poll() is None and _proc.is_alive(theirs_ident)
        # gpus empty: the server's GPUs are all of them, and the regex's match on GPU 1 is this server's to adopt.
        r = run_module(server_restart.main, dict(a, gpus=[]), check_mode=True)
        assert theirs.pid in {p["pid"] for p in r["kill"]["processes"]}, r["kill"]
    finally:
        loading.kill()
        loading.wait()


def test_a_new_tag_name_restarts_the_server_launched_under_the_old_one(server, run_module):
    """Found by the new-user pass (issue 24): gpufleet_server_tag_name changed on a running service. The old server
    carries the old tag name, and the restart did not select it: it failed at the port preflight, taking its own server
    for a foreign listener "started by hand". A service is its name: GPUFLEET_LAUNCH_TAG (old NAME=this name) selects it
    for the kill, and the new server carries the new tag."""
    a = server
    old_name = "GPUFLEET_TEST_OLD_%d" % os.getpid()
    first = run_module(server_restart.main, dict(a, tag_name=old_name))
    try:
        assert "failed" not in first, first.get("msg")
        assert _tagged(a) == []  # the old server carries the old tag name only
        r = run_module(server_restart.main, a)
        assert "failed" not in r, r.get("msg")
        assert first["pid"] in [p["pid"] for p in r["kill"]["processes"]], r["kill"]
        assert not pid_alive(first["pid"]) and r["pid"] in _tagged(a)
    finally:
        for pid in [pid for pid in _proc.snapshot() if _proc.environ_has(pid, old_name, SERVICE)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_worker_without_the_expected_environment_fails_verify_env_and_is_not_recorded(server, run_module):
    a = server
    _lock(a)
    a["verify_env"] = {"expected": {"NCCL_P2P_LEVEL": "SYS", "NCCL_PROTO": "LL"}}
    r = run_module(server_restart.main, a)
    assert r["failed"] and r["phase"] == "verify_env", r
    assert "lack the expected environment" in r["msg"] and "missing NCCL_PROTO" in r["msg"], r["msg"]
    assert r["env"]["wrong"] and r["pid"] in _tagged(a)  # launched, but not proven: not recorded as good
    # Only the mark that the launch is not verified (issue 24: a launch carrying the fingerprint is trusted only
    # without it), no fingerprint.
    assert json.load(open(a["record"]["state_file"])) == {"verified": False}
    assert r["lock_released"] is True


def test_a_process_that_takes_the_servers_gpu_after_the_clean_gate_fails_the_restart(server, run_module, tmp_path):
    """helper-47 (Medium): a process that took a GPU right after the kill (a watcher starting a job when the old server
    died) shared it with the new server unseen: the host was reported ok and the server recorded as its last known good.
    Here the launch itself starts it, without the launch tag, after the clean gate: the restart fails, unrecorded."""
    a = server
    _lock(a)
    wrapper = tmp_path / "with_intruder.py"
    wrapper.write_text(
        "import os, subprocess, sys, time\n"
        "env = {k: v for k, v in os.environ.items() if k != %r}\n"
        "subprocess.Popen([sys.executable, os.path.join(os.environ['FAKE_DIR'], 'fake_gpu.py'), 'hold', '--gpu', '0',"
        " '--mib', '10', '--ready-file', %r], env=env, start_new_session=True)\n"
        "while not os.path.exists(%r):\n    time.sleep(0.01)\n"
        "os.execv(sys.executable, [sys.executable] + sys.argv[1:])\n"
        % (a["tag_name"], str(tmp_path / "intruder-ready"), str(tmp_path / "intruder-ready")))
    a["command"] = [sys.executable, str(wrapper)] + a["command"][1:]
    try:
        r = run_module(server_restart.main, a)
        assert r["failed"] and r["phase"] == "verify_gpus", r
        intruder = [pid for pid in _proc.snapshot() if pid not in _tagged(a)
                    and "intruder-ready" in " ".join(_proc.read_proc(pid).cmdline if _proc.read_proc(pid) else [])]
        assert len(intruder) == 1, intruder
        assert r["msg"].startswith("after the launch, GPU 0 is held by pid %d (" % intruder[0]), r["msg"]
        assert ("not this server's (no %s=%s in its environment): another process took the GPU between the clean gate "
                "and the launch" % (a["tag_name"], SERVICE)) in r["msg"], r["msg"]
        assert list(r["gpu_intruders"]) == ["0"] and len(r["gpu_intruders"]["0"]) == 1, r["gpu_intruders"]
        assert json.load(open(a["record"]["state_file"])) == {"verified": False}  # not recorded as good
        assert pid_alive(intruder[0])  # never killed: it is not this service's
    finally:
        for pid in _proc.snapshot():
            proc = _proc.read_proc(pid)
            if proc and "intruder-ready" in " ".join(proc.cmdline):
                os.kill(pid, signal.SIGKILL)


def test_check_mode_lists_what_it_would_kill_and_changes_nothing(server, run_module):
    a = server
    first = run_module(server_restart.main, a)
    old = _tagged(a)
    state_before = open(a["record"]["state_file"]).read()
    r = run_module(server_restart.main, a, check_mode=True)
    assert r["changed"] is True and r["would_launch"] is True and "lock_released" not in r
    assert sorted(p["pid"] for p in r["kill"]["processes"]) == old and r["kill"]["elapsed_s"] == 0
    # Nothing was signalled: no kill to count or time (a 0.00 in the summary would read as a kill).
    assert r["killed"] == 0 and "kill_s" not in r["timings"]
    assert _tagged(a) == old and all(pid_alive(p) for p in old)
    assert _statefile.pidfile_identity(a["pidfile"])[0] == first["pid"]
    assert open(a["record"]["state_file"]).read() == state_before


def test_check_mode_fails_where_the_clean_gate_would_and_passes_where_the_stray_kill_would_clear_it(
        server, run_module, nvml):
    a = server
    run_module(server_restart.main, a)
    old = _tagged(a)
    stray = nvml.hold(gpu=0, mib=256)  # a hand-started server's worker: no launch tag, so the kill leaves it
    a["wait_clean"] = {"timeout": 0.3}
    r = run_module(server_restart.main, a, check_mode=True)
    # Not changed: the real run fails before it stops anything.
    assert r["failed"] and r["phase"] == "clean" and r["changed"] is False and r["killed"] == 0, r
    assert re.match(r"would fail at the clean gate, before the kill: GPUs not clean after \d+\.\d s, held by processes the "
                    r"kill would not end: GPU 0 pid %d \(" % stray.pid, r["msg"]), r["msg"]
    assert r["msg"].endswith("None is gpufleet's: adopt a server started by hand with kill.cmdline_regex "
                             "(gpufleet_server_adopt_cmdline_regex), or kill.gpu_strays (gpufleet_server_kill_gpu_strays) "
                             "ends them"), r["msg"]
    assert [h["pid"] for h in r["clean"]["holders"]] == [stray.pid]
    # The server's own processes are not named: the kill would end them.
    assert not any(h["pid"] in old for h in r["clean"]["holders"])
    assert stray.poll() is None and _tagged(a) == old

    # With the stray kill, the real run would clear the GPUs: check mode predicts a launch, and kills nothing.
    a["kill"] = dict(a["kill"], gpu_strays=True)
    r = run_module(server_restart.main, a, check_mode=True)
    assert "failed" not in r and r["would_launch"] is True, r.get("msg")
    # (Check mode kills nothing, so the stray kill's list also holds the server's own GPU worker.)
    assert stray.pid in [p["pid"] for p in r["strays"]["processes"]]
    assert {p["pid"] for p in r["strays"]["processes"]} <= set(old) | {stray.pid}
    assert stray.poll() is None and _tagged(a) == old


# Bug E: a holder that neither kill step would end fails the gate after the kill for sure; the real run refuses before
# stopping anything, with the gate's holders and advice, and check mode says the same.
UNENDED = {
    "hand-started": ({}, {}, "None is gpufleet's: adopt a server started by hand with kill.cmdline_regex "
                             "(gpufleet_server_adopt_cmdline_regex), or kill.gpu_strays (gpufleet_server_kill_gpu_strays) "
                             "ends them"),
    "other-service": ({"GPUFLEET_OTHER": "sgb"}, {"gpu_strays": True},
                      "gpufleet service {tag}=sgb, stop it first or give each service its own GPUs (gpufleet_server_gpus)"),
    "excluded": ({}, {"gpu_strays": True, "exclude_regex": ["--mib 256 "]},
                 "never killed (excluded by '--mib 256 '), stop it by hand"),
}


def _verdict(msg):
    """A failure message less its verb and its waited seconds (check mode and the real run wait alike)."""
    return re.sub(r"after \d+\.\d s", "after N s", re.sub(r"^(would fail|fails) ", "", msg))


@pytest.mark.parametrize("stop_only", [False, True], ids=["restart", "stop_only"])
@pytest.mark.parametrize("holder", sorted(UNENDED))
def test_a_holder_no_kill_would_end_refuses_before_the_kill_and_the_healthy_server_keeps_running(
        server, run_module, nvml, holder, stop_only):
    a = server
    first = run_module(server_restart.main, a)
    assert "failed" not in first, first.get("msg")
    old = _tagged(a)
    identities = sorted(_proc.read_proc(pid).identity for pid in old)
    env, kill, hint = UNENDED[holder]
    stray = nvml.hold(gpu=0, mib=256, extra_env={a["tag_name"]: env["GPUFLEET_OTHER"]} if env else None)
    hint = hint.format(tag=a["tag_name"])
    state_before = open(a["record"]["state_file"]).read()
    a["kill"] = dict(a["kill"], **kill)
    a["wait_clean"] = {"timeout": 0.5}
    if stop_only:
        a = dict(a, stop_only=True, command=None, wait_ready=None, wait_busy=None, verify_env=None, record=None)

    checked = run_module(server_restart.main, a, check_mode=True)
    _lock(a)
    r = run_module(server_restart.main, a)

    assert r["failed"] and r["phase"] == "clean" and r["killed"] == 0 and r["changed"] is False, r
    assert re.match(r"fails at the clean gate, before the kill: GPUs not clean after \d+\.\d s, held by processes the kill "
                    r"would not end: GPU 0 pid %d \(" % stray.pid, r["msg"]), r["msg"]
    assert "; nothing was stopped. " in r["msg"] and r["msg"].endswith(hint), r["msg"]
    assert [h["pid"] for h in r["clean"]["holders"]] == [stray.pid] and r["clean"]["before_kill"] is True
    assert 0.5 <= r["clean"]["waited_s"] < 10, r["clean"]  # the holder got the gate's timeout to go away
    assert "kill" not in r and "strays" not in r and "pid" not in r
    # The healthy server runs on, untouched: the same processes, pidfile and record.
    assert sorted(_proc.read_proc(pid).identity for pid in old if pid_alive(pid)) == identities
    assert _tagged(a) == old and stray.poll() is None
    assert _statefile.pidfile_identity(a["pidfile"])[0] == first["pid"]
    assert open(server["record"]["state_file"]).read() == state_before
    assert r["lock_released"] is True and not os.path.exists(a["release_lock"]["lock_file"])
    # Check mode gave the same verdict, in the same words but the verb.
    assert checked["failed"] and checked["phase"] == "clean" and checked["killed"] == 0 and checked["changed"] is False
    assert checked["msg"].startswith("would fail at the clean gate, before the kill: "), checked["msg"]
    assert _verdict(checked["msg"]) == _verdict(r["msg"]), (checked["msg"], r["msg"])
    assert checked["clean"]["holders"] == r["clean"]["holders"]


def test_a_holder_that_exits_by_itself_within_the_gates_timeout_lets_the_restart_go_on(server, run_module, nvml):
    a = server
    first = run_module(server_restart.main, a)
    assert "failed" not in first, first.get("msg")
    old = _tagged(a)
    # A process ending on its own (a finished job): not the kill's, gone 1 s after the restart starts.
    passing = nvml.hold(gpu=0, mib=256)
    ender = threading.Timer(1.0, passing.kill)
    ender.start()
    a["wait_clean"] = {"timeout": 30}
    r = run_module(server_restart.main, a)
    assert "failed" not in r, r.get("msg")
    assert r["killed"] == 2 and not any(pid_alive(pid) for pid in old)
    ender.join()
    assert passing.wait(timeout=5) is not None and r["pid"] in _tagged(a)


def test_the_systemd_launcher_refuses_before_it_stops_the_unit(server, run_module, nvml, tmp_path):
    """The refusal comes before the launcher's stop: systemctl is never asked (it would fail: this unit is not
    installed, and the unit tests run no systemd)."""
    a = {k: v for k, v in server.items() if k not in ("command", "env", "wait_busy", "verify_env")}
    a.update(launcher="systemd", systemd={"unit": "gpufleet-h7-not-installed.service"})
    stray = nvml.hold(gpu=0, mib=256)
    a["wait_clean"] = {"timeout": 0.3}
    r = run_module(server_restart.main, a)
    assert r["failed"] and r["phase"] == "clean" and r["killed"] == 0 and r["changed"] is False, r
    assert r["msg"].startswith("fails at the clean gate, before the kill: ") and "pid %d" % stray.pid in r["msg"], r["msg"]
    assert "unit" not in r and stray.poll() is None


@pytest.mark.parametrize("change, msg", [
    ({"wait_ready": {"health_url": "", "request": {}}}, "wait_ready: "),
    ({"wait_ready": None}, "wait_ready: set health_url or request"),
    ({"kill": {"signals": ["TERM", "NOPE"]}}, "kill: signals: "),
    ({"kill": {"grace": -1}}, "kill: grace must be >= 0 seconds"),
    ({"env": {"BAD-NAME": "x"}}, "env: invalid variable name 'BAD-NAME'"),
    ({"env": {"HF_TOKEN": ["a", "list"]}}, "env: value of HF_TOKEN must be a string or a number, got list"),
    ({"verify_env": {"expected": {}}}, "verify_env: expected must name at least one variable"),
    ({"wait_busy": {"min_processes": 0}}, "wait_busy: "),
    ({"wait_clean": {"timeout": 0}}, "wait_clean: timeout and poll_interval must be greater than 0 seconds"),
    ({"wait_ready": {"request": {"body": "{}"}}}, "wait_ready: request.url is required when request is set"),
    ({"wait_ready": {"health_url": "http://x/", "interval": 0}}, "wait_ready: interval must be greater than 0 seconds"),
])
def test_bad_input_fails_before_anything_is_killed(server, run_module, change, msg):
    a = server
    run_module(server_restart.main, a)
    old = _tagged(a)
    bad = dict(a, **change)
    r = run_module(server_restart.main, bad)
    assert r["failed"] and msg in r["msg"], r["msg"]
    assert "kill" not in r and _tagged(a) == old
    assert all(pid_alive(p) for p in old)
    # Said so the caller can act on it: the gpu_server role puts a drained host back into rotation only when the
    # failure says nothing was stopped (it left a healthy server out of its balancers otherwise).
    assert r["phase"] == "preflight" and r["killed"] == 0, r


def _status_umask(pid):
    with open("/proc/%d/status" % pid) as f:
        return [ln.split()[1] for ln in f if ln.startswith("Umask:")][0]


@pytest.mark.parametrize("umask, want", [(None, "0022"), ("0002", "0002")])
def test_the_server_gets_its_own_umask_and_gpufleets_files_their_modes_under_the_operators_umask_077(
        server, run_module, umask, want):
    """Issue 16 item 3: a rollout run from a shell with `umask 077` launched a server (and workers) with umask 0077
    and made the run, log and state directories 0700 and the log 0600. The state file is 0600: its fingerprint digests
    the secrets."""
    a = server
    if umask is not None:
        a["umask"] = umask
    old = os.umask(0o077)
    try:
        r = run_module(server_restart.main, a)
    finally:
        os.umask(old)
    assert "failed" not in r, r.get("msg")
    tagged = _tagged(a)
    assert r["pid"] in tagged and len(tagged) == 2
    assert {pid: _status_umask(pid) for pid in tagged} == {pid: want for pid in tagged}
    modes = {k: "%04o" % (os.stat(path).st_mode & 0o7777) for k, path in (
        ("log_dir", os.path.dirname(a["log_path"])), ("log", a["log_path"]),
        ("run_dir", os.path.dirname(a["pidfile"])), ("pidfile", a["pidfile"]),
        ("state_dir", os.path.dirname(a["record"]["state_file"])), ("state", a["record"]["state_file"]))}
    assert modes == dict(log_dir="0755", log="0644", run_dir="0755", pidfile="0644", state_dir="0755", state="0600")


def test_a_bad_umask_fails_before_anything_is_killed(server, run_module):
    a = server
    first = run_module(server_restart.main, a)
    assert "failed" not in first, first.get("msg")
    r = run_module(server_restart.main, dict(a, umask="0o22"))
    assert r["failed"] and "umask must be an octal mode" in r["msg"], r
    assert first["pid"] in _tagged(a)


def test_launch_input_that_would_fail_after_the_kill_fails_before_it(server, run_module):
    # A server that cannot be relaunched is never stopped: each of these failed after the kill before (phase clean
    # or launch), leaving the host without its server.
    first = run_module(server_restart.main, server)
    assert not first.get("failed"), first
    running = _tagged(server)
    for bad, phrase in [({"gpus": [7]}, "GPU index 7 does not exist on this host"),
                        ({"user": "nosuchuser-gpufleet"}, "user nosuchuser-gpufleet does not exist"),
                        ({"workdir": "/nonexistent-gpufleet"}, "workdir /nonexistent-gpufleet is not a directory"),
                        ({"command": ["/nonexistent-gpufleet/python3"]}, "is not an executable file"),
                        ({"command": ["nosuchcmd-gpufleet"]}, "command[0] nosuchcmd-gpufleet is not found on the server's PATH"),
                        ({"user": "nobody", "workdir": "/root"}, "user nobody cannot enter workdir /root"),
                        ({"log_path": "/tmp"}, "log_path /tmp is a directory"),
                        ({"log_path": "/etc/passwd/x.log"}, "log_path /etc/passwd/x.log lies under /etc/passwd"),
                        ({"pidfile": "/etc/passwd/x.pid"}, "pidfile /etc/passwd/x.pid lies under /etc/passwd"),
                        ({"record": {"state_file": "/tmp", "fingerprint": "f" * 64}}, "record.state_file /tmp is a directory")]:
        for check_mode in (True, False):
            r = run_module(server_restart.main, dict(server, **bad), check_mode=check_mode)
            assert r["failed"] and r["phase"] == "preflight", (bad, r)
            assert phrase in r["msg"] and "nothing was stopped" in r["msg"], r["msg"]
            assert r.get("killed", 0) == 0 and _tagged(server) == running, bad
            assert not os.path.exists(server["release_lock"]["lock_file"])  # released all the same


def test_the_cycle_notes_termination_signals_without_obeying_them_and_execd_children_keep_theirs():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    with _restart.shielded(True) as got:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGHUP)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            status = open("/proc/%d/status" % child.pid).read()
        finally:
            child.kill()
            child.wait()
    assert got == ["SIGTERM", "SIGHUP"]
    # Handlers, not SIG_IGN: a server the cycle launches must still stop on SIGTERM.
    ignored = int(re.search(r"^SigIgn:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
    assert not ignored & (1 << (signal.SIGTERM - 1)) and not ignored & (1 << (signal.SIGHUP - 1))
    assert {s: signal.getsignal(s) for s in before} == before
    with _restart.shielded(False) as got:  # check mode: nothing changes
        assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
    assert got == []


# ---------------------------------------------------------------- issue 24: foreign listener, failed relaunch, idle GPU

# Another user's process answering 200 to every request; with a port already taken it retries every 5 ms until it
# gets it (so it takes the port the moment the old server lets it go).
GRABBER = HTTP_OK_SCRIPT + r"""
while True:
    try:
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
        break
    except OSError:
        time.sleep(0.005)
srv.serve_forever()
"""


@pytest.fixture
def grabber():
    """Start GRABBER as user nobody (the system python: nobody cannot reach the test venv); returns it and a function
    telling whether it holds its port."""
    procs = []

    def start(port):
        def demote():
            os.setgid(65534)
            os.setuid(65534)
        p = subprocess.Popen(["/usr/bin/python3", "-c", GRABBER, str(port)], preexec_fn=demote, cwd="/",
                             stdin=subprocess.DEVNULL, start_new_session=True)
        procs.append(p)

        def holds():  # ss -ltnp: the listening socket of the port and its process
            out = subprocess.run(["ss", "-Hltnp", "sport = :%d" % port], capture_output=True, text=True, check=False).stdout
            return "pid=%d," % p.pid in out
        return p, holds
    yield start
    for p in procs:
        p.kill()
        p.wait()


def _port(a):
    return int(a["wait_ready"]["health_url"].rsplit(":", 1)[1].split("/")[0])


def test_no_launch_while_another_services_unfinished_run_changed_the_layers(server, run_module):
    """Found by the new-user pass (issue 24): sga's run wrote the NCCL layers (its snapshot in the run dir) and waited at
    its clean gate; sgb's rollback by hand (which writes no layers) launched onto them, and sga's refused restart then
    put them back. Every launch refuses, before anything is stopped, while another service's run holds its lock with a
    snapshot; its lock alone (it changed nothing) does not."""
    a = server
    assert "failed" not in run_module(server_restart.main, a)
    running = _tagged(a)
    run_dir = os.path.dirname(a["pidfile"])
    owner = "ctl:77:boot.1.uuid:%d" % int(time.time())
    with open(os.path.join(run_dir, "sga.lock"), "w") as f:
        json.dump({"owner": owner, "acquired": time.time(), "expires": time.time() + 600}, f)
    with open(os.path.join(run_dir, "sga.layers-previous.json"), "w") as f:
        json.dump({"files": []}, f)
    r = run_module(server_restart.main, a)
    assert r["failed"] and r["phase"] == "preflight", r
    since = re.search(r"since (\d\d:\d\d:\d\d), until (\d\d:\d\d:\d\d)", r["msg"])
    assert since, r["msg"]
    assert r["msg"] == ("the NCCL layers are host-wide and service sga (its host lock held by run %s since %s, until %s; "
                        "no process of that run works on this host now) changed them and "
                        "has not finished its restart on this host; it puts them back if that restart is refused before "
                        "its kill, and %s would then run with values the files no longer hold. Run again once that run "
                        "is done. If it was interrupted (Ctrl-C, its controller killed), rerun the rollout of sga: from "
                        "the controller that started it, it takes the lock over and finishes; from another, remove %s "
                        "first, once you know that run is gone (runbook: A rollout was interrupted); nothing was stopped"
                        % (owner, since.group(1), since.group(2), SERVICE, os.path.join(run_dir, "sga.lock"))), r["msg"]
    assert r.get("killed", 0) == 0 and _tagged(a) == running
    os.unlink(os.path.join(run_dir, "sga.layers-previous.json"))
    r = run_module(server_restart.main, a)
    assert "failed" not in r and not set(_tagged(a)) & set(running), r.get("msg")


def test_a_foreign_listener_on_the_servers_port_fails_the_preflight_and_nothing_is_stopped(server, run_module,
                                                                                           grabber):
    a = server
    assert "failed" not in run_module(server_restart.main, a)
    running = _tagged(a)
    new_port = _free_port()
    holder, holds = grabber(new_port)
    deadline = time.monotonic() + 30
    while not holds() and time.monotonic() < deadline:
        time.sleep(0.02)
    # The new definition moves the server to the port the foreign process holds.
    a["command"] = a["command"][:2] + [str(new_port)] + a["command"][3:]
    a["wait_ready"] = dict(a["wait_ready"], health_url="http://127.0.0.1:%d/health" % new_port)
    r = run_module(server_restart.main, a)
    assert r["failed"] and r["phase"] == "preflight", r
    assert r["msg"].startswith("port %d of http://127.0.0.1:%d/health is held by pid %d (nobody: " % (
        new_port, new_port, holder.pid)), r["msg"]
    assert "Nothing was stopped" in r["msg"] and r["port_holders"][0]["pid"] == holder.pid
    assert r.get("killed", 0) == 0 and _tagged(a) == running and holder.poll() is None


def test_a_listener_beside_the_servers_own_address_on_its_port_does_not_refuse_the_restart(server, run_module):
    """helper-49 (Medium): the server listens on 127.0.0.1 and another process on another address of the port: both
    listen side by side (no EADDRINUSE), so the restart goes on; the old server's own sockets say where it binds."""
    a = server
    assert "failed" not in run_module(server_restart.main, a)
    beside = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        beside.bind(("127.0.0.2", _port(a)))
        beside.listen(1)
        r = run_module(server_restart.main, a)
        assert "failed" not in r, r.get("msg")
        assert r["killed"] >= 1 and r["ready"]["ready_s"] > 0
    finally:
        beside.close()


def test_a_foreign_listener_taking_the_port_after_the_kill_fails_the_start_at_once_and_is_not_killed(
        server, run_module, grabber):
    a = server
    first = run_module(server_restart.main, a)
    assert "failed" not in first, first.get("msg")
    holder, holds = grabber(_port(a))  # waits for the port: the old server holds it during the preflight
    a["wait_ready"] = dict(a["wait_ready"], timeout=120)
    a["wait_busy"] = {"timeout": 120}
    t0 = time.monotonic()
    r = run_module(server_restart.main, a)
    took = time.monotonic() - t0
    assert holds() and holder.poll() is None  # it got the port, and is left alone
    assert r["failed"] and r["phase"] == "startup", r
    assert took < 60, took
    assert r["msg"].startswith("server process %d exited during start-up after " % r["pid"]), r["msg"]
    assert "(exit status 1); port %d is held by pid %d (nobody: " % (_port(a), holder.pid) in r["msg"], r["msg"]
    assert "Address already in use" in r["log_tail"]
    # Its worker, which had started before the launcher died, is stopped: nothing of the service holds the GPU.
    assert r["new_server"]["stopped"] is True and r["new_server"]["killed"] == 1, r["new_server"]
    assert r["new_server"]["clean"]["holders"] == [] and _tagged(a) == []
    assert "The failed new server was stopped (1 process(es) ended) and its GPUs are clean" in r["msg"], r["msg"]


def test_a_relaunch_failing_its_readiness_is_stopped_unless_kept_for_debugging(server, run_module):
    a = server
    assert "failed" not in run_module(server_restart.main, a)
    # /health answers 200, the real request never succeeds (the demo launcher answers no POST).
    a["wait_ready"] = dict(a["wait_ready"], timeout=1.5, request={"url": a["wait_ready"]["health_url"].replace(
        "/health", "/generate"), "timeout": 0.3})
    r = run_module(server_restart.main, a)
    assert r["failed"] and r["phase"] == "ready" and r["health_ok"] is True, r
    assert r["killed"] == 2  # the old server
    assert r["new_server"]["kept"] is False and r["new_server"]["stopped"] is True and r["new_server"]["killed"] == 2
    assert r["new_server"]["clean"]["holders"] == [] and _tagged(a) == []
    assert r["msg"].endswith("The failed new server was stopped (2 process(es) ended) and its GPUs are clean: nothing "
                             "of this service runs on the host, which is not serving"), r["msg"]

    assert "failed" not in run_module(server_restart.main, dict(a, wait_ready=server["wait_ready"] | {
        "request": {}, "timeout": 30}))
    r = run_module(server_restart.main, dict(a, keep_failed=True))
    assert r["failed"] and r["phase"] == "ready", r
    kept = _tagged(a)
    assert r["pid"] in kept and len(kept) == 2 and r["new_server"]["kept"] is True, (kept, r["new_server"])
    assert "The failed new server was kept for debugging (keep_failed): 2 process(es) of it (pid %d) still run" % (
        r["pid"]) in r["msg"], r["msg"]


def test_keep_failed_with_a_launcher_that_died_keeps_nothing_and_says_so(server, run_module):
    """issue 26: the summary's "failed new server kept" comes from new_server.kept; a server that exited during its
    start-up leaves nothing to keep, and the result must not say it kept something."""
    a = dict(server, keep_failed=True, command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    r = run_module(server_restart.main, a)
    assert r["failed"] and r["phase"] in ("startup", "ready"), r
    assert r["new_server"]["kept"] is False and r["new_server"]["processes"] == 0, r["new_server"]
    assert "Nothing of the failed new server is left running (keep_failed had nothing to keep)" in r["msg"], r["msg"]
    assert _tagged(a) == []


def test_with_gpus_unset_a_gpu_the_ready_server_leaves_idle_fails_early_and_names_the_gpus_to_set(
        server, run_module):
    a = server
    a["gpus"] = []  # both fake GPUs; the server's one worker holds GPU 0
    a["wait_busy"] = {"timeout": 120, "idle_grace": 1}
    t0 = time.monotonic()
    r = run_module(server_restart.main, a)
    took = time.monotonic() - t0
    assert r["failed"] and r["phase"] == "busy", r
    assert took < 60, took
    assert re.search(r"^GPUs not busy after [0-9.]+ s \(GPU 0 2000 MiB used, GPU 1 0 MiB used\): GPU 1 stayed idle "
                     r"[0-9.]+ s after the server was ready while its processes hold GPU 0; if the server uses only "
                     r"GPU 0, set gpus \(gpufleet_server_gpus\) to \[0\]", r["msg"]), r["msg"]
    assert r["busy"]["idle"] == [1] and r["busy"]["held"] == [0], r["busy"]


def test_a_server_started_by_hand_on_the_port_is_named_with_the_takeover_hint_or_left_to_the_stray_kill(
        server, run_module, nvml):
    a = server
    # The same server, started by hand without the launch tag: it listens on the port, its worker holds GPU 0.
    env = dict(os.environ, **a["env"])
    hand = subprocess.Popen(a["command"], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while "pid=%d," % hand.pid not in subprocess.run(["ss", "-Hltnp", "sport = :%d" % _port(a)], check=False,
                                                         capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline and hand.poll() is None
            time.sleep(0.05)
        r = run_module(server_restart.main, a)
        assert r["failed"] and r["phase"] == "preflight", r
        assert "is held by pid %d (" % hand.pid in r["msg"], r["msg"]
        assert r["msg"].endswith("It holds the server's GPUs (a server started by hand?): adopt it with "
                                 "kill.cmdline_regex (gpufleet_server_adopt_cmdline_regex), or kill.gpu_strays "
                                 "(gpufleet_server_kill_gpu_strays) ends what holds them"), r["msg"]
        assert hand.poll() is None
        # With the stray kill, the preflight lets it through: the stray kill ends its GPU-holding worker.
        a["kill"] = dict(a["kill"], gpu_strays=True)
        a["wait_ready"] = dict(a["wait_ready"], timeout=10)
        r = run_module(server_restart.main, a)
        assert r.get("phase") != "preflight" and r["strays"]["signalled"] == 1, r
    finally:
        hand.kill()
        hand.wait()


def test_a_stop_removes_the_pidfile_of_the_server_it_stopped(server, run_module):
    """Issue 24: after the clean playbook the pidfile named the stopped server's pid, which the next process could
    reuse. The stop removes its pidfile once the process it names is gone (check mode removes nothing)."""
    a = server
    first = run_module(server_restart.main, a)
    assert "failed" not in first, first.get("msg")
    stop = dict(a, stop_only=True, command=None, wait_ready=None, wait_busy=None, verify_env=None, record=None,
                release_lock=None)
    checked = run_module(server_restart.main, stop, check_mode=True)
    assert "failed" not in checked and checked["would_stop"] is True and "pidfile_removed" not in checked, checked
    assert _statefile.pidfile_identity(a["pidfile"])[0] == first["pid"]
    r = run_module(server_restart.main, stop)
    assert "failed" not in r and r["killed"] >= 1 and r["pidfile_removed"] is True, r
    assert not os.path.exists(a["pidfile"]) and _tagged(a) == []
    again = run_module(server_restart.main, stop)  # nothing to stop, nothing to remove
    assert "failed" not in again and again["killed"] == 0 and "pidfile_removed" not in again, again


def _restore(a, fingerprint):
    """A restore call: the caller's definition left out (the generation's is launched)."""
    return dict({k: v for k, v in a.items() if k not in ("command", "env")}, restore=fingerprint)


def test_restore_relaunches_a_last_known_good_generation_verifies_it_as_then_and_makes_it_the_newest(server, run_module,
                                                                                                     tmp_path):
    """The rollback by hand (issue 26): definition A, then B (another NCCL value) both pass and are kept; restore A by
    the 12 characters the summary shows: B's server is killed, A's NCCL layer (an nccl.conf of its own here) is put
    back, A's command and environment are launched, its worker is verified against A's expected environment (not the
    caller's), the record says A, and A is the newest generation again, the file noting the rollback from B. Check mode
    says the same and changes nothing."""
    conf = tmp_path / "nccl.conf"
    a = dict(server, record=dict(server["record"], fingerprint="a" * 64, generations=3,
                                 layers={"nccl_conf": {"path": str(conf), "env": {"NCCL_ALGO": "Ring"}}}))
    assert "failed" not in run_module(server_restart.main, a)
    lkg = a["record"]["state_file"][:-len(".json")] + ".last_good.json"
    b = dict(a, env=dict(a["env"], NCCL_P2P_LEVEL="NVL"), verify_env={"expected": {"NCCL_P2P_LEVEL": "NVL"}},
             record=dict(a["record"], fingerprint="b" * 64, layers=None))
    r = run_module(server_restart.main, b)
    assert "failed" not in r and [g["fingerprint"] for g in r["last_good"]] == ["b" * 64, "a" * 64], r
    b_pids = _tagged(a)

    # The caller still passes B's expected environment: the generation's is what its workers are verified against.
    r = run_module(server_restart.main, _restore(b, "a" * 12), check_mode=True)
    assert "failed" not in r and r["would_launch"] is True and r["changed"] is True, r
    assert r["restore"] == {"fingerprint": "a" * 64, "recorded_at": r["restore"]["recorded_at"], "previous": "b" * 64}
    assert _tagged(a) == b_pids and json.loads(open(a["record"]["state_file"]).read())["fingerprint"] == "b" * 64
    assert r["layers_restored"] == {"changed": True, "layers": ["nccl_conf"]} and not conf.exists(), r

    r = run_module(server_restart.main, _restore(b, "a" * 12))
    assert "failed" not in r, r["msg"]
    assert r["killed"] == 2 and not any(pid_alive(p) for p in b_pids), r
    assert r["layers_restored"]["changed"] is True and "NCCL_ALGO=Ring" in conf.read_text(), r
    assert r["env"]["ok"] == 1 and r["env"]["processes"][0]["env"] == {"NCCL_P2P_LEVEL": "SYS"}, r["env"]
    worker = [p for p in _tagged(a) if p != r["pid"]]
    assert _proc.read_environ(worker[0], ["NCCL_P2P_LEVEL"]) == {"NCCL_P2P_LEVEL": "SYS"}
    state = json.loads(open(a["record"]["state_file"]).read())
    assert state["fingerprint"] == "a" * 64 and state["pid"] == r["pid"] and state.get("verified") is not False
    data = json.loads(open(lkg).read())
    assert [g["fingerprint"] for g in data["generations"]] == ["a" * 64, "b" * 64] and data["generations"][0]["restored_at"]
    assert data["rolled_back"]["from"] == "b" * 64 and data["rolled_back"]["to"] == "a" * 64
    assert [g["fingerprint"] for g in r["last_good"]] == ["a" * 64, "b" * 64] and "env" not in r["last_good"][0]


@pytest.mark.parametrize("restore, said", [
    ("c" * 64, "restore: %s is not a last known good generation of this host (" % ("c" * 64)),
    ("bbbb", "restore: 'bbbb' is not a fingerprint of a last known good generation of this host and too short"),
])
def test_a_restore_of_a_generation_the_host_lacks_fails_before_anything_is_stopped(server, run_module, restore, said):
    a = dict(server, record=dict(server["record"], fingerprint="b" * 64, generations=3))
    assert "failed" not in run_module(server_restart.main, a)
    old = _tagged(a)
    r = run_module(server_restart.main, _restore(a, restore))
    assert r["failed"] and said in r["msg"] and r["msg"].endswith("nothing was stopped"), r["msg"]
    assert r["phase"] == "preflight" and "known: bbbbbbbbbbbb (recorded " in r["msg"], r["msg"]
    assert _tagged(a) == old and all(pid_alive(p) for p in old)


@pytest.mark.parametrize("change, said", [
    ({"command": ["x"]}, "restore: command and env are the generation's, not this call's"),
    ({"record": None}, "restore needs record"),
    ({"rollback": True}, "restore: rollback is not for a restore"),
    ({"restore": " "}, "restore must name a fingerprint"),
])
def test_a_restore_with_options_it_cannot_honour_is_refused_before_anything(server, run_module, change, said):
    r = run_module(server_restart.main, dict(_restore(server, "a" * 12), **change))
    assert r["failed"] and said in r["msg"], r["msg"]


def test_a_failed_cycle_keeps_the_lock_for_the_caller_with_keep_on_failure(server, run_module, nvml):
    """The role puts the NCCL layers and the host back after a failed restart: under its lock, which the restart then
    leaves to it (keep_on_failure); a passing cycle still releases it itself."""
    a = server
    a["release_lock"] = dict(a["release_lock"], keep_on_failure=True)
    stray = nvml.hold(gpu=0, mib=4096)  # refused at the clean gate, before the kill
    _lock(a)
    a["wait_clean"] = {"timeout": 0.3}
    r = run_module(server_restart.main, a)
    assert r["failed"] and r["phase"] == "clean" and r["killed"] == 0, r.get("msg")
    assert r["lock_released"] is False and _hostlock.lock_holder(a["release_lock"]["lock_file"]) == "ctl:1:run"
    stray.kill()
    stray.wait()
    a["wait_clean"] = {"timeout": 10}
    r = run_module(server_restart.main, a)
    assert "failed" not in r, r.get("msg")
    assert r["lock_released"] is True and not os.path.exists(a["release_lock"]["lock_file"])


def test_a_rollback_asked_for_and_not_done_says_why(server, run_module):
    """issue 26 (found by a new-user pass): with rollback on, a failure past the kill that cannot go back says so and
    why, instead of leaving the host out of rotation without a word."""
    a = dict(server, rollback=True)
    bad = dict(a, verify_env={"expected": {"NCCL_P2P_LEVEL": "NOT-SET"}})
    r = run_module(server_restart.main, bad)
    assert r["failed"] and r["phase"] == "verify_env", r.get("msg")
    assert r["msg"].endswith("(no rollback: this host has no last known good generation yet)"), r["msg"]
    r = run_module(server_restart.main, a)
    assert "failed" not in r, r.get("msg")  # now kept as the newest generation, with this fingerprint
    r = run_module(server_restart.main, bad)
    assert r["failed"] and "rolled_back" not in r, r.get("msg")
    assert "(no rollback: its newest last known good is this very definition (%s)" % ("f" * 12) in r["msg"], r["msg"]
    r = run_module(server_restart.main, dict(bad, keep_failed=True))
    assert "(no rollback: keep_failed keeps the failed server instead)" in r["msg"], r["msg"]
    r = run_module(server_restart.main, dict(bad, record=dict(bad["record"], generations=0)))
    assert "(no rollback: record.generations is 0, no last known good is kept" in r["msg"], r["msg"]


def test_the_rollback_waits_for_the_generation_where_it_answered_not_at_the_failed_definitions_url(server, run_module):
    """issue 26 (a review finding): a new definition that serves on another port fails; the rollback relaunches the
    last known good, which answers on its own port, and waits for it there (the generation keeps its health URL and
    request), not at the failed definition's URL, where nothing will ever answer."""
    a = dict(server, rollback=True)
    first = run_module(server_restart.main, a)
    assert "failed" not in first, first.get("msg")
    port = _free_port()
    bad = dict(a, command=[sys.executable, "-c", "import sys; sys.exit(3)", str(port)],
               wait_ready=dict(a["wait_ready"], health_url="http://127.0.0.1:%d/health" % port, timeout=60),
               record=dict(a["record"], fingerprint="e" * 64))
    _lock(a)
    r = run_module(server_restart.main, bad)
    assert r["failed"] and r["msg"].startswith("rolled back to the last known good %s" % ("f" * 12)), r["msg"]
    assert r["rolled_back"]["fingerprint"] == "f" * 64 and r["rolled_back"]["pid"] in _tagged(a), r
    with open(_lastgood_path(a)) as f:
        assert json.load(f)["generations"][0]["ready"]["health_url"] == a["wait_ready"]["health_url"]


def _lastgood_path(a):
    from ansible_collections.gpufleet.serving.plugins.module_utils import _lastgood
    return _lastgood.path_for(a["record"]["state_file"])


def test_keep_failed_with_nothing_left_to_keep_goes_back_to_the_last_known_good(server, run_module):
    """Found by the new-user pass (issue 26): keep_failed with a new server that died at start-up kept nothing and
    skipped the rollback, leaving the host without a server ("keep_failed had nothing to keep ... (no rollback:
    keep_failed keeps the failed server instead)"). With nothing to keep, the host goes back as without keep_failed."""
    a = dict(server, rollback=True)
    assert "failed" not in run_module(server_restart.main, a)
    dies = dict(a, command=[sys.executable, "-c", "import sys; sys.exit(3)"], keep_failed=True,
                wait_ready=dict(a["wait_ready"], timeout=60), record=dict(a["record"], fingerprint="e" * 64))
    _lock(a)
    r = run_module(server_restart.main, dies)
    assert r["failed"] and r["msg"].startswith("rolled back to the last known good %s" % ("f" * 12)), r["msg"]
    assert "no rollback" not in r["msg"] and r["rolled_back"]["pid"] in _tagged(a), r
    assert "The failed new server was not running any more; the last known good (pid %d) serves in its place" \
        % r["rolled_back"]["pid"] in r["msg"], r["msg"]
