# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_server role's host facts, composed on the controller from what its steps registered.

The role publishes `gpufleet_server_rotation` (where the host stands in its balancers) and `gpufleet_server_result`
(its summary row) once, at the end of the host's flow or in its rescue. Each step only registers its result; these
functions say what the host's rotation and row are after the steps that have run. They replace a `set_fact` after
each step (one task execution per restarted host each: issue 25) and the Jinja that merged the balancers' answers.

A step that has not run in this flow registered {} (the role resets its registers when the flow starts, so a second
service of the host never reads the first one's); a step skipped (check mode) registered `skipped`.
"""

from __future__ import annotations

import copy
import re
import typing as t

Result = t.Dict[str, t.Any]
_STILL_OUT = re.compile("MAINT|DRAIN")


def _ran(reg: t.Any) -> bool:
    return isinstance(reg, t.Mapping) and bool(reg) and not reg.get("skipped")


def _items(reg: t.Any) -> t.List[t.Mapping[str, t.Any]]:
    """A loop's per-call results (one per balancer machine); [] for a step that did not run."""
    if not _ran(reg):
        return []
    return [r for r in reg.get("results") or [] if isinstance(r, t.Mapping)]


def _rotations(reg: t.Any) -> t.List[t.Mapping[str, t.Any]]:
    return [r["rotation"] for r in _items(reg) if isinstance(r.get("rotation"), t.Mapping)]


def _merge(a: t.Any, b: t.Any) -> t.Any:
    """Ansible's combine(recursive=True, list_merge='append_rp'): dicts merged key by key, a list extended by the
    other's items (those it already has moved to the end), anything else replaced."""
    if isinstance(a, t.Mapping) and isinstance(b, t.Mapping):
        out = dict(a)
        for k, v in b.items():
            out[k] = _merge(out[k], v) if k in out else copy.deepcopy(v)
        return out
    if isinstance(a, list) and isinstance(b, list):
        return [x for x in a if x not in b] + list(b)
    return copy.deepcopy(b)


def _flat(results: t.Iterable[t.Mapping[str, t.Any]], key: str) -> t.List[t.Any]:
    out: t.List[t.Any] = []
    for r in results:
        v = r.get(key)
        if isinstance(v, list):
            out.extend(v)
    return out


def _whole(back: t.Iterable[t.Any]) -> t.List[str]:
    """The entries back in rotation in every backend: one still MAINT or DRAIN in a backend ("web=UP api=MAINT") is
    still out there, gpufleet's drain, as the drain record keeps it (the drain's settle and the slow path's verdict,
    helper-41)."""
    return [str(b.get("name")) for b in back
            if isinstance(b, t.Mapping) and not _STILL_OUT.search(str(b.get("found") or ""))]


def _step(drain: t.Any, step: str) -> t.List[t.Mapping[str, t.Any]]:
    """The drain loop's items of one step (rotation_step's results carry their step)."""
    return [r for r in _items(drain) if r.get("step") == step]


def rotation(start: t.Any, names: t.Sequence[str], check_mode: bool, drain: t.Any = None, slow: t.Any = None,
             back: t.Any = None, retake: t.Any = None) -> Result:
    """The host's rotation after the drain's and the return's steps that have run, in their order.

    start: the check's decision (or the stop's): in rotation, nothing drained yet; or the entries a host an earlier
      run left drained goes back into. {} for a host whose balancers this run does not touch: {} stays.
    drain: the drain's loop (drain.yml, the rotation_step action): what each take-out call took out (also when another
      call failed: what it took out stays out and is listed), and its outcome (settle: drained, or a balancer has the
      host back in rotation; check mode drains nothing; deferred to the slow path while requests are in flight).
    slow: the drain's slow path (its loop, when the first slice ended with requests in flight): its verdict, as the
      drain's settle (drained, proceed past the timeout, or a balancer has the host back in rotation; the timeout or
      an unreadable metrics URL fail the host with the host still out). back: the put-back (what each call put back,
      also one that failed after); retake: the best-effort take-out after a failed put-back (what each call took out)."""
    if not isinstance(start, t.Mapping) or not start:
        return {}
    rot: Result = copy.deepcopy(dict(start))
    order = [str(n) for n in names]

    def ordered(keep: t.Iterable[str]) -> t.List[str]:
        # out_of in the entries' order, whatever order the calls ran in
        keep = set(keep)
        return [n for n in order if n in keep]

    outs = [r["rotation"] for r in _step(drain, "out") if isinstance(r.get("rotation"), t.Mapping)]
    if outs:
        for r in outs:
            rot = _merge(rot, r)
        rot["out_of"] = ordered(rot.get("out_of") or [])
    settle = (_step(drain, "settle") or [{}])[0]
    verdict = (_step(slow, "verdict") or [{}])[0]
    if verdict.get("outcome") in ("drained", "lost", "proceed", "timeout"):
        settle = verdict  # the slow path's, the last read before the kill
    # (Past the timeout with requests in flight, under gpufleet_server_drain_on_timeout fail, the host was not drained:
    # it fails, still out.)
    if settle.get("outcome") in ("drained", "lost", "check_mode", "proceed"):
        again = _whole(settle.get("back_in_rotation") or [])
        rot["drained"] = not check_mode
        rot["out_of"] = [n for n in rot.get("out_of") or [] if n not in again]
        rot["inflight_left"] = settle.get("inflight_left")
    if _ran(back):
        # What the put-back put back is back, also from a call that failed after it (its partial rotation): the
        # take-out below says what went out again (helper-41).
        backs = _rotations(back)
        done = _flat(backs, "back_in")
        rot["out_of"] = [n for n in rot.get("out_of") or [] if n not in done]
        left = dict(rot.get("left_as_found") or {})
        for r in backs:
            left.update(r.get("left_as_found") or {})
        rot["left_as_found"] = left
    retaken = _rotations(retake)
    if retaken:
        rot["out_of"] = ordered(list(rot.get("out_of") or []) + _flat(retaken, "out_of"))
    # A restart of a host an earlier run left out (its drain record, the check's decision): the entries its put-back
    # put back are returned to service; until then (a failure before it) the host is still out of them (`left_out`).
    # Under --check the put-back is what the run would do.
    recorded = [str(n) for n in rot.get("recorded") or []]
    if recorded:
        if check_mode:
            rot.update(returned=ordered(recorded), would_return=True)
        else:
            done = set(_flat(_rotations(back), "back_in")) - set(rot.get("out_of") or [])
            rot["returned"] = ordered(n for n in recorded if n in done)
            rot["left_out"] = ordered(n for n in recorded if n not in done)
    return rot


def result(start: t.Any, check_mode: bool, restart: t.Any = None) -> Result:
    """The host's summary row: the check's decision, then what its restart did (in check mode, what it would do:
    nothing killed or timed). A failed restart adds nothing here; the role's rescue records its failure."""
    row: Result = dict(start) if isinstance(start, t.Mapping) else {}
    if _ran(restart) and not restart.get("failed"):
        env = restart.get("env") if isinstance(restart.get("env"), t.Mapping) else {}
        row.update(restarted=not check_mode, would_restart=check_mode,
                   killed=0 if check_mode else restart.get("killed", 0),
                   timings={} if check_mode else (restart.get("timings") or {}),
                   workers_verified=len(env.get("processes") or []))
        if "gate" in restart:
            row["gate"] = restart["gate"]
    return row
