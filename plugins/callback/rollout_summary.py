# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: rollout_summary
type: aggregate
short_description: Per-host summary of a gpufleet rollout (terminal table, Markdown and JSON)
version_added: 0.1.0
description:
  - Collects the C(gpufleet_server_result) fact that the C(gpufleet.serving.gpu_server) role sets on each host,
    plus failures and unreachable hosts, and prints one table at the end of the run.
  - It prints even when a failed batch stops the rollout, so the hosts left untouched are listed too.
  - One row per host and service. A host whose play ran several services (a play of the user's that includes the
    C(gpu_server) role once per service) has a row for each, named C(HOST/SERVICE) in the table, in the notes after it
    and in the JSON's C(out_of_rotation) and C(left_as_found) keys; every row has C(service) (the server's
    C(gpufleet_server_name)) and C(name). A playbook that imports two of the collection's playbooks for the same
    service (C(clean), then C(rollout)) shows what the last play that handled it left, not a mix of both.
  - The table is titled after the collection's playbook that ran (C(GPUFLEET AUDIT SUMMARY) for
    C(gpufleet.serving.audit), also when a C(site.yml) imports it); a playbook of the user's gets C(ROLLOUT).
  - "A host whose old server was killed counts as restarted, also when it failed afterwards; the C(restarted) column
    then says what the host was left with, in the runbook's terms. C(killed, not relaunched): it failed before the new
    server was started. When the new server was started but died or never got ready (it serves nobody):
    C(killed, not serving (failed new server stopped)) (stopped and its GPUs verified clean, the default),
    C(killed, failed new server kept) (C(gpufleet_server_keep_failed), still running and holding its GPUs),
    C(killed, failed new server not stopped) (its stop failed) or C(killed, not serving) (nothing of it left). The
    C(kill_s) column shows the kill's time. Those come from the failed M(gpufleet.serving.server_restart) result
    (RV(gpufleet.serving.server_restart#module:killed), RV(gpufleet.serving.server_restart#module:timings),
    RV(gpufleet.serving.server_restart#module:phase), RV(gpufleet.serving.server_restart#module:new_server))."
  - A host that became unreachable during its restart (the M(gpufleet.serving.server_restart) task) may have finished
    the restart on the host or not (the cycle runs to its end there without its controller), so its C(restarted)
    column says C(unknown (unreachable during the restart)), and the JSON's C(restarted) is C(null). Bound how long ssh
    waits for a host that went away with C(ServerAliveInterval) and C(ServerAliveCountMax) in C(ssh_args).
  - Batch settings the rollout refuses (C(gpufleet_rollout_max_fail_percentage), C(gpufleet_rollout_serial)) are said
    after the table as C(rollout refused before any host was touched), with the setting's name; no host is listed as
    failed for them (the check runs once, on a host of the batch, so ansible's recap counts it there).
  - When O(summary_dir) is set it also writes C(rollout-summary.json) and C(rollout-summary.md) there.
  - A run of a gpufleet playbook whose tags selected none of the roles' steps (C(--tags preflight)) says so (C(no host
    was checked, tuned or restarted)) and removes the report files an earlier run left in O(summary_dir).
  - A host whose verified server was kept although its record still cannot be written (a full state filesystem after a
    record that failed; RV(gpufleet.serving.server_state#module:record_missing)) is named after the table (C(record
    still missing, server kept)), with the file and the error, and its row has C(record_missing). A row has C(gate),
    the performance gate's numbers (metric, median, baseline, ratio, min_ratio, passed, msg), when the restart ran one
    (under C(--check), what it would measure and against what, with C(would_measure), also said after the table),
    and C(rolled_back) (fingerprint, pid, workers_verified, recorded_at) when a failed restart went back to the host's
    last known good; its C(restarted) column then says C(killed, rolled back to FINGERPRINT) (C(rolled back to
    FINGERPRINT) where no server ran before the restart), and a line after the table
    names those hosts and says that the inventory still describes the definition that failed. When that rollback failed
    too, the row has C(rollback_failed) (fingerprint, error) and the column ends with C(; rollback to FINGERPRINT
    failed).
  - "The C(gpufleet.serving.rollback) playbook: each row has C(rollback_to) (C(fingerprint), C(recorded_at), C(from),
    what the host ran, and C(inventory_fingerprint)), and its C(restarted) column says C(rolled back to FINGERPRINT),
    C(would roll back to FINGERPRINT) (C(--check)) or C(no, runs FINGERPRINT already). The hosts rolled back whose
    inventory still describes another definition are named after the table (C(rolled back), C(would roll back)),
    with what that means: the next rollout restarts them to that definition again."
  - Hosts the role left out of their load balancers (C(gpufleet_server_balancers), a host that failed after its
    drain began) are named after the table (C(left out of rotation)) and in the JSON's C(out_of_rotation); each row
    has C(out_of_rotation) (balancer names) and C(would_drain) (check mode).
  - A server the role found out of rotation by someone else (HAProxy MAINT with no drain record of gpufleet's) or in an
    operator's DRAIN is left as found after its restart. Such hosts are named after the table (C(left as found)) and in
    each row's and the JSON's C(left_as_found) (balancer name to state).
  - A run whose tags left the gpu_server role's tasks out (C(--tags nccl_tuning)) still lists its hosts; those whose
    NCCL layers were tuned while no server task ran are named after the table (C(NCCL layers only, servers not
    checked or restarted)), with whether their layers changed (under C(--check), would change), and each row has
    C(nccl_only), C(nccl_changed) and C(check_mode).
    The other way round (C(--tags gpufleet_server) after the layers changed), a host whose server is right but whose
    layers are not what the inventory asks is named after the table (C(NCCL layers not as the inventory asks, left as
    they are)) with the layers that differ, also in its row's C(nccl_stale).
  - A host an earlier run left out of rotation (its drain record) whose server needs no restart is put back without
    one; such hosts are named after the table (C(put back into rotation), under C(--check) C(would put back into
    rotation), and not as left out) and in each row's C(returned_to_service) (and C(would_return) in check mode). So
    are the entries a restart's put-back returns that an earlier run left out (the clean playbook's, a failed run's).
    Until then they count as left out of rotation, also when the restart is refused before anything is touched
    (C(left_out_of_rotation) of the refusal).
requirements:
  - enable in ansible.cfg with C(callbacks_enabled = gpufleet.serving.rollout_summary)
options:
  summary_dir:
    description: Directory to write C(rollout-summary.json) and C(rollout-summary.md) into.
    type: path
    env:
      - name: GPUFLEET_SUMMARY_DIR
    ini:
      - section: gpufleet
        key: summary_dir
  fork_gc_freeze:
    description:
      - Make the garbage collector of ansible-playbook's forked workers (one per task and host) skip what they
        inherited from the main process (C(gc.freeze()) in each child, right after the fork; the main process is
        untouched). Their collections otherwise walk, and copy page by page, the whole heap of the main process on
        every task. It lowers the controller's CPU time of a rollout (docs/benchmarks.md, bench/fork_gc.py).
      - It applies to the whole C(ansible-playbook) process this callback is enabled in, and stays for its life once
        on. Set V(false) to leave ansible-core's workers as they are.
    type: bool
    default: true
    version_added: 0.2.0
    env:
      - name: GPUFLEET_FORK_GC_FREEZE
    ini:
      - section: gpufleet
        key: fork_gc_freeze
"""

import gc
import json
import os
import re
import typing as t

from ansible import context
from ansible.plugins.callback import CallbackBase


# fork_gc_freeze. ansible-core forks one worker per task and host from its main process, whose heap holds every loaded
# plugin, parsed role and host variable. A worker's first cyclic collections walk every object it inherited and write
# the GC header of each, so the kernel copies nearly every page of that heap into the worker, on every task, for objects
# the worker never frees. gc.freeze() in the child right after the fork moves what it inherited to the permanent
# generation: its collections look only at what it allocates itself. Nothing inherited is collected in the worker, which
# lives for one task and leaves with os._exit. The main process is untouched. The standard library's
# os.register_at_fork is the whole mechanism (no ansible-core internals patched); a handler cannot be removed, so it is
# registered once per process. Kept in this file, not plugin_utils: tools/gpufleet_ci loads it by path, without the
# collection loader. Measured by bench/fork_gc.py (docs/benchmarks.md).
_FORK_GC_FREEZE = {"installed": False}


def install_fork_gc_freeze() -> bool:
    """Freeze the inherited heap in every child forked from now on; True when this call registered it."""
    if _FORK_GC_FREEZE["installed"] or not hasattr(os, "register_at_fork"):
        return False
    os.register_at_fork(after_in_child=gc.freeze)
    _FORK_GC_FREEZE["installed"] = True
    return True


# The collection's playbooks, which name the table.
PLAYBOOKS = ("rollout", "restart", "clean", "audit", "rollback")
# server_restart's steps before the new server is started, and those where it started but never got ready.
BEFORE_LAUNCH = ("kill", "strays", "clean", "launch")
NOT_READY = ("startup", "ready")
# The task whose host going unreachable leaves the restart's outcome unknown: it runs to its end on the host.
RESTART_ACTIONS = ("gpufleet.serving.server_restart", "server_restart")
# The calls whose result names the host's service they were for (`service`).
STATE_ACTIONS = ("gpufleet.serving.server_state", "server_state")
UNKNOWN_RESTART = "unknown (unreachable during the restart)"
# The rollout's check of its batch settings (gpu_server tasks/batch_begin.yml): it runs once, on the batch's first
# host, and its failure is the run's settings refused, not that host failing.
SETTINGS_TASK = "Check the batch settings"


def _outcome(h: t.Mapping[str, t.Any]) -> bool:
    """Whether a row says what happened to its service (restarted or not, stopped, failed)."""
    return "restarted" in h or "stopped" in h or h.get("status", "ok") != "ok"


def _name(r: t.Mapping[str, t.Any]) -> str:
    """A row's name in the table and the notes: the host's, HOST/SERVICE where the host has several rows (rows from
    tools/gpufleet_ci have no `name`)."""
    return str(r.get("name") or r["host"])


def _union(*lists: t.Any) -> t.List[str]:
    out: t.List[str] = []
    for items in lists:
        out.extend(str(x) for x in items or [] if str(x) not in out)
    return out


def _stem(path: str) -> str:
    """A playbook's name: its file's stem (a play's path ends with :LINE)."""
    return os.path.splitext(os.path.basename(re.sub(r":\d+$", "", path)))[0]


def _count(v: t.Any) -> int:
    try:
        return int(v or 0)
    except (TypeError, ValueError):
        return 0


def restart_cell(status: t.Optional[str], restarted: bool, would: bool, phase: t.Optional[str],
                 new_server: t.Optional[t.Mapping[str, t.Any]] = None) -> str:
    """The `restarted` column: whether the old server is gone, and what took its place (docs/runbook.md's terms)."""
    if would:
        return "would"
    if not restarted:
        return "no"
    if status != "ok" and phase in BEFORE_LAUNCH:
        return "killed, not relaunched"
    if status != "ok" and phase in NOT_READY:
        # server_restart's new_server: what it did with a new server that serves nobody.
        new_server = new_server or {}
        if new_server.get("kept"):
            return "killed, failed new server kept"
        if new_server.get("error"):
            return "killed, failed new server not stopped"
        # Stopped with nothing left to end (`killed` 0: it had died): the message says "not running any more", so does this.
        if new_server.get("stopped") and new_server.get("killed") != 0:
            return "killed, not serving (failed new server stopped)"
        return "killed, not serving"
    return "yes"


def rolled_back_cell(rolled_back: t.Mapping[str, t.Any], killed: int) -> str:
    """The `restarted` column of a host whose failed restart went back to its last known good. Where no server ran
    before the restart (nothing killed), there was nothing to kill: it only says what runs now."""
    fp = str(rolled_back.get("fingerprint") or "")[:12]
    return ("killed, rolled back to %s" if killed > 0 else "rolled back to %s") % fp


# OpenSSH's warning banner (@@@@...@@@ lines, "@    WARNING: ...    @"): the @s carry no information, only length.
_BANNER = re.compile(r"@{3,}|^@\s+|\s+@$")
FAILURE_CHARS = 600


def failure_cause(res: t.Mapping[str, t.Any]) -> str:
    """Why a task failed, whole: the one composition of a failure's text, for this summary (failure_text, cut to its
    column) and for the gpu_server role's rescues (the gpufleet.serving.failure_text filter, which imports it from here:
    this file stays loadable on its own, by tools/gpufleet_ci).

    A loop's failure ("One or more items failed": the role's balancer calls, one per delegate) is each failed item's
    message. A command's ("non-zero return code") keeps what it printed on stderr. A module that printed no JSON fails
    with "Module result deserialization failed" or "MODULE FAILURE": the cause is in what it printed (module_stderr /
    module_stdout: "sudo: sorry, you must have a tty to run sudo", a traceback's last line)."""
    msg = str(res.get("msg") or "failed")
    items = [str(r.get("msg") or "failed") for r in res.get("results") or [] if isinstance(r, dict) and r.get("failed")]
    if items:
        msg = "; ".join(items)
    stderr = str(res.get("stderr") or "").strip()
    if res.get("msg") == "non-zero return code" and stderr:
        msg = "%s: %s" % (msg, stderr)
    printed = " ".join(str(res.get(k) or "").strip() for k in ("module_stderr", "module_stdout")).strip()
    if printed and printed not in msg:
        msg = "%s: %s" % (msg.rstrip(". "), printed)
    return msg


def failure_text(res: t.Mapping[str, t.Any], limit: int = FAILURE_CHARS) -> str:
    """One line saying why a task failed or a host was unreachable, with the cause kept (failure_cause). An unreachable
    host's message ends with what to do (OpenSSH's "Offending ... key" and "ssh-keygen -R" lines): a long text keeps
    its head and its end, not only its head."""
    text = " ".join(_BANNER.sub(" ", ln.strip()) for ln in failure_cause(res).splitlines())
    return fit(" ".join(text.split()), limit)


# The shortest a clause is cut to: its head (what it is about: "systemd: ...", "log tail (PATH): ") and its end.
_CLAUSE_MIN = 60
_LINES_MIN = 150


def _head_end(text: str, limit: int, ratio: float = 0.25) -> str:
    """`ratio` of `limit` from the head (at least up to the first ": ", which names the clause, when that is within half
    of it), the rest from the end."""
    head = int(limit * ratio)
    colon = text.find(": ")
    if 0 < colon and colon + 2 <= limit // 2:
        head = max(head, colon + 2)
    return text[:head] + " ... " + text[-(limit - head - 5):]


def fit(text: str, limit: int) -> str:
    """`text` within `limit` characters. gpufleet's own failures join clauses with "; " (a rollback's: its own cause, the
    new server's exit, systemd's status, its journal, the log tail, what was left): they are cut clause by clause
    (after "; " and ". "), the longest first and only down to the next longest, so each clause keeps its head and its
    end. Any other text (OpenSSH's, whose advice is at its end) keeps its head and its end as a whole."""
    if len(text) <= limit:
        return text
    if "; " not in text:
        return _head_end(text, limit)
    parts = [x for x in re.split(r"(?<=; )|(?<=\. )", text) if x]
    size = [len(x) for x in parts]

    def cut_size(i: int) -> int:  # a clause cut at all loses at least the " ... " it gains
        return size[i] if size[i] >= len(parts[i]) else min(size[i], len(parts[i]) - 6)

    # Two passes. First the middle clauses (the first says what failed, the last what to do or what was left), a log
    # tail's or the journal's lines (" | ") keeping room for their last line; then every clause, down to the floor.
    passes = ((range(1, len(parts) - 1), [_LINES_MIN if " | " in x else _CLAUSE_MIN for x in parts]),
              (range(len(parts)), [_CLAUSE_MIN] * len(parts)))
    for clauses, floors in passes:
        pool = [i for i in clauses if size[i] > floors[i]]
        while pool and sum(cut_size(i) for i in range(len(parts))) > limit:
            top = max(size[i] for i in pool)
            longest = [i for i in pool if size[i] == top]
            below = max([size[i] for i in pool if size[i] < top] or [0])
            room = top - max(below, max(floors[i] for i in longest))  # down to the next longest at most
            if room <= 0:  # this pool's clauses as short as they get
                break
            excess = sum(cut_size(i) for i in range(len(parts))) - limit
            step = min(room, -(-excess // len(longest)))
            for i in longest:
                size[i] -= step
    if sum(cut_size(i) for i in range(len(parts))) > limit:  # every clause as short as it gets
        return _head_end(text, limit)
    return "".join(parts[i] if cut_size(i) >= len(parts[i]) else _cut_clause(parts[i], cut_size(i), i == 0)
                   for i in range(len(parts)))


def _cut_clause(text: str, size: int, first: bool) -> str:
    """A clause in `size` characters: lines joined by " | " (a log tail, the journal) keep their name ("log tail
    (PATH): ") and as much of their end as fits, where the error is; the first clause, which says what failed, most of
    its head; any other half of each."""
    if " | " in text:
        return _head_end(text, size, 0.0)
    return _head_end(text, size, 0.75 if first else 0.5)


def _fmt(v: t.Any) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, float):
        return "%.2f" % v
    return str(v)


# The per-host table, in this order; `restarted` shows the row's `restart` wording ("killed, not relaunched").
COLUMNS = ("host", "status", "restarted", "kill_s", "clean_s", "launch_s", "ready_s", "workers_verified", "failure")


def markdown_table(rows: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    """The per-host Markdown table of rows as CallbackModule.rows() builds them (a missing value shows '-')."""
    table = [list(COLUMNS)]
    for r in rows:
        vals = [(r.get("restart") or "-") if c == "restarted" else _name(r) if c == "host" else _fmt(r.get(c))
                for c in COLUMNS]
        table.append([v.replace("|", "/").replace("\n", " ") for v in vals])
    # Padded columns, so the table reads in a terminal and stays valid Markdown; the last (failure) is not padded.
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS) - 1)] + [0]
    lines = ["| " + " | ".join(v.ljust(w) for v, w in zip(row, widths)) + " |" for row in table]
    lines.insert(1, "|" + "|".join("-" * (w + 2) if w else "---" for w in widths) + "|")
    return "\n".join(lines) + "\n"


def out_of_rotation(rows: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    """The line naming hosts this run left out of their load balancers ('' when none)."""
    # A host this run puts back (or, under --check, would) is not left out: returned() names it.
    left = [r for r in rows if r.get("out_of_rotation") and not _put_back(r)]
    failed = ["%s (%s)" % (_name(r), ", ".join(r["out_of_rotation"])) for r in left if r.get("status") != "ok"]
    # A host that did not fail was left out on purpose (the clean playbook stops its server): no cause to fix
    # (helper-39).
    kept = ["%s (%s)" % (_name(r), ", ".join(r["out_of_rotation"])) for r in left if r.get("status") == "ok"]
    lines = []
    if failed:
        lines.append("left out of rotation: %s; the next rollout puts it back once the cause is fixed (docs/runbook.md)"
                     % "; ".join(failed))
    if kept:
        lines.append("left out of rotation, as this playbook does: %s; the next rollout puts it back" % "; ".join(kept))
    return ". ".join(lines)


def left_as_found(rows: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    """The line naming servers found out of rotation (or in DRAIN) by someone else and left so ('' when none)."""
    out = ["%s (%s)" % (_name(r), ", ".join("%s %s" % kv for kv in sorted(r["left_as_found"].items())))
           for r in rows if r.get("left_as_found")]
    return ("left as found, taken out by someone else, not by gpufleet: %s" % "; ".join(out)) if out else ""


def _returned_entries(r: t.Mapping[str, t.Any]) -> str:
    # An entry gpufleet had found in an operator's DRAIN goes back to it, not into rotation: said so (helper-35).
    lf = r.get("left_as_found") or {}
    return ", ".join("%s back to %s as found" % (n, lf[n]) if n in lf else n for n in r["returned_to_service"])


def returned(rows: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    """The line naming hosts an earlier run left drained (its drain record) that this run put back ('' when none)."""
    done = ["%s (%s)" % (_name(r), _returned_entries(r)) for r in rows if _put_back(r) and not r.get("would_return")]
    would = ["%s (%s)" % (_name(r), _returned_entries(r)) for r in rows if _put_back(r) and r.get("would_return")]
    notes = []
    if done:
        notes.append("put back into rotation, left out by an earlier run (drain record): %s" % "; ".join(done))
    if would:
        notes.append("would put back into rotation, left out by an earlier run (drain record): %s" % "; ".join(would))
    return "; ".join(notes)


def _put_back(r: t.Mapping[str, t.Any]) -> bool:
    """A host an earlier run left drained that this run put back (or, in check mode, would), with no failure."""
    return bool(r.get("returned_to_service")) and r.get("status") == "ok" \
        and (r.get("would_return") or not r.get("out_of_rotation"))


def rollback_cell(r: t.Mapping[str, t.Any], cell: str) -> str:
    """The `restarted` column of a host the rollback playbook handled (its row's rollback_to): what it went back to."""
    to = str((r.get("rollback_to") or {}).get("fingerprint") or "")[:12]
    if r.get("status") != "ok":
        return cell
    if r.get("would_restart"):
        return "would roll back to %s" % to
    return "rolled back to %s" % to if r.get("restarted") else "no, runs %s already" % to


def rolled_back(rows: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    """The line naming the hosts the rollback playbook put back to a last known good (or, under --check, would) whose
    inventory describes another definition ('' when none): the next rollout restarts them to it again."""
    hosts = [r for r in rows if r.get("rollback_to") and r.get("status") == "ok"
             and (r.get("restarted") or r.get("would_restart"))
             and r["rollback_to"].get("inventory_fingerprint") not in (None, "", r["rollback_to"].get("fingerprint"))]
    if not hosts:
        return ""
    named = ["%s (to %s, the inventory says %s)" % (_name(r), str(r["rollback_to"].get("fingerprint"))[:12],
                                                    str(r["rollback_to"].get("inventory_fingerprint"))[:12]) for r in hosts]
    return ("%s: %s; the inventory is unchanged, so the next rollout restarts these hosts to the inventory's definition "
            "again: change the inventory first (docs/runbook.md)"
            % ("would roll back" if all(r.get("would_restart") for r in hosts) else "rolled back", "; ".join(named)))


def auto_rolled_back(rows: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    """The line naming the hosts whose failed restart went back to their last known good (gpufleet_server_rollback;
    '' when none): the inventory still describes the definition that failed, which the next rollout restarts them to
    again."""
    hosts = [r for r in rows if isinstance(r.get("rolled_back"), dict)]
    if not hosts:
        return ""
    return ("rolled back to the last known good: %s; the inventory still describes the definition that failed, so the "
            "next rollout restarts these hosts to it again: fix or revert it first (docs/runbook.md)"
            % "; ".join("%s (to %s)" % (_name(r), str(r["rolled_back"].get("fingerprint") or "")[:12]) for r in hosts))


def summary_notes(rows: t.Sequence[t.Mapping[str, t.Any]], halted: t.Optional[t.Mapping[str, t.Any]],
                  playbook: t.Optional[str] = None) -> t.List[str]:
    """The lines said after the table, each a sentence about the whole run: why the rollout halted, which hosts it
    left out of rotation. A new line about the run goes here, and every output (terminal, files, gpufleet_ci) says it."""
    notes = []
    if halted:
        notes.append(str(halted.get("msg", "rollout halted")).strip())
    notes.append(out_of_rotation(rows))
    notes.append(left_as_found(rows))
    notes.append(returned(rows))
    notes.append(record_missing(rows))
    notes.append(nccl_only(rows))
    notes.append(nccl_stale(rows, playbook))
    notes.append(gate_plans(rows))
    notes.append(rolled_back(rows))
    notes.append(auto_rolled_back(rows))
    return [n for n in notes if n]


def nccl_only(rows: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    """The line naming hosts whose NCCL layers were tuned while no server task ran (--tags nccl_tuning; '' when none):
    their servers were neither checked nor restarted, and run on with the environment they were started with."""
    out = ["%s (%s)" % (_name(r), ("layers would change" if r.get("check_mode") else "layers changed")
                        if r.get("nccl_changed") else "layers already as asked")
           for r in rows if r.get("nccl_only")]
    return ("NCCL layers only, servers not checked or restarted (the run's tags left the gpu_server tasks out; a "
            "rollout without them restarts a server whose workers lack the tuning): %s" % "; ".join(out)) if out else ""


def nccl_stale(rows: t.Sequence[t.Mapping[str, t.Any]], playbook: t.Optional[str] = None) -> str:
    """The line naming hosts whose server was right but whose NCCL layers are not what the inventory asks, left as they
    are because the run's tags left the nccl_tuning role out, or because the run is the read-only audit ('' when
    none)."""
    out = ["%s (%s)" % (_name(r), ", ".join(r["nccl_stale"])) for r in rows if r.get("nccl_stale")]
    if not out:
        return ""
    if playbook == "audit":  # it changes nothing, whatever the tags (helper-45: it blamed tags never given)
        return ("NCCL layers not as the inventory asks (the audit changes nothing; the next rollout writes them and "
                "restarts the servers onto them): %s" % "; ".join(out))
    return ("NCCL layers not as the inventory asks, left as they are (the run's tags left the nccl_tuning role out; "
            "the servers run on as checked; a run with the nccl_tuning tag writes them): %s" % "; ".join(out))


def gate_cell(g: t.Any) -> t.Optional[t.Dict[str, t.Any]]:
    """The performance gate's numbers for the JSON summary (server_restart's RV(gpufleet.serving.server_restart#module:gate)),
    None when no gate ran."""
    if not isinstance(g, t.Mapping):
        return None
    cell = {k: g.get(k) for k in ("metric", "median", "baseline", "ratio", "min_ratio", "passed", "msg")}
    if g.get("would_measure"):
        cell["would_measure"] = True  # check mode: nothing was sent
    return cell


def gate_plans(rows: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    """Under --check, what each host's performance gate would measure and against what ('' when none)."""
    out = ["%s %s" % (_name(r), r["gate"]["msg"]) for r in rows
           if isinstance(r.get("gate"), t.Mapping) and r["gate"].get("would_measure")]
    return ("performance gate (check mode, no request sent): %s" % "; ".join(out)) if out else ""


def record_missing(rows: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    """The line naming hosts whose kept server still has no record (server_state's record_missing; '' when none)."""
    out = ["%s (%s)" % (_name(r), r["record_missing"]) for r in rows if r.get("record_missing")]
    return ("record still missing, server kept: %s" % "; ".join(out)) if out else ""


def summary_json(playbook: str, rows: t.Sequence[t.Mapping[str, t.Any]],
                 halted: t.Optional[t.Mapping[str, t.Any]] = None) -> t.Dict[str, t.Any]:
    """rollout-summary.json: the rows, the halt, and by row name the balancers each host was left out of (as the note
    after the table: not a host this run put back, or under --check would) and the entries left as found."""
    return {"playbook": playbook, "hosts": list(rows), "halted": halted,
            "out_of_rotation": {_name(r): r["out_of_rotation"] for r in rows if r.get("out_of_rotation") and not _put_back(r)},
            "left_as_found": {_name(r): r["left_as_found"] for r in rows if r.get("left_as_found")}}


def render_markdown(rows: t.Sequence[t.Mapping[str, t.Any]], halted: t.Optional[t.Mapping[str, t.Any]] = None,
                    playbook: t.Optional[str] = None) -> str:
    """The summary as Markdown: the table, then each note in bold (rollout-summary.md; tools/gpufleet_ci's report)."""
    return markdown_table(rows) + "".join("\n**%s**\n" % n for n in summary_notes(rows, halted, playbook))


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpufleet.serving.rollout_summary"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        # Host, then service, to its row: a host may run several services, each with a flow of its own in one play
        # (helper-44: they merged into one row, fields from both). "" is a row begun before its service was known.
        self.hosts: t.Dict[str, t.Dict[str, t.Dict[str, t.Any]]] = {}
        # The service each host's tasks are for now: the last server_state call's (its `service`) or row's.
        self.current: t.Dict[str, str] = {}
        # Plays seen, for a playbook that imports two of the collection's (clean, then rollout): a service's row from an
        # earlier play is replaced by this play's, not merged with it.
        self.play_no = 0
        # Stems of the playbook files that ran (the command line's first, then each play's), for the title.
        self.playbook_names: t.List[str] = []
        self.cli_playbooks: t.List[str] = []
        self.inventory_hosts: t.List[str] = []
        self.batch: t.List[str] = []
        # Set by the rollout's batch gate (gpu_server tasks/batch_end.yml) when a batch failed beyond
        # gpufleet_rollout_max_fail_percentage and the later batches were not started.
        self.halted: t.Optional[t.Dict[str, t.Any]] = None

    def set_options(self, task_keys: t.Any = None, var_options: t.Any = None, direct: t.Any = None) -> None:
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        # ansible-core sets a callback's options when it loads it, in the main process, before the first worker fork.
        try:
            if self.get_option("fork_gc_freeze"):
                install_fork_gc_freeze()
        except Exception:  # the summary must never break a run
            pass

    def v2_playbook_on_start(self, playbook: t.Any) -> None:
        # The command line's playbooks, from context.CLIARGS as ansible-core's own callbacks read the command line
        # (the Playbook object keeps its file name in a private attribute). A playbook given by FQCN
        # (gpufleet.serving.audit) is named by its last part.
        try:
            for arg in context.CLIARGS.get("args") or ():
                arg = str(arg)
                fqcn = re.match(r"^[a-z0-9_]+\.[a-z0-9_]+\.([a-z0-9_]+)$", arg)
                name = fqcn.group(1) if fqcn and not os.path.exists(arg) else arg
                self._note_playbook(name)
                self.cli_playbooks.append(_stem(name))
        except Exception:  # the summary must never break a run
            pass

    def _note_playbook(self, path: str) -> None:
        name = _stem(path)
        if name and name not in self.playbook_names:
            self.playbook_names.append(name)

    def playbook(self) -> str:
        """The collection's playbook named on the command line (restart, which imports rollout), else the last of them
        whose play ran (a site.yml importing audit; one importing clean, then rollout, is a rollout: helper-45)."""
        return next((n for n in self.cli_playbooks if n in PLAYBOOKS), None) \
            or next((n for n in reversed(self.playbook_names) if n in PLAYBOOKS), "rollout")

    def v2_playbook_on_play_start(self, play: t.Any) -> None:
        self.play_no += 1
        try:
            # A site.yml importing gpufleet.serving.audit: the play's own file names the playbook.
            self._note_playbook(play.get_path())
        except Exception:  # the summary must never break a run
            pass
        try:
            # The play's magic variables, through the public VariableManager API: ansible_play_hosts_all lists the
            # play's hosts of every batch (serial ignored, --limit applied), so the summary also lists the hosts of
            # later batches (left untouched when a batch fails); ansible_play_batch is this batch.
            magic = play.get_variable_manager().get_vars(play=play, include_hostvars=False)
            for name in magic.get("ansible_play_hosts_all") or []:
                if name not in self.inventory_hosts:
                    self.inventory_hosts.append(name)
            self.batch = list(magic.get("ansible_play_batch") or [])
        except Exception:  # the summary must never break a run
            pass

    def v2_playbook_on_no_hosts_remaining(self) -> None:
        # The play ended for this batch (max_fail_percentage exceeded, or every host failed). A host of the
        # batch that is still "ok" but never reached the gpu_server decision may still run its old server.
        for n in self.batch:
            for h in (self.hosts.get(n) or {}).values():
                if h.get("status") == "ok" and "restarted" not in h:
                    h["status"] = "stopped"
                    h["failure"] = "stopped before the server step: the rollout ended for this host's batch"

    def _host(self, name: str, service: t.Optional[str] = None) -> t.Dict[str, t.Any]:
        """The row of `name`'s service: `service` where the event says which (it becomes the host's current one), else
        the host's current service's."""
        rows = self.hosts.setdefault(name, {})
        if service is None:
            service = self.current.get(name, "")
        else:
            self.current[name] = service
            if service not in rows and "" in rows and service and not _outcome(rows[""]):
                # Begun before its service was known (the rollout's check of a host it leaves to the roles, the NCCL
                # tuning's fact): this service's row.
                rows[service] = dict(rows.pop(""), service=service)
            elif service in rows and rows[service].get("_play") != self.play_no and _outcome(rows[service]):
                # An earlier play handled this service (clean, then rollout): this play's outcome is the row.
                del rows[service]
        if service not in rows:
            rows[service] = {"host": name, "service": service, "status": "ok", "_play": self.play_no}
        return rows[service]

    @staticmethod
    def _service(result: t.Any, facts: t.Mapping[str, t.Any]) -> t.Optional[str]:
        """The service an event is for, where it says: a row's `service`, or a server_state call's (its O(name))."""
        row = facts.get("gpufleet_server_result")
        if isinstance(row, t.Mapping) and row.get("service") not in (None, ""):
            return str(row["service"])
        try:
            task = result.task
            action = getattr(task, "resolved_action", None) or task.action
        except Exception:  # the summary must never break a run
            return None
        if action in STATE_ACTIONS and result.result.get("service") not in (None, ""):
            return str(result.result["service"])
        return None

    # result.result/.host/.task: the public CallbackTaskResult API, in every core we support (2.19+); core
    # marks _result/_host/_task for deprecation (2.23).
    def v2_runner_on_ok(self, result: t.Any) -> None:
        facts = result.result.get("ansible_facts") or {}
        if "gpufleet_server_result" in result.result:  # the rollout_check action returns a no-op host's row, as no fact
            facts = dict(facts, gpufleet_server_result=result.result["gpufleet_server_result"],
                         gpufleet_nccl_changed=result.result.get("gpufleet_nccl_changed", False))
        if facts.get("gpufleet_rollout_halted"):  # {} at the start of each batch
            self.halted = dict(facts["gpufleet_rollout_halted"])
        service = self._service(result, facts)
        if service is not None:
            self._host(result.host.get_name(), service)
        if "gpufleet_server_result" in facts:
            h = self._host(result.host.get_name())
            h.update(facts["gpufleet_server_result"])
            if isinstance(h.get("failure"), str):  # the role records the whole failure; the column keeps each clause
                h["failure"] = failure_text({"msg": h["failure"]})
        # The NCCL tuning's fact: a run whose tags left the server's tasks out (--tags nccl_tuning) sets no
        # gpufleet_server_result, and its hosts still get a row (nccl_only).
        if "gpufleet_nccl_changed" in facts:
            h = self._host(result.host.get_name())
            h["nccl_changed"] = str(facts["gpufleet_nccl_changed"]).lower() == "true"
            # Under --check the layers' write only predicted a change (helper-42: "layers changed" misled).
            h["check_mode"] = bool(getattr(result.task, "check_mode", False))
        # The drain's view (issue 17): which balancers the host is out of; {} for a host whose balancers were not touched.
        if facts.get("gpufleet_server_rotation"):
            self._host(result.host.get_name())["rotation"] = dict(facts["gpufleet_server_rotation"])
        elif result.host.get_name() not in self.hosts:
            self._host(result.host.get_name())

    def v2_runner_on_failed(self, result: t.Any, ignore_errors: bool = False) -> None:
        if ignore_errors:
            return
        if result.task.get_name().split(" : ")[-1] == SETTINGS_TASK:
            self.halted = {"msg": "rollout refused before any host was touched: %s" % failure_text(result.result),
                           "refused": True, "batch": list(self.batch), "failed": [],
                           "not_started": list(self.inventory_hosts)}
            for n in self.batch:  # nothing ran on them but this check: listed as not run
                self.hosts.pop(n, None)
            return
        h = self._host(result.host.get_name(), self._service(result, {}))
        h["status"] = "failed"
        h.setdefault("failure", failure_text(result.result))
        h.setdefault("failed_task", result.task.get_name())
        res = result.result
        # A refused restart of a host an earlier run left out of rotation (its drain record): it stays out (helper-45).
        if isinstance(res.get("left_out_of_rotation"), list) and res["left_out_of_rotation"]:
            rot = h.setdefault("rotation", {})
            rot["left_out"] = [str(n) for n in res["left_out_of_rotation"]]
        # A failed server_restart says what it did before the failing step: processes killed mean the old server
        # is gone, whatever the role's rescue records afterwards.
        if "killed" in res and "timings" in res:
            h.update(killed=res["killed"], timings=res["timings"], phase=res.get("phase"))
            if isinstance(res.get("new_server"), dict):
                h["new_server"] = {k: res["new_server"].get(k) for k in ("kept", "stopped", "killed", "error")}

    def v2_runner_on_unreachable(self, result: t.Any) -> None:
        h = self._host(result.host.get_name())
        h["status"] = "unreachable"
        h["failure"] = failure_text(result.result)
        try:
            task = result.task
            action = getattr(task, "resolved_action", None) or task.action
        except Exception:  # the summary must never break a run
            action = None
        if action in RESTART_ACTIONS:
            h["restart_unknown"] = True

    def _halted_by_ansible(self) -> None:
        """A batch in which every host failed ends the play inside ansible-core, before the batch gate can run:
        say it the gate's way when hosts of later batches were not started."""
        not_run = [n for n in self.inventory_hosts if n not in self.hosts]
        failed = [n for n in self.batch
                  if any(h.get("status") in ("failed", "unreachable") for h in (self.hosts.get(n) or {}).values())]
        if self.halted is not None or not not_run or not failed:
            return
        self.halted = {
            "msg": "rollout halted: %d of %d host(s) of the batch failed (%s); %d host(s) of later batches were not "
                   "touched: %s" % (len(failed), len(self.batch), ", ".join(failed), len(not_run), ", ".join(not_run)),
            "batch": list(self.batch), "failed": failed, "not_started": not_run,
        }

    def _each_row(self, names: t.Sequence[str]) -> t.Iterator[t.Tuple[str, str, t.Dict[str, t.Any]]]:
        """(host, service, a copy of its row) for every row of each host, a "not run" row for a host without one."""
        for n in names:
            for service, h in (self.hosts.get(n) or {"": {"host": n, "status": "not run"}}).items():
                yield n, service, dict(h)

    def rows(self) -> t.List[t.Dict[str, t.Any]]:
        out = []
        names = list(self.inventory_hosts) + [n for n in self.hosts if n not in self.inventory_hosts]
        for n, service, h in self._each_row(names):
            tm = h.get("timings") or {}
            killed, would = _count(h.get("killed")), bool(h.get("would_restart"))
            # Restarted whenever the old server was killed, also on a host that failed before a new one was ready;
            # a stop (the clean playbook) kills without meaning to relaunch.
            stopped = bool(h.get("stopped"))
            restarted = not stopped and (bool(h.get("restarted")) or (killed > 0 and not would))
            # A stop that failed before it killed anything (its drain, its preflight) stopped nothing: not "nothing to stop".
            cell = ("would stop" if h.get("would_stop") else "stopped" if killed > 0
                    else "not stopped" if h.get("status") == "failed" else "nothing to stop") if stopped else \
                restart_cell(h.get("status"), restarted, would, h.get("phase"), h.get("new_server"))
            if h.get("rolled_back"):
                cell = rolled_back_cell(h["rolled_back"], killed)
            elif isinstance(h.get("rollback_failed"), dict):
                cell = "%s; rollback to %s failed" % (cell, str(h["rollback_failed"].get("fingerprint") or "")[:12])
            if isinstance(h.get("rollback_to"), dict):
                cell = rollback_cell(dict(h, restarted=restarted, would_restart=would), cell)
            if h.get("restart_unknown"):
                # No result came back: whether the old server was killed and a new one verified is not known here.
                restarted, cell = None, UNKNOWN_RESTART
            out.append({
                "host": n,
                "service": service or None,
                # The row's name: the host's, with the service where the host has several rows.
                "name": "%s/%s" % (n, service) if service and len(self.hosts.get(n) or {}) > 1 else n,
                "status": h.get("status"),
                "restarted": restarted,
                "stopped": stopped,
                "restart": cell,
                "would_restart": would,
                "killed": killed,
                "phase": h.get("phase"),
                "new_server": h.get("new_server"),
                "kill_s": tm.get("kill_s"),
                "clean_s": tm.get("clean_s"),
                "launch_s": tm.get("launch_s"),
                "ready_s": tm.get("ready_s"),
                "workers_verified": h.get("workers_verified"),
                "reasons": h.get("reasons") or [],
                "failure": h.get("failure"),
                # What this run took out, and what an earlier run left out that it did not put back (`left_out`).
                "out_of_rotation": _union((h.get("rotation") or {}).get("out_of"), (h.get("rotation") or {}).get("left_out")),
                "would_drain": bool((h.get("rotation") or {}).get("would_drain")),
                "left_as_found": dict((h.get("rotation") or {}).get("left_as_found") or {}),
                "returned_to_service": list((h.get("rotation") or {}).get("returned") or []),
                "record_missing": h.get("record_missing") or None,
                "gate": gate_cell(h.get("gate")),
                "rolled_back": dict(h["rolled_back"]) if isinstance(h.get("rolled_back"), dict) else None,
                "rollback_failed": dict(h["rollback_failed"]) if isinstance(h.get("rollback_failed"), dict) else None,
                "rollback_to": dict(h["rollback_to"]) if isinstance(h.get("rollback_to"), dict) else None,
                "would_return": bool((h.get("rotation") or {}).get("would_return")),
                "nccl_changed": h.get("nccl_changed"),
                "check_mode": bool(h.get("check_mode")),
                "nccl_stale": list(h.get("nccl_stale") or []),
                # The NCCL layers were tuned but no server task ran on the host (its server was not even checked).
                "nccl_only": "nccl_changed" in h and "restarted" not in h and h.get("status", "ok") == "ok",
            })
        return out

    def _nothing_selected(self, rows: t.Sequence[t.Mapping[str, t.Any]]) -> None:
        """A gpufleet playbook whose --tags/--skip-tags selected none of the roles' steps (--tags preflight): said, and
        the report files of an earlier run in O(summary_dir) removed, so that no one reads that run's result as this
        one's (helper-42)."""
        self._display.banner("GPUFLEET %s SUMMARY" % self.playbook().upper())
        self._display.display("no host was checked, tuned or restarted: the run's tags selected none of the roles' steps "
                              "(hosts: %s)" % ", ".join(r["host"] for r in rows))
        d = self.get_option("summary_dir")
        for name in ("rollout-summary.json", "rollout-summary.md"):
            if d and os.path.exists(os.path.join(d, name)):
                os.unlink(os.path.join(d, name))

    def v2_playbook_on_stats(self, stats: t.Any) -> None:
        if not self.hosts and not any(h for h in self.inventory_hosts):
            return
        self._halted_by_ansible()
        rows = self.rows()
        if not any("restarted" in h for hs in self.hosts.values() for h in hs.values()) \
                and not any(r["nccl_only"] or r["status"] != "ok" for r in rows):
            if any(n in PLAYBOOKS for n in self.playbook_names):
                self._nothing_selected(rows)
            return  # not a gpufleet rollout, or one whose tags selected none of the roles' steps
        self._display.banner("GPUFLEET %s SUMMARY" % self.playbook().upper())
        self._display.display(markdown_table(rows))
        for note in summary_notes(rows, self.halted, self.playbook()):
            self._display.display(note, color="red", stderr=False)
        d = self.get_option("summary_dir")
        if d:
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "rollout-summary.json"), "w") as f:
                json.dump(summary_json(self.playbook(), rows, self.halted), f, indent=1)
            with open(os.path.join(d, "rollout-summary.md"), "w") as f:
                f.write(render_markdown(rows, self.halted, self.playbook()))
