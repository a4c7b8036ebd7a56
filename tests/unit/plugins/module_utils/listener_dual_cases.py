# SPDX-License-Identifier: GPL-3.0-or-later
"""A health URL whose host names two addresses (new-user pass, issue 24 item 5): `gpufleet-dual` is ::1 and 127.0.0.1
in the /etc/hosts that test__listener_dual.py bind-mounts for this run (a mount namespace of its own), as `localhost`
is on Ubuntu. A client reaches the first address that has a listener (::1 here); a process holding the port there
answers for the URL although the launched server listens on 127.0.0.1. Real sockets, real processes, /proc."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _listener, _proc, _ready, _server

HOST = "gpufleet-dual"
# 200 to everything, on the address and port given.
SERVE = r"""
import http.server, socket, sys
class S(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
S((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as a, socket.socket(socket.AF_INET6) as b:
        a.bind(("127.0.0.1", 0))
        port = a.getsockname()[1]
        b.bind(("::1", port))  # free on both addresses
        return port


@pytest.fixture
def serve():
    procs = []

    def start(addr, port):
        p = subprocess.Popen([sys.executable, "-c", SERVE, addr, str(port)])
        procs.append(p)
        deadline = time.monotonic() + 30
        while not any(s.address == addr for s in _listener.listeners(port)):
            assert p.poll() is None and time.monotonic() < deadline, "no listener on %s:%d" % (addr, port)
            time.sleep(0.02)
        return p
    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_the_host_names_both_addresses_v6_first():
    assert _listener.connect_order(HOST, 80) == ["::1", "127.0.0.1"]


def test_an_answer_from_the_address_the_url_reaches_first_is_not_the_servers_and_fails_at_once(serve, tmp_path):
    port = _free_port()
    ours = serve("127.0.0.1", port)
    foreign = serve("::1", port)
    url = "http://%s:%d/health" % (HOST, port)
    # Both listen on the port; the preflight's view (every socket the URL's host can reach) names the foreign one.
    res = _listener.port_holders(url, _listener.tree_of(_proc.read_proc(ours.pid).identity))
    assert res["ours"] == [ours.pid] and [f["pid"] for f in res["foreign"]] == [foreign.pid], res
    t0 = time.monotonic()
    with pytest.raises(_server.ServerError) as e:
        _ready.wait_ready(_proc.read_proc(ours.pid).identity, url, {}, 20, 0.05, str(tmp_path / "log"))
    assert time.monotonic() - t0 < 10  # at once, not after the start timeout
    msg = str(e.value)
    assert msg.startswith("health answered from pid %d (" % foreign.pid) and "on port %d, not from the server gpufleet " \
        "launched, which listens there on another address (pid %d): %s reaches that process first" % (
            port, ours.pid, url) in msg, msg
    assert e.value.details["phase"] == "ready"


def test_the_server_on_the_address_reached_first_is_ready_whatever_listens_on_the_other(serve, tmp_path):
    port = _free_port()
    ours = serve("::1", port)
    serve("127.0.0.1", port)
    r = _ready.wait_ready(_proc.read_proc(ours.pid).identity, "http://%s:%d/health" % (HOST, port), {}, 20, 0.05,
                          str(tmp_path / "log"))
    assert r["listener"]["ours"] == [ours.pid] and r["listener"]["checked"] is True, r


def test_reached_prefers_the_exact_address_then_a_wildcard_in_the_clients_order():
    v6, v4, any6 = (_listener.Listener(a, 1, i, 0) for i, a in enumerate(("::1", "127.0.0.1", "::")))
    assert _listener.reached([v4, v6], ["::1", "127.0.0.1"]) == [v6]
    assert _listener.reached([v4, v6], ["127.0.0.1", "::1"]) == [v4]
    assert _listener.reached([v4, any6], ["::1", "127.0.0.1"]) == [any6]  # ::1 reaches the v6 wildcard
    assert _listener.reached([v4], ["::1", "127.0.0.1"]) == [v4]  # nothing on ::1: the client goes on to 127.0.0.1
