# SPDX-License-Identifier: GPL-3.0-or-later
"""server_ready main() in-process: a real HTTP server in a thread and real processes named by a pidfile."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _proc
from ansible_collections.gpufleet.serving.plugins.modules import server_ready


@pytest.fixture
def srv(http_server):
    """tests/unit/conftest.py's HTTP server: /health 200, POST answers srv.gen_code."""
    return http_server


def pidfile_of(tmp_path, p):
    pf = tmp_path / "demo.pid"
    pf.write_text("%d %d\n" % (p.pid, _proc.read_proc(p.pid).start_time))
    return str(pf)


def test_health_200_and_failing_request_times_out_with_the_hang_hint_and_log_tail(srv, tmp_path, run_module):
    srv.gen_code = 500
    log = tmp_path / "demo.log"
    log.write_text("\n".join("line %d" % i for i in range(100)) + "\n")
    r = run_module(server_ready.main, {"health_url": srv.url + "/health", "request": {"url": srv.url + "/generate"},
                                       "timeout": 0.5, "interval": 0.05, "log_path": str(log), "log_tail_lines": 3})
    assert r["failed"] is True and r["phase"] == "ready" and r["health_ok"] is True
    assert "real request returned HTTP 500" in r["msg"] and "the server may be hung" in r["msg"]
    assert r["log_tail"] == "line 97\nline 98\nline 99"


def test_server_dying_during_start_up_fails_at_once(srv, tmp_path, run_module):
    log = tmp_path / "demo.log"
    with open(log, "wb") as f:
        p = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.3); "
                              "print('RuntimeError: NCCL error', flush=True); sys.exit(1)"], stdout=f, stderr=f)
    pf = pidfile_of(tmp_path, p)
    reaper = threading.Thread(target=p.wait)
    reaper.start()
    t0 = time.monotonic()
    r = run_module(server_ready.main, {"health_url": srv.url + "/nothing-here", "pidfile": pf, "timeout": 120,
                                       "interval": 0.05, "log_path": str(log)})
    reaper.join()
    assert time.monotonic() - t0 < 5
    assert r["failed"] is True and r["phase"] == "startup"
    assert r["msg"].startswith("server process %d exited during start-up" % p.pid)
    assert "RuntimeError: NCCL error" in r["log_tail"]


def test_log_tail_path_names_the_servers_own_log(srv, tmp_path, run_module):
    log, own = tmp_path / "launch.log", tmp_path / "own.log"
    log.write_text("==== gpufleet launch 2026-01-01T00:00:00+0000: demo --log own.log\n")
    p = subprocess.Popen([sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write('RuntimeError: no weights\\n'); "
                          "sys.exit(1)", str(own)])
    pf = pidfile_of(tmp_path, p)
    p.wait()
    r = run_module(server_ready.main, {"health_url": srv.url + "/health", "pidfile": pf, "log_path": str(log),
                                       "log_tail_path": str(own)})
    assert r["failed"] is True and r["phase"] == "startup"
    assert "log tail (%s): RuntimeError: no weights" % own in r["msg"], r["msg"]
    assert r["log_tail"] == "RuntimeError: no weights"


def test_check_mode_polls_as_a_real_run_does(srv, run_module):
    args = {"health_url": srv.url + "/health", "request": {"url": srv.url + "/generate", "body": "{}"},
            "timeout": 5, "interval": 0.05}
    srv.health = [503, 503, 200]
    check = run_module(server_ready.main, args, check_mode=True)
    assert srv.health_calls == 3 and srv.bodies == ["{}"]  # polled until ready, then the real request
    srv.health_calls = 0
    real = run_module(server_ready.main, args)
    assert "failed" not in check and check["changed"] is False and "skipped" not in check
    assert set(check) == set(real) and check["request_status"] == real["request_status"] == 200


@pytest.mark.parametrize("body, headers, sent, content_type", [
    # Issue 24: a YAML dict body was sent as its Python repr ({'text': 'ping'}), and the canary's relaunch failed.
    ({"text": "ping", "sampling_params": {"max_new_tokens": 1}}, {},
     '{"text": "ping", "sampling_params": {"max_new_tokens": 1}}', "application/json"),
    ([{"role": "user", "content": "hi"}], {}, '[{"role": "user", "content": "hi"}]', "application/json"),
    ({"text": "ping"}, {"content-type": "application/vnd.x+json"}, '{"text": "ping"}', "application/vnd.x+json"),
    ('{"text": "ping"}', {}, '{"text": "ping"}', "application/x-www-form-urlencoded"),  # a string: as it is
])
def test_a_dict_or_list_body_is_sent_as_json_and_a_string_as_it_is(srv, run_module, body, headers, sent, content_type):
    request = {"url": srv.url + "/generate", "body": body}
    if headers:
        request["headers"] = headers
    r = run_module(server_ready.main, {"health_url": srv.url + "/health", "request": request, "timeout": 5,
                                       "interval": 0.05})
    assert "failed" not in r and r["request_status"] == 200, r
    assert srv.bodies == [sent] and srv.content_types == [content_type]


