# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Process selection shared by process_kill and process_env.

A selector is a union of criteria (tag, confirmed pidfile, pids, cmdline regex, user, GPU holders),
expanded with descendants and with the sessions/process groups the selected processes LEAD,
then reduced by exclusions, by the protected set (pid 1, kernel threads, our own chain) and, when the selection
knows its service (its tag), by the processes of other gpufleet services (their launch tag, another value).
"""

from __future__ import annotations

import os
import re
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _proc

# Host agents that hold /dev/nvidia* or GPU contexts but are never part of a server.
DEFAULT_EXCLUDES = [
    r"(^|/)nvidia-persistenced(\s|$)",
    r"(^|/)nv-hostengine(\s|$)",
    r"(^|/)dcgm",
    r"(^|/)(dcgm|nvidia_gpu|node|dcgm-)exporter",
    r"nvidia_gpu_exporter",
    r"(^|/)nvidia-fabricmanager",
]

# Tolerance between a process start and a pidfile mtime (clock ticks round to 10 ms,
# and a launcher writes its pidfile right after fork).
_PIDFILE_SLACK_S = 2.0


class SelectError(Exception):
    pass


class Selector(t.NamedTuple):
    tag: str | None = None
    pidfile: str | None = None
    pidfile_cmdline_regex: str | None = None
    pids: t.Sequence[int] = ()
    cmdline_regex: str | None = None
    user: str | None = None
    gpu_holder_pids: t.Sequence[int] = ()
    include_descendants: bool = True
    include_groups: bool = True
    exclude_regex: t.Sequence[str] = tuple(DEFAULT_EXCLUDES)
    # This selection's service (NAME=VALUE) when `tag` is not a criterion (server_restart's stray kill): a process
    # whose environ has NAME with another value belongs to another service and is never selected. `tag` sets it too.
    service_tag: str | None = None
    # This service's GPUs when the adopt regex (cmdline_regex) guesses at its server (server_restart, with gpus set),
    # and which GPUs each process holds: a process matched by the regex alone whose tree holds GPUs, none of them
    # these, is another server started by hand (a second service on the host, issue 24) and is never selected.
    adopt_gpus: t.Sequence[int] = ()
    gpus_by_pid: t.Optional[t.Mapping[int, t.Sequence[int]]] = None
    # The users whose processes the launch tag selects (server_restart: the server's user); empty: any user's. Anyone
    # can put the tag into a process's environment; only the server's own processes run as its user. The process a
    # confirmed pidfile names counts as one of them (a server launched before gpufleet_server_user changed).
    tag_users: t.Sequence[str] = ()

    def is_empty(self) -> bool:
        return not (self.tag or self.pidfile or self.pids or self.cmdline_regex or self.user or self.gpu_holder_pids)


def parse_tag(tag: str) -> t.Tuple[str, str]:
    name, sep, value = tag.partition("=")
    if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name) or not value:
        raise SelectError("tag must look like NAME=VALUE (for example GPUFLEET_SERVICE=sglang), got %r" % tag)
    return name, value


def _compile(option: str, regex: str) -> t.Pattern[str]:
    try:
        return re.compile(regex)
    except re.error as e:
        raise SelectError("%s: invalid regular expression %r: %s" % (option, regex, e))


def read_pidfile(path: str) -> t.Tuple[int, int | None]:
    """Our pidfiles hold 'PID START_TIME'; foreign ones hold just 'PID'."""
    if os.path.isdir(path):
        raise SelectError("pidfile %s is a directory; name the pidfile itself" % path)
    with open(path) as f:
        parts = f.read().split()
    if not parts or not parts[0].isdigit():
        raise SelectError("pidfile %s does not start with a pid" % path)
    start = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    return int(parts[0]), start


def check_pidfile(path: str, procs: t.Mapping[int, _proc.Proc], cmdline_regex: str | None = None,
                  tag: t.Tuple[str, str] | None = None, adopt_regex: str | None = None) -> t.Dict[str, t.Any]:
    """What the pidfile names and whether that process is confirmed to be the server.

    Returns {path, pid, status, reason, confirmed_by} (plus user and cmdline of a live process). status is
    confirmed, unconfirmed, stale, not_running or missing; only a confirmed pid may be selected.
    """
    out: t.Dict[str, t.Any] = dict(path=path, pid=None, status="missing", reason="", confirmed_by=None)

    def done(status: str, reason: str, by: str | None = None) -> t.Dict[str, t.Any]:
        out.update(status=status, reason=reason, confirmed_by=by)
        return out

    try:
        pid, start = read_pidfile(path)
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return done("missing", "pidfile %s does not exist" % path)
    out["pid"] = pid
    p = procs.get(pid)
    if p is None or p.state in ("Z", "X"):
        return done("not_running", "pidfile %s names pid %d, which is not running" % (path, pid))
    out.update(user=p.user(), cmdline=p.command[:300])
    who = "%s, user %s" % (p.command[:120], out["user"])
    # A pid is reused after its process dies, and a pidfile can be written by anyone who can write its directory:
    # a pidfile is no proof of anything. The process must show it is the server - the launch tag every server
    # gpufleet launches carries (either launcher), or the adopt regex. The recorded start time (gpufleet's own
    # 'PID START_TIME') and the pidfile's mtime only tell a stale pidfile (a reused pid); a matching start time
    # never confirms on its own (an unrelated process's pid and real start time are easy to write).
    if start is not None and start != p.start_time:
        return done("stale", "pidfile %s is stale: pid %d now belongs to another process (%s)" % (path, pid, who))
    if start is None and _proc.start_epoch(p) > mtime + _PIDFILE_SLACK_S:
        return done("stale", "pidfile %s is stale: pid %d started after the pidfile was written (%s)" % (path, pid, who))
    other = other_service_tag(pid, tag) if tag is not None else None
    if other is not None:
        # Two services on one host: an adopt regex matches both servers, and a pidfile is anyone's to write.
        return done("unconfirmed", "pidfile %s is unconfirmed: pid %d is a process of gpufleet service %s (%s=%s), "
                    "not of %s; left alone" % (path, pid, other[1], other[0], other[1], tag[1]))
    if cmdline_regex and not re.search(cmdline_regex, p.command):
        return done("unconfirmed", "pidfile %s is unconfirmed: pid %d does not match %r (%s); left alone"
                    % (path, pid, cmdline_regex, who))
    # The tag, or this service's launch under the tag name it had before gpufleet_server_tag_name changed: only the
    # process its own pidfile names (and its tree), never a scan of the host for other processes of that name.
    if tag is not None and own_service_tag(pid, tag):
        by = "tag"
    elif cmdline_regex:
        by = "pidfile_cmdline_regex"
    elif adopt_regex and re.search(adopt_regex, p.command):
        by = "cmdline_regex"
    else:
        checks = ["no launch tag %s=%s" % tag if tag else "no launch tag given"]
        checks.append("no match for %r" % adopt_regex if adopt_regex else "no command line regex given")
        if start is not None:
            checks.append("a matching start time alone confirms nothing")
        return done("unconfirmed", "pidfile %s is unconfirmed: it names pid %d (%s) but %s; left alone"
                    % (path, pid, who, ", ".join(checks)))
    return done("confirmed", "pidfile %s names running pid %d (confirmed by %s)" % (path, pid, by), by)


def select(sel: Selector, procs: t.Mapping[int, _proc.Proc] | None = None, self_pid: int | None = None) -> t.Dict[str, t.Any]:
    """Return {'selected': {pid: [reasons]}, 'notes': [...], 'excluded': {pid: reason}}, and with a pidfile
    'pidfile' (check_pidfile's report)."""
    if procs is None:
        procs = _proc.snapshot()
    me = os.getpid() if self_pid is None else self_pid
    cmd_rx = _compile("cmdline_regex", sel.cmdline_regex) if sel.cmdline_regex else None
    excl = [_compile("exclude_regex", r) for r in sel.exclude_regex]
    if sel.pidfile_cmdline_regex:
        _compile("pidfile_cmdline_regex", sel.pidfile_cmdline_regex)
    tag = parse_tag(sel.tag) if sel.tag else None
    own = parse_tag(sel.service_tag) if sel.service_tag else tag
    uid = None
    if sel.user is not None:
        uid = uid_of(sel.user)

    tag_uids = {uid_of(u) for u in sel.tag_users} if sel.tag_users else None

    reasons: t.Dict[int, t.List[str]] = {}
    notes: t.List[str] = []

    def add(pid: int, why: str) -> None:
        reasons.setdefault(pid, [])
        if why not in reasons[pid]:
            reasons[pid].append(why)

    for pid in sel.pids:
        if pid in procs:
            add(pid, "pid")
        else:
            notes.append("pid %d is not running" % pid)
    pidfile = None
    if sel.pidfile:
        pidfile = check_pidfile(sel.pidfile, procs, sel.pidfile_cmdline_regex, tag, sel.cmdline_regex)
        notes.append(pidfile["reason"])
        if pidfile["status"] == "confirmed":
            add(pidfile["pid"], "pidfile")
            if tag_uids is not None:
                tag_uids.add(procs[pidfile["pid"]].uid)
    for pid in sel.gpu_holder_pids:
        if pid in procs:
            add(pid, "gpu_holder")
    tag_elsewhere: t.List[int] = []
    for p in procs.values():
        if p.pid == me:
            continue
        if cmd_rx is not None and p.cmdline and cmd_rx.search(p.command):
            add(p.pid, "cmdline")
        if uid is not None and p.uid == uid:
            add(p.pid, "user")
        if tag is not None and _proc.environ_has(p.pid, tag[0], tag[1]):
            if tag_uids is None or p.uid in tag_uids:
                add(p.pid, "tag")
            else:
                tag_elsewhere.append(p.pid)

    protected = _proc.protected_pids(procs, me)
    excluded: t.Dict[int, str] = {}
    other_cache: t.Dict[int, t.Optional[t.Tuple[str, str]]] = {}

    def drop_excluded() -> None:
        for pid in list(reasons):
            p = procs.get(pid)
            if p is None:
                del reasons[pid]
                continue
            why = _exclusion(p, protected, excl)
            if why is None and own is not None:
                # A selection made for one service (its tag) never takes another service's process, whatever matched
                # it: an adopt regex matching every server_sim.py on the host, a user, the GPU holders, a session or a
                # tree are guesses about which processes are this service's, and the launch tag says they are not.
                why = _other_service_reason(pid, own, other_cache)
            if why is None and sel.adopt_gpus and sel.gpus_by_pid is not None and set(reasons[pid]) == {"cmdline"}:
                why = _other_gpus_reason(pid, procs, sel.adopt_gpus, sel.gpus_by_pid)
            if why:
                excluded[pid] = why
                del reasons[pid]

    # Filter BEFORE expanding: a protected or excluded match (pid 1, our own ansible chain,
    # nvidia-persistenced) must not pull in its descendants or the session it leads.
    drop_excluded()
    roots = list(reasons)
    if sel.include_groups:
        for pid in _proc.group_members(roots, procs):
            add(pid, "group_member")
    if sel.include_descendants:
        for pid in _proc.descendants(list(reasons), procs):
            add(pid, "descendant")
    drop_excluded()
    for pid in tag_elsewhere:
        if pid not in reasons and pid not in excluded and tag is not None and tag_uids is not None:
            excluded[pid] = tag_user_reason(procs[pid], tag, tag_uids)
    out: t.Dict[str, t.Any] = {"selected": reasons, "notes": notes, "excluded": excluded}
    if pidfile is not None:
        out["pidfile"] = pidfile
    return out


# Every launch by gpufleet (process launcher; the systemd unit where the tag name is not the default) also carries
# its tag under this fixed name: a service whose tag name is its own (gpufleet_server_tag_name) is then still known
# to a service that looks for another tag name (issue 24: SGB_SERVICE=sgb was killed by GPUFLEET_SERVICE=sglang's
# adopt regex, and the other way round).
LAUNCH_TAG_VAR = "GPUFLEET_LAUNCH_TAG"
DEFAULT_TAG_NAME = "GPUFLEET_SERVICE"


def other_service_tag(pid: int, own: t.Tuple[str, str]) -> t.Optional[t.Tuple[str, str]]:
    """(NAME, VALUE) of the other gpufleet service whose launch tag the process carries, or None (own's tag, no tag,
    or an environ this process may not read). Another service's is: own's NAME with another value; the fixed
    LAUNCH_TAG_VAR naming another tag; or, for a service with a tag name of its own, the default tag (a service
    launched with it, also by an older gpufleet or a systemd unit, carries no LAUNCH_TAG_VAR)."""
    try:
        env = _proc.read_environ(pid, [own[0], LAUNCH_TAG_VAR, DEFAULT_TAG_NAME])
    except _proc.ProcError:
        return None
    # The service is its name (the tag's value): a process of the same name under another tag name is this service's
    # own, launched before gpufleet_server_tag_name changed, and the kill must still end it.
    if own[0] in env:
        return (own[0], env[own[0]]) if env[own[0]] != own[1] else None
    name, sep, value = env.get(LAUNCH_TAG_VAR, "").partition("=")
    if sep and value:
        return (name, value) if value != own[1] else None
    if own[0] != DEFAULT_TAG_NAME and env.get(DEFAULT_TAG_NAME, own[1]) != own[1]:
        return DEFAULT_TAG_NAME, env[DEFAULT_TAG_NAME]
    return None


def own_service_tag(pid: int, own: t.Tuple[str, str]) -> bool:
    """Whether the process carries a launch tag of own's service: own's NAME=VALUE, or (that NAME absent) the same
    service, VALUE, under the tag name it was launched with before gpufleet_server_tag_name changed (GPUFLEET_LAUNCH_TAG,
    or the default tag for a service whose tag name is now its own). The complement of other_service_tag among the
    tagged: a service is its name, and a rename of its tag name must still find (and end) its running server."""
    try:
        env = _proc.read_environ(pid, [own[0], LAUNCH_TAG_VAR, DEFAULT_TAG_NAME])
    except _proc.ProcError:
        return False
    if own[0] in env:
        return env[own[0]] == own[1]
    _name, sep, value = env.get(LAUNCH_TAG_VAR, "").partition("=")
    if sep and value:
        return value == own[1]
    return own[0] != DEFAULT_TAG_NAME and env.get(DEFAULT_TAG_NAME) == own[1]


def other_service(pid: int, own: t.Tuple[str, str]) -> str | None:
    """The name (tag value) of the other gpufleet service the process belongs to, or None (other_service_tag)."""
    other = other_service_tag(pid, own)
    return other[1] if other else None


def _other_service_reason(pid: int, own: t.Tuple[str, str],
                          cache: t.Dict[int, t.Optional[t.Tuple[str, str]]]) -> str | None:
    if pid not in cache:
        cache[pid] = other_service_tag(pid, own)
    other = cache[pid]
    if other is None:
        return None
    return "a process of gpufleet service %s (%s=%s), not of %s: another service's launch tag" % (
        other[1], other[0], other[1], own[1])


def _other_gpus_reason(pid: int, procs: t.Mapping[int, _proc.Proc], own_gpus: t.Sequence[int],
                       gpus_by_pid: t.Mapping[int, t.Sequence[int]]) -> str | None:
    """Why a process the adopt regex alone matched is not this service's: its tree (itself and its descendants) holds
    GPUs, none of them own_gpus. None when it holds none (a server still loading is adopted) or one of own_gpus."""
    held: t.Set[int] = set()
    for member in {pid} | set(_proc.descendants([pid], procs)):
        held.update(gpus_by_pid.get(member, ()))
    if not held or held & set(own_gpus):
        return None
    return ("matched by the adopt regex, but it holds GPU %s and none of this service's GPUs (%s): another server, "
            "started by hand, left alone" % (", ".join(str(g) for g in sorted(held)),
                                             ", ".join(str(g) for g in sorted(set(own_gpus)))))


def tag_user_reason(p: _proc.Proc, tag: t.Tuple[str, str], uids: t.Iterable[int]) -> str:
    """Why a process carrying the launch tag is not taken for the server: it runs as another user."""
    users = ", ".join(sorted(_proc.user_name(u) for u in uids))
    return ("carries the launch tag %s=%s but runs as user %s, not as the server's user (%s): anyone can put the tag "
            "into a process's environment; left alone" % (tag[0], tag[1], p.user(), users))


def _exclusion(p: _proc.Proc, protected: t.Set[int], excl: t.Sequence[t.Pattern[str]]) -> str | None:
    if p.pid in protected:
        return "protected (pid 1, kernel thread, or this module's own process chain)"
    if p.state in ("Z", "X"):
        return "zombie (already exited)"
    for rx in excl:
        if rx.search(p.command) or rx.search(p.comm):
            return "excluded by %r" % rx.pattern
    return None


def uid_of(user: str) -> int:
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        if user.isdigit():
            return int(user)
        raise SelectError("user %r does not exist on this host" % user)


def describe(pid: int, procs: t.Mapping[int, _proc.Proc], why: t.Sequence[str]) -> t.Dict[str, t.Any]:
    p = procs[pid]
    return {
        "pid": pid,
        "ppid": p.ppid,
        "start_time": p.start_time,
        "user": p.user(),
        "cmdline": p.command[:500],
        "matched_by": list(why),
    }
