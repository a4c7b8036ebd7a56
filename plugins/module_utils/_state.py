# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""What gpufleet.serving.server_info and gpufleet.serving.server_state do: the read-only check of a running server
against its desired state (server_info, `info`), and server_state's jobs by its O(action) - the same check under the
host lock it may take (with the record of an up-to-date server the record lost), the record, and the host lock. Both
modules take the check's options from `check_argument_spec`. Errors are raised as StepError; only a module's main()
turns one into fail_json (issue 25)."""

from __future__ import annotations

import math
import os
import pwd
import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import (
    _gpumod, _hostaddr, _hostlock, _lastgood, _layercheck, _layers, _layershare, _nvml, _proc, _rotation, _runid,
    _select, _server, _statefile, _systemd)
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step


def check_argument_spec() -> t.Dict[str, t.Any]:
    """The check's options, the same in gpufleet.serving.server_info and server_state (documented once, in the
    gpufleet.serving._server_check doc fragment; O(lock_file) is each module's own, as it means more in server_state)."""
    return dict(
        name=dict(type="str", required=True),
        tag_name=dict(type="str", default="GPUFLEET_SERVICE"),
        state_file=dict(type="path", required=True),
        pidfile=dict(type="path"),
        fingerprint=dict(type="str"),
        launchable=dict(type="dict", options=dict(
            command=dict(type="str", required=True),
            user=dict(type="str", default="root"),
            workdir=dict(type="path", default="/"),
            # From the server's env, whose values are secret (server_restart's env is no_log, and so its PATH).
            path=dict(type="str", no_log=True),
            log_path=dict(type="path"),
            drain_record=dict(type="path"),
            urls=dict(type="list", elements="str", default=[]),
            clean_timeout=dict(type="float", default=30.0),
            kill=dict(type="dict", default={}, options=dict(
                cmdline_regex=dict(type="str"),
                gpu_strays=dict(type="bool", default=False),
            )),
        )),
        gpus=dict(type="list", elements="int", default=[]),
        require_gpu_holders=dict(type="bool", default=True),
        expected_env=dict(type="dict", default={}),
        lock_file=dict(type="path"),
        rotation_file=dict(type="path"),
        worker_urls=dict(type="dict", default={}),
        # Read by the action plugins only (plugins/action/server_state.py, server_info.py).
        decide=dict(type="dict", options=dict(
            force=dict(type="bool", default=False),
            balancers=dict(type="list", elements="str", default=[]),
            idents=dict(type="dict", default={}),
            nccl_profile=dict(type="str"),
            nccl_known=dict(type="bool", default=True),
            tags=dict(type="list", elements="str", default=[]),
        )),
        nccl_layers=dict(type="dict", options=_layercheck.argument_spec()),
        rollback=dict(type="dict", options=dict(to=dict(type="str", default=""))),
        # Top-level, not in systemd: the module's journal entry masks a no_log value only where it is the whole
        # argument, and a dict option is logged as its text (a multi-line secret in it was not masked).
        systemd_env_content=dict(type="str", no_log=True),
        systemd=dict(type="dict", options=dict(
            unit=dict(type="str", required=True),
            unit_path=dict(type="path", required=True),
            unit_content=dict(type="str"),
            env_file=dict(type="path"),
            enabled=dict(type="bool"),
            loaded=dict(type="dict"),
            dropins=dict(type="str", choices=["warn", "remove", "fail"], default="warn"),
        )),
        backend=dict(type="str", choices=["auto", "nvml", "nvidia-smi"], default="auto"),
    )


def argument_spec() -> t.Dict[str, t.Any]:
    """server_state's options: the check's, and those of its writes (the lock, the record) and of its action plugin."""
    return dict(
        check_argument_spec(),
        action=dict(type="str", choices=["check", "record", "lock", "unlock"], default="check"),
        timings=dict(type="dict", default={}),
        owner=dict(type="str"),
        lock_ttl=dict(type="float", default=1800.0),
        lock_wait=dict(type="float", default=0.0),
        # Read by the action plugin only: the failure to report after the release.
        fail_msg=dict(type="str"),
        break_owner=dict(type="str"),
        keep_lock=dict(type="bool", default=False),
        # Read by the action plugin only: the lock and the NCCL layers' write before the check.
        tune=dict(type="dict", options=dict(
            sitecustomize=dict(type="dict"),
            nccl_conf=dict(type="dict"),
            backup=dict(type="bool", default=False),
            keep_previous=dict(type="path"),
            tags=dict(type="list", elements="str", default=[]),
        )),
    )


