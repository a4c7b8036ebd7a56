# SPDX-License-Identifier: GPL-3.0-or-later
"""_drain: the Prometheus text parser and the wait for no request in flight (issue 17)."""
from __future__ import annotations

import urllib.error

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _drain

SGLANG = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0"} 3.0
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="1"} 1.0
sglang:num_queue_reqs{model_name="m"} 2.0 1712345678000
sglang:num_running_reqs_offline_batch{model_name="m"} 9.0
vllm:num_requests_running{model_name="m"} NaN
"""


def test_parse_sums_label_sets_and_ignores_other_names():
    assert _drain.parse(SGLANG, _drain.SGLANG_METRICS) == {"sglang:num_running_reqs": 4.0, "sglang:num_queue_reqs": 2.0}


def test_parse_nan_is_no_value():
    assert _drain.parse(SGLANG, ["vllm:num_requests_running"]) == {}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def answers(*texts):
    it = iter(texts)

    def fetch(url):
        x = next(it)
        if isinstance(x, BaseException):
            raise x
        return x
    return fetch


def gauge(running, queued=0):
    return 200, "sglang:num_running_reqs %s\nsglang:num_queue_reqs %s\n" % (running, queued)


def test_waits_until_zero():
    c = Clock()
    r = _drain.wait(answers(gauge(2, 1), gauge(1), gauge(0)), "http://x/metrics", _drain.SGLANG_METRICS, 10, 0.5,
                    clock=c, sleep=c.sleep)
    assert r["inflight"] == 0 and r["reads"] == 3 and r["waited_s"] == 1.0 and not r["server_down"]


def test_timeout_raises_with_the_counts():
    c = Clock()
    with pytest.raises(_drain.DrainTimeout, match=r"1 request\(s\) still in flight after 1s \(sglang:num_queue_reqs=0, "
                                                  r"sglang:num_running_reqs=1\)") as e:
        _drain.wait(answers(*[gauge(1)] * 10), "http://x/metrics", _drain.SGLANG_METRICS, 1, 0.5, clock=c, sleep=c.sleep)
    assert e.value.result["inflight"] == 1


def test_check_mode_reads_once():
    r = _drain.wait(answers(gauge(5)), "http://x/metrics", _drain.SGLANG_METRICS, 10, 0.5, once=True)
    assert r["inflight"] == 5 and r["reads"] == 1


def test_refused_connection_is_a_down_server():
    refused = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
    r = _drain.wait(answers(refused), "http://x/metrics", _drain.SGLANG_METRICS, 10, 0.5)
    assert r["server_down"] and r["inflight"] == 0


@pytest.mark.parametrize("answer,msg", [
    ((200, "other_metric 1\n"), "has none of the metrics sglang:num_running_reqs, sglang:num_queue_reqs"),
    ((500, ""), "answered HTTP 500"),
    (urllib.error.URLError(TimeoutError("timed out")), "could not be read"),
])
def test_unusable_metrics_fail_not_drained(answer, msg):
    with pytest.raises(_drain.DrainError, match=msg) as e:
        _drain.wait(answers(answer), "http://x/metrics", _drain.SGLANG_METRICS, 10, 0.5)
    assert not isinstance(e.value, _drain.DrainTimeout)


@pytest.mark.parametrize("url,metrics,timeout,interval,msg", [
    ("127.0.0.1:30000/metrics", ["a"], 1, 1, "url must be an http"),
    ("http://h/metrics", [], 1, 1, "metrics must be a non-empty list"),
    ("http://h/metrics", ["bad name"], 1, 1, "metrics must be a non-empty list"),
    ("http://h/metrics", ["a"], -1, 1, "timeout must be >= 0"),
    ("http://h/metrics", ["a"], 1, 0, "interval must be greater than 0"),
])
def test_input_errors(url, metrics, timeout, interval, msg):
    assert msg in _drain.input_error(url, metrics, timeout, interval)
