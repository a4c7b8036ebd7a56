# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""The NCCL layers are host-wide; two services on one host share them (sitecustomize_env, nccl_conf).

The system sitecustomize.py and /etc/nccl.conf are read by every process on the host, so two services with different
tuning would rewrite them in turn, each run reporting ok and each breaking the other's next start and its audit. A
layer module that knows its service (its launch tag, `service_tag`) refuses, before anything is written, a change of
the block's values while a process of another gpufleet service (its launch tag, under any tag name) runs on the host.
Only the variable names are said: the values are the operator's, and the other service's environ is not ours to print.
"""

from __future__ import annotations

import os
import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _hostlock, _proc, _select, _statefile
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError


def parse_service_tag(tag: t.Optional[str]) -> t.Optional[t.Tuple[str, str]]:
    """service_tag as (NAME, VALUE), None when unset or empty (the module then behaves as without it)."""
    if not tag:
        return None
    try:
        return _select.parse_tag(tag)
    except _select.SelectError as e:
        raise StepError("service_tag: %s; nothing was changed" % e)


def changed_names(before: t.Mapping[str, str], after: t.Mapping[str, str]) -> t.List[str]:
    """Variables whose value the change sets, changes or removes (a reformatted block with the same values: none)."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def other_services(own: t.Tuple[str, str], lock_dir: t.Optional[str] = None) -> t.Dict[str, int]:
    """service -> the pid of its oldest live process, for every other service whose launch tag a process on this host
    carries (_select.other_service_tag: own's NAME with another value, GPUFLEET_LAUNCH_TAG naming another service under
    any tag name, or the default tag for a service with a tag name of its own). Processes whose environ cannot be read
    (another user's, without become) are not seen.

    With `lock_dir` (the services' run dir), a process counts only when it runs as root or as the user of the process
    that service's pidfile there (<name>.pid, written by gpufleet as root) names: anyone can put a launch tag into a
    process's environment, and a tagged `sleep` of any user would otherwise hold back every layer change of the host."""
    procs = _proc.snapshot()
    protected = _proc.protected_pids(procs, os.getpid())
    found: t.Dict[str, _proc.Proc] = {}
    trusted: t.Dict[str, t.Set[int]] = {}
    for pid, p in procs.items():
        if pid in protected or p.state in ("Z", "X"):
            continue
        # The kill's own rule (issue 24): a service with a tag name of its own is another service here as well.
        other = _select.other_service_tag(pid, own)
        if other is None:
            continue
        value = other[1]
        if lock_dir:
            if value not in trusted:
                trusted[value] = service_uids(value, lock_dir, procs)
            if p.uid not in trusted[value]:
                continue
        if value not in found or (p.start_time, p.pid) < (found[value].start_time, found[value].pid):
            found[value] = p  # the oldest: the launcher, as an SRE would look it up
    return {value: p.pid for value, p in sorted(found.items())}


def service_uids(service: str, run_dir: str, procs: t.Mapping[int, _proc.Proc]) -> t.Set[int]:
    """The users whose processes carrying `service`'s launch tag count as that gpufleet service's: root, and the user of
    the live process its pidfile in the run dir (<run_dir>/<service>.pid, written by gpufleet as root) names."""
    if "/" in service or service.startswith("."):  # a name is no path to walk
        return {0}
    uid = _statefile.pidfile_uid(os.path.join(run_dir, service + ".pid"), procs)
    return {0} if uid is None else {0, uid}


def services_in_rollout(own: t.Tuple[str, str], lock_dir: t.Optional[str]) -> t.Dict[str, str]:
    """service -> the run holding its host lock, for every other service whose lock in `lock_dir` (the role's run dir,
    <name>.lock) is held and not past its expiry: that run may be between its kill and its launch, when no process of
    the service runs and other_services cannot see it, and it launches onto whatever the layers then hold."""
    if not lock_dir or not os.path.isdir(lock_dir):
        return {}
    out: t.Dict[str, str] = {}
    for entry in sorted(os.listdir(lock_dir)):
        name = entry[:-len(".lock")] if entry.endswith(".lock") else ""
        if not name or name == own[1]:
            continue
        holder = _hostlock.lock_holder(os.path.join(lock_dir, entry))
        if holder:
            out[name] = holder
    return out


# The gpu_server role's snapshot of the layers a run changed (its _gpufleet_server_layers_previous: RUN_DIR/NAME +
# this), kept from the write until the restart passes, or put back when it is refused before its kill.
SNAPSHOT_SUFFIX = ".layers-previous.json"


def services_changing_layers(own: t.Tuple[str, str], lock_dir: t.Optional[str]) -> t.Dict[str, str]:
    """service -> the run holding its host lock, for every other service whose run changed the layers and has not
    finished its restart (its snapshot in `lock_dir` is there): that run puts the layers back if its restart is
    refused before its kill, so values this service would launch with now could be gone from the files next."""
    return {name: run for name, run in services_in_rollout(own, lock_dir).items()
            if os.path.exists(os.path.join(str(lock_dir), name + SNAPSHOT_SUFFIX))}