def record_input_error(p: t.Mapping[str, t.Any]) -> t.Optional[str]:
    """A pidfile whose live process is not the server (no launch tag, or the pid reused since) is not recorded: the
    record is what later checks and kills trust."""
    ident = _statefile.pidfile_identity(p["pidfile"])
    if ident is None:
        return None  # recorded without a pid (main warns): the next check finds nothing running and restarts
    proc = _proc.read_proc(ident[0])
    if proc is None:
        return None  # gone: the record then says so, and the next check restarts it
    if proc.start_time != ident[1]:
        return "pidfile %s names pid %d, which is another process now (started at %s, not %s); not recorded" % (
            p["pidfile"], ident[0], proc.start_time, ident[1])
    if not _proc.environ_has(ident[0], p["tag_name"], p["name"]):
        return "pidfile %s names pid %d, which does not carry the launch tag %s=%s; not recorded" % (
            p["pidfile"], ident[0], p["tag_name"], p["name"])
    return None


def lock_input_error(p: t.Mapping[str, t.Any]) -> t.Optional[str]:
    """A lock that cannot exclude anybody (expired when written, an empty owner) is refused before anything is done."""
    if p["owner"] is not None and not p["owner"].strip():
        return "owner must not be empty (it names the run that holds the lock)"
    # not (x > 0) and not (x >= 0) also refuse NaN; inf would be a lock that never goes stale, or a wait forever.
    if not p["lock_ttl"] > 0 or math.isinf(p["lock_ttl"]):
        return "lock_ttl must be a number of seconds > 0, got %s (a lock past its TTL is broken by the next run)" % p["lock_ttl"]
    if not p["lock_wait"] >= 0 or math.isinf(p["lock_wait"]):
        return "lock_wait must be a number of seconds >= 0, got %s" % p["lock_wait"]
    if p["lock_file"] and os.path.isdir(p["lock_file"]):
        return "lock_file %s is a directory; name the lock file itself" % p["lock_file"]
    return None


def take_lock(p: t.Dict[str, t.Any], step: Step) -> dict:
    if p["break_owner"] and p["break_owner"] != p["owner"]:
        # The dead run's restart may still be running here (a module goes on when its controller dies): let it finish;
        # it releases the lock itself.
        try:
            waited = _hostlock.wait_lock_worker(p["lock_file"], p["break_owner"], p["lock_ttl"])
        except _server.ServerError as e:
            raise StepError(str(e), **e.details) from None
        if waited:
            step.warn("waited %.1f s for the restart of dead run %s, still running on this host as pid %d, to finish"
                      % (waited["waited_s"], p["break_owner"], waited["pid"]))
        cur = _statefile.read_state(p["lock_file"])
        if cur.get("owner") == p["break_owner"]:
            try:
                os.unlink(p["lock_file"])
            except FileNotFoundError:
                pass
            step.warn("broke the lock of dead run %s" % p["break_owner"])
    try:
        res = _hostlock.acquire_lock(p["lock_file"], p["owner"], p["lock_ttl"], p["lock_wait"])
    except _server.ServerError as e:
        raise StepError(str(e), **e.details) from None
    except OSError as e:  # a full or read-only run directory: the error names the lock file; nothing was left there
        raise StepError("cannot take the host lock: %s; nothing was stopped" % (e.strerror or e),
                        path=p["lock_file"]) from None
    if res.get("broke_stale"):
        step.warn("broke a stale lock: %s" % res["broke_stale"])
    if res.get("waited"):
        # Wait-die: only an earlier run waits, for a later one; say so, and for how long, in the run's output.
        waited = res["waited"]
        step.warn("waited %.1f s for the host lock of a later gpufleet run %s (%s), which held this host; this "
                  "earlier run goes on now (wait-die: only an earlier run waits; lock_wait %.0f s)"
                  % (waited["s"], waited["for"], _runid.started_text(waited["for"]), p["lock_wait"]))
    return res


def restart_problems(p: t.Mapping[str, t.Any]) -> t.List[str]:
    """What server_restart's preflight would refuse about its launch and its files (_server.restart_problems, the same
    code and words), checked in the check so that a restart sure to be refused for it neither drains the host nor
    reaches its kill: the command on the server's PATH (process launcher), the files the restart writes
    (O(launchable.log_path) and this check's own paths) and the drain record (writable, room in their directories)."""
    la = p["launchable"]
    # server_restart's own list, of the paths this check knows by its own options (the same role variables).
    files = _server.restart_files(p["state_file"], p["pidfile"], p["lock_file"], la["log_path"])
    if la.get("drain_record"):
        files.setdefault("drain_record", la["drain_record"])
    return _server.restart_problems(files, command=None if p["systemd"] else la["command"], user=la["user"],
                                    workdir=la["workdir"], path=la["path"])


