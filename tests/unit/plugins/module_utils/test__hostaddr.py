# SPDX-License-Identifier: GPL-3.0-or-later
"""_hostaddr: whether a balancer entry's worker URL names this host (real sockets, real name resolution)."""
from __future__ import annotations

import socket

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _hostaddr


def _own_addr() -> str:
    """An address of this machine that is not loopback, as the route to a public address picks it (no packet sent)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))
        return s.getsockname()[0]
    finally:
        s.close()


def test_own_addresses_pass():
    assert _hostaddr.refusals({"lb": "http://127.0.0.1:30000", "router": "http://localhost:30000/x",
                               "own": "http://%s:8000" % _own_addr()}) == []


def test_an_address_of_another_machine_is_refused_naming_the_entry_and_the_host_only():
    # 192.0.2.0/24 is TEST-NET-1: never an address of a machine; the URL's credentials are never shown.
    why = _hostaddr.refusals({"haproxy": "http://user:s3cret@192.0.2.7:30000/health?token=abc"})
    assert len(why) == 1
    assert why[0].startswith("balancer entry haproxy: its worker_url's host 192.0.2.7 is no address of this host "
                             "(it resolves here to 192.0.2.7)"), why
    assert "gpufleet_server_worker_url_check" in why[0]
    assert "s3cret" not in why[0] and "abc" not in why[0]


def test_a_host_that_does_not_resolve_and_a_url_without_host_are_refused():
    why = _hostaddr.refusals({"a": "http://no-such-host.invalid:30000", "b": "http:///x"})
    assert why[0].startswith("balancer entry a: its worker_url's host no-such-host.invalid does not resolve on this host")
    assert why[1] == "balancer entry b: its worker_url names no host"


def test_ipv6_loopback_is_local_and_a_documentation_address_is_not():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        local = _hostaddr.is_local("::1", socket.AF_INET6)
    except OSError:
        pytest.skip("IPv6 disabled in this kernel")
    assert local
    assert not _hostaddr.is_local("2001:db8::1", socket.AF_INET6)
