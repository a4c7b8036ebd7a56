# SPDX-License-Identifier: GPL-3.0-or-later
"""_listener: who holds the socket listening on a URL's port (real sockets, real processes, /proc)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _listener, _proc, _ready

LISTEN = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET)
s.bind((sys.argv[1], 0)); s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(60)
"""


@pytest.fixture
def child_listener():
    procs = []

    def start(addr="127.0.0.1"):
        p = subprocess.Popen([sys.executable, "-c", LISTEN, addr], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        return p, int(p.stdout.readline())
    yield start
    for p in procs:
        p.kill()
        p.wait()


def _ident(pid):
    return _proc.read_proc(pid).identity


@pytest.fixture
def unrelated():
    """A launched process that listens nowhere (the server that died on EADDRINUSE would be one)."""
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


@pytest.mark.parametrize("addr", ["127.0.0.1", "0.0.0.0", "::"])
def test_a_listener_of_the_launched_process_is_ours_and_another_is_foreign(child_listener, unrelated, addr):
    p, port = child_listener(addr)
    url = "http://127.0.0.1:%d/health" % port
    res = _listener.port_holders(url, _listener.tree_of(_ident(p.pid)))
    assert res["checked"] is True and res["ours"] == [p.pid] and res["foreign"] == [], res
    # The same socket while another process is the launched one: held by a foreign process, named.
    res = _listener.port_holders(url, _listener.tree_of(_ident(unrelated.pid)))
    assert res["checked"] is True and res["ours"] == [] and [f["pid"] for f in res["foreign"]] == [p.pid], res
    assert res["foreign"][0]["user"] == _proc.read_proc(p.pid).user() and "-c" in res["foreign"][0]["cmdline"]
    assert _listener.foreign_text(res).startswith("pid %d (" % p.pid)


def test_descendants_and_tagged_processes_count_as_the_launched_servers(child_listener, unrelated):
    p, port = child_listener()  # a child of this process: in this process's tree
    res = _listener.port_holders("http://localhost:%d/" % port, _listener.tree_of(_ident(os.getpid())))
    assert res["ours"] == [p.pid] and res["foreign"] == [], res
    tagged = subprocess.Popen([sys.executable, "-c", LISTEN, "127.0.0.1"], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, GPUFLEET_LISTEN_TEST="svc"))
    try:
        port2 = int(tagged.stdout.readline())
        url = "http://127.0.0.1:%d/" % port2
        res = _listener.port_holders(url, _listener.tree_of(_ident(unrelated.pid), ("GPUFLEET_LISTEN_TEST", "svc")))
        assert res["ours"] == [tagged.pid], res
        res = _listener.port_holders(url, _listener.tree_of(_ident(unrelated.pid), ("GPUFLEET_LISTEN_TEST", "other")))
        assert res["ours"] == [] and [f["pid"] for f in res["foreign"]] == [tagged.pid], res
    finally:
        tagged.kill()
        tagged.wait()


def test_a_tagged_process_of_another_user_is_not_the_launched_servers(unrelated):
    """Found by the new-user pass (issue 24): any user can put the launch tag into its process's environment; a
    process of user nobody carrying it, listening on the port, must not pass for the server (which runs as the
    launched process's user, root here)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as nobody")
    forged = subprocess.Popen(["/usr/bin/python3", "-c", LISTEN, "127.0.0.1"], stdout=subprocess.PIPE, text=True,
                              env={"GPUFLEET_LISTEN_TEST": "svc", "PATH": "/usr/bin:/bin"}, user=65534, group=65534,
                              cwd="/")
    try:
        url = "http://127.0.0.1:%d/" % int(forged.stdout.readline())
        res = _listener.port_holders(url, _listener.tree_of(_ident(unrelated.pid), ("GPUFLEET_LISTEN_TEST", "svc")))
        assert res["ours"] == [] and [f["pid"] for f in res["foreign"]] == [forged.pid], res
        assert res["foreign"][0]["user"] == _proc.user_name(65534)
    finally:
        forged.kill()
        forged.wait()


def test_nothing_listening_or_a_remote_host_is_assumed_and_said():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening
        res = _listener.port_holders("http://127.0.0.1:%d/" % port, lambda pid, procs: False)
    assert res["checked"] is False and "no listening socket on port %d" % port in res["assumed"], res
    res = _listener.port_holders("http://192.0.2.7:8000/health", lambda pid, procs: False)  # TEST-NET-1: not ours
    assert res["checked"] is False and res["port"] == 8000 and "192.0.2.7 is not an address of this host" in res["assumed"]


def test_url_endpoint_defaults_to_the_schemes_port():
    assert _listener.url_endpoint("http://h/x") == ("h", 80)
    assert _listener.url_endpoint("https://h/x") == ("h", 443)
    assert _listener.url_endpoint("http://[::1]:30000/x") == ("::1", 30000)


def test_addresses_of_proc_net_tcp_read_in_host_order():
    assert _listener._addr("0100007F") == "127.0.0.1"
    assert _listener._addr("00000000000000000000000001000000") == "::1"
    assert _listener._addr("0000000000000000FFFF00000100007F") == "127.0.0.1"  # v4-mapped


def test_exit_status_of_an_unreaped_child_and_none_for_another_process():
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    while _proc.read_proc(p.pid) is not None and _proc.read_proc(p.pid).state != "Z":
        time.sleep(0.01)
    assert _ready.exit_status(p.pid) == "exit status 3"
    p.returncode = 3  # reaped above
    assert _ready.exit_status(1) is None


@pytest.mark.parametrize("a, b, clash", [
    ("127.0.0.1", "127.0.0.1", True), ("0.0.0.0", "10.0.0.5", True), ("10.0.0.5", "0.0.0.0", True),
    ("::", "127.0.0.1", True), ("127.0.0.1", "10.0.0.5", False), ("0.0.0.0", "::1", False), ("::1", "fe80::1", False)])
def test_two_sockets_on_a_port_clash_on_one_address_or_a_wildcard_of_its_family(a, b, clash):
    """helper-49: a server on 127.0.0.1 and another process on the host's address listen side by side; the preflight
    refuses only what the old server's own addresses would clash with."""
    assert _listener.binds_clash(a, b) is clash