def restart_preflight(p: t.Dict[str, t.Any], step: Step) -> None:
    """What server_restart refuses before its kill but after the drain, refused here before the drain, with its code,
    words and phase: a foreign listener on the server's port (preflight), GPU holders no kill step would end (clean,
    after the clean gate's timeout for them to go, as the restart waits; nothing is signalled, in check mode alike).
    Only for the check of a run that may restart (O(owner)): the rollout's read-only fast path leaves a host that needs
    a restart to that check anyway (it would wait the gate's timeout twice), and the audit reports the holders."""
    # Imported here: the restart engine is most of the collection's code, and only a check that may restart needs it.
    from ansible_collections.gpufleet.serving.plugins.module_utils import _restart  # pylint: disable=import-outside-toplevel
    la = p["launchable"]
    sel = _restart.selection_params(p["name"], p["tag_name"], p["pidfile"], p["gpus"], p["backend"],
                                    la["kill"]["cmdline_regex"], la["kill"]["gpu_strays"], la["clean_timeout"],
                                    la["user"])
    try:
        # The restart's own refusal (its preflight), before the drain: the run dir holds the services' locks.
        if p["pidfile"]:
            _layershare.refuse_launch_onto_changing((p["tag_name"], p["name"]), os.path.dirname(p["pidfile"]))
        _restart.refuse_foreign_listeners(sel, la["urls"])
        if p["require_gpu_holders"]:
            _restart.refuse_unended(step, sel)
    except StepError as e:
        if e.details.get("phase") == "clean":  # as the restart returns it: phase clean, the gate's details under `clean`
            raise StepError(str(e), phase="clean", clean=dict(e.details))
        raise


def server_processes(p: t.Mapping[str, t.Any], procs: t.Mapping[int, _proc.Proc],
                     launcher: t.Optional[t.Tuple[t.Any, t.Any]]) -> t.Tuple[t.List[int], t.List[int]]:
    """(the server's processes, processes carrying its launch tag that are not): a tagged process is the server's when
    it is the running launcher or its descendant, or runs as the launcher's user or the definition's
    (O(launchable.user)). Anyone can put the tag into a process's environment (the restart's kill leaves such a
    process alone), so another user's must not pass for a worker lacking the environment (issue 24)."""
    tagged = sorted(pid for pid in procs if _proc.environ_has(pid, p["tag_name"], p["name"]))
    uids: t.Set[int] = set()
    tree: t.Set[int] = set()
    if launcher and launcher[0] in procs:
        uids.add(procs[launcher[0]].uid)
        tree = {launcher[0]} | _proc.descendants([launcher[0]], procs)
    if p["launchable"]:
        try:
            uids.add(pwd.getpwnam(p["launchable"]["user"]).pw_uid)
        except KeyError:  # the launch check reports a missing user
            pass
    if not uids:  # nothing to tell the server's user by: every tagged process counts, as before
        return tagged, []
    mine = [pid for pid in tagged if pid in tree or procs[pid].uid in uids]
    return mine, [pid for pid in tagged if pid not in mine]


def rollback_choice(p: t.Dict[str, t.Any], step: Step) -> t.Dict[str, t.Any]:
    """O(rollback): the last known good generation this host goes back to (_lastgood.choose), chosen before anything
    is locked; the check then compares the host with it instead of O(fingerprint) and O(expected_env), and the launch
    check looks at its command. Fails, nothing changed, when the host has no such generation."""
    state = _statefile.read_state(p["state_file"])
    running = _lastgood.running_from_pidfile(state, p["pidfile"], p["tag_name"], p["name"]) if p["pidfile"] else None
    lkg = _lastgood.path_for(p["state_file"])
    f = _lastgood.read_file(lkg)
    try:
        g = _lastgood.choose(f["generations"], running, p["rollback"]["to"] or "", f["rolled_back"], lkg)
    except _lastgood.TargetError as e:
        raise StepError("rollback: %s; nothing was changed" % e, running_fingerprint=running,
                        last_good=_lastgood.summary(f["generations"]))
    launcher = "systemd" if p["systemd"] else "process"
    if g.get("launcher") != launcher:
        raise StepError("rollback: the last known good %s was launched by the %s launcher, and this service's is "
                        "%s (gpufleet_server_launcher): roll out that definition instead; nothing was changed"
                        % (str(g["fingerprint"])[:12], g.get("launcher"), launcher),
                        running_fingerprint=running, last_good=_lastgood.summary(f["generations"]))
    gone = _lastgood.missing_paths(g)
    if gone:  # refused before the drain and the kill: the healthy server would be stopped for one that cannot run
        raise StepError("rollback: the last known good %s names %s, which no longer exist%s on this host; nothing "
                        "was changed" % (str(g["fingerprint"])[:12], ", ".join(gone), "s" if len(gone) == 1 else ""),
                        running_fingerprint=running, last_good=_lastgood.summary(f["generations"]))
    refused = _layers.put_back_refusal(g.get("layers"), warn=step.warn, files=step.files)
    if refused:  # before the drain and the kill (a second service on the host runs with the current values)
        raise StepError("rollback: the NCCL layers of the last known good %s cannot be put back: %s"
                        % (str(g["fingerprint"])[:12], refused),
                        running_fingerprint=running, last_good=_lastgood.summary(f["generations"]))
    choice = {"fingerprint": g["fingerprint"], "recorded_at": g.get("recorded_at"), "from": running,
              "inventory_fingerprint": p["fingerprint"]}
    p["fingerprint"] = g["fingerprint"]
    p["expected_env"] = dict(g.get("expected_env") or {})
    if p["systemd"]:
        # The unit is compared with the generation's files, not the inventory's: a host that runs it already is right.
        # Its own drop-ins are part of it (kept, not removed); the loaded settings are the generation's file's.
        files = {str(x.get("path")): x.get("content") for x in g.get("systemd_files") or []}
        p["systemd"] = dict(p["systemd"], unit_content=files.get(p["systemd"]["unit_path"]), loaded=None, dropins="warn")
        p["systemd_env_content"] = files.get(p["systemd"]["env_file"] or "")
        return choice
    if p["launchable"]:
        path = (g.get("env") or {}).get("PATH")
        ready = _lastgood.ready_for(g, {})  # the URLs the generation answered at, for the foreign-listener check
        urls = [ready.get("health_url"), (ready.get("request") or {}).get("url")] if ready else p["launchable"]["urls"]
        p["launchable"] = dict(p["launchable"], command=g["command"][0], user=g.get("user") or "root",
                               workdir=g.get("workdir") or "/", path=str(path) if path else None, urls=urls)
    return choice


