# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""process_env: prove that running processes carry the expected environment.

/proc/PID/environ is the environment a process got at exec (proc_pid_environ(5)). Variables that
sitecustomize sets inside a process are therefore invisible there for that process, but visible
in every child it starts with exec (multiprocessing 'spawn', subprocess). Measured on an H200:
the launcher that ran sitecustomize does not show them, its spawn workers do.

Statuses per checked process:
- ok: every expected variable is in its environ with the expected value (or NCCL's log confirms it
  for that pid, which also covers /etc/nccl.conf).
- explained (launcher): it lacks some, but a descendant that it exec'd carries all of them: the
  values were set inside it after exec and reached its children.
- explained (fork): it lacks some, but it is a fork-started copy of its parent (same executable,
  command line and environ block, no exec) whose parent is ok or explained: its environ is the
  parent's exec-time block, its runtime environment is the parent's.
- wrong: anything else, including any variable NCCL's log contradicts for that pid.
"""

from __future__ import annotations

import os
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _envblock, _killmod, _nccllog, _nvml, _proc
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step


class EnvCheckError(Exception):
    pass


def _exe(pid: int) -> t.Optional[str]:
    try:
        return os.readlink("/proc/%d/exe" % pid)
    except OSError:
        return None


def _environ_fingerprint(pid: int) -> t.Optional[int]:
    """A hash of the raw environ block: compared between parent and child, never returned."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return hash(f.read())
    except OSError:
        return None


def nvml_holders(prefer: str) -> t.Tuple[t.Set[int], t.List[str]]:
    """Pids NVML lists on any GPU, plus /dev/nvidiaN minors; best effort (the device scan still runs)."""
    notes: t.List[str] = []
    pids: t.Set[int] = set()
    try:
        backend = _nvml.open_backend(prefer)
    except _nvml.BackendUnavailable as e:
        notes.append("GPU backend unavailable (%s); GPU holders found through /dev/nvidia* only" % e)
        return pids, notes
    try:
        for i in _nvml.resolve_indices(backend, []):
            pids.update(p["pid"] for p in backend.processes(i))
    except _nvml.GpuError as e:
        notes.append("GPU process list failed (%s); GPU holders found through /dev/nvidia* only" % e)
    finally:
        backend.close()
    return pids, notes


def classify(selected: t.Mapping[int, t.Sequence[str]], procs: t.Mapping[int, _proc.Proc], holders: t.Set[int],
             target: str) -> t.Dict[int, str]:
    """pid -> role among the selection: 'worker' (holds a GPU), 'worker_descendant', or 'other'."""
    sel = set(selected)
    workers = {pid for pid in sel if pid in holders}
    desc = _proc.descendants(workers, procs) & sel
    roles = {}
    for pid in sel:
        role = "worker" if pid in workers else "worker_descendant" if pid in desc else "other"
        if target == "workers" and role == "other":
            continue
        roles[pid] = role
    return roles


def check(expected: t.Mapping[str, str], selected: t.Mapping[int, t.Sequence[str]], procs: t.Mapping[int, _proc.Proc],
          holders: t.Set[int], target: str, log_entries: t.Optional[t.Sequence[_nccllog.Entry]] = None,
          ) -> t.Dict[str, t.Any]:
    roles = classify(selected, procs, holders, target)
    keys = sorted(expected)
    log = None
    if log_entries is not None:
        log = _nccllog.judge(log_entries, expected, pids=set(selected))
    rows: t.Dict[int, t.Dict[str, t.Any]] = {}
    envs: t.Dict[int, t.Optional[t.Dict[str, str]]] = {}
    gone: t.List[int] = []

    def environ(pid: int) -> t.Optional[t.Dict[str, str]]:
        # Only the expected keys are ever read (environ holds tokens).
        if pid not in envs:
            try:
                envs[pid] = _proc.read_environ(pid, keys)
            except _proc.ProcError as e:
                if pid in roles and "Permission denied" in str(e):
                    raise EnvCheckError(str(e))
                envs[pid] = None
        return envs[pid]

    def carries(pid: int) -> bool:
        e = environ(pid)
        return e is not None and all(e.get(k) == expected[k] for k in keys)

    def exec_carriers(pid: int) -> t.List[int]:
        return sorted(d for d in _proc.descendants([pid], procs) if not _is_fork_copy(d, procs) and carries(d))

    def vouched(pid: int, depth: int = 0) -> t.Optional[str]:
        """Why pid's runtime environment has the values: 'ok', 'launcher' or 'fork', else None."""
        if pid not in procs or depth > 64:
            return None
        if carries(pid):
            return "ok"
        if exec_carriers(pid):
            return "launcher"
        if _is_fork_copy(pid, procs) and vouched(procs[pid].ppid, depth + 1):
            return "fork"
        return None

    for pid in sorted(roles):
        env = environ(pid)
        if env is None:
            gone.append(pid)
            continue
        p = procs[pid]
        logrow = (log or {}).get("pids", {}).get(str(pid), {})
        missing, mismatched, contradicted = [], [], []
        for k in keys:
            st = logrow.get(k, {}).get("status")
            if st == "contradicted":
                contradicted.append(k)
            elif env.get(k) == expected[k] or st == "confirmed":
                continue
            elif k in env:
                mismatched.append(k)
            else:
                missing.append(k)
        row = dict(pid=pid, ppid=p.ppid, cmdline=p.command[:300], matched_by=list(selected[pid]), role=roles[pid],
                   env={k: env.get(k) for k in keys}, missing=missing, mismatched=mismatched,
                   nccl_log_contradicted=contradicted, status="ok", explanation=None)
        rows[pid] = row
        if not (missing or mismatched or contradicted):
            continue
        row["status"] = "wrong"
        if contradicted:
            continue
        lacking = ", ".join(missing + mismatched)
        carriers = exec_carriers(pid)
        if carriers:
            row["status"] = "explained"
            row["explanation"] = (
                "launcher: /proc/%d/environ is the environment at exec and lacks %s, but its exec'd descendant(s) %s "
                "carry every expected value, so they were set inside this process after exec (sitecustomize)"
                % (pid, lacking, ", ".join(str(c) for c in carriers[:8])))
        elif _is_fork_copy(pid, procs):
            why = vouched(p.ppid)
            if why:
                row["status"] = "explained"
                row["explanation"] = (
                    "fork-started child of %d (same executable, command line and environ block, no exec): /proc shows "
                    "the parent's exec-time environment, and its runtime environment is the parent's (%s)"
                    % (p.ppid, "which carries them" if why == "ok" else "a launcher whose exec'd children carry them"))

    processes = [rows[k] for k in sorted(rows)]
    return {
        "processes": processes,
        "checked": len(processes),
        "ok": sum(1 for r in processes if r["status"] == "ok"),
        "explained": sum(1 for r in processes if r["status"] == "explained"),
        "wrong": [r["pid"] for r in processes if r["status"] == "wrong"],
        "gone": gone,
        "nccl_log": log,
    }


