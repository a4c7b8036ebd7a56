# SPDX-License-Identifier: GPL-3.0-or-later
"""server_bench main() in-process against real HTTP servers: the sandbox's demo server (tests/sandbox/demo_server.py)
as a subprocess, fast and slowed by its GPUFLEET_DEMO_TOKEN_DELAY_S (its stand-in for a slower server), and a tiny
http.server in this process for the OpenAI shape, an HTTP error and counting requests. The pure parts:
tests/unit/plugins/module_utils/test__bench.py."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ansible_collections.gpufleet.serving.plugins.modules import server_bench

DEMO = Path(__file__).resolve().parents[3] / "sandbox" / "demo_server.py"
TOKENS = 8  # max_new_tokens of each request
# The slowed server sleeps this long per token, one request at a time: 8 tokens take 80 ms, at most 100 tokens/s
# whatever the concurrency. The demo without the delay answers in a few ms (its round trip through the worker).
SLOW_S_PER_TOKEN = 0.01
SECRET = "Bearer sk-bench-secret-0123456789"
QUERY_SECRET = "qs-secret-987654"


class Demo:
    """The demo server in its own session (killed as a group at the end, its workers with it)."""

    def __init__(self, tmp: Path, token_delay: float = 0.0) -> None:
        env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_DEMO_TOKEN_DELAY_S"}
        if token_delay:
            env["GPUFLEET_DEMO_TOKEN_DELAY_S"] = str(token_delay)
        self.state = tmp / "state"
        self.log = open(tmp / "demo.log", "wb")
        self.proc = subprocess.Popen([sys.executable, str(DEMO), "--host", "127.0.0.1", "--port", "0", "--mib", "0",
                                      "--state-dir", str(self.state)], env=env, stdout=self.log, stderr=self.log,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.url = ""

    def wait_ready(self, timeout: float = 60.0) -> "Demo":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.state.parent / "demo.log").read_text()
            try:
                state = json.loads((self.state / "launcher.json").read_text())
                if state["ready"]:
                    self.url = "http://127.0.0.1:%d" % state["port"]
                    with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                        if r.status == 200:
                            return self
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        raise AssertionError("demo server not ready after %s s: %s" % (timeout, (self.state.parent / "demo.log").read_text()))

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    """A fast demo server and a slowed one, started together (each spawns its worker: a second or more when busy)."""
    fast = Demo(tmp_path_factory.mktemp("fast"))
    slow = Demo(tmp_path_factory.mktemp("slow"), SLOW_S_PER_TOKEN)
    try:
        yield fast.wait_ready(), slow.wait_ready()
    finally:
        fast.stop()
        slow.stop()


def bench_args(url, **kw):
    a = {"request": {"url": url + "/generate", "body": {"text": "ping", "max_new_tokens": TOKENS}},
         "warmup": 2, "requests": 8, "concurrency": 2, "rounds": 3}
    a.update(kw)
    return a


def test_without_a_baseline_it_measures_passes_and_says_nothing_was_compared(demos, run_module):
    fast, _slow = demos
    r = run_module(server_bench.main, bench_args(fast.url))
    assert "failed" not in r, r
    assert r["changed"] is False and r["passed"] is True and r["ratio"] is None and r["baseline"] is None
    assert r["metric"] == "output_tokens_per_s" and r["url"] == fast.url + "/generate"
    assert r["requests"] == 8 and r["concurrency"] == 2 and r["warmup"] == 2 and r["round_count"] == 3
    assert len(r["rounds"]) == 3 and all(v > 0 for v in r["rounds"]) and r["median"] == sorted(r["rounds"])[1]
    # SGLang's meta_info.completion_tokens (the demo answers max_new_tokens), the warm-up left out.
    assert r["tokens"] == 3 * 8 * TOKENS
    lat = r["latency_s"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["max"]
    assert "no baseline was given, so nothing was compared" in r["msg"] and "skipped" not in r


def test_the_slowed_server_fails_against_the_fast_ones_median_naming_the_ratio(demos, run_module):
    fast, slow = demos
    base = run_module(server_bench.main, bench_args(fast.url))
    assert "failed" not in base, base
    # The fast server against its own median passes. Its few-ms requests vary with the machine's load (other test runs
    # share it: rounds of 818 to 2265 tokens/s in one run at load 8 on the 2-core CI machine, and a median 0.54 of the
    # one before), so this comparison asks for a quarter of it; the slowed server is far below even that (0.04 there).
    again = run_module(server_bench.main, bench_args(fast.url, baseline=base["median"], min_ratio=0.25))
    assert "failed" not in again, again
    assert again["passed"] is True and again["ratio"] >= 0.25 and again["baseline"] == base["median"]
    assert again["msg"].startswith("output_tokens_per_s median %g is " % again["median"])

    r = run_module(server_bench.main, bench_args(slow.url, baseline=base["median"]))
    assert r["failed"] is True and r["passed"] is False and r["changed"] is False, r
    # At most 100 tokens/s (8 tokens in 80 ms, one request at a time): measurably lower than the fast server.
    assert r["median"] <= 1.0 / SLOW_S_PER_TOKEN * 1.05 and r["ratio"] < 0.9, r
    assert r["ratio"] == round(r["median"] / base["median"], 4)
    assert r["msg"].startswith("output_tokens_per_s fell to %.4g of the baseline: median %g against baseline %g, "
                               "below min_ratio 0.9 (rounds: " % (r["median"] / base["median"], r["median"],
                                                                  base["median"])), r["msg"]
    assert len(r["rounds"]) == 3 and r["tokens"] == 3 * 8 * TOKENS
    # Each slowed request takes at least its 8 tokens' sleep.
    assert r["latency_s"]["p50"] >= TOKENS * SLOW_S_PER_TOKEN


def test_requests_per_s_is_measured_too(demos, run_module):
    fast, _slow = demos
    r = run_module(server_bench.main, bench_args(fast.url, metric="requests_per_s", rounds=1, warmup=0))
    assert "failed" not in r, r
    assert r["metric"] == "requests_per_s" and len(r["rounds"]) == 1 and r["tokens"] == 8 * TOKENS


class _Tiny(BaseHTTPRequestHandler):
    """Answers every request with the server's `code` and `answer`, recording what it was sent."""

    def log_message(self, *a):
        pass

    def _answer(self):
        s = self.server
        n = int(self.headers.get("Content-Length") or 0)
        with s.lock:
            s.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                           "body": self.rfile.read(n).decode()})
        data = s.answer.encode()
        self.send_response(s.code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = _answer


@pytest.fixture
def tiny():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Tiny)
    srv.daemon_threads = True
    srv.seen, srv.lock, srv.code = [], threading.Lock(), 200
    srv.answer = json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "a b c d e"}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}})
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.url = "http://127.0.0.1:%d" % srv.server_address[1]
    yield srv
    srv.shutdown()
    srv.server_close()