def rollback_reasons(res: t.Dict[str, t.Any], choice: t.Mapping[str, t.Any]) -> t.List[str]:
    """The check's reasons in a rollback's words: the fingerprint's change is the rollback itself."""
    said = "roll back to the last known good %s (recorded %s) from %s" % (
        str(choice["fingerprint"])[:12], choice["recorded_at"], str(choice["from"] or "no verified server")[:12])
    return [said if r.startswith("desired state changed (fingerprint") else r for r in res["reasons"]]


def check(p: t.Dict[str, t.Any], step: Step) -> dict:
    choice = rollback_choice(p, step) if p["rollback"] is not None else None
    if p["launchable"]:
        la = p["launchable"]
        problems = _server.launch_problems(la["command"], la["user"], la["workdir"])
        if problems:
            raise StepError("cannot run this server: %s." % "; ".join(problems), launch_problems=problems)
        # The restart's own words for a GPU index this host lacks (the GPU reading below would fail on it too).
        _gpumod.gpus_preflight(p)
    locking = bool(p["lock_file"] and p["owner"]) and not step.check_mode
    # This run's lock from an earlier call (action=lock, or a check that kept it) is neither taken nor dropped here.
    held = _statefile.read_state(p["lock_file"]) if p["lock_file"] and p["owner"] else {}
    held_before = held.get("owner") == p["owner"] and float(held.get("expires", 0)) >= time.time()
    lock_res = {}
    if locking:
        lock_res = take_lock(p, step)
    elif p["lock_file"] and p["owner"] and not p["break_owner"]:
        # Check mode takes no lock, but predicts the real call: another run's live lock makes it fail (an earlier
        # run's at once, wait-die) or wait.
        busy = _hostlock.foreign_live_lock(p["lock_file"], p["owner"])
        if busy is not None and _runid.is_earlier(str(busy.get("owner")), p["owner"]):
            e = _hostlock.lock_refused_error(busy)
            raise StepError(str(e), **e.details)
        if busy is not None and p["lock_wait"] == 0:
            e = _hostlock.lock_busy_error(busy)
            raise StepError(str(e), **e.details)
    try:
        res = check_state(p, step)
        # A server its record does not name is kept, but not "already right": the rollout's read-only fast path then
        # leaves it to the role, whose locked check writes the record again (rerecord).
        res["up_to_date"] = (not res["needs_restart"] and not res.get("unit", {}).get("drift")
                             and not res.get("unrecorded") and not res.get("last_good_pending"))
        if p["nccl_layers"]:
            res["nccl_layers"] = _layercheck.up_to_date(p["nccl_layers"], step.warn)
            res["up_to_date"] = res["up_to_date"] and res["nccl_layers"]["up_to_date"]
        if p["rotation_file"]:
            try:
                res["drain_records"] = _rotation.read(p["rotation_file"])
            except (_rotation.RecordError, OSError) as e:
                res["drain_record_error"] = "drain record %s: %s" % (p["rotation_file"], e)
                res["up_to_date"] = False
        if p["launchable"] and (res["needs_restart"] or p["keep_lock"]):
            try:
                problems = restart_problems(p)
                if problems:
                    raise StepError("cannot run this server, nothing was stopped: %s" % "; ".join(problems),
                                    phase="preflight", launch_problems=problems)
                if p["owner"]:
                    restart_preflight(p, step)
            except StepError as e:
                # A host an earlier run left out of rotation stays out: its records go with the refusal, for the
                # summary (helper-45: it did not say so).
                if "drain_records" in res:
                    e.details.setdefault("drain_records", res["drain_records"])
                raise
        if choice is not None:
            res["reasons"] = rollback_reasons(res, choice)
            res["rollback"] = choice
            inv = choice["inventory_fingerprint"]
            if res["needs_restart"] and inv and inv != choice["fingerprint"]:
                # The rollback changes the host, not the inventory: the next rollout restarts it to the inventory's again.
                step.warn("rollback: %s goes back to %s, but the inventory still describes %s: the next rollout restarts "
                          "it to that definition again; change the inventory before the next rollout"
                          % (p["name"], str(choice["fingerprint"])[:12], inv[:12]))
        if lock_res.get("waited"):
            res["lock_waited"] = lock_res["waited"]
        # Before any balancer call of a run: a drain (a restart) or a put-back (an earlier run's drain record). An entry
        # copied from another host's variables would take that host out, or put it back over an operator's MAINT.
        if p["owner"] and (res["needs_restart"] or p["keep_lock"] or res.get("drain_records")):
            refuse_foreign_worker_urls(p)
    except BaseException:
        # Whatever refuses after the lock was taken here releases it (one taken by an earlier call stays).
        if locking and not held_before:
            _hostlock.release_lock(p["lock_file"], p["owner"])
        raise
    if p["lock_file"] and not p["owner"]:
        holder = _hostlock.lock_holder(p["lock_file"])
        if holder is not None:
            res["lock_holder"] = holder
            res["up_to_date"] = False
    # A host an earlier run left out of rotation (its drain record names entries of its balancers) goes back in this
    # run, also without a restart: under the lock, as a put-back outside it would race another run's drain of the host
    # (helper-47). The return to service releases it once the host is back.
    returning = bool(p["owner"] and p["decide"] and set(res.get("drain_records") or {})
                     & {str(n) for n in p["decide"].get("balancers") or []})
    if locking:
        res["locked"] = True
        rerecord(p, step, res)  # under the lock, when there is one
        if not res["needs_restart"] and not p["keep_lock"] and not held_before and not returning:
            res["locked"] = not _hostlock.release_lock(p["lock_file"], p["owner"])
        # The lock file this call leaves behind, when it was not there before, is its only change to the host (with
        # the record of a server whose record had failed).
        res["changed"] = res["locked"] and not held_before or bool(res.get("recorded") or res.get("last_good_kept"))
    elif p["lock_file"] and p["owner"]:
        # Check mode takes no lock but predicts the real call: it keeps the lock when a restart is needed.
        res["locked"] = held_before
        res["changed"] = bool(res["needs_restart"] or p["keep_lock"] or returning) and not held_before
    return res


