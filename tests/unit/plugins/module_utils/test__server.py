# SPDX-License-Identifier: GPL-3.0-or-later
"""_server helpers: env validation, log tail, pidfile/state files, host lock, readiness gate (real processes, real HTTP)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _hostlock, _http, _proc, _ready, _runid, _server, _statefile


# ---------------------------------------------------------------- validate_env

def test_validate_env_stringifies_numbers():
    assert _server.validate_env({"A": "x", "B_2": 3, "_C": 1.5, "D": ""}) == {"A": "x", "B_2": "3", "_C": "1.5", "D": ""}


@pytest.mark.parametrize("env, needle", [
    ({"1A": "x"}, "invalid variable name '1A'"),
    ({"A-B": "x"}, "invalid variable name 'A-B'"),
    ({"": "x"}, "invalid variable name ''"),
    ({"A B": "x"}, "invalid variable name 'A B'"),
    ({5: "x"}, "invalid variable name 5"),
    ({"A": True}, "value of A must be a string or a number, got bool"),
    ({"A": None}, "value of A must be a string or a number, got NoneType"),
    ({"A": ["x"]}, "value of A must be a string or a number, got list"),
    ({"A": {"k": 1}}, "value of A must be a string or a number, got dict"),
    ({"A": "x\0y"}, "value of A contains a NUL byte"),
])
def test_validate_env_errors_name_the_field_and_the_variable(env, needle):
    with pytest.raises(_server.ServerError) as e:
        _server.validate_env(env, field="gpufleet_server_env")
    assert str(e.value).startswith("gpufleet_server_env: "), str(e.value)
    assert needle in str(e.value)


def test_validate_env_never_echoes_other_values():
    with pytest.raises(_server.ServerError) as e:
        _server.validate_env({"HF_TOKEN": "hf_secret", "BAD": None})
    assert "hf_secret" not in str(e.value)


# ---------------------------------------------------------------- log_tail

def test_log_tail_returns_the_last_lines(tmp_path):
    p = tmp_path / "server.log"
    p.write_text("".join("line %d\n" % i for i in range(100)))
    assert _server.log_tail(str(p), lines=3) == "line 97\nline 98\nline 99"


def test_log_tail_reads_only_the_end_of_a_big_log_and_survives_bad_bytes(tmp_path):
    p = tmp_path / "server.log"
    with open(p, "wb") as f:
        f.write(b"x" * 200000 + b"\nbad \xff byte\nTraceback: boom\n")
    out = _server.log_tail(str(p), lines=40, max_bytes=1000)
    assert out.endswith("bad \ufffd byte\nTraceback: boom")
    assert len(out) <= 1000


def test_log_tail_of_a_missing_log_is_empty(tmp_path):
    assert _server.log_tail(str(tmp_path / "nope.log")) == ""


# ---------------------------------------------------------------- pidfile and state files

def test_pidfile_round_trip_and_garbage(tmp_path):
    me = _proc.read_proc(os.getpid())
    pf = tmp_path / "run" / "x.pid"
    _statefile.write_pidfile(str(pf), me)
    assert _statefile.pidfile_identity(str(pf)) == (me.pid, me.start_time)
    assert oct(pf.stat().st_mode & 0o777) == "0o644"
    pf.write_text("garbage\n")
    assert _statefile.pidfile_identity(str(pf)) is None
    pf.write_text("123\n")
    assert _statefile.pidfile_identity(str(pf)) is None
    assert _statefile.pidfile_identity(str(tmp_path / "missing.pid")) is None


def test_state_file_round_trip_missing_and_corrupt(tmp_path):
    sf = tmp_path / "lib" / "demo.json"
    assert _statefile.read_state(str(sf)) == {}
    _statefile.write_json_atomic(str(sf), {"fingerprint": "abc", "pid": 1})
    assert _statefile.read_state(str(sf)) == {"fingerprint": "abc", "pid": 1}
    assert [p.name for p in sf.parent.iterdir()] == ["demo.json"]  # no temp file left
    sf.write_text("{not json")
    assert _statefile.read_state(str(sf)) == {"corrupt": True}


# ---------------------------------------------------------------- host lock

def lock_content(path):
    with open(path) as f:
        return json.load(f)


def test_acquire_then_reacquire_by_the_same_owner_then_release(tmp_path):
    lf = str(tmp_path / "run" / "demo.lock")
    assert _hostlock.acquire_lock(lf, "ctl:1:a", ttl=60, wait=0) == {"acquired": True, "broke_stale": None}
    c = lock_content(lf)
    assert c["owner"] == "ctl:1:a" and 59 <= c["expires"] - time.time() <= 60
    again = _hostlock.acquire_lock(lf, "ctl:1:a", ttl=60, wait=0)
    assert again["acquired"] is False and again["already_held"] is True
    assert _hostlock.release_lock(lf, "ctl:1:a") is True
    assert not os.path.exists(lf)
    assert _hostlock.release_lock(lf, "ctl:1:a") is False


def test_another_live_owner_refuses_after_waiting_and_names_the_holder(tmp_path):
    lf = str(tmp_path / "demo.lock")
    _hostlock.acquire_lock(lf, "ctl:1:a", ttl=60, wait=0)
    t0 = time.monotonic()
    with pytest.raises(_server.ServerError) as e:
        _hostlock.acquire_lock(lf, "ctl:2:b", ttl=60, wait=0.4, poll=0.05)
    took = time.monotonic() - t0
    assert 0.4 <= took < 2
    assert "locked by another gpufleet run (ctl:1:a)" in str(e.value)
    assert e.value.details["holder"] == "ctl:1:a"
    assert lock_content(lf)["owner"] == "ctl:1:a"  # untouched
    assert _hostlock.release_lock(lf, "ctl:2:b") is False  # a stranger cannot release it
    assert lock_content(lf)["owner"] == "ctl:1:a"


def test_waiting_owner_gets_the_lock_when_the_holder_releases(tmp_path):
    lf = str(tmp_path / "demo.lock")
    _hostlock.acquire_lock(lf, "ctl:1:a", ttl=60, wait=0)
    th = threading.Timer(0.3, _hostlock.release_lock, (lf, "ctl:1:a"))
    th.start()
    try:
        r = _hostlock.acquire_lock(lf, "ctl:2:b", ttl=60, wait=5, poll=0.05)
    finally:
        th.join()
    assert r["acquired"] is True and lock_content(lf)["owner"] == "ctl:2:b"


def test_a_lock_past_its_ttl_is_broken_and_reported(tmp_path):
    lf = str(tmp_path / "demo.lock")
    _hostlock.acquire_lock(lf, "ctl:1:old", ttl=0.05, wait=0)
    time.sleep(0.1)
    r = _hostlock.acquire_lock(lf, "ctl:2:new", ttl=60, wait=0)
    assert r["acquired"] is True
    assert r["broke_stale"]["owner"] == "ctl:1:old"
    assert lock_content(lf)["owner"] == "ctl:2:new"


def test_a_corrupt_lock_file_is_broken(tmp_path):
    lf = tmp_path / "demo.lock"
    lf.write_text("{half a json")
    r = _hostlock.acquire_lock(str(lf), "ctl:2:new", ttl=60, wait=0)
    assert r["acquired"] is True and r["broke_stale"] == {"corrupt": True}


# Wait-die (issue 24): run ids carry their start time; ties are broken by the id string.
EARLY = "ctl-a:11:b.1.u1:1000.000000"
LATE = "ctl-b:22:b.2.u2:1001.500000"


def test_a_later_run_meeting_an_earlier_runs_lock_stops_at_once_naming_it(tmp_path):
    lf = str(tmp_path / "demo.lock")
    _hostlock.acquire_lock(lf, EARLY, ttl=60, wait=0)
    t0 = time.monotonic()
    with pytest.raises(_server.ServerError) as e:
        _hostlock.acquire_lock(lf, LATE, ttl=60, wait=30, poll=0.05)  # a long wait it must not use
    assert time.monotonic() - t0 < 1
    started = time.strftime("%H:%M:%S", time.localtime(1000))
    assert str(e.value) == ("host is locked by an earlier gpufleet run %s (started %s); this later run stops here, "
                            "the earlier one goes on; run again after it" % (EARLY, started))
    assert e.value.details["holder"] == EARLY
    assert lock_content(lf)["owner"] == EARLY


def test_an_earlier_run_waits_for_a_later_runs_lock_and_says_how_long(tmp_path):
    lf = str(tmp_path / "demo.lock")
    _hostlock.acquire_lock(lf, LATE, ttl=60, wait=0)
    th = threading.Timer(0.5, _hostlock.release_lock, (lf, LATE))
    th.start()
    try:
        r = _hostlock.acquire_lock(lf, EARLY, ttl=60, wait=10, poll=0.05)
    finally:
        th.join()
    assert r["acquired"] is True and lock_content(lf)["owner"] == EARLY
    assert r["waited"]["for"] == LATE and 0.4 <= r["waited"]["s"] < 5


def test_an_earlier_run_waits_only_up_to_its_bound(tmp_path):
    lf = str(tmp_path / "demo.lock")
    _hostlock.acquire_lock(lf, LATE, ttl=60, wait=0)
    with pytest.raises(_server.ServerError) as e:
        _hostlock.acquire_lock(lf, EARLY, ttl=60, wait=0.3, poll=0.05)
    assert "locked by another gpufleet run (%s)" % LATE in str(e.value) and "still after waiting 0 s" in str(e.value)


def test_two_runs_started_in_the_same_tick_are_ordered_by_their_ids(tmp_path):
    a, b = "ctl:1:b.1.aaa:1000.000000", "ctl:1:b.1.bbb:1000.000000"
    lf = str(tmp_path / "demo.lock")
    _hostlock.acquire_lock(lf, a, ttl=60, wait=0)
    with pytest.raises(_server.ServerError, match="earlier gpufleet run"):
        _hostlock.acquire_lock(lf, b, ttl=60, wait=30)
    _hostlock.release_lock(lf, a)
    _hostlock.acquire_lock(lf, b, ttl=60, wait=0)
    with pytest.raises(_server.ServerError, match="another gpufleet run"):  # a waits for b (bounded)
        _hostlock.acquire_lock(lf, a, ttl=60, wait=0.2, poll=0.05)


@pytest.mark.parametrize("owner, started", [
    ("ctl:1:b.1.u:1000.500000", 1000.5),
    ("ctl:1:b.1.u", None),  # an id of an older gpufleet: no start time, no order
    ("it-run-1", None),
    ("ctl:1:b.1.u:soon", None),
])
def test_run_ids_are_read_with_and_without_a_start_time(owner, started):
    assert _runid.started(owner) == started
    assert _runid.is_earlier(owner, LATE) is (None if started is None else True)


# ---------------------------------------------------------------- readiness gate


def closed_port_url():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "http://127.0.0.1:%d/health" % s.getsockname()[1]


def gen_request(srv, **kw):
    r = {"url": srv.url + "/generate", "method": "POST", "body": '{"text": "ping"}',
         "headers": {"Content-Type": "application/json"}, "timeout": 2}
    r.update(kw)
    return r


def test_http_answers_every_status_and_ignores_proxies(http_server, monkeypatch):
    # The server is on this host: a proxy from the environment must not be used (it would refuse the connection).
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:1")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:1")
    client = _http.http_client()
    assert _http.http(http_server.url + "/health", client=client) == (200, "ok")
    assert _http.http(http_server.url + "/nothing", client=client) == (404, "no")
    http_server.gen_code, http_server.gen_body = 503, "busy"
    assert _http.http(http_server.url + "/generate", "POST", "{}", {"X-A": "1"}) == (503, "busy")
    assert http_server.bodies == ["{}"]


def test_ready_after_health_turns_200_and_the_real_request_succeeds(http_server):
    http_server.health = [503, 503, 200]
    r = _ready.wait_ready(None, http_server.url + "/health", gen_request(http_server, expect_regex="pong"),
                          timeout=10, interval=0.05, log_path="")
    assert r["request_status"] == 200 and "pong" in r["response"]
    assert r["attempts"] == 3 and r["health_s"] is not None and r["ready_s"] >= r["health_s"]
    assert http_server.bodies == ['{"text": "ping"}']


def test_ready_with_health_only(http_server):
    r = _ready.wait_ready(None, http_server.url + "/health", {}, timeout=5, interval=0.05, log_path="")
    assert r["attempts"] == 1 and "request_status" not in r


def test_health_200_but_real_request_failing_times_out_with_the_hang_hint(http_server, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("loading weights\nworker 0 ready\n")
    http_server.gen_code, http_server.gen_body = 503, "scheduler stuck"
    t0 = time.monotonic()
    with pytest.raises(_server.ServerError) as e:
        _ready.wait_ready(None, http_server.url + "/health", gen_request(http_server), timeout=0.6, interval=0.05,
                          log_path=str(log))
    assert 0.6 <= time.monotonic() - t0 < 3
    msg = str(e.value)
    assert msg.startswith("server not ready after 0.6 s: real request returned HTTP 503: scheduler stuck")
    assert "/health answered 200 but the real request did not succeed: the server may be hung" in msg
    assert e.value.details["phase"] == "ready" and e.value.details["health_ok"] is True
    assert e.value.details["log_tail"] == "loading weights\nworker 0 ready"


def test_a_real_request_that_hangs_is_reported_as_such(http_server):
    http_server.hang = 1.0
    with pytest.raises(_server.ServerError) as e:
        _ready.wait_ready(None, http_server.url + "/health", gen_request(http_server, timeout=0.2), timeout=0.5,
                          interval=0.05, log_path="")
    assert "real request failed" in str(e.value) and "may be hung" in str(e.value)


def test_response_not_matching_expect_regex_is_not_ready(http_server):
    http_server.gen_body = '{"error": "model not loaded"}'
    with pytest.raises(_server.ServerError) as e:
        _ready.wait_ready(None, http_server.url + "/health", gen_request(http_server, expect_regex='"text"'),
                          timeout=0.3, interval=0.05, log_path="")
    assert "real request returned HTTP 200: {\"error\": \"model not loaded\"}" in str(e.value)


def test_health_never_answering_times_out_without_the_hang_hint():
    with pytest.raises(_server.ServerError) as e:
        _ready.wait_ready(None, closed_port_url(), {"url": "http://127.0.0.1:1/x"}, timeout=0.3, interval=0.05,
                          log_path="")
    msg = str(e.value)
    assert msg.startswith("server not ready after 0.3 s: health failed: ") and "may be hung" not in msg
    assert e.value.details["health_ok"] is False


def test_a_server_that_dies_fails_at_once_with_its_log_tail(tmp_path):
    log = tmp_path / "server.log"
    with open(log, "wb") as f:
        p = subprocess.Popen([sys.executable, "-c", "import sys, time; print('CUDA out of memory', flush=True); "
                              "time.sleep(0.3); sys.exit(3)"], stdout=f, stderr=subprocess.STDOUT)
    ident = (p.pid, _proc.read_proc(p.pid).start_time)
    reaper = threading.Thread(target=p.wait)  # a real launcher's parent reaps it; a zombie counts as dead too
    reaper.start()
    t0 = time.monotonic()
    with pytest.raises(_server.ServerError) as e:
        _ready.wait_ready(ident, closed_port_url(), {}, timeout=60, interval=0.05, log_path=str(log))
    took = time.monotonic() - t0
    reaper.join()
    assert took < 5, "waited %.1f s for a dead server" % took
    assert str(e.value).startswith("server process %d exited during start-up after " % p.pid)
    assert e.value.details["phase"] == "startup"
    assert "CUDA out of memory" in e.value.details["log_tail"]


def test_a_zombie_server_counts_as_dead(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    ident = (p.pid, _proc.read_proc(p.pid).start_time)
    deadline = time.monotonic() + 5
    while _proc.read_proc(p.pid).state != "Z" and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        with pytest.raises(_server.ServerError) as e:
            _ready.wait_ready(ident, closed_port_url(), {}, timeout=30, interval=0.05, log_path="")
        assert e.value.details["phase"] == "startup"
    finally:
        p.wait()


# A foreign listener on the server's port (issue 24, item 5): this test process's HTTP server answers 200 to everything.
DEMO = os.path.join(os.path.dirname(__file__), "..", "..", "..", "sandbox", "demo_server.py")


def _launch(argv, tmp_path):
    return _server.launch(argv, {"PATH": os.environ["PATH"]}, "root" if os.geteuid() == 0 else os.environ["USER"],
                          str(tmp_path), str(tmp_path / "launch.log"), str(tmp_path / "run" / "s.pid"))


def test_a_foreign_listener_answering_200_is_not_counted_and_is_named(http_server, tmp_path):
    p = _launch(["sleep", "60"], tmp_path)  # the launched server: alive, listening nowhere
    try:
        with pytest.raises(_server.ServerError) as e:
            _ready.wait_ready(p.identity, http_server.url + "/health", {}, timeout=0.6, interval=0.05, log_path="")
    finally:
        os.kill(p.pid, 9)
        os.waitpid(p.pid, 0)
    msg = str(e.value)
    port = int(http_server.url.rsplit(":", 1)[1])
    assert msg.startswith("server not ready after 0.6 s: health answered, but port %d is held by pid %d (" % (
        port, os.getpid())), msg
    assert "not by the server gpufleet launched (pid %d); not counted" % p.pid in msg, msg
    assert e.value.details["phase"] == "ready" and e.value.details["health_ok"] is False


def test_a_launcher_dying_on_eaddrinuse_fails_at_once_with_its_exit_status_and_the_ports_holder(http_server, tmp_path):
    port = int(http_server.url.rsplit(":", 1)[1])
    p = _launch([sys.executable, DEMO, "--host", "127.0.0.1", "--port", str(port), "--state-dir", str(tmp_path / "st")],
                tmp_path)
    t0 = time.monotonic()
    with pytest.raises(_server.ServerError) as e:
        _ready.wait_ready(p.identity, http_server.url + "/health", {}, timeout=120, interval=0.05,
                          log_path=str(tmp_path / "launch.log"))
    assert time.monotonic() - t0 < 30
    msg = str(e.value)
    assert msg.startswith("server process %d exited during start-up after " % p.pid), msg
    assert "(exit status 1); port %d is held by pid %d (" % (port, os.getpid()) in msg, msg
    assert "Address already in use" in msg, msg
    assert e.value.details["phase"] == "startup" and e.value.details["exit_status"] == "exit status 1"


def test_the_launch_line_quotes_the_argv_as_a_shell_would_need_it(tmp_path):
    p = _launch(["sh", "-c", "exit 0", "a b", "it's"], tmp_path)
    os.waitpid(p.pid, 0)
    line = (tmp_path / "launch.log").read_text().splitlines()[0]
    assert line.endswith(": sh -c 'exit 0' 'a b' 'it'\"'\"'s'"), line


# ---------------------------------------------------------------- failure_tail

LAUNCH = "==== gpufleet launch 2026-01-01T00:00:00+0000: demo --log /var/log/demo.log"


def test_failure_tail_of_the_launch_log_starts_at_the_last_launch_line(tmp_path):
    log = tmp_path / "launch.log"
    log.write_text("==== gpufleet launch 2025-12-31T00:00:00+0000: demo\nRuntimeError: an older run's cause\n"
                   + LAUNCH + "\nImportError: this run's cause\n")
    assert _server.failure_tail(str(log), 40) == (LAUNCH + "\nImportError: this run's cause", str(log))


def test_failure_tail_says_where_to_look_when_the_server_wrote_nothing_after_the_launch_line(tmp_path):
    log = tmp_path / "launch.log"
    log.write_text("RuntimeError: an older run's cause\n" + LAUNCH + "\n")
    tail, where = _server.failure_tail(str(log), 40)
    assert tail == LAUNCH
    assert where == ("%s; the server wrote nothing to stdout/stderr: if it logs to a file of its own, name that file "
                     "in log_tail_path (role: gpufleet_server_log_tail_path)" % log)


def test_failure_tail_reads_the_servers_own_log_unless_it_was_not_written_since_the_launch(tmp_path):
    log, own = tmp_path / "launch.log", tmp_path / "own.log"
    log.write_text(LAUNCH + "\n")
    own.write_text("RuntimeError: an older run's cause\n")
    since = _server.log_stamp(str(own))
    assert _server.failure_tail(str(log), 40, str(own), since) == (LAUNCH, "%s; nothing new in %s" % (log, own))
    with open(own, "a") as f:
        f.write("RuntimeError: this run's cause\n")
    assert _server.failure_tail(str(log), 1, str(own), since) == ("RuntimeError: this run's cause", str(own))
    # Without a stamp (server_ready, no launch to compare with): whatever the file holds.
    assert _server.failure_tail(str(log), 1, str(own)) == ("RuntimeError: this run's cause", str(own))
    assert _server.log_stamp(str(tmp_path / "missing.log")) == (0, 0, 0)


# ---------------------------------------------------------------- umask and file modes (issue 16 item 3)

@pytest.fixture
def operator_umask_077():
    """The module runs in whatever umask the operator's shell had: `umask 077` in root's shell, here."""
    old = os.umask(0o077)
    yield
    os.umask(old)


def _umask_of(pid: int) -> str:
    with open("/proc/%d/status" % pid) as f:
        return [ln.split()[1] for ln in f if ln.startswith("Umask:")][0]


def _mode(path) -> str:
    return "%04o" % (os.stat(path).st_mode & 0o7777)


# The server reports its own umask and that of a worker it starts, the way a spawn worker inherits it.
UMASK_SERVER = r"""
import os, subprocess, sys, time
w = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(sys.argv[1] + ".tmp", "w").write("%d\n" % w.pid)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""


