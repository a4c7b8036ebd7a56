# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""The whole restart cycle of a server in one module call (server_restart), whatever its launcher.

preflight -> unended GPU holders (refuse_unended) -> kill -> strays -> clean gate -> launch -> ready -> busy -> verify
env -> record -> release the host lock.
The launcher only changes how the old server is stopped and the new one started: the process launcher signals the
tagged processes itself and starts the command in its own session; the systemd launcher asks systemd (`systemctl
stop`: TERM to the main process, the unit's TimeoutStopSec, which the role sets to the kill grace, then KILL of the
whole cgroup; `systemctl start`, the main pid from `systemctl show`) and then sweeps what systemd does not own
(an adopted server started by hand, orphans of an earlier launcher) with the same kill. Every other step, and the
timings, are the same code for both.
Each step is the same code the single-step modules run (process_kill, gpu_wait, server_launch, process_env,
server_state); running them in one process saves one ansible task start per step, which on a fleet is most of
a restart's wall time (each task is a module round trip to every host).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import (
    _bench, _envblock, _envcheck, _gpumod, _gpuwait, _hostlock, _killmod, _lastgood, _layers, _layershare, _listener,
    _nvml, _proc, _ready, _select, _server, _statefile, _systemd)
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step


def argument_spec() -> t.Dict[str, t.Any]:
    gate = _gpumod.clean_gate_argspec()
    gate.pop("gpus")  # one GPU list for the gate, the stray kill and the busy wait
    gate.pop("backend")
    spec = _server.launch_argspec(
        pidfile=dict(type="path", required=True),
        gpus=dict(type="list", elements="int", default=[]),
        backend=dict(type="str", choices=["auto", "nvml", "nvidia-smi"], default="auto"),
        kill=dict(type="dict", default={}, options=dict(
            cmdline_regex=dict(type="str"),
            gpu_strays=dict(type="bool", default=False),
            exclude_regex=dict(type="list", elements="str"),
            **_killmod.signal_argspec()
        )),
        wait_clean=dict(type="dict", default={}, options=gate),
        wait_ready=dict(type="dict", options=_ready.ready_argspec()),
        keep_failed=dict(type="bool", default=False),
    )
    # With the systemd launcher the unit defines the command and its environment.
    spec["command"] = dict(type="list", elements="str")
    spec.update(
        launcher=dict(type="str", choices=["process", "systemd"], default="process"),
        systemd=dict(type="dict", options=dict(
            unit=dict(type="str", required=True),
            remove_dropins=dict(type="list", elements="path", default=[]),
        )),
        retire_unit=dict(type="dict", options=dict(
            unit=dict(type="str", required=True),
            files=dict(type="list", elements="path", required=True),
        )),
        stop_only=dict(type="bool", default=False),
    )
    spec.update(
        wait_busy=dict(type="dict", options=dict(
            min_processes=dict(type="int", default=1),
            timeout=dict(type="float", default=600.0),
            poll_interval=dict(type="float", default=0.05),
            idle_grace=dict(type="float", default=30.0),
        )),
        verify_env=dict(type="dict", options=dict(
            expected=dict(type="dict", required=True),
            nccl_log=dict(type="list", elements="path", default=[]),
            target=dict(type="str", choices=["workers", "all_selected"], default="workers"),
        )),
        record=dict(type="dict", options=dict(
            state_file=dict(type="path", required=True),
            fingerprint=dict(type="str", required=True),
            generations=dict(type="int", default=3),
            layers=dict(type="dict"),
        )),
        release_lock=dict(type="dict", options=dict(
            lock_file=dict(type="path", required=True),
            owner=dict(type="str", required=True),
            keep_on_failure=dict(type="bool", default=False),
        )),
        gate=dict(type="dict", options=_bench.argument_spec()),
        rollback=dict(type="bool", default=False),
        layers_previous=dict(type="path"),
        restore=dict(type="str"),
    )
    return spec


def _selector(p: t.Mapping[str, t.Any], **over: t.Any) -> t.Dict[str, t.Any]:
    """process_kill/process_env parameters: the selector's own defaults, this module's backend and excludes."""
    sel = {k: v.get("default") for k, v in _killmod.selector_argspec().items()}
    # Every selection of this cycle is this service's: another service's processes on the host (its launch tag) are
    # never taken, also by the adopt regex, the stray kill or a session (two services on one host).
    # The launch tag selects only the server's user's processes (and those of the process its pidfile names): anyone
    # can put the tag into a process's environment.
    sel.update(exclude_regex=p["kill"]["exclude_regex"], backend=p["backend"],
               service_tag="%s=%s" % (p["tag_name"], p["name"]), tag_users=[p["user"]])
    sel.update(over)
    return sel


def input_error(p: t.Mapping[str, t.Any]) -> t.Optional[str]:
    """Every input is checked before anything is read, killed or started."""
    err = restore_input_error(p)
    if err:
        return err
    if p["launcher"] == "systemd":
        if not p["systemd"]:
            return "launcher=systemd needs systemd.unit (the unit the caller installed)"
        if p["command"] or p["env"]:
            return "launcher=systemd: command and env belong to the unit, not to this call"
        if not p["systemd"]["unit"].endswith(".service") or "/" in p["systemd"]["unit"]:
            return "systemd.unit must be a service unit name such as gpufleet-sglang.service"
        bad = [d for d in p["systemd"]["remove_dropins"] if not _systemd.removable_dropin(d, p["systemd"]["unit"])]
        if bad:
            return "systemd.remove_dropins: %s: not a drop-in of %s alone under /etc or /run/systemd/system" % (
                ", ".join(bad), p["systemd"]["unit"])
    elif not p["stop_only"] and p["restore"] is None and (not p["command"] or not p["command"][0]):
        return "command must be a non-empty argument list"
    if p["retire_unit"] and (p["launcher"] != "process" or not p["retire_unit"]["unit"].endswith(".service")):
        return "retire_unit (a service unit name) is for launcher=process only"
    err = _server.launch_input_error(p) or (_gpumod.gate_input_error(p["wait_clean"]) if p["wait_clean"] else None)
    if err:
        return err
    r = p["wait_ready"]
    err = _ready.ready_input_error(r["health_url"], r["request"], r["timeout"], r["interval"]) if r else None
    if r and not err and r["log_tail_lines"] < 0:
        err = "log_tail_lines must be >= 0, got %s" % r["log_tail_lines"]
    if err:
        return "wait_ready: " + err
    err = _killmod.kill_input_error(p["kill"])
    if err:
        return "kill: " + err
    if p["record"] and p["record"]["generations"] < 0:
        return "record.generations must be >= 0, got %d" % p["record"]["generations"]
    if p["rollback"] and not p["record"]:
        return "rollback needs record (the last known good generations lie beside its state_file)"
    if p["gate"]:
        if p["stop_only"]:
            return "gate: a stop (stop_only) starts no server to measure"
        try:
            _bench.check_input(dict(p["gate"], baseline=None))
        except StepError as e:
            return "gate: %s" % e
    if not p["wait_ready"] and not p["stop_only"]:
        return "wait_ready: set health_url or request (a restart ends with a server that answers)"
    b = p["wait_busy"]
    if b and (b["timeout"] <= 0 or b["poll_interval"] <= 0 or b["min_processes"] < 1 or b["idle_grace"] <= 0):
        return "wait_busy: timeout, poll_interval and idle_grace must be > 0 and min_processes >= 1"
    if p["verify_env"]:
        try:
            _envcheck.normalize_expected(p["verify_env"]["expected"])
        except _envcheck.EnvCheckError as e:
            return "verify_env: %s" % e
    return None


def restore_input_error(p: t.Mapping[str, t.Any]) -> t.Optional[str]:
    """restore launches a last known good generation's definition in place of the caller's."""
    if p["restore"] is None:
        return None
    if not p["restore"].strip():
        return "restore must name a fingerprint (or a prefix of one) of a last known good generation"
    if p["command"] or p["env"]:
        return "restore: command and env are the generation's, not this call's"
    if not p["record"]:
        return "restore needs record (the last known good generations lie beside its state_file)"
    for opt in ("stop_only", "rollback", "gate"):
        if p[opt]:
            return ("restore: %s is not for a restore (the generation was measured when it was recorded, and there is "
                    "no other generation to fall back to)" % opt)
    return None