def check_unit(p: t.Mapping[str, t.Any], step: Step, procs: t.Mapping[int, _proc.Proc]) -> t.Dict[str, t.Any]:
    """The systemd launcher: the unit's main pid is the launcher, and the unit systemd runs is compared with the
    desired one (file content, pending reload, drop-ins, enablement)."""
    sd = p["systemd"]
    try:
        props = _systemd.show(step.run_command, sd["unit"])
    except _systemd.SystemdError as e:
        raise StepError("cannot read the state of %s: %s" % (sd["unit"], e), **e.details)
    try:
        d = _systemd.drift(props, sd["unit"], sd["unit_path"], sd["unit_content"], sd["enabled"], sd["env_file"],
                           p["systemd_env_content"], sd["loaded"])
    except _systemd.SystemdError as e:
        raise StepError(str(e), **e.details)
    pid = _systemd.main_pid(props)
    live = procs.get(pid) if pid else None
    confirmed = live is not None and _proc.environ_has(pid, p["tag_name"], p["name"])
    if d["dropins"] and sd["dropins"] == "fail":
        raise StepError("%s has drop-ins gpufleet did not write (%s); gpufleet_server_systemd_dropins is fail: "
                        "remove them, or set it to remove or warn" % (sd["unit"], ", ".join(d["dropins"])),
                        dropins=d["dropins"])
    restart = list(d["restart"])
    drift = list(d["other"])
    if d["dropins"]:
        if sd["dropins"] == "remove":
            # Only this unit's own drop-ins under /etc or /run are gpufleet's to delete; refuse before anything
            # is stopped rather than restart onto a unit that still has the others.
            kept = [x for x in d["dropins"] if not _systemd.removable_dropin(x, sd["unit"])]
            if kept:
                raise StepError("%s has drop-ins gpufleet may not delete (%s: a name prefix's, shared with other "
                                "units, or a package's); remove them by hand" % (sd["unit"], ", ".join(kept)),
                                dropins=d["dropins"])
            restart.append("drop-ins gpufleet did not write change the unit (removed at the restart): %s"
                           % ", ".join(d["dropins"]))
            drift = [x for x in drift if not x.startswith("drop-ins")]
        else:
            step.warn("%s: drop-ins gpufleet did not write change the unit: %s; they stay in force "
                      "(gpufleet_server_systemd_dropins: warn)" % (sd["unit"], ", ".join(d["dropins"])))
    enabled_ok = not any(x.startswith("unit is") for x in d["other"]) and d["loaded"]
    return dict(loaded=d["loaded"], active_state=props["ActiveState"], main_pid=pid, main_confirmed=confirmed,
                main_start_time=live.start_time if live else None, unit_file_state=d["enabled_state"],
                enabled_ok=enabled_ok, content_matches=d["content_matches"], dropins=d["dropins"],
                restart_reasons=restart, drift=drift)