@pytest.mark.parametrize("umask, want", [("0022", "0022"), ("027", "0027")])
def test_launch_under_the_operators_umask_077_gives_the_server_its_own_umask_and_the_files_their_modes(
        tmp_path, operator_umask_077, umask, want):
    script = tmp_path / "server.py"
    script.write_text(UMASK_SERVER)
    log = tmp_path / "log" / "deep" / "demo.log"
    pidfile = tmp_path / "run" / "demo.pid"
    worker_file = tmp_path / "worker.pid"
    p = _server.start("demo", [sys.executable, str(script), str(worker_file)], {}, [], "root", "/", str(log),
                      str(pidfile), "GPUFLEET_TEST_UMASK", umask)
    try:
        deadline = time.monotonic() + 10
        while not worker_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        worker = int(worker_file.read_text())
        assert _umask_of(p.pid) == want and _umask_of(worker) == want
        # Every directory gpufleet made (missing parents included) is 0755, its files 0644, whatever the umask.
        for d in (tmp_path / "log", tmp_path / "log" / "deep", tmp_path / "run"):
            assert _mode(d) == "0755", d
        assert _mode(log) == "0644" and _mode(pidfile) == "0644"
    finally:
        os.killpg(p.pid, 9)
        os.waitpid(p.pid, 0)  # the server is this process's child; its worker is not