def test_a_body_that_is_neither_text_nor_json_is_refused(srv, run_module):
    r = run_module(server_ready.main, {"health_url": srv.url + "/health", "timeout": 5,
                                       "request": {"url": srv.url + "/generate", "body": 42}})
    assert r["failed"] is True and r["msg"] == "request.body must be a dict or a list (sent as JSON) or a string, got int"
    assert srv.bodies == []


def test_check_mode_fails_for_a_server_that_is_not_up(tmp_path, run_module):
    r = run_module(server_ready.main, {"health_url": "http://127.0.0.1:1/health", "timeout": 0.3, "interval": 0.05},
                   check_mode=True)
    assert r["failed"] is True and r["phase"] == "ready" and r["msg"].startswith("server not ready after 0.3 s: health failed")
    r = run_module(server_ready.main, {"health_url": "http://127.0.0.1:1/health", "pidfile": str(tmp_path / "none.pid"),
                                       "timeout": 60}, check_mode=True)
    assert r["failed"] is True and "was the server launched?" in r["msg"]


@pytest.mark.parametrize("args, msg", [
    ({"health_url": "http://x/health", "timeout": 0}, "timeout must be greater than 0 seconds, got 0.0"),
    ({"health_url": "http://x/health", "interval": -1}, "interval must be greater than 0 seconds, got -1.0"),
    ({}, "set health_url or request (or both)"),
    ({"request": {"body": "{}"}}, "request.url is required when request is set"),
    # Each would have polled until the timeout (600 s by default) before failing.
    ({"health_url": "notaurl"}, "health_url must be an http:// or https:// URL with a host (and a valid port), got 'notaurl'"),
    ({"request": {"url": "file:///etc/passwd"}},
     "request.url must be an http:// or https:// URL with a host (and a valid port), got 'file:///etc/passwd'"),
    ({"health_url": "http://127.0.0.1:99999/health"},
     "health_url must be an http:// or https:// URL with a host (and a valid port), got 'http://127.0.0.1:99999/health'"),
    ({"request": {"url": "http://x/generate", "method": "GE T"}},
     "request.method must be an HTTP method such as GET or POST, got 'GE T'"),
    ({"request": {"url": "http://x/generate", "expect_regex": "("}},
     "request.expect_regex: invalid regular expression '(': missing ), unterminated subpattern at position 0"),
    ({"health_url": "http://x/health", "log_tail_lines": -3}, "log_tail_lines must be >= 0, got -3"),
    ({"health_url": "http://x/health", "timeout": "nan"}, "timeout must be greater than 0 seconds, got nan"),
])
def test_bad_input(run_module, args, msg):
    r = run_module(server_ready.main, args)
    assert r["failed"] is True and r["msg"] == msg


def test_missing_pidfile_says_so(tmp_path, run_module):
    r = run_module(server_ready.main, {"health_url": "http://127.0.0.1:1/health", "pidfile": str(tmp_path / "none.pid")})
    assert r["failed"] is True and r["msg"] == "pidfile %s is missing or unreadable; was the server launched?" % (
        tmp_path / "none.pid")
    assert os.listdir(tmp_path) == []


def test_request_headers_are_masked_and_an_unknown_request_key_fails(srv, run_module):
    r = run_module(server_ready.main, {"request": {"url": srv.url + "/generate", "body": "{}", "expect_regex": "pong",
                                                   "headers": {"Authorization": "Bearer sk-0123456789abcdef"}},
                                       "timeout": 5, "interval": 0.05})
    assert "failed" not in r and r["request_status"] == 200
    assert r["invocation"]["module_args"]["request"]["headers"] == {"Authorization": "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"}
    assert "sk-0123456789abcdef" not in str(r)
    bad = run_module(server_ready.main, {"request": {"url": srv.url + "/generate", "expect_re": "pong"}, "timeout": 5})
    assert bad["failed"] is True and "expect_re" in bad["msg"], bad
