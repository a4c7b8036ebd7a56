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
(EADDRNOTAVAIL otherwise), which needs no interface listing (no netifaces, no `ip addr` to parse) and answers for
IPv4 and IPv6 alike. Behind NAT or a proxy the URL is rightly no address of the host: the role's
gpufleet_server_worker_url_check turns the check off.
"""

from __future__ import annotations

import errno
import socket
import typing as t
from urllib.parse import urlsplit


def is_local(ip: str, family: int) -> bool:
    """Whether `ip` is an address of this host (a bind to it succeeds)."""
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