def test_an_existing_log_and_directory_keep_their_modes(tmp_path, operator_umask_077):
    d = tmp_path / "log"
    d.mkdir(mode=0o750)
    os.chmod(d, 0o750)
    log = d / "demo.log"
    log.write_text("old\n")
    os.chmod(log, 0o640)
    _server.launch([sys.executable, "-c", "pass"], {}, "root", "/", str(log), str(tmp_path / "run" / "x.pid"))
    assert _mode(d) == "0750" and _mode(log) == "0640" and log.read_text().startswith("old\n")


def test_state_file_and_lock_under_umask_077(tmp_path, operator_umask_077):
    state = tmp_path / "var" / "lib" / "gpufleet" / "demo.json"
    _statefile.record_state(str(state), "demo", "f" * 64, str(tmp_path / "none.pid"), {})
    lock = tmp_path / "run" / "gpufleet" / "demo.lock"
    assert _hostlock.acquire_lock(str(lock), "me", 60, 0)["acquired"]
    assert _hostlock.mark_lock(str(lock), "me", (os.getpid(), 1))
    for d in (state.parent, state.parent.parent, lock.parent, lock.parent.parent):
        assert _mode(d) == "0755", d
    # The state file's fingerprint digests the secrets: root only. The lock holds none.
    assert _mode(state) == "0600" and _mode(lock) == "0644"


