# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""The last known good definitions of a service on its host (issue 26): after a restart passed every check (ready,
the workers' environment, the performance gate) and was recorded, what it runs is kept as the newest generation of
STATE.last_good.json, beside the state file and, like it, root-only (0600): the server's environment values are
secrets. A rollback relaunches a generation from it: automatically after a failed restart (server_restart's rollback,
the newest generation), or by hand (the rollback playbook: server_state's check chooses the generation with choose(),
server_restart's restore launches it and marks it restored())."""

from __future__ import annotations

import os
import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _proc, _statefile

# The shortest fingerprint prefix that names a generation by hand (the rollout summary and the audit show 12
# characters).
MIN_PREFIX = 12


class TargetError(Exception):
    """No generation to roll back to, or not the one asked for: said before anything is stopped."""


# What a generation keeps of server_restart's parameters (the systemd launcher's command and environment are its
# unit's, which the unit name names).
DEFINITION_KEYS = ("launcher", "command", "env", "env_passthrough", "user", "workdir", "umask", "tag_name")


def path_for(state_file: str) -> str:
    """STATE.json -> STATE.last_good.json (any other name gets the suffix appended)."""
    base = state_file[:-len(".json")] if state_file.endswith(".json") else state_file
    return base + ".last_good.json"


def argv_paths(command: t.Any) -> t.List[str]:
    """The absolute paths a command's arguments name (`/opt/serve.py`, `--model-path=/models/x`), its executable
    aside (the launch's own check finds that): what must still be there for a generation to run again."""
    out: t.List[str] = []
    for a in (command or [])[1:] if isinstance(command, list) else []:
        a = str(a)
        v = a.split("=", 1)[1] if a.startswith("-") and "=" in a else a
        if v.startswith("/") and v not in out:
            out.append(v)
    return out


def missing_paths(g: t.Mapping[str, t.Any]) -> t.List[str]:
    """The files or directories the generation's arguments named when it was recorded that are gone now."""
    kept = g.get("paths")
    return [x for x in kept if isinstance(x, str) and not os.path.exists(x)] if isinstance(kept, list) else []


def generation(p: t.Mapping[str, t.Any], fingerprint: str, gate: t.Optional[t.Mapping[str, t.Any]],
               layers: t.Optional[t.Mapping[str, t.Any]],
               systemd_files: t.Optional[t.Sequence[t.Mapping[str, t.Any]]] = None) -> t.Dict[str, t.Any]:
    """One generation from server_restart's parameters: the definition, the NCCL layers this run applied (as the
    caller passed them) and the gate's measurement. With the systemd launcher, the definition is the unit's files as
    systemd ran them (_systemd.definition_files: unit, its own drop-ins, its environment file)."""
    g: t.Dict[str, t.Any] = {k: p.get(k) for k in DEFINITION_KEYS}
    g.update(fingerprint=fingerprint, recorded_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             systemd_unit=(p.get("systemd") or {}).get("unit"), layers=dict(layers) if layers else None,
             systemd_files=[dict(f) for f in systemd_files] if systemd_files else None,
             gate=dict(gate) if gate else None,
             # What its workers' environment was verified against, for the verify after a rollback to it.
             expected_env=dict((p.get("verify_env") or {}).get("expected") or {}),
             # The paths its arguments named that existed when it passed: a rollback checks they still do.
             paths=[x for x in argv_paths(p.get("command")) if os.path.exists(x)],
             # Where it answered its health check and real request: a new definition may serve on another port.
             ready={k: (p.get("wait_ready") or {}).get(k) for k in READY_KEYS})
    return g


# What a generation keeps of server_restart's wait_ready: the URL and request it passed with (the timeouts and the log
# are the run's own).
READY_KEYS = ("health_url", "request")


def ready_for(g: t.Mapping[str, t.Any], current: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
    """wait_ready for a relaunch of generation `g`: its own health URL and request where it recorded them (a generation
    recorded before gpufleet kept them is waited for at the current ones)."""
    kept = g.get("ready") if isinstance(g.get("ready"), dict) else {}
    return dict(current, **{k: kept[k] for k in READY_KEYS if kept.get(k)})


def pending_path(pidfile: str) -> str:
    """RUN_DIR/NAME.pid -> RUN_DIR/NAME.last_good-pending.json: a verified server's generation whose record could not be
    written (a full state filesystem). It lives beside the pidfile, on another filesystem than the state file as a
    rule (/run is a tmpfs), until the check that writes the record again (server_state's rerecord) keeps it."""
    base = pidfile[:-len(".pid")] if pidfile.endswith(".pid") else pidfile
    return base + ".last_good-pending.json"


def keep_pending(pidfile: str, new: t.Mapping[str, t.Any], generations: int, launcher: t.Tuple[int, int]) -> None:
    """Put a generation aside until its record can be written (0600, atomically): `launcher` is the verified
    launcher's (pid, start time), which the rerecord must find running for the generation to count."""
    _statefile.write_json_atomic(pending_path(pidfile), {"generation": dict(new), "generations": generations,
                                                         "launcher": list(launcher)}, _statefile.STATE_MODE)


def drop_pending(pidfile: str) -> None:
    """Forget a generation put aside (none there is fine)."""
    try:
        os.unlink(pending_path(pidfile))
    except FileNotFoundError:
        pass


def _read_pending(pidfile: str, launcher: t.Optional[t.Tuple[int, int]]) -> t.Optional[t.Dict[str, t.Any]]:
    """The generation put aside for this launcher (pid and start time: a reused pid is another process) as
    {generation, generations}; None when there is none, or it was put aside for another launcher. One reading for
    both of its users (rerecord and the promotion before a restart)."""
    if launcher is None:
        return None
    data = _statefile.read_state(pending_path(pidfile))
    g = data.get("generation") if isinstance(data, dict) else None
    if not isinstance(g, dict) or data.get("launcher") != list(launcher):
        return None
    n = data.get("generations")
    return {"generation": g, "generations": n if isinstance(n, int) and n > 0 else 1}


def pending_for(pidfile: str, fingerprint: str,
                launcher: t.Optional[t.Tuple[int, int]]) -> t.Optional[t.Dict[str, t.Any]]:
    """The generation put aside for this definition and this launcher as {generation, generations}; None when there is
    none. A pending file of another definition or launcher is left as it is (a later launch's to replace): only what
    was verified counts."""
    pending = _read_pending(pidfile, launcher)
    if pending is None or pending["generation"].get("fingerprint") != fingerprint:
        return None
    return pending


def promote(pidfile: str, state_file: str, pending: t.Mapping[str, t.Any]) -> t.List[t.Dict[str, t.Any]]:
    """Make a generation put aside (pending_for / _read_pending) the newest last known good, then forget it: the file
    is dropped only once the generations are written. Returns the generations."""
    gens = keep(path_for(state_file), pending["generation"], pending["generations"])
    drop_pending(pidfile)
    return gens


def promote_running_pending(pidfile: str, state_file: str, tag_name: str, name: str) -> t.Optional[t.List[t.Dict[str, t.Any]]]:
    """Before a restart that may roll back: a generation put aside for the server that runs now (its launcher, by pid
    and start time, alive and carrying the launch tag) becomes the newest last known good, whatever definition the
    restart brings (its record failed on a full disk; the rerecord only keeps it for the same definition). Returns
    the generations, None when there was nothing to keep. Called under the host lock."""
    ident = _statefile.pidfile_identity(pidfile)
    if ident is None or not _proc.is_alive(ident) or not _proc.environ_has(ident[0], tag_name, name):
        return None
    pending = _read_pending(pidfile, ident)
    return None if pending is None else promote(pidfile, state_file, pending)


def relaunchable(g: t.Mapping[str, t.Any]) -> bool:
    """Whether the generation holds a definition to launch again: a process launcher's command, or the systemd
    launcher's unit files (a generation recorded before they were kept has none)."""
    if g.get("launcher") == "systemd":
        files = g.get("systemd_files")
        return isinstance(files, list) and bool(files) and all(isinstance(f, dict) and f.get("path") for f in files)
    return g.get("launcher") == "process" and isinstance(g.get("command"), list) and bool(g["command"])


def rollback_target(gens: t.Sequence[t.Mapping[str, t.Any]], desired: str,
                    launcher: str) -> t.Optional[t.Dict[str, t.Any]]:
    """The generation a failed restart of `desired` goes back to: the newest, unless it is the definition that just
    failed (then there is nothing better to go back to), was launched by the other launcher (the restart that failed
    already moved the server off it), or cannot be launched again (relaunchable(), the paths its arguments named)."""
    if not gens:
        return None
    g = dict(gens[0])
    if g.get("fingerprint") == desired or g.get("launcher") != launcher or not relaunchable(g) or missing_paths(g):
        return None
    return g


def read_file(path: str) -> t.Dict[str, t.Any]:
    """The file's `generations` (newest first, [] when there is no file or it cannot be read as one) and
    `rolled_back`, the last rollback by hand ({from, to, at}; None when there is none)."""
    data = _statefile.read_state(path)
    data = data if isinstance(data, dict) else {}
    gens = data.get("generations")
    marker = data.get("rolled_back")
    return {"generations": [g for g in gens if isinstance(g, dict)] if isinstance(gens, list) else [],
            "rolled_back": dict(marker) if isinstance(marker, dict) else None}


def read(path: str) -> t.List[t.Dict[str, t.Any]]:
    """The generations, newest first ([] when there is no file, or it cannot be read as one)."""
    return read_file(path)["generations"]


def keep(path: str, new: t.Mapping[str, t.Any], generations: int) -> t.List[t.Dict[str, t.Any]]:
    """Put `new` first (an older generation with its fingerprint gives way to it, but its `recorded_at` stays: when the
    definition first passed on the host, as restored() keeps it too) and keep `generations` of them; written
    atomically, 0600. Returns what the file holds now. A rollback by hand is forgotten once another definition becomes
    the newest generation (the host was rolled forward); the same definition restarted keeps it."""
    cur = read_file(path)
    new = dict(new)
    first = [g.get("recorded_at") for g in cur["generations"] if g.get("fingerprint") == new.get("fingerprint")]
    if first and first[0]:
        new["recorded_at"] = first[0]
    gens = [new] + [g for g in cur["generations"] if g.get("fingerprint") != new.get("fingerprint")]
    gens = gens[:max(generations, 0)]
    data: t.Dict[str, t.Any] = {"generations": gens}
    if cur["rolled_back"] and cur["rolled_back"].get("to") == new.get("fingerprint"):
        data["rolled_back"] = cur["rolled_back"]
    _statefile.write_json_atomic(path, data, _statefile.STATE_MODE)
    return gens


def restored(path: str, fingerprint: str, previous: t.Optional[str]) -> t.List[t.Dict[str, t.Any]]:
    """After a rollback by hand relaunched the generation of `fingerprint` and verified it: it is the host's newest last
    known good again (first, with `restored_at`; its `recorded_at` stays when it was first recorded, and the others
    keep their order), and the file remembers the rollback (`rolled_back`: from `previous`, what ran before, to it), so
    running the rollback again is a no-op (choose()). Written atomically, 0600; returns the generations."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    gens = read(path)
    mine = [dict(g, restored_at=now) for g in gens if g.get("fingerprint") == fingerprint]
    gens = mine[:1] + [g for g in gens if g.get("fingerprint") != fingerprint]
    _statefile.write_json_atomic(path, {"generations": gens, "rolled_back": {"from": previous, "to": fingerprint,
                                                                             "at": now}}, _statefile.STATE_MODE)
    return gens


def find(gens: t.Sequence[t.Mapping[str, t.Any]], fingerprint: str) -> t.Optional[t.Dict[str, t.Any]]:
    """The generation named by `fingerprint`: the whole fingerprint, or a prefix of at least MIN_PREFIX characters that
    only one generation has. None when none has it; TargetError when the prefix is too short or names several."""
    fingerprint = fingerprint.strip()
    exact = [g for g in gens if g.get("fingerprint") == fingerprint]
    if exact:
        return dict(exact[0])
    if len(fingerprint) < MIN_PREFIX:
        raise TargetError("%r is not a fingerprint of a last known good generation of this host and too short for a "
                          "prefix of one (at least %d characters, as the summary and the audit show them); known: %s"
                          % (fingerprint, MIN_PREFIX, known(gens)))
    hits = [g for g in gens if str(g.get("fingerprint") or "").startswith(fingerprint)]
    if len(hits) > 1:
        raise TargetError("%s names %d last known good generations of this host; give more of the fingerprint: %s"
                          % (fingerprint, len(hits), known(hits)))
    return dict(hits[0]) if hits else None


def known(gens: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    """The generations as a message names them: fingerprint (12 characters) and when each was recorded."""
    return ", ".join("%s (recorded %s)" % (str(g.get("fingerprint") or "?")[:MIN_PREFIX], g.get("recorded_at") or "?")
                     for g in gens) or "none"


def choose(gens: t.Sequence[t.Mapping[str, t.Any]], running: t.Optional[str], to: str = "",
           rolled_back: t.Optional[t.Mapping[str, t.Any]] = None, path: str = "") -> t.Dict[str, t.Any]:
    """The generation a rollback by hand goes to (TargetError, said before anything is stopped, when there is none).

    `to` (a fingerprint, or a prefix of one) names it; otherwise it is the newest generation whose fingerprint differs
    from `running` (what the host runs now: after a passing rollout the newest generation is the running one, so this
    is the one before it; a host that runs no verified server goes back to the newest). A host this file says was
    rolled back by hand to what it runs (`rolled_back`) stays there: running the rollback again is a no-op, not a
    step back to the definition it was rolled back from (name that one in `to`). The result may be the running one
    (nothing to do). A generation with nothing to launch again (relaunchable(): a systemd generation recorded before
    gpufleet kept the unit's files) is refused."""
    where = " (%s)" % path if path else ""
    if not gens:
        raise TargetError("this host has no last known good generation%s: gpufleet keeps one per definition that "
                          "passed every check of a rollout (gpufleet_server_last_good_generations), and none was kept "
                          "here yet; nothing to roll back to" % where)
    if to:
        g = find(gens, to)
        if g is None:
            raise TargetError("%s is not a last known good generation of this host%s; known: %s"
                              % (to, where, known(gens)))
    elif running and rolled_back and rolled_back.get("to") == running and find_exact(gens, running):
        g = find_exact(gens, running)
    else:
        older = [x for x in gens if x.get("fingerprint") != running]
        if not older:
            raise TargetError("this host has no last known good generation other than the one it runs (%s)%s: nothing "
                              "to roll back to" % (known(gens), where))
        g = dict(older[0])
    if not relaunchable(g):
        raise TargetError("the last known good generation %s holds nothing to launch again (%s); roll out that "
                          "definition instead" % (str(g.get("fingerprint"))[:MIN_PREFIX],
                                                  "it was recorded before gpufleet kept a systemd unit's files"
                                                  if g.get("launcher") == "systemd" else "no command"))
    return g


def find_exact(gens: t.Sequence[t.Mapping[str, t.Any]], fingerprint: str) -> t.Optional[t.Dict[str, t.Any]]:
    return next((dict(g) for g in gens if g.get("fingerprint") == fingerprint), None)


def running_from_pidfile(state: t.Mapping[str, t.Any], pidfile: str, tag_name: str, name: str) -> t.Optional[str]:
    """running_fingerprint() of the launcher the pidfile names (confirmed by the launch tag, as the kill confirms it)."""
    ident = _statefile.pidfile_identity(pidfile)
    confirmed = ident is not None and _proc.is_alive(ident) and _proc.environ_has(ident[0], tag_name, name)
    return running_fingerprint(state, ident or (None, None), tag_name, confirmed)


def running_fingerprint(state: t.Mapping[str, t.Any], launcher: t.Tuple[t.Any, t.Any], tag_name: str,
                        confirmed: bool) -> t.Optional[str]:
    """The fingerprint of the definition the host runs now: the one its launcher carries (a process launch carries
    its fingerprint, _statefile.FINGERPRINT_SUFFIX), else the record's when the launcher (`confirmed`: it carries the
    launch tag) is the verified launch on record; None when no verified server of a known definition runs."""
    if not confirmed or launcher[0] is None:
        return None
    key = tag_name + _statefile.FINGERPRINT_SUFFIX
    try:
        carried = _proc.read_environ(int(launcher[0]), [key]).get(key)
    except _proc.ProcError:
        carried = None
    if carried:
        return carried
    if state.get("verified") is False or not state.get("fingerprint"):
        return None
    if state.get("pid") is not None and (state.get("pid"), state.get("start_time")) != tuple(launcher):
        return None
    return str(state["fingerprint"])


def summary(gens: t.Sequence[t.Mapping[str, t.Any]]) -> t.List[t.Dict[str, t.Any]]:
    """What a result may show of the generations: no definition (its environment values are secret)."""
    return [{"fingerprint": g.get("fingerprint"), "recorded_at": g.get("recorded_at"),
             "gate_median": (g.get("gate") or {}).get("median")} for g in gens]