def check_state(p: t.Dict[str, t.Any], step: Step) -> dict:
    state = _statefile.read_state(p["state_file"])
    reasons = []
    procs = _proc.snapshot()
    pidfile = pidfile_state(p["pidfile"], procs, (p["tag_name"], p["name"])) if p["pidfile"] else None
    unit = check_unit(p, step, procs) if p["systemd"] else None
    notes = []
    if unit is not None:
        # systemd knows the launcher: after a `systemctl restart` by hand the pidfile names the old one.
        running = unit["main_confirmed"]
        launcher = (unit["main_pid"], unit["main_start_time"])
    else:
        # The same test as the kill's: a pidfile naming a live process the pidfile cannot confirm (a pid-only file
        # naming an unrelated process) is not our server running.
        running = bool(pidfile and pidfile["status"] == "confirmed")
        live = procs.get(pidfile["pid"]) if running else None
        launcher = (pidfile["pid"], live.start_time if live else None) if running else (None, None)
    if not running:
        reasons.append("server is not running")
    recorded = state.get("fingerprint")
    on_record = (state.get("pid"), state.get("start_time"))
    unrecorded = unit is None and running and unrecorded_launch(p, state, launcher, on_record)
    if unrecorded:
        notes.append("the running server (pid %s) was launched by gpufleet with this definition, but its record %s does "
                     "not name it (the record of its restart failed): kept, and recorded again"
                     % (launcher[0], p["state_file"]))
    elif p["fingerprint"] and recorded != p["fingerprint"]:
        reasons.append("desired state changed (fingerprint %s -> %s)" % ((recorded or "none")[:12], p["fingerprint"][:12]))
    # The record names the launch that passed every check. A server launched after it whose launch failed (not ready,
    # workers without the environment) runs under the same pidfile; it is not the recorded one, whatever the
    # fingerprint says, and must be restarted.
    if unrecorded:
        pass
    elif state.get("verified") is False:
        # server_restart marks the record before each launch and rewrites it once every check passed.
        reasons.append("the last launch by gpufleet did not pass its checks (or its run was interrupted)")
    elif running and state.get("pid") is not None and launcher != on_record:
        if unit is not None:
            # The record is of a verified launch, and no gpufleet launch since: systemd started the unit itself
            # (a reboot, `systemctl restart`, Restart=), from the unit the check compares with the desired one.
            notes.append("the unit was restarted outside gpufleet (main pid %s, verified launch on record pid %s); "
                         "its unit and its workers' environment are checked as usual" % (launcher[0], on_record[0]))
        else:
            reasons.append("the running server (pid %s) is not the verified launch on record (pid %s)"
                           % (launcher[0], state.get("pid")))
    if unit is not None:
        reasons.extend(unit["restart_reasons"])
    tagged, forged = server_processes(p, procs, launcher if running else None)
    holders = {}
    if p["require_gpu_holders"]:
        with _gpumod.backend_or_fail(p["backend"]) as backend:
            indices = _nvml.resolve_indices(backend, p["gpus"])
            if not indices:
                raise StepError("gpus: this host has no GPUs, so no GPU server can run here", backend=backend.name)
            for i in indices:
                holders[i] = [h["pid"] for h in backend.processes(i)]
    tagged_set = set(tagged)
    strays = [dict(gpu=g, pid=pid, cmdline=procs[pid].command[:300] if pid in procs else "?")
              for g, pids in sorted(holders.items()) for pid in pids if pid not in tagged_set]
    if strays:
        reasons.append("GPUs held by %d process(es) without this server's launch tag%s" % (
            len(strays), "" if not forged else " (pid %s: with it, as a user the server does not run as)"
            % ", ".join(str(x) for x in forged)))
    for g, pids in sorted(holders.items()):
        if not tagged_set.intersection(pids):
            reasons.append("GPU %d is not held by a %s worker" % (g, p["name"]))
    if tagged and not running:
        reasons.append("%d tagged process(es) alive without their launcher (orphans)" % len(tagged))
    holder_pids = {pid for pids in holders.values() for pid in pids}
    env_problems = {}
    expected = {k: str(v) for k, v in p["expected_env"].items()}
    for pid in tagged:
        if holders and pid not in holder_pids:
            continue
        try:
            actual = _proc.read_environ(pid, expected)
        except _proc.ProcError:
            continue
        bad = sorted(k for k, v in expected.items() if actual.get(k) != v)
        if bad:
            env_problems[str(pid)] = bad
    if env_problems:
        reasons.append("workers lack the expected environment: %s" % ", ".join(
            "pid %s: %s" % (k, " ".join(v)) for k, v in sorted(env_problems.items())))
    workers = [dict(pid=pid, ppid=procs[pid].ppid, cmdline=procs[pid].command[:300], holds_gpu=pid in holder_pids)
               for pid in tagged if pid in procs]
    res = dict(changed=False, needs_restart=bool(reasons), reasons=reasons, running=running,
               fingerprint_recorded=recorded, workers=workers, strays=strays, env_problems=env_problems,
               gpu_holders={str(k): v for k, v in holders.items()},
               running_fingerprint=_lastgood.running_fingerprint(state, launcher, p["tag_name"], running),
               last_good=last_good_report(p["state_file"], state))
    if unrecorded:
        res["unrecorded"] = True
    elif running and not reasons and p["pidfile"] and p["fingerprint"] and pending_last_good(p, launcher):
        # Its record was written again, but not its last known good generation (the state filesystem was still full):
        # kept aside since, promoted by the locked check once there is room (rerecord), not only at the next kill.
        res["last_good_pending"] = True
    if pidfile is not None:
        res["pidfile"] = pidfile
    if unit is not None:
        res["unit"] = unit
    if notes:
        res["notes"] = notes
    return res