def openai_args(url, **kw):
    a = {"request": {"url": url + "/v1/completions", "body": {"model": "m", "prompt": "hi", "max_tokens": 5},
                     "headers": {"Authorization": SECRET}},
         "warmup": 1, "requests": 4, "concurrency": 2, "rounds": 2}
    a.update(kw)
    return a


@pytest.mark.parametrize("api", ["auto", "openai"])
def test_an_openai_shaped_answer_is_read_with_api_auto_and_openai(tiny, run_module, api):
    r = run_module(server_bench.main, openai_args(tiny.url, api=api))
    assert "failed" not in r, r
    assert r["tokens"] == 2 * 4 * 5 and len(r["rounds"]) == 2 and r["passed"] is True
    assert len(tiny.seen) == 1 + 2 * 4
    sent = tiny.seen[0]
    assert sent["method"] == "POST" and sent["path"] == "/v1/completions"
    assert json.loads(sent["body"]) == {"model": "m", "prompt": "hi", "max_tokens": 5}
    assert sent["headers"]["Content-Type"] == "application/json" and sent["headers"]["Authorization"] == SECRET
    assert "sk-bench-secret" not in json.dumps(r)


def test_an_openai_shaped_answer_read_as_sglang_fails_naming_the_field(tiny, run_module):
    r = run_module(server_bench.main, openai_args(tiny.url, api="sglang"))
    assert r["failed"] is True and r["phase"] == "warm-up" and r["succeeded"] == 0 and r["status"] == 200, r
    assert r["msg"] == ("a request to %s/v1/completions failed in the warm-up: HTTP 200, but the answer has no output "
                        "token count (meta_info.completion_tokens; it has: choices, id, object, usage); 0 request(s) "
                        "succeeded, 1 failed" % tiny.url)