def refuse_launch_onto_changing(own: t.Tuple[str, str], lock_dir: t.Optional[str]) -> None:
    """StepError, before anything is stopped, when another service's unfinished run changed the NCCL layers
    (services_changing_layers): a server launched now reads values that run puts back if its restart is refused. For
    every launch, whatever wrote (or skipped) the layers before it: the rollback playbook, a run with --tags, a play of
    the user's own."""
    changing = services_changing_layers(own, lock_dir)
    if changing:
        raise StepError("the NCCL layers are host-wide and %s the files no longer hold. %s; nothing was stopped"
                        % (_changing_text(own, changing, lock_dir), _run_again(changing, lock_dir)), phase="preflight",
                        other_services=sorted(changing))


def _lock_text(lock_dir: t.Optional[str], name: str, holder: str) -> str:
    """The other service's run as its lock shows it: who, since and until when, and whether a process of that run works
    on this host now (a run whose controller was killed leaves its lock until it expires)."""
    cur = _statefile.read_state(os.path.join(str(lock_dir), name + ".lock"))
    out = "its host lock held by run %s" % holder
    try:
        since, until = (time.strftime("%H:%M:%S", time.localtime(float(cur[k]))) for k in ("acquired", "expires"))
        out += " since %s, until %s" % (since, until)
    except (KeyError, TypeError, ValueError):
        pass
    worker = _hostlock.lock_worker(cur)
    return out + ("; its restart runs on this host as pid %d" % worker[0] if worker else
                  "; no process of that run works on this host now")


def _run_again(changing: t.Mapping[str, str], lock_dir: t.Optional[str]) -> str:
    locks = " and ".join(os.path.join(str(lock_dir), n + ".lock") for n in changing)
    return ("Run again once that run is done. If it was interrupted (Ctrl-C, its controller killed), rerun the rollout of "
            "%s: from the controller that started it, it takes the lock over and finishes; from another, remove %s first, "
            "once you know that run is gone (runbook: A rollout was interrupted)" % (" and ".join(changing), locks))


def _who(runs: t.Mapping[str, str], lock_dir: t.Optional[str]) -> str:
    """The other services whose runs hold their locks, each with what its lock shows."""
    return ", ".join("%s (%s)" % (name, _lock_text(lock_dir, name, run)) for name, run in runs.items())


def _changing_text(own: t.Tuple[str, str], changing: t.Mapping[str, str], lock_dir: t.Optional[str]) -> str:
    """Who changed the layers and what that means for `own`, as both refusals say it."""
    who = _who(changing, lock_dir)
    return ("service %s changed them and has not finished its restart on this host; it puts them back if that restart "
            "is refused before its kill, and %s would then run with values" % (who, own[1]))


def _refusal(path: str, runs: t.Mapping[str, str], lock_dir: t.Optional[str], names: t.Sequence[str],
             own: t.Tuple[str, str], doing: str, what: str) -> StepError:
    """A change refused because another service's run holds its lock (`doing`: what that run does; `what`: what a change
    now would change for it)."""
    return StepError("NCCL layers are host-wide (%s): service %s %s; changing %s for %s now would change what it %s. %s, "
                     "with the same gpufleet_nccl_* for every service of the host; nothing was changed"
                     % (path, _who(runs, lock_dir), doing, ", ".join(names), own[1], what, _run_again(runs, lock_dir)),
                     path=path, changed_vars=list(names), other_services=sorted(runs))


def refuse_if_shared(own: t.Optional[t.Tuple[str, str]], path: str, before: t.Mapping[str, str],
                     after: t.Mapping[str, str], lock_dir: t.Optional[str] = None) -> None:
    """StepError when writing `after` over `before` in the host-wide file `path` would change the values another
    gpufleet service runs with, or launches with (its host lock in `lock_dir` held by a run), or when the values are
    those another service's unfinished run just wrote and may put back (services_changing_layers: this service would
    launch onto values the files may no longer hold); nothing when no service is named, or no value changes and no
    other run changed them, or no other service runs or is being rolled out."""
    if own is None:
        return
    names = changed_names(before, after)
    # Another service's unfinished run that changed the layers comes first, whether this run changes them or not: that
    # run (or the rerun that takes its lock over, when its controller was killed) restarts onto them or puts them back.
    changing = services_changing_layers(own, lock_dir)
    if changing and not names:
        raise StepError("NCCL layers are host-wide (%s): %s the file no longer holds. %s; nothing was changed"
                        % (path, _changing_text(own, changing, lock_dir), _run_again(changing, lock_dir)),
                        path=path, changed_vars=[], other_services=sorted(changing))
    if changing:
        raise _refusal(path, changing, lock_dir, names, own,
                       "changed them and has not finished its restart on this host", "launches with, or puts back")
    if not names:
        return
    others = other_services(own, lock_dir)
    rolling = {k: v for k, v in services_in_rollout(own, lock_dir).items() if k not in others}
    if rolling:
        raise _refusal(path, rolling, lock_dir, names, own, "is being restarted on this host by another run, which "
                       "launches it onto the layers' current values", "starts with")
    if not others:
        return
    who = ", ".join("%s (pid %d)" % kv for kv in others.items())
    them = " and ".join(others)
    many = len(others) > 1
    raise StepError(
        "NCCL layers are host-wide (%s): service%s %s run%s on this host and start%s workers with what the layers hold; "
        "changing %s for %s would change %s next start too. Give every service on a host the same gpufleet_nccl_* (the host's "
        "group_vars), or stop %s first (gpufleet.serving.clean); nothing was changed"
        % (path, "s" if many else "", who, "" if many else "s", "" if many else "s", ", ".join(names), own[1],
           "their" if many else them + "'s", "them" if many else them),
        path=path, changed_vars=names, other_services=sorted(others))