def _is_fork_copy(pid: int, procs: t.Mapping[int, _proc.Proc]) -> bool:
    p = procs.get(pid)
    if p is None:
        return False
    parent = procs.get(p.ppid)
    if parent is None or parent.cmdline != p.cmdline:
        return False
    if _exe(pid) != _exe(p.ppid):
        return False
    a, b = _environ_fingerprint(pid), _environ_fingerprint(p.ppid)
    return a is not None and a == b


def normalize_expected(value: t.Any, field: str = "expected") -> t.Dict[str, str]:
    """The expected variables as strings; raises EnvCheckError when they are invalid or empty."""
    try:
        expected = _envblock.normalize_env(value, field)
    except _envblock.BlockError as e:
        raise EnvCheckError(str(e))
    if not expected:
        raise EnvCheckError("%s must name at least one variable" % field)
    return expected


def run(p: t.Mapping[str, t.Any], step: Step = Step()) -> t.Dict[str, t.Any]:
    """process_env (read-only): the check's result; StepError, with the result, when the environment is wrong."""
    del step  # read-only, the same in check mode, and it warns of nothing
    try:
        expected = normalize_expected(p["expected"])
    except EnvCheckError as e:
        raise StepError(str(e))
    chosen, procs = _killmod.select_or_fail(p)
    selected = chosen["selected"]
    notes = list(chosen["notes"])
    holders: t.Set[int] = {pid for pid, why in selected.items() if "gpu_holder" in why}
    holders.update(_proc.device_holders(selected))
    if p["target"] == "workers":
        nv, nv_notes = nvml_holders(p["backend"])
        holders.update(nv)
        notes.extend(nv_notes)
    log_entries = None
    if p["nccl_log"]:
        log_entries, log_notes = _nccllog.parse_files(p["nccl_log"])
        notes.extend(log_notes)
    try:
        res = check(expected, selected, procs, holders, p["target"], log_entries)
    except EnvCheckError as e:
        raise StepError(str(e))
    excluded = [dict(pid=pid, reason=why, cmdline=procs[pid].command[:300]) for pid, why in sorted(chosen["excluded"].items())]
    result = dict(changed=False, expected_keys=sorted(expected), target=p["target"], selected=len(selected),
                  excluded=excluded, notes=notes, **res)
    if "pidfile" in chosen:
        result["pidfile"] = chosen["pidfile"]
    if not res["checked"]:
        if p["allow_empty"]:
            return result
        if selected and p["target"] == "workers":
            raise StepError("%d process(es) matched the selection but none holds a GPU or descends from one; "
                            "use target=all_selected to check them anyway" % len(selected), **result)
        raise StepError("No process matched the selection; nothing was checked (set allow_empty=true to accept that)",
                        **result)
    log = res["nccl_log"]
    if log is not None and p["require_confirmed"] and log["not_logged"]:
        raise StepError("NCCL's log does not confirm %s for the selected processes (NCCL logs a variable only when "
                        "it reads it, with NCCL_DEBUG=INFO)" % ", ".join(log["not_logged"]), **result)
    if res["wrong"]:
        parts = []
        for r in res["processes"]:
            if r["status"] != "wrong":
                continue
            why = []
            if r["missing"]:
                why.append("missing " + ", ".join(r["missing"]))
            if r["mismatched"]:
                why.append("different " + ", ".join(r["mismatched"]))
            if r["nccl_log_contradicted"]:
                why.append("NCCL log contradicts " + ", ".join(r["nccl_log_contradicted"]))
            parts.append("pid %d (%s): %s" % (r["pid"], r["cmdline"][:80], "; ".join(why)))
        raise StepError("%d of %d checked process(es) lack the expected environment: %s"
                        % (len(res["wrong"]), res["checked"], " | ".join(parts[:10])), **result)
    return result