def test_a_500_answer_fails_naming_the_status_and_the_url_without_its_secrets(tiny, run_module):
    tiny.code, tiny.answer = 500, '{"error": "CUDA out of memory"}'
    url = "http://bench:pw-in-url-5555@127.0.0.1:%d/v1/completions?api_key=%s" % (tiny.server_address[1],
                                                                                  QUERY_SECRET)
    a = openai_args(tiny.url, warmup=0)
    a["request"] = dict(a["request"], url=url, body={"prompt": "hi", "key": "body-secret-4242"})
    r = run_module(server_bench.main, a)
    assert r["failed"] is True and r["passed"] is False and r["status"] == 500 and r["phase"] == "round 1 of 2", r
    assert r["msg"].startswith("a request to %s/v1/completions failed in round 1 of 2: HTTP 500 (answer: "
                               '{"error": "CUDA out of memory"}); 0 request(s) succeeded, ' % tiny.url), r["msg"]
    assert r["url"] == tiny.url + "/v1/completions" and r["succeeded"] == 0 and r["failed_requests"] >= 1
    assert r["rounds"] == [] and "median" not in r
    # The header was sent, and its value never comes back (the invocation masks it); nor does anything of the URL's
    # credentials or query string, or the body, outside the invocation that echoes the options as given.
    assert tiny.seen[0]["headers"]["Authorization"] == SECRET
    assert "sk-bench-secret" not in json.dumps(r)
    shown = json.dumps({k: v for k, v in r.items() if k != "invocation"})
    for secret in (QUERY_SECRET, "pw-in-url", "body-secret"):
        assert secret not in shown


def test_a_server_that_refuses_fails_naming_the_cause_and_no_success(run_module):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = "http://127.0.0.1:%d" % s.getsockname()[1]
    r = run_module(server_bench.main, openai_args(url))
    assert r["failed"] is True and r["status"] is None and r["succeeded"] == 0 and r["phase"] == "warm-up", r
    assert r["msg"].startswith("a request to %s/v1/completions failed in the warm-up: connection error: " % url)
    assert "refused" in r["msg"].lower() and "sk-bench-secret" not in json.dumps(r)


def test_a_timeout_fails_saying_so(tiny, run_module):
    class Hang(_Tiny):
        def _answer(self):
            time.sleep(1.0)
            super()._answer()
        do_POST = _answer

    tiny.RequestHandlerClass = Hang
    r = run_module(server_bench.main, openai_args(tiny.url, timeout=0.2, warmup=1))
    assert r["failed"] is True and r["phase"] == "warm-up" and r["status"] is None, r
    assert "failed in the warm-up: no answer within the timeout of 0.2 s" in r["msg"], r["msg"]


def test_check_mode_sends_no_request_and_says_what_it_would_measure(tiny, run_module):
    r = run_module(server_bench.main, openai_args(tiny.url, baseline=250.0, min_ratio=0.8), check_mode=True)
    assert "failed" not in r, r
    assert tiny.seen == []
    assert r["changed"] is False and r["skipped"] is True and r["passed"] is None and r["ratio"] is None
    assert r["rounds"] == [] and r["median"] is None and r["tokens"] is None and r["latency_s"] is None
    assert r["baseline"] == 250.0 and r["round_count"] == 2 and r["requests"] == 4 and r["concurrency"] == 2
    assert r["msg"] == ("check mode, no request sent: a run would measure output_tokens_per_s of POST "
                        "%s/v1/completions: 1 warm-up request(s), then 2 round(s) of 4 request(s) at concurrency 2, "
                        "the median compared with the baseline 250.0 (failing below 0.8 of it)" % tiny.url)
    assert "sk-bench-secret" not in json.dumps(r)


@pytest.mark.parametrize("kw, msg", [
    (dict(concurrency=0), "concurrency must be >= 1, got 0"),
    (dict(requests=0), "requests must be >= 1, got 0"),
    (dict(min_ratio=1.2, baseline=10.0), "min_ratio must be greater than 0 and at most 1, got 1.2"),
    (dict(api="tgi"), "value of api must be one of: auto, sglang, openai, got: tgi"),
])
def test_bad_input_fails_before_any_request(tiny, run_module, kw, msg):
    r = run_module(server_bench.main, openai_args(tiny.url, **kw))
    assert r["failed"] is True and r["msg"] == msg, r
    assert tiny.seen == []


def test_a_url_that_is_not_http_fails_before_any_request(tiny, run_module):
    a = openai_args(tiny.url)
    a["request"] = dict(a["request"], url="file:///etc/passwd")
    r = run_module(server_bench.main, a)
    assert r["failed"] is True and tiny.seen == []
    assert r["msg"] == ("request.url must be an http:// or https:// URL with a host (and a valid port), got "
                        "'file:///etc/passwd'")
