# SPDX-License-Identifier: GPL-3.0-or-later
"""_hostaddr: whether a balancer entry's worker URL names this host (real sockets, real name resolution)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

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


def _in_netns(code: str, nonlocal_bind: str) -> subprocess.CompletedProcess:
    """Run `code` in a new network namespace holding 10.250.0.1/24 on a veth (on lo the whole /24 would be local), with ip_nonlocal_bind as given."""
    ns = "gf-hostaddr-%d" % os.getpid()
    root = str(Path(_hostaddr.__file__).resolve().parents[5])  # the directory that holds ansible_collections
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "link", "add", "gf0", "type", "veth", "peer", "name", "gf1"],
                    ["ip", "link", "set", "gf0", "up"], ["ip", "link", "set", "gf1", "up"], ["ip", "addr", "add", "10.250.0.1/24", "dev", "gf0"],
                    ["sysctl", "-qw", "net.ipv4.ip_nonlocal_bind=%s" % nonlocal_bind]):
            subprocess.run(["ip", "netns", "exec", ns] + cmd, check=True)
        return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], capture_output=True, text=True,
                              env={"PYTHONPATH": root, "PATH": os.environ.get("PATH", "")}, check=True)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=True)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2 for a network namespace")
@pytest.mark.parametrize("nonlocal_bind", ["0", "1"])
def test_ip_nonlocal_bind_does_not_make_another_hosts_address_local(nonlocal_bind):
    """With ip_nonlocal_bind on (keepalived, HAProxy hosts) any bind succeeds: the kernel's table decides instead
    (helper-37, H1: a copied entry passed the check and another host was taken out)."""
    code = ("import json; from ansible_collections.gpufleet.serving.plugins.module_utils import _hostaddr; "
            "print(json.dumps(_hostaddr.refusals({'own': 'http://10.250.0.1:30000', 'loop': 'http://127.0.0.1:1', "
            "'other': 'http://10.250.0.9:30000'})))")
    out = json.loads(_in_netns(code, nonlocal_bind).stdout)
    assert len(out) == 1 and out[0].startswith("balancer entry other: its worker_url's host 10.250.0.9 is no address"), out
