# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Who listens on a health URL's port: the listening TCP sockets of /proc/net/tcp{,6} and the processes holding them.

An HTTP 200 says only that *something* answered. A foreign listener on the server's port (another user's process,
a leftover of another tool) answers in milliseconds while the launched server dies on EADDRINUSE (issue 24, item 5).
The readiness gate and the restart's preflight attribute the listening socket to a process through the socket's inode
(/proc/net/tcp) and the `socket:[INODE]` links of /proc/PID/fd, as `ss -ltnp` does.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import typing as t
from urllib.parse import urlparse

from ansible_collections.gpufleet.serving.plugins.module_utils import _proc

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


class Listener(t.NamedTuple):
    address: str  # the bound address, "0.0.0.0" / "::" for a wildcard
    port: int
    inode: int
    uid: int


def url_endpoint(url: str) -> t.Tuple[str, int]:
    """(host, port) of an http(s) URL, with the scheme's default port."""
    u = urlparse(url)
    return u.hostname or "", u.port or (443 if u.scheme == "https" else 80)


def _addr(hexaddr: str) -> str:
    """An address of /proc/net/tcp{,6} (hex, each 32-bit word in host order, little-endian here) as text."""
    raw = bytes.fromhex(hexaddr)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def listeners(port: int, proc_root: str = "/proc") -> t.List[Listener]:
    """The listening TCP sockets on `port` in this network namespace (the module's, which is the server's)."""
    out = []
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc_root, "net", name)) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            addr, _sep, hexport = fields[1].partition(":")
            if int(hexport, 16) != port:
                continue
            out.append(Listener(_addr(addr), port, int(fields[9]), int(fields[7])))
    return out


def resolve(host: str, port: int) -> t.List[str]:
    """The addresses of `host`, sorted ([] when it does not resolve)."""
    return sorted(connect_order(host, port))


