# SPDX-License-Identifier: GPL-3.0-or-later
"""_bench's pure parts: an answer's token count per api, the input checks, the rounds and the baseline decision.
The module against real HTTP servers: tests/unit/plugins/modules/test_server_bench.py."""
from __future__ import annotations

import json
import threading

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _bench
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError

SGLANG = {"text": "a b c", "meta_info": {"id": 1, "prompt_tokens": 2, "completion_tokens": 3}}
OPENAI = {"choices": [{"text": "a b c d"}], "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}}
BOTH = dict(SGLANG, usage={"completion_tokens": 9})


@pytest.mark.parametrize("answer, api, want", [
    (SGLANG, "sglang", 3), (SGLANG, "auto", 3), (SGLANG, "openai", None),
    (OPENAI, "openai", 4), (OPENAI, "auto", 4), (OPENAI, "sglang", None),
    (BOTH, "auto", 3), (BOTH, "openai", 9),  # auto reads SGLang's field first
    ([SGLANG, SGLANG], "auto", 6),  # SGLang's answer to a batch of prompts
    ([SGLANG, {"text": "x"}], "auto", None), ([], "auto", None),
    ({"meta_info": {"completion_tokens": True}}, "auto", None),  # a bool is no count
    ({"meta_info": {"completion_tokens": -1}}, "auto", None),
    ({"meta_info": {"completion_tokens": "3"}}, "auto", None),
    ({"meta_info": {"completion_tokens": 3.0}}, "auto", None),
    ({"meta_info": "3"}, "auto", None), ({"meta_info": {}, "usage": {"completion_tokens": 0}}, "auto", 0),
    ("text", "auto", None), (None, "auto", None), (7, "openai", None),
])
def test_output_tokens_per_api(answer, api, want):
    assert _bench.output_tokens(answer, api) == want


@pytest.mark.parametrize("api, names", [
    ("auto", ["meta_info.completion_tokens", "usage.completion_tokens"]),
    ("sglang", ["meta_info.completion_tokens"]), ("openai", ["usage.completion_tokens"])])
def test_field_names_follow_the_api(api, names):
    assert _bench.field_names(api) == names


@pytest.mark.parametrize("url, shown", [
    ("http://127.0.0.1:30000/generate", "http://127.0.0.1:30000/generate"),
    ("https://user:pa55word@host.example:8443/v1/completions?api_key=sk-123#frag",
     "https://host.example:8443/v1/completions"),
    ("http://[::1]:8000/generate?x=1", "http://[::1]:8000/generate"),
])
def test_shown_url_drops_credentials_query_and_fragment(url, shown):
    assert _bench.shown_url(url) == shown


def params(**kw):
    p = dict(request={"url": "http://127.0.0.1:1/generate", "method": "POST", "body": None, "headers": {},
                      "validate_certs": True},
             api="auto", metric="output_tokens_per_s", warmup=2, requests=16, concurrency=4, rounds=3, timeout=120.0,
             baseline=None, min_ratio=0.9)
    req = dict(p["request"], **kw.pop("request", {}))
    p.update(kw, request=req)
    return p


@pytest.mark.parametrize("kw, msg", [
    (dict(requests=0), "requests must be >= 1, got 0"),
    (dict(concurrency=0), "concurrency must be >= 1, got 0"),
    (dict(concurrency=-3), "concurrency must be >= 1, got -3"),
    (dict(concurrency=5000), "concurrency must be at most 4096 (one thread per request in flight), got 5000"),
    (dict(rounds=0), "rounds must be >= 1, got 0"),
    (dict(warmup=-1), "warmup must be >= 0, got -1"),
    (dict(timeout=0.0), "timeout must be greater than 0 seconds, got 0.0"),
    (dict(timeout=float("nan")), "timeout must be greater than 0 seconds, got nan"),
    (dict(timeout=float("inf")), "timeout must be greater than 0 seconds, got inf"),
    (dict(min_ratio=0.0), "min_ratio must be greater than 0 and at most 1, got 0.0"),
    (dict(min_ratio=1.5), "min_ratio must be greater than 0 and at most 1, got 1.5"),
    (dict(min_ratio=float("nan")), "min_ratio must be greater than 0 and at most 1, got nan"),
    (dict(baseline=0.0), "baseline must be greater than 0 (an earlier median of output_tokens_per_s), got 0.0"),
    (dict(baseline=-5.0, metric="requests_per_s"),
     "baseline must be greater than 0 (an earlier median of requests_per_s), got -5.0"),
    (dict(request={"url": "ftp://u:secretpw@host/x?token=abc"}),
     "request.url must be an http:// or https:// URL with a host (and a valid port), got 'ftp://host/x'"),
    (dict(request={"url": "http:///generate"}),
     "request.url must be an http:// or https:// URL with a host (and a valid port), got 'http:///generate'"),
    (dict(request={"url": "http://h:99999/generate"}),
     "request.url must be an http:// or https:// URL with a host (and a valid port), got 'http://h:99999/generate'"),
    (dict(request={"method": "post"}), "request.method must be an HTTP method such as GET or POST, got 'post'"),
    (dict(request={"body": 42}), "request.body must be a dict or a list (sent as JSON) or a string, got int"),
    (dict(request={"headers": {"Bad Name": "x"}}), "request.headers: 'Bad Name' is not a valid header name"),
    (dict(request={"headers": {"X-Key": {"nested": "hunter2hunter2"}}}),
     "request.headers: the value of X-Key must be a string or a number, got dict"),
    (dict(request={"headers": {"Authorization": "Bearer sk-1\r\nX-Injected: 1"}}),
     "request.headers: the value of Authorization contains a line break or a NUL byte"),
])
def test_bad_input_is_refused_with_a_clear_message_that_shows_no_secret(kw, msg):
    with pytest.raises(StepError) as e:
        _bench.check_input(params(**kw))
    assert str(e.value) == msg
    for secret in ("secretpw", "token=abc", "hunter2", "sk-1"):
        assert secret not in str(e.value)


def test_a_dict_body_is_sent_as_json_with_its_content_type_unless_one_is_set():
    req = _bench.check_input(params(request={"body": {"text": "hi", "max_new_tokens": 4}}))
    assert json.loads(req.body) == {"text": "hi", "max_new_tokens": 4}
    assert req.headers == {"Content-Type": "application/json"} and req.method == "POST"
    req = _bench.check_input(params(request={"body": [1, 2], "headers": {"content-type": "text/x", "X-N": 3}}))
    assert req.body == "[1, 2]" and req.headers == {"content-type": "text/x", "X-N": "3"}
    req = _bench.check_input(params(request={"body": '{"raw": true}', "method": "PUT", "validate_certs": False}))
    assert req.body == '{"raw": true}' and req.headers == {} and req.method == "PUT" and req.validate_certs is False


@pytest.mark.parametrize("median, baseline, min_ratio, ratio, passed, msg", [
    (100.0, None, 0.9, None, True,
     "output_tokens_per_s median 100 (rounds: 90, 100, 110); no baseline was given, so nothing was compared"),
    (95.0, 100.0, 0.9, 0.95, True,
     "output_tokens_per_s median 95 is 0.95 of the baseline 100, at least min_ratio 0.9 (rounds: 90, 100, 110)"),
    (90.0, 100.0, 0.9, 0.9, True,  # exactly at the ratio passes
     "output_tokens_per_s median 90 is 0.9 of the baseline 100, at least min_ratio 0.9 (rounds: 90, 100, 110)"),
    (62.0, 100.0, 0.9, 0.62, False,
     "output_tokens_per_s fell to 0.62 of the baseline: median 62 against baseline 100, below min_ratio 0.9 "
     "(rounds: 90, 100, 110)"),
    (120.0, 100.0, 1.0, 1.2, True,
     "output_tokens_per_s median 120 is 1.2 of the baseline 100, at least min_ratio 1 (rounds: 90, 100, 110)"),
    (1.0, 3.0, 0.5, 0.3333, False,
     "output_tokens_per_s fell to 0.3333 of the baseline: median 1 against baseline 3, below min_ratio 0.5 "
     "(rounds: 90, 100, 110)"),
])
def test_the_median_against_the_baseline(median, baseline, min_ratio, ratio, passed, msg):
    assert _bench.compare(median, baseline, min_ratio, "output_tokens_per_s", [90, 100, 110]) == (ratio, passed, msg)


def test_nearest_rank_returns_a_measured_value():
    vals = [0.5, 0.1, 0.4, 0.2, 0.3]
    assert _bench.nearest_rank(vals, 0.5) == 0.3
    assert _bench.nearest_rank(vals, 0.9) == 0.5
    assert _bench.nearest_rank([0.7], 0.9) == 0.7
    assert _bench.nearest_rank(list(range(1, 11)), 0.9) == 9


class FakeClock:
    """A clock each send advances by its request's seconds: round times and latencies without waiting."""

    def __init__(self) -> None:
        self.now = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.now

    def advance(self, s: float) -> None:
        with self.lock:
            self.now += s


def test_measure_counts_tokens_per_round_wall_time_and_leaves_the_warm_up_out():
    clock = FakeClock()
    calls = []

    def send():
        calls.append(1)
        clock.advance(0.5)
        return 200, json.dumps({"meta_info": {"completion_tokens": 10}})

    # concurrency 1: the fake clock's time is the sum of the requests' (0.5 s each, 4 per round = 2 s, 40 tokens).
    p = params(warmup=3, requests=4, concurrency=1, rounds=2)
    res = _bench.measure(send, p, "http://127.0.0.1:1/generate", clock=clock)
    assert len(calls) == 3 + 2 * 4
    assert res["rounds"] == [20.0, 20.0] and res["median"] == 20.0 and res["tokens"] == 80
    assert res["latency_s"] == {"p50": 0.5, "p90": 0.5, "max": 0.5}
    res = _bench.measure(send, dict(p, metric="requests_per_s"), "http://127.0.0.1:1/generate", clock=clock)
    assert res["rounds"] == [2.0, 2.0] and res["tokens"] == 80


def test_requests_per_s_needs_no_token_count_and_then_reports_none():
    res = _bench.measure(lambda: (200, "not json"), params(metric="requests_per_s", requests=3, rounds=1, warmup=0),
                         "u")
    assert res["tokens"] is None and len(res["rounds"]) == 1 and res["rounds"][0] > 0


@pytest.mark.parametrize("answer, metric, error", [
    ((500, "CUDA out of memory"), "output_tokens_per_s", "HTTP 500 (answer: CUDA out of memory)"),
    ((404, ""), "requests_per_s", "HTTP 404 (answer: empty)"),
    ((200, "data: {}\n\n"), "output_tokens_per_s",
     "HTTP 200, but the answer is not JSON (a streamed answer is not read: send stream false)"),
    ((200, '{"text": "x", "meta": 1}'), "output_tokens_per_s",
     "HTTP 200, but the answer has no output token count (meta_info.completion_tokens or usage.completion_tokens; "
     "it has: meta, text)"),
])
def test_a_failed_request_fails_the_measurement_with_what_failed(answer, metric, error):
    with pytest.raises(StepError) as e:
        _bench.measure(lambda: answer, params(metric=metric, warmup=0, requests=2, concurrency=1, rounds=2),
                       "http://h:1/generate")
    # The round's second request fails too when the pool's thread took it before the first failure was seen (a loaded
    # machine: it was seen as 2 failed once); the counts say which.
    failed = e.value.details["failed_requests"]
    assert failed in (1, 2)
    assert str(e.value) == ("a request to http://h:1/generate failed in round 1 of 2: %s; 0 request(s) succeeded, "
                            "%d failed" % (error, failed))
    assert e.value.details == {"phase": "round 1 of 2", "status": answer[0], "succeeded": 0, "failed_requests": failed,
                               "rounds": []}


def test_a_failure_in_a_later_round_keeps_the_rounds_before_and_counts_the_successes():
    n = []

    def send():
        n.append(1)
        return (500, "overloaded") if len(n) == 2 + 3 + 2 else (200, '{"usage": {"completion_tokens": 1}}')

    with pytest.raises(StepError) as e:
        _bench.measure(send, params(warmup=2, requests=3, concurrency=1, rounds=3), "u")
    d = e.value.details
    # The round's last request is cancelled unless the pool's thread took it before the failure was seen.
    assert len(n) in (7, 8) and d["succeeded"] == len(n) - 1 and d["failed_requests"] == 1
    assert d["phase"] == "round 2 of 3" and len(d["rounds"]) == 1


def test_a_connection_error_names_no_credentials_and_a_timeout_says_so():
    def refused():
        raise ConnectionRefusedError(111, "Connection refused")

    def slow():
        raise TimeoutError("timed out")

    out = _bench.attempt(refused, "auto", True, "http://u:pw@h:1/g?k=v", 7.0)
    assert not out.ok and out.status is None and out.error == "connection error: [Errno 111] Connection refused"
    out = _bench.attempt(slow, "auto", True, "http://h:1/g", 7.0)
    assert out.error == "no answer within the timeout of 7.0 s"


def test_an_answer_echoing_the_query_string_or_password_shows_neither():
    url = "http://bench:pw-4242@h:1/generate?api_key=sk-777"
    out = _bench.attempt(lambda: (404, "no route for /generate?api_key=sk-777 (user bench:pw-4242)"), "auto", True,
                         url, 5.0)
    assert out.error == "HTTP 404 (answer: no route for /generate?*** (user bench:***))"
    assert _bench.scrub("GET %s failed" % url, url) == "GET http://h:1/generate failed"


def test_the_plan_says_what_would_be_measured_and_against_what():
    p = params(request={"url": "http://u:pw@h:1/generate?key=s"})
    req = _bench.check_input(p)
    assert _bench.plan_text(p, req) == (
        "output_tokens_per_s of POST http://h:1/generate: 2 warm-up request(s), then 3 round(s) of 16 request(s) at "
        "concurrency 4, with no baseline to compare the median with")
    p = params(baseline=123.5, min_ratio=0.8, metric="requests_per_s", warmup=0)
    assert _bench.plan_text(p, _bench.check_input(p)).endswith(
        "0 warm-up request(s), then 3 round(s) of 16 request(s) at concurrency 4, the median compared with the "
        "baseline 123.5 (failing below 0.8 of it)")


def test_the_gate_plan_says_what_would_be_measured_against_what_and_shows_no_secret():
    p = params(request={"url": "http://user:secretpw@127.0.0.1:30000/generate?token=abc", "body": {"text": "x"},
                        "headers": {"Authorization": "Bearer sk-1"}})
    first = _bench.gate_plan(p, None)
    assert first["would_measure"] is True and first["median"] is None and first["passed"] is None, first
    assert first["url"] == "http://127.0.0.1:30000/generate" and first["key"] == _bench.gate_key(p), first
    assert "with no baseline to compare the median with (this host's first measurement of this benchmark: it would be " \
        "recorded and pass)" in first["msg"] and first["msg"].count("baseline") == 1, first["msg"]
    known = _bench.gate_plan(p, 12.5)
    assert known["baseline"] == 12.5 and "the median compared with the baseline 12.5 (failing below" in known["msg"], known
    assert "this host's last known good measurement" in known["msg"]
    for secret in ("secretpw", "token=abc", "Bearer", "sk-1"):
        assert secret not in json.dumps([first, known])