def restore_params(p: t.Dict[str, t.Any], step: Step) -> t.Dict[str, t.Any]:
    """With restore: the generation it names, before anything is stopped (StepError in phase preflight when this host
    has none such), and what the host runs now (the rollback's `from`). The module's parameters then launch, verify and
    record that generation: its command, environment, user, working directory, umask, fingerprint, NCCL layers and the
    environment its workers were verified against. `p` is updated in place."""
    lkg = _lastgood.path_for(p["record"]["state_file"])
    gens = _lastgood.read(lkg)
    try:
        g = _lastgood.find(gens, p["restore"])
        if g is None:
            raise _lastgood.TargetError("%s is not a last known good generation of this host (%s); known: %s"
                                        % (p["restore"], lkg, _lastgood.known(gens)))
        g = _lastgood.choose([g], None)  # the same checks as the rollback's choice: something to launch again
        if g.get("launcher") != p["launcher"]:
            raise _lastgood.TargetError("generation %s was launched by the %s launcher, not the %s launcher"
                                        % (str(g["fingerprint"])[:12], g.get("launcher"), p["launcher"]))
    except _lastgood.TargetError as e:
        raise StepError("restore: %s; nothing was stopped" % e, phase="preflight")
    if (g.get("tag_name") or p["tag_name"]) != p["tag_name"]:
        raise StepError("restore: generation %s was launched with the launch tag %s, not %s; nothing was stopped"
                        % (str(g["fingerprint"])[:12], g["tag_name"], p["tag_name"]), phase="preflight")
    previous = _lastgood.running_from_pidfile(_statefile.read_state(p["record"]["state_file"]), p["pidfile"],
                                              p["tag_name"], p["name"])
    if p["launcher"] == "process":
        p.update(command=list(g["command"]), env=dict(g.get("env") or {}),
                 env_passthrough=list(g.get("env_passthrough") or []), user=g.get("user") or "root",
                 workdir=g.get("workdir") or "/", umask=g.get("umask") or "0022")
    else:  # the unit's files: put back before the stop (run()), the unit then started as it was
        p["systemd"] = dict(p["systemd"], remove_dropins=[])
    refused = _layers.put_back_refusal(g.get("layers"), warn=step.warn, files=step.files)
    if refused:  # learnt after the kill, it would leave the host without a server (issue 24, two services on a host)
        raise StepError("restore: the NCCL layers of %s cannot be put back: %s" % (str(g["fingerprint"])[:12], refused),
                        phase="preflight")
    p["record"] = dict(p["record"], fingerprint=str(g["fingerprint"]), layers=g.get("layers"))
    p["wait_ready"] = _lastgood.ready_for(g, p["wait_ready"])
    if p["verify_env"]:
        p["verify_env"] = dict(p["verify_env"], expected=dict(g["expected_env"])) if g.get("expected_env") else None
    return {"generation": g, "previous": previous}


def _all_gpus(p: t.Mapping[str, t.Any]) -> t.List[int]:
    with _gpumod.backend_or_fail(p["backend"]) as backend:
        return _nvml.resolve_indices(backend, p["gpus"])


def _kill_step(step: Step, p: t.Mapping[str, t.Any], select_only: bool = False,
               **selector: t.Any) -> t.Dict[str, t.Any]:
    """A kill step of this cycle; with `select_only` (and in check mode) it only selects: nothing is signalled."""
    k = p["kill"]
    params = _selector(p, **selector)
    params.update(signals=k["signals"], grace=k["grace"], final_wait=k["final_wait"],
                  poll_interval=k["poll_interval"], order=k["order"], fail_on_survivor=True)
    return _killmod.run(params, Step(check_mode=step.check_mode or select_only))


