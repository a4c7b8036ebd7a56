# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""The last known good definitions of a service on its host (issue 26): after a restart passed every check (ready,
the workers' environment, the performance gate) and was recorded, what it runs is kept as the newest generation of
STATE.last_good.json, beside the state file and, like it, root-only (0600): the server's environment values are
secrets. A rollback (by hand today, automatic later) relaunches a generation from it."""

from __future__ import annotations

import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _server

# What a generation keeps of server_restart's parameters (the systemd launcher's command and environment are its
# unit's, which the unit name names).
DEFINITION_KEYS = ("launcher", "command", "env", "env_passthrough", "user", "workdir", "umask", "tag_name")


def path_for(state_file: str) -> str:
    """STATE.json -> STATE.last_good.json (any other name gets the suffix appended)."""
    base = state_file[:-len(".json")] if state_file.endswith(".json") else state_file
    return base + ".last_good.json"


def generation(p: t.Mapping[str, t.Any], fingerprint: str, gate: t.Optional[t.Mapping[str, t.Any]],
               layers: t.Optional[t.Mapping[str, t.Any]]) -> t.Dict[str, t.Any]:
    """One generation from server_restart's parameters: the definition, the NCCL layers this run applied (as the
    caller passed them) and the gate's measurement."""
    g: t.Dict[str, t.Any] = {k: p.get(k) for k in DEFINITION_KEYS}
    g.update(fingerprint=fingerprint, recorded_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             systemd_unit=(p.get("systemd") or {}).get("unit"), layers=dict(layers) if layers else None,
             gate=dict(gate) if gate else None,
             # What its workers' environment was verified against, for the verify after a rollback to it.
             expected_env=dict((p.get("verify_env") or {}).get("expected") or {}))
    return g


def rollback_target(gens: t.Sequence[t.Mapping[str, t.Any]], desired: str,
                    launcher: str) -> t.Optional[t.Dict[str, t.Any]]:
    """The generation a failed restart of `desired` goes back to: the newest, unless it is the definition that just
    failed (then there is nothing better to go back to). The process launcher only (a systemd unit's definition is its
    files, which a generation does not hold)."""
    if not gens:
        return None
    g = dict(gens[0])
    if g.get("fingerprint") == desired or launcher != "process" or g.get("launcher") != "process":
        return None
    if not isinstance(g.get("command"), list) or not g["command"]:
        return None
    return g


def read(path: str) -> t.List[t.Dict[str, t.Any]]:
    """The generations, newest first ([] when there is no file, or it cannot be read as one)."""
    data = _server.read_state(path)
    gens = data.get("generations") if isinstance(data, dict) else None
    return [g for g in gens if isinstance(g, dict)] if isinstance(gens, list) else []


def keep(path: str, new: t.Mapping[str, t.Any], generations: int) -> t.List[t.Dict[str, t.Any]]:
    """Put `new` first (an older generation with its fingerprint gives way to it) and keep `generations` of them;
    written atomically, 0600. Returns what the file holds now."""
    gens = [dict(new)] + [g for g in read(path) if g.get("fingerprint") != new.get("fingerprint")]
    gens = gens[:max(generations, 0)]
    _server.write_json_atomic(path, {"generations": gens}, _server.STATE_MODE)
    return gens


def summary(gens: t.Sequence[t.Mapping[str, t.Any]]) -> t.List[t.Dict[str, t.Any]]:
    """What a result may show of the generations: no definition (its environment values are secret)."""
    return [{"fingerprint": g.get("fingerprint"), "recorded_at": g.get("recorded_at"),
             "gate_median": (g.get("gate") or {}).get("median")} for g in gens]