def connect_order(host: str, port: int) -> t.List[str]:
    """The addresses a client tries for `host`, in the order it tries them (getaddrinfo's: what Python's
    socket.create_connection, and so the readiness requests, walk until one accepts); each once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    out: t.List[str] = []
    for i in infos:
        a = str(ipaddress.ip_address(i[4][0].split("%")[0]))
        if a not in out:
            out.append(a)
    return out


def reached(socks: t.Sequence[Listener], order: t.Sequence[str]) -> t.List[Listener]:
    """The listening socket(s) a connection lands on: the first address of `order` that one of `socks` serves, a
    socket bound to that very address before a wildcard (the kernel prefers the exact match). Two sockets can share a
    port on different addresses (the server on 127.0.0.1, another process on ::1): only the one reached answers."""
    for a in order:
        exact = [s for s in socks if s.address == a]
        if exact:
            return exact
        wild = [s for s in socks if serving(s, [a])]
        if wild:
            return wild
    return list(socks)


def is_local(address: str) -> bool:
    """Whether `address` is one of this host's (network namespace's): the kernel lets a socket bind only to those."""
    ip = ipaddress.ip_address(address)
    if ip.is_loopback or ip.is_unspecified:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


def binds_clash(a: str, b: str) -> bool:
    """Whether two sockets on one port and these addresses cannot both listen: the same address, or a wildcard of a
    family the other is in (an IPv6 wildcard also takes IPv4 unless it is v6only, which /proc does not say: counted)."""
    if a == b or "::" in (a, b):
        return True
    v4 = [x for x in (a, b) if ipaddress.ip_address(x).version == 4]
    return "0.0.0.0" in (a, b) and len(v4) == 2


def serving(listener: Listener, targets: t.Sequence[str]) -> bool:
    """Whether a connection to one of `targets` can reach `listener`: same address, or a wildcard of its family (an
    IPv6 wildcard also takes IPv4 unless it is v6only, which /proc does not say: counted, to be safe)."""
    if listener.address in targets:
        return True
    if listener.address == "::":
        return True
    return listener.address == "0.0.0.0" and any(ipaddress.ip_address(a).version == 4 for a in targets)


def socket_owners(inodes: t.Iterable[int], pids: t.Optional[t.Iterable[int]] = None,
                  proc_root: str = "/proc") -> t.Dict[int, t.List[int]]:
    """{inode: [pids holding it]} over `pids` (every process when None). A process whose fds cannot be read
    (another user's without root, gone meanwhile) is passed over."""
    want = {"socket:[%d]" % i: i for i in inodes}
    out: t.Dict[int, t.List[int]] = {i: [] for i in want.values()}
    for pid in (pids if pids is not None else _proc.list_pids(proc_root)):
        d = os.path.join(proc_root, str(pid), "fd")
        try:
            fds = os.listdir(d)
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(os.path.join(d, fd))
            except OSError:
                continue
            if link in want and pid not in out[want[link]]:
                out[want[link]].append(pid)
    return out


def describe(pid: int, procs: t.Mapping[int, _proc.Proc]) -> str:
    p = procs.get(pid)
    if p is None:
        return "pid %d" % pid
    return "pid %d (%s: %s)" % (pid, p.user(), p.command[:160])


def port_holders(url: str, ours: t.Callable[[int, t.Mapping[int, _proc.Proc]], bool],
                 proc_root: str = "/proc", reached_only: bool = False, any_address: bool = False) -> t.Dict[str, t.Any]:
    """Who holds the listening socket(s) that a request to `url` can reach, by `ours(pid, procs)`; with
    `reached_only`, only the one a request reaches now (reached(): the URL's host may name several addresses, each
    with its own listener), and `elsewhere` lists the pids of ours listening on the port where the request does not go.
    With `any_address` (the restart's preflight), every socket listening on the port on any address of this host, as
    each keeps a server that binds the port on all addresses from starting (EADDRINUSE; helper-47: one bound to the
    host's own address, not the URL's 127.0.0.1, was missed and the launch failed after the kill).

    Returns {port, checked, foreign: [{pid, user, cmdline, uid}], ours: [pids], ours_addresses, elsewhere: [pids],
    assumed}: `checked`
    is false (and `assumed` says what was taken for granted) when the URL's host is not an address of this host, or
    when no listener of the port could be seen or attributed to a process.
    """
    host, port = url_endpoint(url)
    res: t.Dict[str, t.Any] = {"port": port, "checked": False, "foreign": [], "ours": [], "ours_addresses": [],
                               "elsewhere": [], "assumed": None}
    targets = resolve(host, port)
    if not targets or not all(is_local(a) for a in targets):
        res["assumed"] = ("%s is not an address of this host: the answer on port %d is taken as the launched server's "
                          "(its listening socket cannot be checked)" % (host, port))
        return res
    socks = [s for s in listeners(port, proc_root) if any_address or serving(s, targets)]
    # One reading of the processes and the sockets' owners, for the socket reached and the others alike.
    procs = _proc.snapshot(proc_root) if socks else {}
    owners = socket_owners([s.inode for s in socks], proc_root=proc_root) if socks else {}
    if reached_only and socks:
        hit = reached(socks, connect_order(host, port) or targets)
        for s in socks:
            if s not in hit:
                res["elsewhere"].extend(pid for pid in owners.get(s.inode) or []
                                        if ours(pid, procs) and pid not in res["elsewhere"])
        socks = hit
    if not socks:
        res["assumed"] = ("no listening socket on port %d is visible in this network namespace (a port forwarded into "
                          "a container?): the answer is taken as the launched server's" % port)
        return res
    unattributed = []
    for s in socks:
        pids = owners.get(s.inode) or []
        if not pids:
            unattributed.append(s)
            continue
        for pid in pids:
            if ours(pid, procs):
                if pid not in res["ours"]:
                    res["ours"].append(pid)
                if s.address not in res["ours_addresses"]:
                    res["ours_addresses"].append(s.address)
            elif pid not in [f["pid"] for f in res["foreign"]]:
                p = procs.get(pid)
                res["foreign"].append({"pid": pid, "user": p.user() if p else _proc.user_name(s.uid),
                                       "cmdline": p.command[:300] if p else "?", "address": s.address})
    res["checked"] = True
    if unattributed and not res["foreign"] and not res["ours"]:
        res["checked"] = False
        res["assumed"] = ("the socket listening on port %d (user %s) belongs to no process visible here: the answer is "
                          "taken as the launched server's" % (port, _proc.user_name(unattributed[0].uid)))
    return res


def foreign_text(res: t.Mapping[str, t.Any]) -> str:
    """'pid 812 (nobody: python3 -m http.server 30000)' for each foreign holder, joined."""
    return ", ".join("pid %d (%s: %s)" % (f["pid"], f["user"], f["cmdline"][:160]) for f in res["foreign"])


def tree_of(root: t.Tuple[int, int], tag: t.Optional[t.Tuple[str, str]] = None
            ) -> t.Callable[[int, t.Mapping[int, _proc.Proc]], bool]:
    """`ours` for port_holders: the launched process `root` (pid, start time) and its descendants, or, with `tag`
    (name, value), a process carrying the launch tag (a server that daemonizes leaves the launcher's tree) that runs
    as the launched process's user: any user can put the tag into a process's environment, only the server's own
    processes run as its user."""
    cache: t.Dict[int, t.Set[int]] = {}
    uid: t.List[t.Optional[int]] = [None]

    def ours(pid: int, procs: t.Mapping[int, _proc.Proc]) -> bool:
        if id(procs) not in cache:
            p = procs.get(root[0])
            tree = set()
            if p is not None and p.start_time == root[1]:
                tree = {root[0]} | _proc.descendants([root[0]], procs)
                uid[0] = p.uid
            cache.clear()
            cache[id(procs)] = tree
        if pid in cache[id(procs)]:
            return True
        other = procs.get(pid)
        return (tag is not None and uid[0] is not None and other is not None and other.uid == uid[0]
                and _proc.environ_has(pid, tag[0], tag[1]))
    return ours
