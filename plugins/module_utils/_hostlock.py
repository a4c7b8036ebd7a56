# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""The host lock: one gpufleet run at a time works on a host (its services' checks, NCCL layers and restarts). A file
created exclusively under the run directory, holding its owner (the run id, _runid), expiry and the host process
working under it; wait-die on the runs' start times decides who waits."""

from __future__ import annotations

import json
import os
import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _proc, _runid
from ansible_collections.gpufleet.serving.plugins.module_utils._server import ServerError
from ansible_collections.gpufleet.serving.plugins.module_utils._statefile import (
    create_exclusive, ensure_dir, read_state, write_json_atomic)


def acquire_lock(path: str, owner: str, ttl: float, wait: float, poll: float = 0.2) -> t.Dict[str, t.Any]:
    """Host-side lock: one rollout at a time. A lock older than its TTL is stale and broken.

    The lock is a file created exclusively (create_exclusive) holding {owner, expires}; the owner re-acquiring (same
    run) succeeds.
    Another owner's live lock follows wait-die (both run ids carry their start time, _runid): a run meets the lock
    of an EARLIER run and fails at once (LockRefused); it waits up to `wait` s for a LATER run's lock. Waits then
    only go from earlier to later runs, so two rollouts never wait for each other, and the earliest finishes its
    fleet. Ids without a start time (an older gpufleet) are waited for up to `wait` s, as before.
    """
    deadline = time.monotonic() + wait
    t0 = time.monotonic()
    ensure_dir(os.path.dirname(path))
    broke = None
    waited_for = None
    while True:
        now = time.time()
        if create_exclusive(path, json.dumps({"owner": owner, "acquired": now, "expires": now + ttl})):
            res = {"acquired": True, "broke_stale": broke}
            if waited_for is not None:
                res["waited"] = {"for": waited_for, "s": round(time.monotonic() - t0, 1)}
            return res
        cur = read_state(path)
        if cur.get("owner") == owner:
            if float(cur.get("expires", 0)) < now:
                # This run's own lock past its TTL: another run could break it at any moment and both would hold
                # it. Taken anew, with a new expiry.
                write_json_atomic(path, dict(cur, acquired=now, expires=now + ttl))
                return {"acquired": True, "refreshed": True, "broke_stale": None}
            return {"acquired": False, "already_held": True, "broke_stale": None}
        if cur.get("corrupt") or float(cur.get("expires", 0)) < now:
            broke = cur
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            continue
        if _runid.is_earlier(str(cur.get("owner")), owner):
            raise lock_refused_error(cur)
        if time.monotonic() >= deadline:
            raise lock_busy_error(cur, time.monotonic() - t0 if wait > 0 else None)
        waited_for = cur.get("owner")
        time.sleep(poll)


def lock_refused_error(cur: t.Mapping[str, t.Any]) -> "ServerError":
    """Wait-die: the lock of an earlier run; this later run stops at once (no wait: the earlier one may be waiting
    for a host this run holds)."""
    return ServerError("host is locked by an earlier gpufleet run %s (%s); this later run stops here, the earlier one "
                       "goes on; run again after it" % (cur.get("owner"), _runid.started_text(cur.get("owner"))),
                       holder=cur.get("owner"), holder_earlier=True)


def lock_busy_error(cur: t.Mapping[str, t.Any], waited: t.Optional[float] = None) -> "ServerError":
    return ServerError("host is locked by another gpufleet run (%s) until %s%s; not touching it"
                       % (cur.get("owner"), time.strftime("%H:%M:%S", time.localtime(float(cur.get("expires", 0)))),
                          "" if waited is None else ", still after waiting %.0f s (lock_wait)" % waited),
                       holder=cur.get("owner"))


def foreign_live_lock(path: str, owner: str) -> t.Optional[t.Dict[str, t.Any]]:
    """The lock at `path` when another run holds it and it is not past its TTL (what acquire_lock would wait for)."""
    cur = read_state(path)
    if cur.get("owner") and cur.get("owner") != owner and not cur.get("corrupt") \
            and float(cur.get("expires", 0)) >= time.time():
        return cur
    return None


def lock_holder(path: str) -> t.Optional[str]:
    """Owner of a lock that is held and not past its expiry, without touching it (None: free, stale or corrupt)."""
    cur = read_state(path)
    if not cur or cur.get("corrupt") or float(cur.get("expires", 0)) < time.time():
        return None
    return str(cur.get("owner"))


def mark_lock(path: str, owner: str, identity: t.Tuple[int, int]) -> bool:
    """Record in this run's lock the host process working under it (pid, start time): the restart goes on if the
    controller dies, so a takeover must wait for it (lock_worker) instead of breaking the lock under it."""
    cur = read_state(path)
    if cur.get("owner") != owner:
        return False
    cur["worker"] = list(identity)
    write_json_atomic(path, cur)
    return True


def lock_worker(lock: t.Mapping[str, t.Any]) -> t.Optional[t.Tuple[int, int]]:
    """The live host process working under this lock, if any."""
    w = lock.get("worker")
    if isinstance(w, list) and len(w) == 2 and all(isinstance(x, int) for x in w):
        ident = (w[0], w[1])
        if _proc.is_alive(ident):
            return ident
    return None


def wait_lock_worker(path: str, owner: str, timeout: float, poll: float = 0.2) -> t.Optional[t.Dict[str, t.Any]]:
    """Wait until no live host process works under `owner`'s lock; return what was waited for (None if nothing)."""
    t0 = time.monotonic()
    cur = read_state(path)
    ident = lock_worker(cur) if cur.get("owner") == owner else None
    if ident is None:
        return None
    while _proc.is_alive(ident):
        if time.monotonic() - t0 >= timeout:
            raise ServerError("the restart of run %s is still running on this host (pid %d) after %.0f s; not breaking "
                              "its lock" % (owner, ident[0], timeout), holder=owner)
        time.sleep(poll)
    return {"pid": ident[0], "waited_s": round(time.monotonic() - t0, 3)}


def release_lock(path: str, owner: str) -> bool:
    cur = read_state(path)
    if cur.get("owner") == owner:
        os.unlink(path)
        return True
    return False
