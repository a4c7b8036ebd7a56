# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The drain of a host as one task, and its return to service as another: their steps, each a loop item run where the
item says, and what each step does after the ones before it (the gpufleet.serving.rotation_step action).

The drain alternates between machines: read every balancer (on each balancer's machine), record the drain (on the
host), take the host out (balancers), wait for its requests in flight (host), check it is still out (balancers), and,
when a balancer has it back, drop those entries' records and fail the host (host). ansible-core runs a task on one
machine (its host or its delegate_to), and an action plugin runs modules only over its task's connection, so each
alternation was a task of its own: six task executions per drained host, each a worker fork on the controller
(issue 25). Here the steps are the items of one loop whose `delegate_to` is the item's machine: ansible-core opens
each item's connection to the machine it names, and runs the items one after another in the host's one worker
process, where this module's state carries what each step found to the next (the drains to record, the records the
take-out reads, whether requests are still in flight). An item that finds no state of the steps before it fails the
host before anything is touched (`missing`): the steps never act on what they cannot see.

Each step calls the same module the role's tasks called, with the same arguments; only the glue between them (what the
role's YAML did with `when`, `register` and Jinja) is here, and unit-tested (tests/unit/plugins/plugin_utils).
"""

from __future__ import annotations

import math
import re
import time
import typing as t

Result = t.Dict[str, t.Any]

STEPS = ("plan", "record", "out", "wait", "recheck", "settle")
# A backend the re-read found still MAINT or DRAIN ("web=UP api=MAINT") is still gpufleet's drain there: only an entry
# back in rotation in every backend loses its record (helper-35).
_STILL_OUT = re.compile("MAINT|DRAIN")


def _unique(xs: t.Iterable[str]) -> t.List[str]:
    out: t.List[str] = []
    for x in xs:
        if x not in out:
            out.append(x)
    return out


def steps(entries: t.Sequence[t.Mapping[str, t.Any]], host: str) -> t.List[t.Dict[str, str]]:
    """The loop's items: each step and the machine it runs on (an entry's delegate_to, or the host). Every entry is
    read before the host leaves any; http entries have no read API and are not re-read."""
    machines = _unique(str(e["delegate_to"]) for e in entries)
    readable = _unique(str(e["delegate_to"]) for e in entries if e.get("type") != "http")
    return ([dict(step="plan", where=m) for m in machines] + [dict(step="record", where=host)]
            + [dict(step="out", where=m) for m in machines] + [dict(step="wait", where=host)]
            + [dict(step="recheck", where=m) for m in readable] + [dict(step="settle", where=host)])


class Call(t.NamedTuple):
    """A module call the step makes on its item's machine; check_mode True forces check mode (the plan's read)."""
    module: str
    args: t.Dict[str, t.Any]
    check_mode: t.Optional[bool] = None


def skipped(why: str, **extra: t.Any) -> Result:
    return dict(extra, skipped=True, changed=False, skip_reason=why)


_SAID = ("nothing was killed", "nothing killed", "nothing was touched", "nothing was taken out")


def before_kill(res: Result, what: str = "nothing was killed") -> Result:
    """A failed drain step's message says what its failure left: every drain step comes before the kill, and a user
    reading "the router answered HTTP 500" must not have to guess whether the server was stopped (helper-41, low)."""
    msg = str(res.get("msg") or "")
    if res.get("failed") and not any(s in msg for s in _SAID):
        res["msg"] = "%s; %s" % (msg.rstrip("; .") or "failed", what)
    return res


def _read_lost(res: Result, lost: t.List[t.Mapping[str, t.Any]], msgs: t.List[str]) -> bool:
    """A read before the kill that found the host back in rotation (an HAProxy reload without its server-state-file
    forgets MAINT), or could not read: noted for the last step, which drops the records of those entries and fails the
    host with these words; not a failure of the item itself. Whether it was one."""
    back = [b for b in res.get("back_in_rotation") or [] if isinstance(b, t.Mapping)]
    if not (res.get("failed") or back):
        return False
    lost.extend(back)
    msgs.append(str(res.get("msg") or "a balancer has the host back in rotation"))
    res["failed"] = False
    res["lost"] = True
    res["note"] = res.pop("msg", "")
    res.pop("exception", None)
    return True


def _slice_result(res: Result) -> Result:
    """A slice of the in-flight wait: one that ends with requests in flight (its result has the count) is not a failure
    yet, its words kept as a note (ansible shows a result's msg beside `failed` as an error); an unreadable metrics URL
    is, at once (returned failed, saying nothing was killed)."""
    if res.get("failed") and "inflight" not in res:
        return before_kill(res)
    res["failed"] = False
    if "msg" in res:
        res["note"] = res.pop("msg")
    res.pop("exception", None)
    return res


def missing(step: str) -> Result:
    """An item that finds no state of the items before it (a step of the drain or of the return) touches nothing."""
    return dict(failed=True, changed=False, msg=(
        "%s step %s ran without the results of the steps before it (ansible-core ran the loop's items in separate "
        "processes?); nothing was touched by it" % ("drain" if step in STEPS else "return to service", step)))


class Drain:
    """What the drain's steps found so far, for one host in one run of the task."""

    def __init__(self, once: t.Optional[t.Mapping[str, t.Any]] = None, check_mode: bool = False) -> None:
        self.once = dict(once or {})  # the arguments the loop's first item carried for all (the action's)
        self.check_mode = check_mode
        self.aborted = ""  # why the steps after a failed one do nothing
        self.drains: t.List[t.Any] = []  # what the plan would take out (the drain record's entries)
        self.records: t.Optional[t.Dict[str, t.Any]] = None  # the drain record after the add
        self.out_failed = False
        self.deferred = False  # requests still in flight after the first slice: the slow path (its own loop, Slow)
        self.inflight: t.Any = None
        self.lost: t.List[t.Mapping[str, t.Any]] = []  # entries a re-read found back in rotation
        self.lost_msgs: t.List[str] = []

    # --- the module each step calls (or its result when it calls none) ---------------------------------------------

    @staticmethod
    def _balancer(p: t.Mapping[str, t.Any], state: str, **extra: t.Any) -> t.Dict[str, t.Any]:
        args = dict(balancers=list(p["balancers"]), server=p["server"], worker_url=p["worker_url"], state=state)
        args.update(extra)
        return args

    def call(self, step: str, p: t.Mapping[str, t.Any]) -> t.Union[Call, Result]:
        check_mode = self.check_mode
        if step == "plan":
            if self.aborted:
                return skipped(self.aborted)
            return Call("gpufleet.serving.balancer",
                        self._balancer(p, "out", names=list(p["names"]), records=dict(p["records"])), True)
        if self.aborted:
            return skipped(self.aborted, outcome="aborted")
        if check_mode:
            # --check touches no balancer: the plan's prediction (would drain) is the drain's whole answer.
            return skipped("check mode: the host is not taken out", outcome="check_mode")
        if step == "record":
            if not self.drains:
                return skipped("nothing to take out")
            return Call("gpufleet.serving.rotation_record", dict(path=p["record"]["path"], action="add",
                                                                 drains=list(self.drains), run=p["record"]["run"]))
        if step == "out":
            records = self.records if self.records is not None else dict(p["records"])
            return Call("gpufleet.serving.balancer", self._balancer(p, "out", names=list(p["names"]), records=records))
        if self.out_failed:
            return skipped("a balancer did not take the host out", outcome="aborted")
        if step == "wait":
            w = p.get("wait")
            if not w:
                return skipped("no in-flight metrics to wait on")
            return Call("gpufleet.serving.inflight_wait", dict(
                url=w["url"], metrics=list(w["metrics"]), timeout=min(float(w["timeout"]), float(w["slice"])),
                interval=w["interval"], on_timeout="fail", alive_url=w.get("alive_url") or None))
        if self.deferred:
            return skipped("requests still in flight after the first slice: the slow path waits on, then checks",
                           outcome="deferred")
        if step == "recheck":
            if not p["balancers"]:
                return skipped("no balancer to read on this machine")
            return Call("gpufleet.serving.balancer", self._balancer(p, "read", report="rotation"))
        if step == "settle":
            whole = _unique(str(b.get("name")) for b in self.lost if not _STILL_OUT.search(str(b.get("found") or "")))
            if whole:
                return Call("gpufleet.serving.rotation_record",
                            dict(path=p["record"]["path"], action="clear", balancers=whole))
            return self.settled({})
        raise ValueError("unknown drain step %r (one of %s)" % (step, ", ".join(STEPS)))

    # --- what each step's module said, as the loop item's result -----------------------------------------------------

    def took(self, step: str, res: Result) -> Result:
        res = {k: v for k, v in res.items() if k != "invocation"}
        failed = bool(res.get("failed"))
        if step == "plan":
            if failed:
                self.aborted = "a balancer could not be read before the take-out: nothing was touched"
                return before_kill(res, "nothing was touched")
            self.drains.extend(res.get("drains") or [])
            # A read: changed only as --check's prediction of the take-out (which check mode skips).
            res["changed"] = bool(self.check_mode and res.get("changed"))
            return res
        if step == "record":
            if failed:
                self.aborted = "the drain record could not be written: nothing was taken out"
                return before_kill(res, "nothing was taken out, nothing was killed")
            self.records = dict(res.get("records") or {})
            return res
        if step == "out":
            self.out_failed = self.out_failed or failed
            return before_kill(res)
        if step == "wait":
            res = _slice_result(res)
            if res.get("failed"):
                self.aborted = "the requests in flight could not be read: nothing was killed"
                return res
            self.inflight = res.get("inflight")
            self.deferred = not res.get("drained", True)
            return res
        if step == "recheck":
            _read_lost(res, self.lost, self.lost_msgs)  # the host fails at the settle step, after those records go
            return res
        if step == "settle":
            return self.settled(res)
        raise ValueError("unknown drain step %r" % step)

    def settled(self, cleared: Result) -> Result:
        """The drain's outcome, the last step: drained, or failed (a balancer has the host back in rotation, or cannot
        be read), nothing killed. The records of the entries back in rotation were dropped (`cleared`), so an
        operator's MAINT set on them later is not taken for gpufleet's and undone by the next run (helper-35)."""
        out: Result = dict(changed=bool(cleared.get("changed")), inflight_left=self.inflight,
                           back_in_rotation=list(self.lost))
        if cleared.get("failed"):
            return dict(out, failed=True, outcome="lost", msg="; ".join(self.lost_msgs + [str(cleared.get("msg"))]))
        if self.lost_msgs:
            return dict(out, failed=True, outcome="lost", msg="; ".join(self.lost_msgs))
        return dict(out, outcome="drained")


SLOW_STEPS = ("reread", "slice", "final", "verdict")


def slow_steps(entries: t.Sequence[t.Mapping[str, t.Any]], host: str, timeout: float, slice_s: float) -> t.List[t.Dict[str, str]]:
    """The slow path's items, when the drain's first slice ended with requests still in flight: rounds of a re-read of
    every balancer that can be read (on its machine) and the next slice of the wait (on the host), as many as the
    drain timeout leaves slices for, then the read right before the kill (balancers) and the verdict (host). A loop's
    items are fixed when it starts: the rounds a drained host (or a failed one) no longer needs return at once."""
    readable = _unique(str(e["delegate_to"]) for e in entries if e.get("type") != "http")
    rounds = max(1, int(math.ceil(max(float(timeout) - float(slice_s), 0.0) / max(float(slice_s), 0.001))))
    one = [dict(step="reread", where=m) for m in readable] + [dict(step="slice", where=host)]
    return one * rounds + [dict(step="final", where=m) for m in readable] + [dict(step="verdict", where=host)]


class Slow:
    """The drain's slow path (drain.yml's second task): its first slice (the drain's `wait`) ended with requests still
    in flight. The balancers are read again between slices, so one that put the server back in rotation meanwhile (an
    HAProxy reload without its server-state-file forgets MAINT) fails the host at once, nothing killed, instead of after
    the whole drain timeout with the server serving all along. Past the deadline (gpufleet_server_drain_timeout from
    the start of the wait) with requests still in flight, gpufleet_server_drain_on_timeout says whether the host fails
    or the restart goes on. Then the read right before the kill, as the drain's own, and the verdict: the records of
    the entries back in rotation go (helper-35), and the host fails with each read's words."""

    def __init__(self, once: t.Optional[t.Mapping[str, t.Any]] = None, check_mode: bool = False,
                 clock: t.Callable[[], float] = time.monotonic) -> None:
        self.once = dict(once or {})
        self.check_mode = check_mode
        self.clock = clock
        first = self.once.get("first") or {}
        self.first_waited = float(first.get("waited_s") or 0.0)
        self.inflight: t.Any = first.get("inflight")
        self.gauges: t.Dict[str, t.Any] = dict(first.get("gauges") or {})
        self.deadline: t.Optional[float] = None
        self.drained = False
        self.aborted = ""
        self.lost: t.List[t.Mapping[str, t.Any]] = []
        self.lost_msgs: t.List[str] = []

    def _left(self, w: t.Mapping[str, t.Any]) -> float:
        if self.deadline is None:  # the deadline counts from the start of the first slice
            self.deadline = self.clock() + float(w["timeout"]) - self.first_waited
        return self.deadline - self.clock()

    def _done(self, w: t.Mapping[str, t.Any]) -> t.Optional[str]:
        if self.aborted:
            return self.aborted
        if self.drained:
            return "no request in flight any more"
        if self._left(w) <= 0:
            return "the drain timeout has passed"
        return None

    def call(self, step: str, p: t.Mapping[str, t.Any]) -> t.Union[Call, Result]:
        w = p.get("wait") or {}
        if self.check_mode or not w:
            return skipped("check mode: nothing is waited for" if self.check_mode else "no in-flight metrics to wait on")
        if step in ("reread", "final"):
            why = self.aborted if step == "final" else self._done(w)
            if why:
                return skipped(why)
            if step == "final" and not self.drained and w.get("on_timeout") != "proceed":
                return skipped("requests still in flight at the drain timeout")
            if not p["balancers"]:
                return skipped("no balancer to read on this machine")
            return Call("gpufleet.serving.balancer", dict(balancers=list(p["balancers"]), server=p["server"],
                                                          worker_url=p["worker_url"], state="read", report="rotation"))
        if step == "slice":
            why = self._done(w)
            if why:
                return skipped(why)
            return Call("gpufleet.serving.inflight_wait", dict(
                url=w["url"], metrics=list(w["metrics"]), timeout=max(min(self._left(w), float(w["slice"])), 0.001),
                interval=w["interval"], on_timeout="fail", alive_url=w.get("alive_url") or None))
        if step == "verdict":
            whole = _unique(str(b.get("name")) for b in self.lost if not _STILL_OUT.search(str(b.get("found") or "")))
            if whole:
                return Call("gpufleet.serving.rotation_record",
                            dict(path=p["record"]["path"], action="clear", balancers=whole))
            return self.verdict({}, w)
        raise ValueError("unknown slow drain step %r (one of %s)" % (step, ", ".join(SLOW_STEPS)))

    def took(self, step: str, res: Result) -> Result:
        res = {k: v for k, v in res.items() if k != "invocation"}
        failed = bool(res.get("failed"))
        if step in ("reread", "final"):
            if _read_lost(res, self.lost, self.lost_msgs):  # the host fails at the verdict, after those records go
                self.aborted = "a balancer has the host back in rotation (or cannot be read): nothing was killed"
            return res
        if step == "slice":
            res = _slice_result(res)
            if res.get("failed"):
                self.aborted = "the requests in flight could not be read: nothing was killed"
                return res
            # Requests still in flight after a slice: the next round reads the balancers again.
            self.inflight = res.get("inflight")
            self.gauges = dict(res.get("gauges") or {})
            self.drained = bool(res.get("drained", True))
            return res
        if step == "verdict":
            return self.verdict(res, {})
        raise ValueError("unknown slow drain step %r" % step)

    def verdict(self, cleared: Result, w: t.Mapping[str, t.Any]) -> Result:
        """The slow path's outcome: drained; lost (a balancer has the host back in rotation, or cannot be read: the
        host fails, nothing killed); timeout (requests still in flight at the deadline: the host fails, nothing killed,
        unless gpufleet_server_drain_on_timeout is proceed, said as a warning); aborted (the metrics could not be
        read: that slice already failed the host)."""
        out: Result = dict(changed=bool(cleared.get("changed")), inflight_left=self.inflight,
                           back_in_rotation=list(self.lost))
        if self.lost_msgs or cleared.get("failed"):
            msgs = self.lost_msgs + ([str(cleared.get("msg"))] if cleared.get("failed") else [])
            return dict(out, failed=True, outcome="lost", msg=before_kill(dict(failed=True, msg="; ".join(msgs)))["msg"])
        if self.aborted:
            return skipped(self.aborted, outcome="aborted", inflight_left=self.inflight)
        if self.drained:
            return dict(out, outcome="drained")
        timeout = float(w.get("timeout") or 0)
        said = "%g request(s) still in flight after %gs (%s)" % (
            float(self.inflight or 0), timeout, ", ".join("%s=%g" % (k, float(v)) for k, v in sorted(self.gauges.items())))
        if (w or {}).get("on_timeout") == "proceed":
            return dict(out, outcome="proceed",
                        warnings=[said + "; going on (gpufleet_server_drain_on_timeout: proceed)"])
        return dict(out, failed=True, outcome="timeout", msg=said + "; nothing was killed")


RETURN_STEPS = ("back", "clear")


def return_steps(entries: t.Sequence[t.Mapping[str, t.Any]], host: str) -> t.List[t.Dict[str, str]]:
    """The return to service's items: the put-back on each machine that reaches a balancer, then the clear of the
    host's drain record on the host."""
    return ([dict(step="back", where=m) for m in _unique(str(e["delegate_to"]) for e in entries)]
            + [dict(step="clear", where=host)])


class Return:
    """The return to service after the verify (return_to_service.yml): each balancer back to the state it was found
    in and UP (every machine's call runs, also after another failed: the role's rescue then takes the host out of
    every balancer again), then, with every call done, the drain record cleared (a renamed entry's old name included;
    a record of another server under the name of an entry left in an operator's MAINT stays: records_kept)."""

    def __init__(self, once: t.Optional[t.Mapping[str, t.Any]] = None, check_mode: bool = False) -> None:
        self.once = dict(once or {})  # the arguments the loop's first item carried for all (the action's)
        self.check_mode = check_mode
        self.failed = False
        self.kept: t.List[str] = []

    def call(self, step: str, p: t.Mapping[str, t.Any]) -> t.Union[Call, Result]:
        if self.check_mode:
            return skipped("check mode: the host is not put back")
        rot = p.get("rotation") or {}
        if step == "back":
            return Call("gpufleet.serving.balancer", dict(
                state="in", balancers=list(p["balancers"]), server=p["server"], worker_url=p["worker_url"],
                found=dict(rot.get("found") or {}), records=dict(p["records"]),
                left_as_found=dict(rot.get("left_as_found") or {}), up_timeout=p["up_timeout"]))
        if step == "clear":
            if self.failed:
                return skipped("a balancer did not take the host back: its drain record stays")
            names = _unique([str(n) for n in p["names"]] + [str(n) for n in rot.get("renamed") or {}])
            return Call("gpufleet.serving.rotation_record", dict(
                path=p["record"]["path"], action="clear", balancers=[n for n in names if n not in self.kept]))
        raise ValueError("unknown return step %r (one of %s)" % (step, ", ".join(RETURN_STEPS)))

    def took(self, step: str, res: Result) -> Result:
        res = {k: v for k, v in res.items() if k != "invocation"}
        if step == "back":
            self.failed = self.failed or bool(res.get("failed"))
            rot = res.get("rotation") if isinstance(res.get("rotation"), t.Mapping) else {}
            self.kept.extend(str(n) for n in rot.get("records_kept") or [])
        return res