def test_the_state_file_is_root_only_under_umask_000_and_an_old_0644_one_is_tightened(tmp_path):
    state = tmp_path / "lib" / "demo.json"
    old = os.umask(0)
    try:
        changed, _new = _statefile.record_state(str(state), "demo", "f" * 64, str(tmp_path / "none.pid"), {"kill_s": 1})
        assert changed and _mode(state) == "0600" and _mode(state.parent) == "0755"
        assert _statefile.read_state(str(state))["fingerprint"] == "f" * 64
        # One an older gpufleet wrote 0644: the next record, even an unchanged one, makes it 0600.
        os.chmod(state, 0o644)
        assert _statefile.record_state(str(state), "demo", "f" * 64, str(tmp_path / "none.pid"), {})[0] is False
        assert _mode(state) == "0600"
        # Check mode changes no mode; a world-writable leftover of an older gpufleet's temp name (PATH.PID.tmp) lends
        # neither its mode nor its content (the temp file is a new, unique one) and is not touched.
        os.chmod(state, 0o644)
        _statefile.record_state(str(state), "demo", "e" * 64, str(tmp_path / "none.pid"), {}, check_mode=True)
        assert _mode(state) == "0644"
        tmp = tmp_path / "lib" / ("demo.json.%d.tmp" % os.getpid())
        tmp.write_text("x")
        os.chmod(tmp, 0o666)
        _statefile.record_state(str(state), "demo", "e" * 64, str(tmp_path / "none.pid"), {})
        assert _mode(state) == "0600" and sorted(os.listdir(tmp_path / "lib")) == ["demo.json", tmp.name]
        assert _statefile.read_state(str(state))["fingerprint"] == "e" * 64
    finally:
        os.umask(old)


