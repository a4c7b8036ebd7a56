# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Shared argument spec and runners for the process-selecting modules (process_kill, process_env)."""

from __future__ import annotations

import math
import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _gpumod, _kill, _nvml, _proc, _select
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step


def selector_argspec(**extra: t.Any) -> t.Dict[str, t.Any]:
    spec: t.Dict[str, t.Any] = dict(
        tag=dict(type="str"),
        pidfile=dict(type="path"),
        pidfile_cmdline_regex=dict(type="str"),
        pids=dict(type="list", elements="int", default=[]),
        cmdline_regex=dict(type="str"),
        user=dict(type="str"),
        gpu_holders=dict(type="list", elements="int", default=[]),
        include_descendants=dict(type="bool", default=True),
        include_groups=dict(type="bool", default=True),
        exclude_regex=dict(type="list", elements="str"),
        backend=dict(type="str", choices=["auto", "nvml", "nvidia-smi"], default="auto"),
    )
    spec.update(extra)
    return spec


def gpu_holder_pids(backend_name: str, gpus: t.Sequence[int], procs: t.Mapping[int, _proc.Proc]) -> t.List[int]:
    """NVML's process list for these GPUs plus processes with their /dev/nvidiaN open."""
    pids: t.Set[int] = set()
    minors = []
    with _gpumod.backend_or_fail(backend_name) as backend:
        for i in _nvml.resolve_indices(backend, gpus):
            pids.update(p["pid"] for p in backend.processes(i))
            minors.append(backend.minor(i))
    if minors:
        rx = r"^/dev/nvidia(%s)$" % "|".join(str(m) for m in minors)
        pids.update(_proc.device_holders(procs, rx))
    return sorted(pids)


def gpus_by_pid(backend_name: str, procs: t.Mapping[int, _proc.Proc]) -> t.Dict[int, t.List[int]]:
    """pid -> the indices of the GPUs it holds, over every GPU of the host (NVML's process lists and /dev/nvidiaN)."""
    held: t.Dict[int, t.Set[int]] = {}
    with _gpumod.backend_or_fail(backend_name) as backend:
        by_minor = {}
        for i in _nvml.resolve_indices(backend, []):
            for x in backend.processes(i):
                held.setdefault(x["pid"], set()).add(i)
            by_minor[backend.minor(i)] = i
    if by_minor:
        for pid, paths in _proc.device_holders(procs, r"^/dev/nvidia(%s)$" % "|".join(str(m) for m in by_minor)).items():
            held.setdefault(pid, set()).update(by_minor[int(x[len("/dev/nvidia"):])] for x in paths)
    return {pid: sorted(g) for pid, g in held.items()}


def build_selector(p: t.Mapping[str, t.Any], procs: t.Mapping[int, _proc.Proc]) -> _select.Selector:
    """The selector of the options of selector_argspec."""
    sel = _select.Selector(
        tag=p["tag"],
        pidfile=p["pidfile"],
        pidfile_cmdline_regex=p["pidfile_cmdline_regex"],
        pids=p["pids"],
        cmdline_regex=p["cmdline_regex"],
        user=p["user"],
        gpu_holder_pids=gpu_holder_pids(p["backend"], p["gpu_holders"], procs) if p["gpu_holders"] else (),
        include_descendants=p["include_descendants"],
        include_groups=p["include_groups"],
        exclude_regex=_select.DEFAULT_EXCLUDES if p["exclude_regex"] is None else p["exclude_regex"],
        # Not a module option: server_restart names its service for the selections it makes without the tag.
        service_tag=p.get("service_tag"),
        # Not module options either: server_restart's GPUs, against which a match of its adopt regex is judged.
        adopt_gpus=p.get("adopt_gpus") or (),
        gpus_by_pid=gpus_by_pid(p["backend"], procs) if p.get("adopt_gpus") and p["cmdline_regex"] else None,
        # Not a module option: server_restart's server user, the only one whose processes its launch tag selects.
        tag_users=p.get("tag_users") or (),
    )
    if sel.is_empty() and not p["gpu_holders"]:
        raise StepError("No selector given: set at least one of tag, pidfile, pids, cmdline_regex, user, gpu_holders")
    return sel


def select_or_fail(p: t.Mapping[str, t.Any]) -> t.Tuple[t.Dict[str, t.Any], t.Mapping[int, _proc.Proc]]:
    procs = _proc.snapshot()
    try:
        sel = build_selector(p, procs)
        return _select.select(sel, procs), procs
    except (_select.SelectError, _proc.ProcError) as e:
        raise StepError(str(e))