def _old_server(p: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
    """The kill step's selectors: the launch tag, the pidfile, the adopt regex (a match holding GPUs, none of this
    server's gpus, is another server started by hand: left alone)."""
    return dict(tag="%s=%s" % (p["tag_name"], p["name"]), pidfile=p["pidfile"], cmdline_regex=p["kill"]["cmdline_regex"],
                adopt_gpus=list(p["gpus"] or []))


def _ending(step: Step, p: t.Mapping[str, t.Any]) -> t.Set[int]:
    """The pids the kill and the stray kill would end, selected now as check mode selects them (nothing signalled)."""
    steps = [_old_server(p)] + ([dict(gpu_holders=_all_gpus(p))] if p["kill"]["gpu_strays"] else [])
    return {x["pid"] for sel in steps for x in _kill_step(step, p, select_only=True, **sel)["processes"]}


def refuse_unended(step: Step, p: t.Mapping[str, t.Any]) -> None:
    """Before anything is stopped (and in check mode alike): a process holding the GPUs that neither the kill nor the
    stray kill would end fails the clean gate after the kill (it passes only when no process is listed), which would
    leave the host without its server. Such holders get the clean gate's timeout to go away by themselves (a process
    exiting, NVML polled at the gate's interval); a holder still there fails the cycle at once, nothing stopped.

    A holder the selection has not seen yet (the first reading, a worker the old server spawned since) is judged by
    selecting again; the others are only polled (a memory read costs ~7 us, a selection reads every process).
    A holder this pid namespace does not show (NVML's pid of a process in another namespace, one that exited) is left
    to the gate: whether the kill ends it cannot be told here."""
    gate = p["wait_clean"]
    t0 = time.monotonic()
    deadline = t0 + gate["timeout"]
    ending: t.Set[int] = set()
    judged: t.Set[int] = set()
    while True:
        with _gpumod.backend_or_fail(p["backend"]) as backend:
            indices = _nvml.resolve_indices(backend, p["gpus"])
            while True:
                gpus = _gpuwait.read_states(backend, indices)
                held = {pr["pid"] for g in gpus for pr in g["processes"]}
                now = time.monotonic()
                fresh = held - ending - judged
                if fresh or not _unended(held, ending) or now >= deadline:
                    break
                time.sleep(min(gate["poll_interval"], max(0.0, deadline - now)))
        if fresh and now < deadline + gate["timeout"]:  # (bounded: a host spawning GPU holders without end)
            judged |= held
            ending = _ending(step, p)
            continue
        break
    waited = round(time.monotonic() - t0, 4)
    unended = _unended(held, ending)
    stay = [h for h in _gpuwait.enrich_holders(gpus) if h["pid"] in unended]
    if not stay:
        return
    hint = holders_hint(p, sorted({h["pid"] for h in stay}))
    # The same words in check mode but the verb: check mode predicts the real run, which stops nothing either.
    raise StepError("%s at the clean gate, before the kill: GPUs not clean after %.1f s, held by processes the kill "
                    "would not end: %s; nothing was stopped%s" % (
                        "would fail" if step.check_mode else "fails", waited, _gpumod.holders_text(stay),
                        ". %s" % hint if hint else ""), phase="clean", before_kill=True, waited_s=waited, holders=stay)


def _unended(held: t.Set[int], ending: t.Set[int]) -> t.Set[int]:
    """The GPU holders no kill step would end, among those this pid namespace shows."""
    return {pid for pid in held - ending if os.path.exists("/proc/%d" % pid)}


def holders_hint(p: t.Mapping[str, t.Any], pids: t.Sequence[int]) -> str:
    """What to do about the processes still holding the GPUs after the kill, by what the kill saw in them. The usual
    first-rollout case is a server started by hand before gpufleet managed it (no launch tag): say how to take it over.
    The stray kill is suggested only for holders it would end: not another gpufleet service's, not an excluded one.
    Kept short: the rollout summary keeps a long failure's head and end, and the holders come before it."""
    if not pids:
        return ""
    procs = _proc.snapshot()
    excludes = p["kill"]["exclude_regex"]
    sel = _select.Selector(gpu_holder_pids=pids, include_descendants=False, include_groups=False,
                           exclude_regex=_select.DEFAULT_EXCLUDES if excludes is None else excludes)
    excluded = _select.select(sel, procs)["excluded"]
    services: t.Dict[int, str] = {}
    for pid in pids:
        if pid in excluded:  # whatever its tag: no kill ends it
            continue
        try:
            value = _proc.read_environ(pid, [p["tag_name"]]).get(p["tag_name"])
        except _proc.ProcError:
            value = None
        if value is not None:
            services[pid] = value
    strays = [pid for pid in pids if pid in procs and pid not in excluded and pid not in services]
    parts = []
    # This service's own tag on a process of another user: the kill leaves it alone (anyone can set the tag).
    foreign = sorted(pid for pid, v in services.items() if v == p["name"] and pid in procs and procs[pid].uid not in
                     server_uids(p))
    for pid in foreign:
        del services[pid]
    if foreign:
        parts.append("pid %s: this service's launch tag as user %s, not the server's user (%s): never killed, stop it "
                     "by hand" % (_pids(foreign), ", ".join(sorted({procs[x].user() for x in foreign})),
                                  ", ".join(sorted(_proc.user_name(u) for u in server_uids(p)))))
    if strays and not p["kill"]["gpu_strays"]:
        head = "None is gpufleet's" if len(strays) == len(pids) else "pid %s: no gpufleet service's" % _pids(strays)
        if p["kill"]["cmdline_regex"]:  # an adopt regex is set and does not match them (orphaned spawn workers)
            parts.append("%s and kill.cmdline_regex (gpufleet_server_adopt_cmdline_regex) does not match them: "
                         "kill.gpu_strays (gpufleet_server_kill_gpu_strays) ends them" % head)
        else:
            parts.append("%s: adopt a server started by hand with kill.cmdline_regex "
                         "(gpufleet_server_adopt_cmdline_regex), or kill.gpu_strays (gpufleet_server_kill_gpu_strays) "
                         "ends them" % head)
    run_dir = os.path.dirname(p["pidfile"]) if p.get("pidfile") else None
    for value in sorted(set(services.values())):
        mine = [pid for pid, v in services.items() if v == value]
        # Another service's tag on a process of a user that service's server does not run as (its pidfile in the run
        # dir): anyone can set a tag, and "stop that service first" would stop nothing (issue 24, new-user pass).
        forged = [pid for pid in mine if run_dir and pid in procs
                  and procs[pid].uid not in _layershare.service_uids(value, run_dir, procs)]
        if forged:
            parts.append("pid %s: the launch tag of service %s as user %s, and no %s server of that user runs from %s: "
                         "not that service's server; never killed for that tag, stop it by hand" % (
                             _pids(forged), value, ", ".join(sorted({procs[x].user() for x in forged})), value, run_dir))
        mine = [pid for pid in mine if pid not in forged]
        if not mine:
            continue
        # No kill of this service ends it (another service's launch tag is never selected): two definitions share GPUs.
        parts.append("pid %s: gpufleet service %s=%s, stop it first or give each service its own GPUs "
                     "(gpufleet_server_gpus)" % (_pids(mine), p["tag_name"], value))
    if excluded:
        parts.append("pid %s: never killed (%s), stop it by hand" % (
            _pids(sorted(excluded)), "; ".join(sorted(set(excluded.values())))))
    return "; ".join(parts)


def server_uids(p: t.Mapping[str, t.Any]) -> t.Set[int]:
    """The uids whose processes the launch tag selects: the server's user's, and that of the process its pidfile names
    (a server launched before gpufleet_server_user changed; the pidfile is gpufleet's, in the root-owned run dir)."""
    uids = set()
    try:
        uids.add(_select.uid_of(p["user"]))
    except _select.SelectError:  # the launch check names a missing user
        pass
    pid_uid = _statefile.pidfile_uid(p["pidfile"]) if p.get("pidfile") else None
    return uids if pid_uid is None else uids | {pid_uid}


def own_tagged(p: t.Mapping[str, t.Any], procs: t.Mapping[int, _proc.Proc]) -> t.List[_proc.Proc]:
    """The processes carrying this service's launch tag that run as the server's user (server_uids)."""
    uids = server_uids(p)
    return [pr for pid, pr in procs.items() if pr.uid in uids and _proc.environ_has(pid, p["tag_name"], p["name"])]


def _pids(pids: t.Iterable[int]) -> str:
    return ", ".join(str(x) for x in sorted(pids))


def preflight(p: t.Mapping[str, t.Any]) -> None:
    """What would fail after the kill, checked before it: a server that cannot be relaunched is never stopped."""
    launch = not p["stop_only"] and p["launcher"] == "process"
    env_path = (p["env"] or {}).get("PATH")
    problems = _server.restart_problems(restart_files(p), command=p["command"][0] if launch else None, user=p["user"],
                                        workdir=p["workdir"], path=str(env_path) if env_path else None,
                                        space=not p["stop_only"])
    if problems:
        raise StepError("cannot run this server, nothing was stopped: %s" % "; ".join(problems), phase="preflight",
                        launch_problems=problems)
    if not p["stop_only"]:
        _layershare.refuse_launch_onto_changing((p["tag_name"], p["name"]), os.path.dirname(p["pidfile"]))
    port_preflight(p)
    _gpumod.gpus_preflight(p)


def restart_files(p: t.Mapping[str, t.Any]) -> t.Dict[str, t.Optional[str]]:
    """The files the restart writes after its kill (_server.restart_files): a record that fails after a good launch
    leaves the host worse than before."""
    return _server.restart_files((p["record"] or {}).get("state_file"), p["pidfile"],
                                 (p["release_lock"] or {}).get("lock_file"), p["log_path"])


def launch_env(p: t.Mapping[str, t.Any], marked: bool) -> t.Dict[str, str]:
    """The launch's environment: the caller's, plus the fingerprint the launch is recorded under (FINGERPRINT_SUFFIX),
    so a later check can tell this server from the record's even when the record could not be written. Only when the
    record is marked unverified for this launch (`marked`): a launch that then fails its checks must not pass for
    a good one whose record failed."""
    env = _server.validate_env(p["env"])
    if p["record"] and marked:
        env[p["tag_name"] + _statefile.FINGERPRINT_SUFFIX] = p["record"]["fingerprint"]
    return env


def _ready_urls(p: t.Mapping[str, t.Any]) -> t.List[str]:
    r = p["wait_ready"] or {}
    return [r.get("health_url"), (r.get("request") or {}).get("url")]


def port_preflight(p: t.Mapping[str, t.Any]) -> None:
    """A process outside what the kill selects that listens on the server's port would answer its health URL while the
    new server dies on EADDRINUSE: fail before anything is stopped, naming it (never killed: it is not this service's).

    A listener that holds the server's GPUs itself or through its descendants is an old server started by hand: with
    kill.gpu_strays the stray kill ends what holds the GPUs (the runbook's way to take such a server over), so it
    passes; without, the failure says how to take it over."""
    if p["stop_only"] or not p["wait_ready"] or not p["wait_ready"]["check_listener"]:
        return
    refuse_foreign_listeners(p, _ready_urls(p))


def selection_params(name: str, tag_name: str, pidfile: t.Optional[str], gpus: t.Sequence[int], backend: str,
                     cmdline_regex: t.Optional[str], gpu_strays: bool, clean_timeout: float,
                     user: str) -> t.Dict[str, t.Any]:
    """The part of this module's parameters that the kill's selection and the clean gate's wait read (_old_server,
    _selector, _kill_step, refuse_unended), for server_state's check: it refuses what this cycle would refuse before
    its kill, before the drain, with this very code (refuse_foreign_listeners, refuse_unended). The exclude list is the
    kill's default one, as the gpu_server role passes none; how a kill signals is not read (nothing is signalled)."""
    kill = {k: v.get("default") for k, v in _killmod.signal_argspec().items()}
    kill.update(cmdline_regex=cmdline_regex, gpu_strays=gpu_strays, exclude_regex=None)
    gate = _gpumod.clean_gate_argspec()
    return dict(name=name, tag_name=tag_name, pidfile=pidfile, gpus=list(gpus or []), backend=backend, kill=kill, user=user,
                wait_clean=dict(timeout=clean_timeout, poll_interval=gate["poll_interval"]["default"]))


def refuse_foreign_listeners(p: t.Mapping[str, t.Any], urls: t.Sequence[str]) -> None:
    """port_preflight's test of `urls` (empty ones and repeats skipped); `p` needs only what selection_params gives."""
    selected: t.Optional[t.Set[int]] = None
    for url in [u for i, u in enumerate(urls) if u and u not in urls[:i]]:
        if selected is None:
            chosen, _procs = _killmod.select_or_fail(_selector(p, **_old_server(p)))
            selected = set(chosen["selected"])
        keep = selected
        res = _listener.port_holders(url, lambda pid, _procs: pid in keep, any_address=True)
        if not res["foreign"]:
            continue
        holding = _holds_server_gpus(p, [f["pid"] for f in res["foreign"]])
        if p["kill"]["gpu_strays"]:
            res["foreign"] = [f for f in res["foreign"] if f["pid"] not in holding]
            if not res["foreign"]:
                continue
        hint = ""
        if holding:
            hint = (" It holds the server's GPUs (a server started by hand?): adopt it with kill.cmdline_regex "
                    "(gpufleet_server_adopt_cmdline_regex), or kill.gpu_strays (gpufleet_server_kill_gpu_strays) ends "
                    "what holds them")
        addrs = sorted({str(f.get("address")) for f in res["foreign"]})
        targets = _listener.resolve(*_listener.url_endpoint(url))
        # An IPv6 wildcard socket takes IPv4 connections too unless it set IPV6_V6ONLY, which /proc does not show: the
        # refusal stays (the port may be taken), the reason says so (helper-39).
        reach = ("may reach it (an IPv6 wildcard socket takes IPv4 connections unless it set IPV6_V6ONLY, which /proc "
                 "does not show) instead of the new server" if "::" in addrs else "would reach it instead of the new server")
        if not any(_listener.serving(_listener.Listener(a, res["port"], 0, 0), targets) for a in addrs):
            # Bound to another address of the host than the URL's: requests to the URL do not reach it. The old server's
            # own sockets say where the new one binds: beside it on other addresses is fine (helper-49: a server on
            # 127.0.0.1 and another process on the host's address); without them (the old server not running), a
            # server that binds every address would fail with EADDRINUSE after the kill (helper-47).
            ours = res.get("ours_addresses") or []
            if ours and not any(_listener.binds_clash(o, a) for o in ours for a in addrs):
                continue
            reach = ("does not reach it, but the new server cannot listen on the port on %s while it does (EADDRINUSE)"
                     % " or ".join(sorted(ours)) if ours else
                     "does not reach it, but a new server that binds every address cannot listen on the port while it "
                     "does (EADDRINUSE; the old server, whose own sockets would say where it binds, is not listening: "
                     "for a server bound to another address, which runs beside it, set gpufleet_server_check_listener "
                     "false)")
        raise StepError("port %d of %s is held by %s, which is not this server's (the kill does not select it, "
                        "and it is never killed); it listens on %s, where %s %s. "
                        "Nothing was stopped: stop that process or give the server another port.%s"
                        % (res["port"], url, _listener.foreign_text(res), " or ".join(addrs), url, reach, hint),
                        phase="preflight", port_holders=res["foreign"])


def gpu_intruders(p: t.Mapping[str, t.Any]) -> t.Dict[int, t.List[str]]:
    """{GPU index: [holders]} of the server's GPUs held by a process that does not carry its launch tag (read once after
    the launch; the tag reaches every worker the server starts, spawn ones included)."""
    with _gpumod.backend_or_fail(p["backend"]) as backend:
        gpus = _gpuwait.read_states(backend, _nvml.resolve_indices(backend, p["gpus"]))
    out: t.Dict[int, t.List[str]] = {}
    procs: t.Optional[t.Mapping[int, _proc.Proc]] = None
    for g in gpus:
        for pr in g["processes"]:
            pid = int(pr["pid"])
            if _proc.environ_has(pid, p["tag_name"], p["name"]):
                continue
            procs = procs if procs is not None else _proc.snapshot()
            # Gone since NVML listed it, or not visible here (another pid namespace): not counted, as a restart failed
            # (and rolled back) on a process it cannot name would be worse than the audit's report of it.
            if pid in procs:
                out.setdefault(int(g["index"]), []).append(_listener.describe(pid, procs))
    return out


def _holds_server_gpus(p: t.Mapping[str, t.Any], pids: t.Sequence[int]) -> t.Set[int]:
    """Those of `pids` that hold one of the server's GPUs, themselves or through a descendant."""
    with _gpumod.backend_or_fail(p["backend"]) as backend:
        gpus = _gpuwait.read_states(backend, _nvml.resolve_indices(backend, p["gpus"]))
    holders = {pr["pid"] for g in gpus for pr in g["processes"]}
    procs = _proc.snapshot()
    return {pid for pid in pids if holders & ({pid} | _proc.descendants([pid], procs))}


@contextlib.contextmanager
def shielded(active: bool) -> t.Iterator[t.List[str]]:
    """Once the cycle starts it runs to its end (the docs' promise; a takeover waits for this process): ansible-playbook
    passes SIGTERM and Ctrl-C on to its workers' process groups (os.killpg), and with the local connection this module
    is in one; an ssh hang-up sends SIGHUP. The signals that come meanwhile are noted (yielded list), not obeyed.
    Handlers, not SIG_IGN: an ignored signal would stay ignored in the server this cycle execs, a handler does not."""
    got: t.List[str] = []
    if not active:
        yield got
        return
    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    before = {s: signal.getsignal(s) for s in sigs}
    for s in sigs:
        signal.signal(s, lambda signum, _frame: got.append(signal.Signals(signum).name))
    try:
        yield got
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def run(p: t.Dict[str, t.Any], step: Step, result: t.Dict[str, t.Any],
        restore: t.Optional[t.Mapping[str, t.Any]] = None) -> None:
    """Run the cycle, filling `result` as it goes; raises StepError (with `phase`) at the first failing step. With
    `restore` (restore_params()), the parameters are a last known good generation's: its NCCL layers are put back after
    the clean gate, and its record keeps its measurement and makes it the newest generation again."""
    gate = dict(p["wait_clean"], gpus=p["gpus"], backend=p["backend"])
    timings = result["timings"]
    t0 = time.monotonic()
    result["phase"] = "preflight"
    preflight(p)
    # The host's last known good measurement, read before this launch marks the record unverified.
    baseline = (_bench.gate_baseline(_statefile.read_state(p["record"]["state_file"]).get("gate"), p["gate"])
                if p["gate"] and p["record"] else None)
    if p["release_lock"] and not step.check_mode:
        # If the controller dies now, this cycle still runs to its end here; a takeover waits for this process.
        me = _proc.read_proc(os.getpid())
        if me is not None:
            _hostlock.mark_lock(p["release_lock"]["lock_file"], p["release_lock"]["owner"], (me.pid, me.start_time))
    # The old server's processes that the kill ended; a failed restart's summary shows from it that the old server is
    # gone. Counted as ended, not as signalled: with the launcher first, its workers usually exit with it, unsignalled.
    result["killed"] = 0
    # A server is never stopped onto GPUs the gate after the kill is sure to refuse (check mode the same).
    result["phase"] = "clean"
    refuse_unended(step, p)
    # Before the first signal: the preflight, the clean gate's look at the GPUs and the lock mark (the restart's own
    # overhead before the server stops; docs/gpu-run.md breaks the restart task down by these timings).
    timings["preflight_s"] = round(time.monotonic() - t0, 4)

    result["phase"] = "kill"
    # The tag finds every worker, orphans reparented to PID 1 included; the pidfile and an adopted command line
    # find a server started before gpufleet managed it.
    if p["launcher"] == "systemd":
        if restore:
            # The generation's unit files, before the stop's daemon-reload: the start below runs them.
            result["unit_restored"] = [f["path"] for f in restore["generation"]["systemd_files"]]
            if not step.check_mode:
                try:
                    _systemd.put_back(restore["generation"]["systemd_files"])
                except OSError as e:
                    raise StepError("cannot put back the unit's files of %s: %s; nothing was stopped"
                                    % (str(restore["generation"]["fingerprint"])[:12], e), phase="preflight") from None
        _systemd_stop(step, p, result)
    elif p["retire_unit"]:
        _retire_unit(step, p, result)
    # With systemd, what its stop left: processes outside the unit's cgroup (none, normally).
    res = _kill_step(step, p, **_old_server(p))
    result["kill"] = res
    result["changed"] = result["changed"] or res["changed"]
    if not step.check_mode:  # nothing was signalled: no time to report (a 0.00 would read as a kill)
        result["killed"] += ended(res)
        timings["kill_s"] = round(timings.get("kill_s", 0.0) + res["elapsed_s"], 4)

    if p["kill"]["gpu_strays"]:
        result["phase"] = "strays"
        res = _kill_step(step, p, gpu_holders=_all_gpus(p))
        result["strays"] = res
        result["changed"] = result["changed"] or res["changed"]
        if not step.check_mode:
            result["killed"] += ended(res)

    if step.check_mode:  # the GPUs were judged before the kill (refuse_unended)
        if restore and restore["generation"].get("layers"):
            result["layers_restored"] = _restore_layers(step, restore["generation"])  # what would change
        if p["stop_only"]:
            would = result["changed"] or (result.get("unit") or {}).get("ActiveState") in ("active", "activating")
            result.update(changed=would, would_stop=would)
        else:
            result.update(changed=True, would_launch=True)
            if p["gate"] and not restore:  # said, not sent: what the gate would measure and against what
                result["gate"] = _bench.gate_plan(p["gate"], baseline)
        result.pop("phase")
        return

    result["phase"] = "clean"
    try:
        result["clean"] = _gpumod.wait_or_fail(gate)
    except StepError as e:
        hint = holders_hint(p, [h["pid"] for h in e.details.get("holders") or []])
        if not hint:
            raise
        raise StepError("%s. %s" % (e, hint), **e.details) from None
    timings["clean_s"] = result["clean"]["waited_s"]
    if p["stop_only"]:
        if remove_stale_pidfile(p["pidfile"]):
            result.update(pidfile_removed=True, changed=True)
        result.pop("phase")
        return

    marked = False
    if p["record"]:
        try:
            _statefile.mark_unverified(p["record"]["state_file"])
            marked = True
        except OSError:
            pass  # the record step, which must write the same file, reports it

    result["phase"] = "launch"
    if restore and restore["generation"].get("layers"):
        # The generation's NCCL layers, once its predecessor is gone and before its launch reads them.
        result["layers_restored"] = _restore_layers(step, restore["generation"])
    r = p["wait_ready"]
    tail_since = _server.log_stamp(r["log_tail_path"]) if r["log_tail_path"] else None
    t_launch = time.monotonic()
    t_launch_epoch = time.time()
    if p["launcher"] == "systemd":
        proc = _systemd_start(step, p, r, tail_since)
    else:
        try:
            proc = _server.start(p["name"], p["command"], launch_env(p, marked), p["env_passthrough"],
                                 p["user"], p["workdir"], p["log_path"], p["pidfile"], p["tag_name"], p["umask"])
        except _server.ServerError as e:
            raise StepError("launch of %s failed: %s" % (p["name"], e))
    result.update(changed=True, pid=proc.pid, start_time=proc.start_time)
    timings["launch_s"] = result["launch_s"] = round(time.monotonic() - t_launch, 4)

    result["phase"] = "ready"
    launched = (proc.pid, proc.start_time)
    try:
        result["ready"] = _ready.wait_ready(launched, r["health_url"], r["request"], r["timeout"],
                                            r["interval"], p["log_path"], r["log_tail_lines"], r["log_tail_path"],
                                            tail_since, tag=(p["tag_name"], p["name"]),
                                            check_listener=r["check_listener"])
    except _server.ServerError as e:
        msg = str(e)
        if p["launcher"] == "systemd" and e.details.get("phase") == "startup":
            # systemd's word first: the summary keeps a message's first 400 characters.
            head, sep, tail = msg.partition("; log tail")
            msg = head + _systemd_end(step, p["systemd"]["unit"], t_launch_epoch) + sep + tail
        # The new server serves nobody: stopped (unless kept for debugging) before the failure is reported.
        left = stop_failed(step, p, result, gate)
        raise StepError("%s. %s" % (msg, left["text"]), **dict(e.details, new_server=left))
    timings["ready_s"] = result["ready"]["ready_s"]
    # From the first signal to the server answering its real request.
    timings["cycle_s"] = round(time.monotonic() - t0, 3)
    assumed = (result["ready"].get("listener") or {}).get("assumed")
    if assumed:
        step.warn("readiness: %s" % assumed)

    if p["wait_busy"]:
        result["phase"] = "busy"
        result["busy"] = wait_busy(p, launched)
        timings["busy_s"] = result["busy"]["waited_s"]

    # The GPUs the server was launched onto hold only its own processes: one that took a GPU between the clean gate and
    # the launch (a watcher starting a job when the old server died) shares it with the new server unseen (helper-47:
    # the host was reported ok and the server recorded as last known good; the next audit said "GPUs held by 1
    # process(es) without this server's launch tag").
    result["phase"] = "verify_gpus"
    foreign = gpu_intruders(p)
    if foreign:
        raise StepError("after the launch, %s, not this server's (no %s=%s in its environment): another process took "
                        "the GPU between the clean gate and the launch, and the new server shares it with that process"
                        % ("; ".join("GPU %s is held by %s" % (g, ", ".join(foreign[g])) for g in sorted(foreign)),
                           p["tag_name"], p["name"]),
                        gpu_intruders={str(g): v for g, v in foreign.items()})

    if p["verify_env"]:
        result["phase"] = "verify_env"
        t_verify = time.monotonic()
        v = p["verify_env"]
        params = _selector(p, tag="%s=%s" % (p["tag_name"], p["name"]), exclude_regex=None)
        params.update(expected=v["expected"], target=v["target"], nccl_log=v["nccl_log"], allow_empty=False,
                      require_confirmed=False)
        result["env"] = _envcheck.run(params)
        timings["verify_env_s"] = round(time.monotonic() - t_verify, 4)

    if p["gate"]:
        # After every other check, before the record: a server that answers and carries the tuning but is slower
        # than this host's last known good (its record's measurement of the same benchmark) fails the host.
        result["phase"] = "gate"
        t_gate = time.monotonic()
        result["gate"] = _bench.gate(p["gate"], baseline)
        timings["gate_s"] = round(time.monotonic() - t_gate, 3)

    if p["record"]:
        result["phase"] = "record"
        kept = {"key", "metric", "median", "rounds", "url"}
        measured = dict({k: v for k, v in result["gate"].items() if k in kept},
                        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z")) if result.get("gate") else None
        if restore and isinstance(restore["generation"].get("gate"), dict):
            # The generation's own measurement is the baseline again (the newer one's was of what it rolled back from).
            measured = {k: v for k, v in restore["generation"]["gate"].items() if k != "fingerprint"}
        try:
            _changed, result["state"] = _statefile.record_state(p["record"]["state_file"], p["name"],
                                                                p["record"]["fingerprint"], p["pidfile"], timings,
                                                                gate=measured)
        except OSError as e:
            # The server is up and verified; only the record is missing. The launch carries the fingerprint
            # (launch_env), so the next check sees this server as up to date and rewrites the record instead of
            # restarting it (server_state's check), once the unverified mark is gone.
            keeps = marked and p["launcher"] == "process"  # the launch carries the fingerprint (launch_env)
            if keeps:
                try:
                    _statefile.drop_record(p["record"]["state_file"])
                except OSError:
                    keeps = False  # the mark stays: the next run restarts the server, as before
            if keeps and p["record"]["generations"] > 0 and not restore:
                # The server passed every check: its generation waits beside the pidfile until the check that writes
                # the record again keeps it (otherwise a later rollback would go back past this verified server).
                try:
                    _lastgood.keep_pending(p["pidfile"], _lastgood.generation(
                        p, p["record"]["fingerprint"], measured, p["record"]["layers"]),
                        p["record"]["generations"], (proc.pid, proc.start_time))
                except OSError as e2:
                    step.warn("the last known good definition could not be put aside in %s either: %s"
                              % (_lastgood.pending_path(p["pidfile"]), e2.strerror or e2))
            raise StepError("the server was restarted and verified (pid %d), but its record could not be written: %s; %s"
                            % (proc.pid, e.strerror or e,
                               "the next run keeps this server and writes the record once there is room" if keeps
                               else "the next run restarts it (nothing on the host tells it from an unverified launch)"),
                            path=p["record"]["state_file"])
        try:
            _lastgood.drop_pending(p["pidfile"])  # one put aside for an earlier launch: this record supersedes it
        except OSError:
            pass
        if p["record"]["generations"] > 0 or restore:
            # The server passed every check and is recorded: it is this host's newest last known good (a restored
            # generation again, with its own record, the file noting the rollback).
            lkg = _lastgood.path_for(p["record"]["state_file"])
            try:
                result["last_good"] = _lastgood.summary(
                    _lastgood.restored(lkg, p["record"]["fingerprint"], restore["previous"]) if restore else
                    _lastgood.keep(lkg, _lastgood.generation(p, p["record"]["fingerprint"], measured,
                                                             p["record"]["layers"], unit_files(step, p)),
                                   p["record"]["generations"]))
            except OSError as e:  # the server is up, verified and recorded: a warning, not a failed host
                step.warn("the last known good definitions could not be written to %s: %s" % (lkg, e.strerror or e))
    result.pop("phase")


def unit_files(step: Step, p: t.Mapping[str, t.Any]) -> t.Optional[t.List[t.Dict[str, str]]]:
    """With the systemd launcher, the files of the unit systemd runs now (_systemd.definition_files), for the last
    known good generation of a verified server; None for the process launcher, or (said in a warning) when they
    cannot be read: that generation is then kept without them, and no rollback goes back to it."""
    if p["launcher"] != "systemd":
        return None
    try:
        return _systemd.definition_files(_runner(step), p["systemd"]["unit"])
    except (_systemd.SystemdError, OSError, UnicodeDecodeError) as e:
        step.warn("the files of %s could not be read for its last known good generation (a rollback cannot go back "
                  "to it): %s" % (p["systemd"]["unit"], e))
        return None


# Not a parameter: the drop-ins the systemd stop removed, as they were (the stop puts them here, a rollback puts them
# back). Kept in the parameters' dict, the one mutable thing the cycle's steps share (restore_params updates it too).
REMOVED_DROPINS = "_removed_dropins"

# Failures after the kill that a rollback answers: the new server never served, or was slower than the last known good.
ROLLBACK_PHASES = ("launch", "ready", "busy", "verify_gpus", "verify_env", "gate")


def _restore_layers(step: Step, g: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
    """Put back the NCCL layers a generation was launched with (what would change, in check mode)."""
    res = _layers.apply(dict(g["layers"], backup=False), Step(check_mode=step.check_mode, warn=step.warn, files=step.files))
    return {"changed": bool(res.get("changed")), "layers": sorted(k for k in ("sitecustomize", "nccl_conf") if k in res)}


def run_or_roll_back(p: t.Dict[str, t.Any], step: Step, result: t.Dict[str, t.Any]) -> None:
    """run(); with O(rollback), a failure after the kill goes back to this host's last known good generation (read
    before the kill) and still fails, saying so (StepError with `rolled_back`). With O(restore), the cycle launches the
    generation it names instead of the caller's definition (a rollback by hand). The module's one entry point:
    `p` its parameters, `step` the rest (Step.of(module): check mode, warnings, file operations, commands)."""
    if p["restore"]:
        result["phase"] = "preflight"
        restore = restore_params(p, step)
        g = restore["generation"]
        result["restore"] = {"fingerprint": g["fingerprint"], "recorded_at": g.get("recorded_at"),
                             "previous": restore["previous"]}
        run(p, step, result, restore)
        return
    target, gens = None, []
    if p["rollback"] and p["record"] and not step.check_mode and not p["stop_only"] \
            and p["record"]["generations"] > 0:
        try:
            _lastgood.promote_running_pending(p["pidfile"], p["record"]["state_file"], p["tag_name"], p["name"])
        except OSError as e:  # the rollback goes back to what the file holds
            step.warn("the last known good generation put aside in %s could not be kept: %s"
                      % (_lastgood.pending_path(p["pidfile"]), e.strerror or e))
        gens = _lastgood.read(_lastgood.path_for(p["record"]["state_file"]))
        target = _lastgood.rollback_target(gens, p["record"]["fingerprint"], p["launcher"])
    try:
        run(p, step, result)
    except StepError as e:
        if result.get("phase") not in ROLLBACK_PHASES:
            raise
        # keep_failed keeps the failed server for debugging instead of going back; when nothing of it is left to keep
        # (it died at start-up), the host goes back to its last known good as without it.
        kept = p["keep_failed"] and bool(own_tagged(p, _proc.snapshot()))
        if target is None or kept:
            why = "keep_failed keeps the failed server instead" if kept else no_rollback_reason(p, gens)
            if why:  # asked for and not done: said, not silent (the host is left as the failure says)
                raise StepError("%s (no rollback: %s)" % (e, why), **e.details) from None
            raise
        roll_back(p, step, result, target, e)
    drop_layers_snapshot(p, step)


def no_rollback_reason(p: t.Mapping[str, t.Any], gens: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    """Why O(rollback) did not go back after a failure past the kill ('' when it was not asked for)."""
    if not p["rollback"] or not p["record"] or p["stop_only"]:
        return ""
    if p["record"]["generations"] <= 0:
        return "record.generations is 0, no last known good is kept (gpufleet_server_last_good_generations)"
    if not gens:
        return "this host has no last known good generation yet"
    newest = str(gens[0].get("fingerprint"))[:12]
    if gens[0].get("launcher") != p["launcher"]:
        return "its newest last known good %s was launched by the %s launcher, not the %s launcher" % (
            newest, gens[0].get("launcher"), p["launcher"])
    if p["launcher"] == "systemd" and gens[0].get("fingerprint") != p["record"]["fingerprint"] \
            and not _lastgood.relaunchable(gens[0]):
        return ("its newest last known good %s does not hold its unit's files (recorded before gpufleet kept them, or "
                "they could not be read then)" % newest)
    gone = _lastgood.missing_paths(gens[0])
    if gens[0].get("fingerprint") != p["record"]["fingerprint"] and gone:
        return ("its newest last known good %s names %s, which no longer exist%s"
                % (str(gens[0].get("fingerprint"))[:12], ", ".join(gone), "s" if len(gone) == 1 else ""))
    if gens[0].get("fingerprint") == p["record"]["fingerprint"]:
        return ("its newest last known good is this very definition (%s), which just failed: going back to it would "
                "launch it again (what failed it lies outside the definition: on the host, or in the expected "
                "environment or the gate)" % str(gens[0].get("fingerprint"))[:12])
    return "its newest last known good generation holds no command to launch again"


def drop_layers_snapshot(p: t.Mapping[str, t.Any], step: Step) -> None:
    """The restart passed: this run's snapshot of the NCCL layers (O(layers_previous)) is of no more use; only a restart
    refused before its kill puts the layers back from it (the role's rescue)."""
    path = p.get("layers_previous")
    if not path or step.check_mode:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:  # left for the next run's nccl_layers call, which drops it before it keeps its own
        step.warn("cannot remove the NCCL layers' snapshot %s: %s" % (path, e.strerror or e))


def restore_layers_for_rollback(p: t.Mapping[str, t.Any], step: Step, g: t.Mapping[str, t.Any]) -> bool:
    """Undo this run's writes to the NCCL layers (O(layers_previous): each file as it was before the run, a file the
    run created removed), then apply the generation's layers. Returns whether the layers now differ from what they
    were before the run (the summary's nccl_changed): after the undo they are as they were, so only the generation's
    apply can have changed them."""
    snapshot = p.get("layers_previous")
    if snapshot:
        _envblock.restore_previous(snapshot)  # drops the snapshot too
    if not g.get("layers"):
        return False
    # The module is the file operations (atomic moves); without them a layer that differs cannot be written.
    return bool(_layers.apply(dict(g["layers"], backup=False), Step(warn=step.warn, files=step.files)).get("changed"))


def roll_back(p: t.Dict[str, t.Any], step: Step, result: t.Dict[str, t.Any], g: t.Mapping[str, t.Any],
              cause: StepError) -> None:
    """Stop what is left of the failed new server, put back the generation's NCCL layers, launch its definition, wait
    until it is ready, verify its workers against what they were verified against then, and record it. Always raises:
    the host failed its restart either way (the rollout halts), and the message says which way."""
    fp = str(g["fingerprint"])
    why = str(cause)
    gate = dict(p["wait_clean"], gpus=p["gpus"], backend=p["backend"])
    r = _lastgood.ready_for(g, p["wait_ready"])  # where the generation answered, not the failed definition's URL
    proc = None
    try:
        left = (cause.details.get("new_server") or {}) if result["phase"] == "ready" else {}
        if not left.get("stopped") or left.get("error"):
            left = stop_failed(step, p, result, gate)
            if left.get("error"):
                raise StepError(left["text"])
        layers_changed = restore_layers_for_rollback(p, step, g)
        tail_since = _server.log_stamp(r["log_tail_path"]) if r["log_tail_path"] else None
        if p["launcher"] == "systemd":
            # The unit's files as they were when the generation passed (the failed restart rewrote them), then the
            # unit as systemd starts it.
            try:
                # The generation's unit file and environment file; of the drop-ins, those this run removed, as they
                # were when it removed them (the operator's, edited since the generation or made after it).
                removed = [x for x in p.get(REMOVED_DROPINS) or []
                           if x["path"] in (result.get("dropins_removed") or [])]
                restored = _systemd.put_back([x for x in g["systemd_files"] if not _systemd.is_dropin(str(x["path"]))]
                                             + removed, dropins=[x["path"] for x in removed])
                result["unit_restored"] = restored
                _systemd.daemon_reload(_runner(step))
            except _systemd.SystemdError as e:
                raise StepError("cannot put back the unit's files: %s" % e) from None
            proc = _systemd_start(step, p, r, tail_since)
        else:
            env = _server.validate_env(g.get("env") or {})
            env[p["tag_name"] + _statefile.FINGERPRINT_SUFFIX] = fp  # the record below could fail: the launch says what it is
            proc = _server.start(p["name"], g["command"], env, g.get("env_passthrough") or [], g.get("user") or "root",
                                 g.get("workdir") or "/", p["log_path"], p["pidfile"], p["tag_name"],
                                 g.get("umask") or "0022")
        _ready.wait_ready((proc.pid, proc.start_time), r["health_url"], r["request"], r["timeout"], r["interval"],
                          p["log_path"], r["log_tail_lines"], r["log_tail_path"], tail_since,
                          tag=(p["tag_name"], p["name"]), check_listener=r["check_listener"])
        if p["wait_busy"]:
            # As after the new server's launch: its workers may answer before they hold the GPUs, and the check below
            # looks at the GPU holders (without the wait, a loaded host failed the rollback at "none holds a GPU").
            wait_busy(p, (proc.pid, proc.start_time))
        verified = 0
        if p["verify_env"] and g.get("expected_env"):
            params = _selector(p, tag="%s=%s" % (p["tag_name"], p["name"]), exclude_regex=None)
            params.update(expected=dict(g["expected_env"]), target=p["verify_env"]["target"], nccl_log=[],
                          allow_empty=False, require_confirmed=False)
            verified = len(_envcheck.run(params).get("processes") or [])
        _statefile.record_state(p["record"]["state_file"], p["name"], fp, p["pidfile"], {})
    except (StepError, _server.ServerError, OSError) as e:
        if proc is not None:
            stop_failed(step, p, result, gate)  # the rollback's server serves nobody either
        result["rollback_failed"] = {"fingerprint": fp, "error": str(e)}
        # Both reasons, the rollback's (short) first: the summary keeps a long failure's head and end, and the new
        # server's own cause is at the end of its message (its log tail).
        err = str(e) if len(str(e)) <= 300 else str(e)[:297] + "..."
        raise StepError("the rollback to the last known good %s failed too (%s); the new server failed: %s"
                        % (fp[:12], err, why),
                        **cause.details) from None
    result["rolled_back"] = {"fingerprint": fp, "pid": proc.pid, "workers_verified": verified,
                             "recorded_at": g.get("recorded_at"),
                             "nccl_changed": layers_changed}
    new_server = cause.details.get("new_server") or {}
    stopped = new_server.get("text")
    if stopped and why.endswith(stopped):
        # Said when the failed server was stopped (or found gone), before the rollback: the host serves again now.
        now = ("The failed new server was %s; the last known good (pid %d) serves in its place"
               % ("stopped" if new_server.get("processes", 1) else "not running any more", proc.pid))
        why = why[:-len(stopped)] + now
        cause.details["new_server"] = dict(new_server, text=now)  # the result says what the message says
    raise StepError("rolled back to the last known good %s (recorded %s): %s" % (fp[:12], g.get("recorded_at"), why),
                    **cause.details)


def stop_failed(step: Step, p: t.Mapping[str, t.Any], result: t.Mapping[str, t.Any],
                gate: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
    """After a start-up or readiness failure: stop what is left of the new server (it serves nobody and holds the
    GPUs), then verify the GPUs clean, unless keep_failed asks to keep it for debugging. Returns what was left, with a
    sentence in the docs' terms (docs/runbook.md, "The new server failed its readiness") for the failure message."""
    alive = sorted(pr.pid for pr in own_tagged(p, _proc.snapshot()))
    if p["keep_failed"]:
        # kept: something of it runs (the summary's "failed new server kept"); a launcher that died kept nothing.
        return {"kept": bool(alive), "stopped": False, "processes": len(alive), "text": (
            "The failed new server was kept for debugging (keep_failed): %d process(es) of it (pid %s) still run and "
            "hold its GPUs, serving nobody; stop it by hand when done (runbook: The new server failed its readiness)"
            % (len(alive), result.get("pid")) if alive else
            "Nothing of the failed new server is left running (keep_failed had nothing to keep); the host is not serving")}
    out: t.Dict[str, t.Any] = {"kept": False, "stopped": False, "processes": len(alive)}
    try:
        if p["launcher"] == "systemd":
            _systemd_bounded_stop(step, p)
        kill = _kill_step(step, p, tag="%s=%s" % (p["tag_name"], p["name"]), pidfile=p["pidfile"])
        out.update(stopped=True, killed=ended(kill))
        out["clean"] = _gpumod.wait_or_fail(gate)
    except (StepError, _systemd.SystemdError) as e:
        out["error"] = str(e)
        out["text"] = ("The failed new server could not be stopped cleanly: %s; the host is not serving (runbook: The new "
                       "server failed its readiness)" % e)
        return out
    what = "stopped (%d process(es) ended)" % out["killed"] if out["killed"] else "not running any more"
    out["text"] = ("The failed new server was %s and its GPUs are clean: nothing of this service runs on the host, "
                   "which is not serving" % what)
    return out


def _gpu_list(indices: t.Sequence[int]) -> str:
    return ", ".join(str(i) for i in indices)


def wait_busy(p: t.Mapping[str, t.Any], launched: t.Tuple[int, int]) -> t.Dict[str, t.Any]:
    """Wait until each GPU of `gpus` lists wait_busy.min_processes processes, while the launcher lives.

    Fails at once when the launcher dies, and early (wait_busy.idle_grace seconds, not the whole timeout) when the
    server's own processes hold some of the GPUs and the others stay idle: a ready server has loaded its model, so a GPU
    it has not taken by then is one it does not use (a tp-1 server with gpus unset on a 2-GPU host: issue 24, item 10).
    The failure names the idle GPUs and the ones the server holds, and suggests the gpus to set."""
    b = p["wait_busy"]
    t0 = time.monotonic()
    deadline = t0 + b["timeout"]
    polls = 0
    since, last_held = t0, None
    with _gpumod.backend_or_fail(p["backend"]) as backend:
        indices = _nvml.resolve_indices(backend, p["gpus"])
        if not indices:
            raise StepError("gpus: this host has no GPUs, so there is nothing to wait for", backend=backend.name)
        while True:
            gpus = _gpuwait.read_states(backend, indices)
            polls += 1
            now = time.monotonic()
            reading = {"state": "busy", "waited_s": round(now - t0, 4), "polls": polls, "gpus": gpus,
                       "backend": backend.name}
            idle = [g["index"] for g in gpus if not _gpuwait.gpu_busy(g, b["min_processes"], 0)]
            if not idle:
                reading["holders"] = _gpuwait.enrich_holders(gpus)
                return reading
            if not _proc.is_alive(launched):
                status = _ready.exit_status(launched[0])
                raise StepError("server process %d exited%s after it was ready, while waiting for its GPUs to be busy; "
                                "log: %s" % (launched[0], " (%s)" % status if status else "", p["log_path"]),
                                **dict(reading, holders=_gpuwait.enrich_holders(gpus)))
            procs = _proc.snapshot()
            tree = {launched[0]} | _proc.descendants([launched[0]], procs)
            held = sorted(g["index"] for g in gpus if any(
                pr["pid"] in tree or _proc.environ_has(pr["pid"], p["tag_name"], p["name"]) for pr in g["processes"]))
            if held != last_held:
                since, last_held = now, held
            early = bool(held) and now - since >= b["idle_grace"]
            if early or now >= deadline:
                used = ", ".join("GPU %d %s MiB used" % (g["index"], g["used_mib"]) for g in gpus)
                if held:
                    why = ("GPU %s stayed idle %.1f s after the server was ready while its processes hold GPU %s; if the "
                           "server uses only GPU %s, set gpus (gpufleet_server_gpus) to [%s] (unset means every GPU "
                           "of the host)" % (_gpu_list(idle), now - since, _gpu_list(held), _gpu_list(held),
                                             _gpu_list(held)))
                else:
                    why = ("no GPU is held by a process of the server (idle or below %d process(es): GPU %s); check "
                           "that the server runs on GPUs and gpus (gpufleet_server_gpus) names the ones it uses"
                           % (b["min_processes"], _gpu_list(idle)))
                raise StepError("GPUs not busy after %.1f s (%s): %s" % (now - t0, used, why),
                                **dict(reading, holders=_gpuwait.enrich_holders(gpus), idle=idle, held=held))
            time.sleep(min(b["poll_interval"], max(0.0, deadline - now)))


def _runner(step: Step) -> _systemd.Runner:
    def run(argv: t.List[str]) -> t.Tuple[int, str, str]:
        return step.run_command(argv)
    return run


def _systemd_stop(step: Step, p: t.Mapping[str, t.Any], result: t.Dict[str, t.Any]) -> None:
    """Stop the unit through systemd (TERM to its main process, TimeoutStopSec, KILL of its cgroup)."""
    unit = p["systemd"]["unit"]
    run = _runner(step)
    try:
        props = _systemd.show(run, unit)
        result["unit"] = {k: props[k] for k in ("LoadState", "ActiveState", "MainPID")}
        if step.check_mode:
            return
        # As the operator had them: a rollback puts back these, not an older generation's copies.
        p[REMOVED_DROPINS] = _systemd.snapshot(p["systemd"]["remove_dropins"])
        removed = _systemd.remove_dropins(p["systemd"]["remove_dropins"], unit)
        if removed:
            result.update(dropins_removed=removed, changed=True)
        # The unit file the caller wrote (and one restored behind systemd's back): this stop already uses its
        # TimeoutStopSec, the start its command.
        _systemd.daemon_reload(run)
        procs = _proc.snapshot()
        tagged = own_tagged(p, procs)
        t0 = time.monotonic()
        if _systemd_bounded_stop(step, p):
            result["stop_escalated"] = True
        stop_s = time.monotonic() - t0
    except _systemd.SystemdError as e:
        raise StepError("%s: %s" % (unit, e), **e.details)
    gone = sum(1 for pr in tagged if not _proc.is_alive((pr.pid, pr.start_time)))
    result["killed"] = gone
    result["changed"] = result["changed"] or gone > 0
    result["timings"]["kill_s"] = round(stop_s, 4)


# Beyond the grace (the unit's TimeoutStopSec, which the role sets to it), what systemd's own stop may take to send
# SIGKILL and reap: a stop is bounded by their sum whatever the unit's drop-ins set (TimeoutStopSec=infinity).
STOP_MARGIN_S = 5.0


def _systemd_bounded_stop(step: Step, p: t.Mapping[str, t.Any]) -> bool:
    """Stop the unit within the kill grace and a margin (then SIGKILL of its cgroup): True when it came to that."""
    unit = p["systemd"]["unit"]
    escalated = _systemd.stop(_runner(step), unit, bound=p["kill"]["grace"] + STOP_MARGIN_S,
                              final_wait=max(p["kill"]["final_wait"], 1.0))
    if escalated:
        step.warn("%s did not stop within gpufleet_server_kill_grace (%.0f s) and %.0f s more (a drop-in setting "
                  "TimeoutStopSec?): its whole cgroup was sent SIGKILL" % (unit, p["kill"]["grace"], STOP_MARGIN_S))
    return escalated


def _retire_unit(step: Step, p: t.Mapping[str, t.Any], result: t.Dict[str, t.Any]) -> None:
    """The process launcher runs the server now: a unit the systemd launcher left must not start it at boot."""
    ru = p["retire_unit"]
    present = [f for f in ru["files"] if os.path.lexists(f)]
    if not present:
        return
    result["unit_retired"] = present
    result["changed"] = True
    if step.check_mode:
        return
    try:
        _systemd.retire(_runner(step), ru["unit"], present)
    except (_systemd.SystemdError, OSError) as e:
        raise StepError("cannot retire %s: %s" % (ru["unit"], e))


def _systemd_end(step: Step, unit: str, since: float) -> str:
    """How systemd saw the unit's main process end, and its journal lines since the start, for a failure message."""
    run = _runner(step)
    try:
        status = _systemd.exit_status(_systemd.show(run, unit))
    except _systemd.SystemdError:
        status = ""
    journal = " | ".join(ln.strip() for ln in _systemd.journal_tail(run, unit, since).splitlines()[-2:] if ln.strip())
    return "; systemd: %s; journal (journalctl -u %s): %s" % (status or "no exit status", unit, journal or "(empty)")


def _systemd_start(step: Step, p: t.Mapping[str, t.Any], r: t.Mapping[str, t.Any],
                   tail_since: t.Optional[_server.LogStamp]) -> _proc.Proc:
    """`systemctl start`, then the unit's main pid as the launcher (written to the pidfile, as the process launcher
    does)."""
    unit = p["systemd"]["unit"]
    run = _runner(step)
    since = time.time()
    t0 = time.monotonic()
    try:
        # The launch line in the log systemd appends to: a failure's log tail starts there, not at an older launch.
        _server.write_launch_line(p["log_path"], "systemctl start %s" % unit)
        _systemd.start(run, unit)
        pid = _systemd.main_pid(_systemd.show(run, unit))
    except (_systemd.SystemdError, OSError) as e:
        raise StepError("launch of %s failed: %s%s" % (unit, e, _systemd_end(step, unit, since)),
                        **getattr(e, "details", {}))
    proc = _proc.read_proc(pid) if pid else None
    if proc is None:
        tail, where = _server.failure_tail(p["log_path"], r["log_tail_lines"], r["log_tail_path"], tail_since)
        last = " | ".join(ln.strip() for ln in tail.splitlines()[-3:]
                          if ln.strip() and not ln.startswith(_server.LAUNCH_LINE))[-300:]
        raise StepError("%s exited during start-up after %.1f s%s; log tail (%s): %s"
                        % (unit, time.monotonic() - t0, _systemd_end(step, unit, since), where, last or "(empty)"),
                        phase="startup", log_tail=tail)
    _statefile.write_pidfile(p["pidfile"], proc)
    return proc


def remove_stale_pidfile(path: str) -> bool:
    """After a stop (the clean playbook), the pidfile is this service's and names a process that is gone: left behind,
    it would name whatever process reuses the pid. Removed then (True). A pidfile naming a live process (one the kill
    did not take for the server: no launch tag), or not in the 'PID START_TIME' form a launch writes, is left to the
    next run's checks."""
    ident = _statefile.pidfile_identity(path)
    if ident is None or _proc.is_alive(ident):  # no 'PID START_TIME' of gpufleet's (or none at all), or alive
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def ended(kill: t.Mapping[str, t.Any]) -> int:
    """Processes a kill step selected that are gone after it (signalled, or ended with their launcher)."""
    return len(kill.get("processes") or []) - len(kill.get("survivors") or [])


def release(p: t.Mapping[str, t.Any], result: t.Dict[str, t.Any], check_mode: bool, failed: bool = False) -> None:
    """Release the host lock at the end of the cycle; a failed one keeps it with `keep_on_failure`: the caller puts
    things back under it (the role: the NCCL layers after a refusal before the kill, the host into rotation) and then
    releases it, instead of another run taking the lock in between."""
    rl = p["release_lock"]
    if not rl or check_mode:
        return
    if failed and rl.get("keep_on_failure"):
        result["lock_released"] = False
        return
    result["lock_released"] = _hostlock.release_lock(rl["lock_file"], rl["owner"])


# Where a failing step's own result goes in the module's result (the others' details go to the top level).
STEP_KEYS = {"kill": "kill", "strays": "strays", "clean": "clean", "busy": "busy", "verify_env": "env"}


def fail_result(result: t.Dict[str, t.Any], e: StepError) -> t.Dict[str, t.Any]:
    out = dict(result)
    phase = out.pop("phase", None)
    details = dict(e.details)
    key = STEP_KEYS.get(phase or "")
    if key:
        out[key] = details
    else:
        out.update(details)
    if phase in ("kill", "strays"):
        # A kill step that failed on survivors still signalled the others (only a real kill can fail so).
        out["killed"] = out.get("killed", 0) + ended(details)
        if phase == "kill" and "elapsed_s" in details:
            out["timings"] = dict(out.get("timings") or {}, kill_s=details["elapsed_s"])
    out["phase"] = details.get("phase") or phase
    # The host's verified workers for the rollout summary (the gpu_server role's rescue): after a kill, those this
    # restart verified (only the performance gate and the record come after the verify), else none; a restart refused before its kill
    # leaves the count out, so the check's stands (the old server still serves).
    if out.get("killed", 0) > 0 or out["phase"] in ("record", "gate"):
        verified = out["phase"] in ("record", "gate")  # only the gate and the record come after the verify
        out["workers_verified"] = len((out.get("env") or {}).get("processes") or []) if verified else 0
    if out.get("rolled_back"):
        out["workers_verified"] = out["rolled_back"]["workers_verified"]  # the last known good's, now serving
    return out
