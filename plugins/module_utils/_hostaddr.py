# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Whether a balancer entry's explicit worker_url names this host.

The balancer module checks that HAProxy's address for the server is the entry's worker_url, so a server name of another
host is refused. An entry copied from another host's vars with both its server and its worker_url passes that check and
would take the other host out while this one is killed under its requests. Only this host can tell: the URL's host must
resolve (here) to an address of one of its interfaces. Binding a socket to an address succeeds only for a local one
(EADDRNOTAVAIL otherwise), for IPv4 and IPv6 alike, with no interface listing to parse; where ip_nonlocal_bind lets any
bind succeed (keepalived and HAProxy hosts), the kernel's own tables of local addresses decide (found by a new user,
helper-37). Behind NAT or a proxy the URL is rightly no address of the host: the role's
gpufleet_server_worker_url_check turns the check off.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import typing as t
from urllib.parse import urlsplit


def _bind_ok(ip: str, family: int) -> bool:
    s = socket.socket(family, socket.SOCK_DGRAM)
    try:
        s.bind((ip, 0))
        return True
    except OSError as e:
        if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            return False
        raise
    finally:
        s.close()


def _nonlocal_bind(family: int) -> bool:
    """Whether the kernel lets a socket bind any address (net.ipv4/ipv6.ip_nonlocal_bind, common on keepalived and
    HAProxy hosts): then a bind proves nothing."""
    path = "/proc/sys/net/%s/ip_nonlocal_bind" % ("ipv6" if family == socket.AF_INET6 else "ipv4")
    try:
        with open(path) as f:
            return f.read().strip() != "0"
    except OSError:
        return False


def _local_table(family: int) -> t.List[t.Any]:
    """The host's own addresses as the kernel lists them: IPv4's LOCAL routes of /proc/net/fib_trie (an address, or
    a range routed to the host such as 127.0.0.0/8), IPv6's /proc/net/if_inet6."""
    nets: t.List[t.Any] = []
    if family == socket.AF_INET6:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                if line.split():
                    nets.append(ipaddress.IPv6Network((int(line.split()[0], 16), 128)))
        return nets
    last = None
    with open("/proc/net/fib_trie") as f:
        for line in f:
            s = line.strip()
            if s.startswith("|-- "):
                last = s[4:]
            elif s.startswith("/") and s.endswith(" LOCAL") and last:
                nets.append(ipaddress.ip_network("%s/%s" % (last, s.split()[0][1:]), strict=False))
    return nets


def is_local(ip: str, family: int) -> bool:
    """Whether `ip` is an address of this host: a bind to it succeeds, and, where ip_nonlocal_bind lets any bind
    succeed, the kernel's own table of local addresses lists it."""
    if not _bind_ok(ip, family):
        return False
    if not _nonlocal_bind(family):
        return True
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
        return any(addr in n for n in _local_table(family))
    except (OSError, ValueError):
        return False  # no table to read: the address is not known to be this host's


def foreign(name: str, url: str) -> t.Optional[str]:
    """Why the entry `name`'s worker URL does not name this host, or None when it does."""
    try:
        host = urlsplit(url).hostname
    except ValueError as e:
        return "balancer entry %s: its worker_url is no URL (%s)" % (name, e)
    if not host:
        return "balancer entry %s: its worker_url names no host" % name
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as e:
        return "balancer entry %s: its worker_url's host %s does not resolve on this host (%s)" % (name, host, e)
    addrs = sorted({(str(i[4][0]), i[0]) for i in infos})
    if any(is_local(ip, fam) for ip, fam in addrs):
        return None
    # The host only: a URL may carry credentials.
    return ("balancer entry %s: its worker_url's host %s is no address of this host (it resolves here to %s): an entry "
            "copied from another host's variables would take that host out of rotation and kill this one under its "
            "requests. Set the entry's worker_url (and server) to this host's, or, behind NAT or a proxy, set "
            "gpufleet_server_worker_url_check to false"
            % (name, host, ", ".join(ip for ip, _fam in addrs)))


def refusals(urls: t.Mapping[str, t.Any]) -> t.List[str]:
    """The refusals of the entries (name to worker URL) whose worker URL does not name this host."""
    out = []
    for name, url in sorted(urls.items()):
        why = foreign(str(name), str(url or ""))
        if why:
            out.append(why)
    return out