KILL_ORDERS = ["launcher_first", "all_at_once"]


def signal_argspec() -> t.Dict[str, t.Any]:
    """How a kill signals (process_kill's options, server_restart's kill suboptions): one source of the defaults."""
    return dict(
        signals=dict(type="list", elements="str", default=["TERM", "KILL"]),
        grace=dict(type="float", default=10.0),
        final_wait=dict(type="float", default=5.0),
        poll_interval=dict(type="float", default=0.01),
        order=dict(type="str", choices=KILL_ORDERS, default="launcher_first"),
    )


def leaders(chosen: t.Mapping[str, t.Any], procs: t.Mapping[int, _proc.Proc], order: str) -> t.List[int]:
    """The pids that get the first signal alone (order launcher_first): the pidfile's confirmed process when it is
    selected, otherwise the tops of the selected trees (a selected process whose parent is not selected: the launcher
    of a server started by hand, an orphaned worker). Empty (everything at once) when that is every selected pid."""
    sel = chosen["selected"]
    if order != "launcher_first" or len(sel) < 2:
        return []
    pf = chosen.get("pidfile") or {}
    if pf.get("status") == "confirmed" and pf.get("pid") in sel:
        return [pf["pid"]]
    tops = sorted(pid for pid in sel if pid in procs and procs[pid].ppid not in sel)
    return tops if len(tops) < len(sel) else []


def kill_input_error(p: t.Mapping[str, t.Any]) -> t.Optional[str]:
    """What is wrong with the signalling options (signals, grace, final_wait, poll_interval), or None."""
    for k in ("grace", "final_wait"):
        if not 0 <= p[k] < math.inf:  # NaN too
            return "%s must be >= 0 seconds, got %s" % (k, p[k])
    if not 0 < p["poll_interval"] < math.inf:
        return "poll_interval must be > 0 seconds, got %s" % p["poll_interval"]
    try:
        for s in p["signals"]:
            _kill.parse_signal(s)
    except _kill.KillError as e:
        return "signals: %s" % e
    if not p["signals"]:
        return "signals must name at least one signal"
    if p.get("order", "launcher_first") not in KILL_ORDERS:
        return "order must be one of %s, got %r" % (", ".join(KILL_ORDERS), p.get("order"))
    return None


def run(p: t.Mapping[str, t.Any], step: Step = Step()) -> t.Dict[str, t.Any]:
    """process_kill: select, then signal (nothing in check mode); StepError carries the result so far."""
    check_mode = step.check_mode
    err = kill_input_error(p)
    if err:
        raise StepError(err)

    chosen, procs = select_or_fail(p)
    sel = chosen["selected"]
    described = {pid: _select.describe(pid, procs, why) for pid, why in sel.items()}
    excluded = [dict(pid=pid, reason=why, cmdline=procs[pid].command[:300]) for pid, why in sorted(chosen["excluded"].items())]
    result: t.Dict[str, t.Any] = dict(changed=bool(sel), processes=[described[k] for k in sorted(described)],
                                      signalled=len(sel), survivors=[], excluded=excluded,
                                      notes=chosen["notes"], elapsed_s=0.0)
    if "pidfile" in chosen:
        result["pidfile"] = chosen["pidfile"]
    first = leaders(chosen, procs, p.get("order") or "launcher_first")
    result["signalled_first"] = first
    if check_mode or not sel:
        return result
    t0 = time.monotonic()
    try:
        report = _kill.kill([procs[pid] for pid in sorted(sel)], signals=p["signals"], grace=p["grace"],
                            final_wait=p["final_wait"], poll_interval=p["poll_interval"], first=first)
    except _kill.KillError as e:
        raise StepError(str(e))
    result["elapsed_s"] = round(time.monotonic() - t0, 4)
    for r in report:
        described[r["pid"]].update(r)
    result["processes"] = [described[k] for k in sorted(described)]
    result["signalled"] = sum(1 for r in report if r["signals_sent"])
    result["changed"] = result["signalled"] > 0
    result["survivors"] = [r["pid"] for r in report if r["survived"]]
    if result["survivors"] and p["fail_on_survivor"]:
        detail = "; ".join("pid %d state %s: %s" % (r["pid"], r.get("state"), r["cmdline"][:160]) for r in report if r["survived"])
        raise StepError("%d process(es) survived %s: %s" % (len(result["survivors"]), p["signals"][-1], detail), **result)
    return result