@pytest.mark.parametrize("value", ["22", "0o22", "0088", "00022", "", "u=rwx"])
def test_a_bad_umask_is_refused(value):
    with pytest.raises(_server.ServerError, match="umask must be an octal mode"):
        _server.parse_umask(value)


# ------------------------------------------------- issue 24: one preflight of the restart's files, for the check and the restart

def test_restart_problems_names_each_file_it_could_not_write_and_a_command_not_on_path(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("")
    files = {"record.state_file": str(plain / "state" / "s.json"), "pidfile": str(tmp_path / "run" / "s.pid"),
             "release_lock.lock_file": str(tmp_path / "run" / "s.lock"), "log_path": str(plain / "log" / "s.log")}
    got = _server.restart_problems(files, command="no-such-server-ut", workdir=str(tmp_path), path=str(tmp_path))
    assert got == [
        "command[0] no-such-server-ut is not found on the server's PATH (%s)" % tmp_path,
        "log_path %s/log/s.log lies under %s, which is not a directory" % (plain, plain),
        "record.state_file %s/state/s.json lies under %s, which is not a directory" % (plain, plain),
    ]
    # The restart's default PATH when the server's env sets none: python3 is on it; no command, no launch checked.
    ok = {k: str(tmp_path / "d" / os.path.basename(v)) for k, v in files.items()}
    assert _server.restart_problems(ok, command="python3") == []
    assert _server.restart_problems(dict(ok, log_path=files["log_path"])) == []


def test_a_file_under_a_read_only_directory_is_a_problem(tmp_path):
    """Root may write anywhere but on a read-only filesystem: a read-only tmpfs, in a mount namespace of its own."""
    ro = tmp_path / "ro"
    ro.mkdir()
    code = ("from ansible_collections.gpufleet.serving.plugins.module_utils import _server; "
            "print(_server.file_path_problem(%r))" % str(ro / "sub" / "x.pid"))
    out = subprocess.run(["unshare", "--mount", "sh", "-c", 'mount -t tmpfs -o ro tmpfs "$1" && exec "$2" -c "$3"', "-",
                          str(ro), sys.executable, code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))).stdout.strip()
    assert out == "cannot be written: directory %s is not writable (a read-only filesystem, or its mode)" % ro
    assert _server.file_path_problem(str(ro / "sub" / "x.pid")) is None  # the same directory, writable
