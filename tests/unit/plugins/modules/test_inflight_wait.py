# SPDX-License-Identifier: GPL-3.0-or-later
"""inflight_wait main() in-process against a real HTTP server in a thread: the module's glue (its HTTP client, the
headers, the size of a page it reads, the result keys); the wait itself is _drain's (test__drain.py) and the
integration target's (tests/integration/targets/inflight_wait, against the demo server)."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.gpufleet.serving.plugins.modules import inflight_wait

TOKEN = "Bearer it-metrics-token-0123456789"


class _Metrics(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        srv = self.server
        srv.seen.append(dict(self.headers))
        if self.headers.get("Authorization") != srv.token:
            body, code = b"unauthorized", 401
        else:
            # Other metrics first (a big page), the gauges at its end; the running count goes down by one per read.
            running = max(0, srv.running - len(srv.seen) + 1)
            body = (srv.filler + "sglang:num_running_reqs{model_name=\"m\"} %d.0\nsglang:num_queue_reqs 0.0\n"
                    % running).encode()
            code = 200
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def metrics():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    srv.daemon_threads = True
    srv.seen, srv.token, srv.running, srv.filler = [], TOKEN, 0, ""
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.url = "http://127.0.0.1:%d/metrics" % srv.server_address[1]
    yield srv
    srv.shutdown()
    srv.server_close()


def test_reads_until_drained_with_the_secret_header_and_masks_it(metrics, run_module):
    metrics.running = 2
    r = run_module(inflight_wait.main, {"url": metrics.url, "headers": {"Authorization": TOKEN}, "interval": 0.01})
    assert "failed" not in r, r
    assert r["changed"] is False and r["drained"] is True and r["reads"] == 3 and r["inflight"] == 0
    assert r["gauges"] == {"sglang:num_running_reqs": 0.0, "sglang:num_queue_reqs": 0.0}
    assert [h.get("Authorization") for h in metrics.seen] == [TOKEN] * 3
    # No proxy, no ~/.netrc: the one client of _server; the header's value never comes back.
    assert "it-metrics-token" not in str(r)


def test_an_http_error_fails_naming_the_status_not_drained(metrics, run_module):
    r = run_module(inflight_wait.main, {"url": metrics.url, "headers": {"Authorization": "Bearer wrong"}})
    assert r["failed"] and r["drained"] is False and r["reads"] == 1
    assert r["msg"] == "%s answered HTTP 401; the metrics could not be read" % metrics.url


def test_a_metrics_page_past_64_kib_is_read_to_its_gauges(metrics, run_module):
    # The ready poll reads 64 KiB of a response; a metrics page of a busy server is longer and its gauges can be last.
    metrics.filler = "# a histogram line\n" * 20000  # about 380 KiB
    r = run_module(inflight_wait.main, {"url": metrics.url, "headers": {"Authorization": TOKEN}}, check_mode=True)
    assert "failed" not in r, r
    assert r["drained"] is True and r["gauges"]["sglang:num_running_reqs"] == 0.0 and r["reads"] == 1