def pending_last_good(p: t.Mapping[str, t.Any], launcher: t.Tuple[t.Any, t.Any]) -> bool:
    """Whether a last known good generation of this definition was put aside for the running launcher."""
    try:
        return _lastgood.pending_for(p["pidfile"], p["fingerprint"], launcher if launcher[1] is not None else None) \
            is not None
    except OSError:
        return False  # unreadable: rerecord says so when it is the record's to recover


def last_good_report(state_file: str, state: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
    """What the check shows of the last known good generations and of the record's gate measurement (RV(last_good)):
    fingerprints, times and numbers, never a definition (its environment values are secret)."""
    f = _lastgood.read_file(_lastgood.path_for(state_file))
    gens = _lastgood.summary(f["generations"])
    g = state.get("gate") if isinstance(state.get("gate"), dict) else None
    gate = None
    if g:
        # Imported only for a recorded measurement: _bench brings http.client and statistics, which every check (a
        # no-op rollout runs one per host) would otherwise compile and import for nothing.
        from ansible_collections.gpufleet.serving.plugins.module_utils import _bench  # pylint: disable=import-outside-toplevel
        gate = {"median": g.get("median"), "metric": g.get("metric"), "unit": _bench.UNITS.get(str(g.get("metric"))),
                "measured_at": g.get("measured_at"), "fingerprint": g.get("fingerprint")}
    return {"newest": gens[0] if gens else None, "generations": gens, "rolled_back": f["rolled_back"], "gate": gate}


def unrecorded_launch(p: t.Mapping[str, t.Any], state: t.Mapping[str, t.Any], launcher: t.Tuple[t.Any, t.Any],
                      on_record: t.Tuple[t.Any, t.Any]) -> bool:
    """Whether the running server is a launch of this very definition that the record does not name because writing
    the record failed after the launch (a full state filesystem): its launcher carries the fingerprint (server_restart
    sets it at launch) and the record says nothing against it. Restarting it would only fail the same way, forever.
    A launch that failed its checks is not one: server_restart marked the record unverified before it, so `verified`
    is false then."""
    if not p["fingerprint"] or state.get("verified") is False:
        return False
    if state.get("fingerprint") == p["fingerprint"] and launcher == on_record:
        return False  # the record names it: nothing to recover
    key = p["tag_name"] + _statefile.FINGERPRINT_SUFFIX
    try:
        return _proc.read_environ(launcher[0], [key]).get(key) == p["fingerprint"]
    except _proc.ProcError:
        return False


def rerecord(p: t.Mapping[str, t.Any], step: Step, res: t.Dict[str, t.Any]) -> None:
    """Write the record of an up-to-date server the record does not name (unrecorded_launch); a record that still
    cannot be written is a warning, not a restart."""
    if step.check_mode or res["needs_restart"] or not p["pidfile"]:
        return
    if res.get("last_good_pending"):  # the record names the server; only its generation is still aside
        keep_pending(p, step, res)
        return
    if not res.get("unrecorded"):
        return
    old = _statefile.read_state(p["state_file"])
    timings = old.get("timings") if isinstance(old.get("timings"), dict) else {}
    # A verified restart whose record failed put its last known good generation (and gate measurement) aside.
    try:
        pending = _lastgood.pending_for(p["pidfile"], p["fingerprint"], _statefile.pidfile_identity(p["pidfile"]))
    except OSError as e:  # unreadable: the record is still written, without it
        step.warn("the last known good generation put aside in %s cannot be read: %s"
                  % (_lastgood.pending_path(p["pidfile"]), e.strerror or e))
        pending = None
    gate = (pending or {}).get("generation", {}).get("gate")
    try:
        _statefile.record_state(p["state_file"], p["name"], p["fingerprint"], p["pidfile"], timings or {},
                                gate=gate if isinstance(gate, dict) else None)
    except OSError as e:
        # Said in the result too (the role passes it to the rollout summary): a warning alone scrolls by.
        why = str(e.strerror or e)
        if p["state_file"] not in why:  # the atomic writers name the file already ("cannot write PATH: ...")
            why = "%s: %s" % (p["state_file"], why)
        res["record_missing"] = ("the running server (pid %s) is up to date and kept, but its record still cannot be "
                                 "written (%s): the record is still missing; the next run writes it once there is "
                                 "room" % ((res.get("pidfile") or {}).get("pid"), why))
        step.warn(res["record_missing"])
        return
    res["recorded"] = True
    if pending is not None:
        keep_pending(p, step, res, pending)


def keep_pending(p: t.Mapping[str, t.Any], step: Step, res: t.Dict[str, t.Any], pending: t.Optional[t.Mapping[str, t.Any]] = None
                 ) -> None:
    """Make the generation put aside for the running server the newest last known good (RV(last_good) shows it); a
    file still too full is a warning, and the generation stays aside for the next check."""
    if pending is None:
        try:
            pending = _lastgood.pending_for(p["pidfile"], p["fingerprint"], _statefile.pidfile_identity(p["pidfile"]))
        except OSError:
            pending = None
        if pending is None:
            return
    try:
        _lastgood.promote(p["pidfile"], p["state_file"], pending)
    except OSError as e:  # the record is written and the server kept: a warning, as after a restart
        step.warn("the last known good definitions could not be written to %s: %s"
                  % (_lastgood.path_for(p["state_file"]), e.strerror or e))
        return
    res["last_good_kept"] = True
    try:
        res["last_good"] = last_good_report(p["state_file"], _statefile.read_state(p["state_file"]))
    except OSError:
        pass  # what the check reported before stays


def pidfile_state(path: str, procs: t.Mapping[int, _proc.Proc], tag: t.Tuple[str, str]) -> t.Dict[str, t.Any]:
    """_select.check_pidfile's report; an unreadable pidfile is reported, not fatal (the check is read-only)."""
    try:
        return _select.check_pidfile(path, procs, tag=tag)
    except (_select.SelectError, OSError) as e:
        return dict(path=path, pid=None, status="unreadable", reason="pidfile %s is unreadable: %s" % (path, e),
                    confirmed_by=None)


def record(p: t.Dict[str, t.Any], step: Step) -> t.Dict[str, t.Any]:
    """O(action=record): the record of a verified launch (the server's fingerprint and pid)."""
    err = record_input_error(p)
    if err:
        raise StepError(err)
    if _statefile.pidfile_identity(p["pidfile"]) is None:
        step.warn("pidfile %s is missing or does not hold the 'PID START_TIME' a launch writes: recorded without a "
                  "pid, so the next check finds no server running" % p["pidfile"])
    changed, new = _statefile.record_state(p["state_file"], p["name"], p["fingerprint"], p["pidfile"], p["timings"],
                                           step.check_mode)
    return dict(changed=changed, state=new)


def refuse_foreign_worker_urls(p: t.Mapping[str, t.Any]) -> None:
    """Before any balancer call (a restart's drain, a put-back, the clean playbook's drain): the entries whose worker URL
    was set by hand must name this host; an entry copied from another host's variables would take that host out."""
    refused = _hostaddr.refusals(p["worker_urls"]) if p["worker_urls"] else []
    if refused:
        raise StepError("a balancer entry's worker_url is not this host's, nothing was touched: %s" % "; ".join(refused),
                        phase="preflight")


def lock(p: t.Dict[str, t.Any], step: Step) -> t.Dict[str, t.Any]:
    """O(action=lock): take this run's host lock (wait-die on the runs' start). With O(worker_urls) (the clean
    playbook's lock, before its drain), a worker URL that is not this host's is refused first, nothing taken."""
    refuse_foreign_worker_urls(p)
    cur = _statefile.read_state(p["lock_file"])
    if step.check_mode:
        return dict(changed=cur.get("owner") != p["owner"], lock=cur)
    res = take_lock(p, step)
    # Taking the lock writes the lock file; re-taking this run's own lock changes nothing.
    return dict(res, changed=cur.get("owner") != p["owner"], locked=True)


def unlock(p: t.Dict[str, t.Any], step: Step) -> t.Dict[str, t.Any]:
    """O(action=unlock): release this run's host lock (another run's is left alone)."""
    cur = _statefile.read_state(p["lock_file"])
    released = False
    if not step.check_mode:
        released = _hostlock.release_lock(p["lock_file"], p["owner"])
    return dict(changed=released if not step.check_mode else cur.get("owner") == p["owner"], released=released)


ACTIONS: t.Dict[str, t.Callable[[t.Dict[str, t.Any], Step], t.Dict[str, t.Any]]] = {
    "check": check, "record": record, "lock": lock, "unlock": unlock}


def info(p: t.Dict[str, t.Any], step: Step) -> t.Dict[str, t.Any]:
    """gpufleet.serving.server_info: the check without a lock owner, which never writes (O(lock_file) only looked at).
    The same code as server_state's check, so both say the same of a host."""
    res = check(dict(p, action="check", owner=None, break_owner=None, keep_lock=False, lock_ttl=1800.0, lock_wait=0.0,
                     timings={}), step)
    res["changed"] = False
    return res


def run(p: t.Dict[str, t.Any], step: Step) -> t.Dict[str, t.Any]:
    """server_state's result for its O(action); raises StepError, nothing changed by the failing step."""
    err = lock_input_error(p)
    if err:
        raise StepError(err)
    return ACTIONS[p["action"]](p, step)
