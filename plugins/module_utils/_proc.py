# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Linux /proc readers: process identity, trees, GPU device holders, environ."""

from __future__ import annotations

import os
import pwd
import re
import typing as t

# PF_KTHREAD from include/linux/sched.h: kernel threads must never be signalled.
_PF_KTHREAD = 0x00200000
DEFAULT_DEVICE_RE = r"^/dev/nvidia[0-9]+$"


class ProcError(Exception):
    """A /proc read failed for a reason the caller must report (not just 'process gone')."""

    def __init__(self, msg: str, pid: int | None = None) -> None:
        super().__init__(msg)
        self.pid = pid


class Proc(t.NamedTuple):
    pid: int
    ppid: int
    pgid: int
    sid: int
    uid: int
    state: str
    start_time: int  # field 22 of /proc/PID/stat, clock ticks since boot
    flags: int
    comm: str
    cmdline: t.List[str]

    @property
    def identity(self) -> t.Tuple[int, int]:
        return (self.pid, self.start_time)

    @property
    def is_kernel_thread(self) -> bool:
        # The flag only: in a pid namespace of its own (a container, a sandbox host) pid 2 and its children are
        # ordinary processes - a server's launcher and its workers there were taken for kernel threads and protected.
        return bool(self.flags & _PF_KTHREAD)

    @property
    def command(self) -> str:
        return " ".join(self.cmdline) if self.cmdline else "[%s]" % self.comm

    def user(self) -> str:
        return user_name(self.uid)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _parse_stat(data: str) -> t.Tuple[str, t.List[str]]:
    # comm may contain spaces and parentheses: split on the LAST ')'.
    lpar = data.index("(")
    rpar = data.rindex(")")
    return data[lpar + 1:rpar], data[rpar + 2:].split()


def read_proc(pid: int, proc_root: str = "/proc") -> Proc | None:
    """Return the process, or None when it is gone (or a zombie-less race made it vanish)."""
    base = "%s/%d" % (proc_root, pid)
    try:
        with open(base + "/stat", "r", encoding="utf-8", errors="surrogateescape") as f:
            comm, rest = _parse_stat(f.read())
        uid = os.stat(base).st_uid
        with open(base + "/cmdline", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except (ValueError, IndexError):
        return None
    # rest[0] is field 3 (state); field N is rest[N - 3].
    cmdline = [a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0")]
    if cmdline and cmdline[-1] == "":
        cmdline.pop()
    return Proc(
        pid=pid,
        ppid=int(rest[1]),
        pgid=int(rest[2]),
        sid=int(rest[3]),
        uid=uid,
        state=rest[0],
        start_time=int(rest[19]),
        flags=int(rest[6]),
        comm=comm,
        cmdline=cmdline,
    )


def list_pids(proc_root: str = "/proc") -> t.List[int]:
    return sorted(int(n) for n in os.listdir(proc_root) if n.isdigit())


def snapshot(proc_root: str = "/proc") -> t.Dict[int, Proc]:
    procs = {}
    for pid in list_pids(proc_root):
        p = read_proc(pid, proc_root)
        if p is not None:
            procs[pid] = p
    return procs


def is_alive(identity: t.Tuple[int, int], proc_root: str = "/proc") -> bool:
    """True while the exact process (pid AND start time) exists and is not a zombie."""
    p = read_proc(identity[0], proc_root)
    return p is not None and p.start_time == identity[1] and p.state not in ("Z", "X")


def children_map(procs: t.Mapping[int, Proc]) -> t.Dict[int, t.List[int]]:
    kids: t.Dict[int, t.List[int]] = {}
    for p in procs.values():
        kids.setdefault(p.ppid, []).append(p.pid)
    return kids


def descendants(roots: t.Iterable[int], procs: t.Mapping[int, Proc]) -> t.Set[int]:
    kids = children_map(procs)
    seen: t.Set[int] = set()
    stack = list(roots)
    while stack:
        for c in kids.get(stack.pop(), ()):
            if c not in seen:
                seen.add(c)
                stack.append(c)
    return seen


def ancestors(pid: int, procs: t.Mapping[int, Proc]) -> t.List[int]:
    chain = []
    cur = procs.get(pid)
    while cur is not None and cur.ppid > 0 and cur.ppid not in chain:
        chain.append(cur.ppid)
        cur = procs.get(cur.ppid)
    return chain


def group_members(leaders: t.Iterable[int], procs: t.Mapping[int, Proc]) -> t.Set[int]:
    """Members of the sessions / process groups LED by the given pids.

    Only a leader's group counts: a worker that shares a login shell's session
    must not pull the shell (and everything else in it) into a kill.
    """
    sids = set()
    pgids = set()
    for pid in leaders:
        p = procs.get(pid)
        if p is None:
            continue
        if p.sid == p.pid:
            sids.add(p.pid)
        if p.pgid == p.pid:
            pgids.add(p.pid)
    return {p.pid for p in procs.values() if p.sid in sids or p.pgid in pgids}


def protected_pids(procs: t.Mapping[int, Proc], self_pid: int | None = None) -> t.Set[int]:
    """PID 1, kernel threads, this process and its ancestors (the ssh/ansible chain)."""
    me = os.getpid() if self_pid is None else self_pid
    prot = {1, me}
    prot.update(ancestors(me, procs))
    prot.update(p.pid for p in procs.values() if p.is_kernel_thread)
    return prot


def device_holders(
    procs: t.Iterable[int], device_re: str = DEFAULT_DEVICE_RE, proc_root: str = "/proc"
) -> t.Dict[int, t.List[str]]:
    """pid -> device paths it has open (like `fuser /dev/nvidia*`, without shelling out)."""
    rx = re.compile(device_re)
    out: t.Dict[int, t.List[str]] = {}
    for pid in procs:
        fd_dir = "%s/%d/fd" % (proc_root, pid)
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        hits = set()
        for n in names:
            try:
                target = os.readlink(fd_dir + "/" + n)
            except OSError:
                continue
            if rx.match(target):
                hits.add(target)
        if hits:
            out[pid] = sorted(hits)
    return out


def read_environ_raw(pid: int, proc_root: str = "/proc") -> t.Dict[str, str]:
    """All of a process's exec-time environment. Callers must filter before returning anything."""
    try:
        with open("%s/%d/environ" % (proc_root, pid), "rb") as f:
            raw = f.read()
    except PermissionError:
        raise ProcError(
            "Permission denied reading /proc/%d/environ; run as the process owner or with become: true" % pid,
            pid=pid,
        )
    except (FileNotFoundError, ProcessLookupError):
        raise ProcError("Process %d is gone" % pid, pid=pid)
    env = {}
    for item in raw.split(b"\0"):
        if not item:
            continue
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode("utf-8", "surrogateescape")] = v.decode("utf-8", "surrogateescape")
    return env


def read_environ(pid: int, keys: t.Iterable[str], proc_root: str = "/proc") -> t.Dict[str, str]:
    """Only the requested keys of /proc/PID/environ: environ holds tokens (HF_TOKEN, API keys)."""
    wanted = set(keys)
    return {k: v for k, v in read_environ_raw(pid, proc_root).items() if k in wanted}


def environ_has(pid: int, key: str, value: str, proc_root: str = "/proc") -> bool:
    try:
        return read_environ(pid, [key], proc_root).get(key) == value
    except ProcError:
        return False


def boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise ProcError("No btime in /proc/stat")


def start_epoch(p: Proc) -> float:
    return boot_time() + p.start_time / float(os.sysconf("SC_CLK_TCK"))
