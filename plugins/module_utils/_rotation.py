# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""gpufleet's own drains of a host (rotation_record): which balancer entry it took the host out of, the state it found
the server in, when and in which run. A balancer's own state cannot tell an operator's MAINT (or a wrong worker URL)
from the drain of an earlier failed run of gpufleet; this record can."""

from __future__ import annotations

import json
import os
import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _statefile

# As the server's state file: root only (the record names the balancers and the run).
RECORD_MODE = _statefile.STATE_MODE


class RecordError(Exception):
    pass


def read(path: str) -> t.Dict[str, t.Dict[str, t.Any]]:
    """{balancer name: entry}; {} when there is no record. A record that is not what gpufleet writes is an error: a
    drain must never be taken for an operator's (or the other way round) on a guess."""
    if os.path.isdir(path):
        raise RecordError("%s is a directory, not a gpufleet drain record" % path)
    try:
        data = _statefile.read_state(path)
    except OSError as e:
        raise RecordError("cannot read %s: %s" % (path, e))
    # Valid JSON that is not what gpufleet writes ([], a number, other keys, an entry that is not an object) is not a
    # record either: overwriting it, or dropping the entry, would lose what someone else keeps there.
    drains = data.get("drains", {}) if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("corrupt") or set(data) - {"drains"} or not isinstance(drains, dict) \
            or not all(isinstance(v, dict) for v in drains.values()):
        raise RecordError("%s is not a gpufleet drain record (move it away once the host's balancers are checked)" % path)
    # Its fields as gpufleet writes them: a state found (text) and, where there, text for the rest. A number where the
    # state should be made the put-back fail after it took the host out again (helper-38).
    for k, v in drains.items():
        if not isinstance(v.get("found"), str) or not v["found"] or not all(
                isinstance(v.get(f), str) for f in ("server", "run", "at") if v.get(f) is not None):
            raise RecordError("%s is not a gpufleet drain record (its entry %s has no state found, or fields that are not "
                              "text; move it away once the host's balancers are checked)" % (path, str(k)[:40]))
    return {str(k): dict(v) for k, v in drains.items()}


def stale(records: t.Mapping[str, t.Mapping[str, t.Any]], known: t.Sequence[str]) -> t.List[str]:
    """One line for each drain the record keeps of a balancer entry the host no longer has (its entry removed or
    renamed in gpufleet_server_balancers since a run took the host out of it): no rollout puts the host back there."""
    # The server the record names, not "the host": a record made from an entry copied from another host's variables
    # names that host's server, which is the one to put back (helper-40).
    return ["drain record: gpufleet took server %s out of balancer entry %s (run %s at %s), and the host no longer has "
            "that entry in gpufleet_server_balancers, so no rollout puts it back there: put that server back into that "
            "balancer by hand (or give the entry back its name), then remove %s from the record"
            % (r.get("server") or "?", name, r.get("run") or "?", r.get("at") or "?", name)
            for name, r in sorted(records.items()) if name not in set(known)]


def add(path: str, balancer: str, entry: t.Mapping[str, t.Any], keep: bool = True,
        check_mode: bool = False, records: t.Optional[t.Dict[str, t.Dict[str, t.Any]]] = None,
        ) -> t.Tuple[bool, t.Dict[str, t.Dict[str, t.Any]]]:
    """Record that gpufleet takes the host out of `balancer`. With `keep`, an entry already there stays as it is: it
    says what an earlier run found before it drained the host (what the host goes back to), which this run cannot see
    any more. Without (the server was found in rotation: the host was put back by hand since), it is replaced.
    `records`: the record as this call already read (and added to) it; read from `path` when None."""
    records = dict(read(path) if records is None else records)
    if balancer in records and keep:
        if not check_mode:
            _statefile.restrict_mode(path, RECORD_MODE)
        return False, records
    records[balancer] = dict(entry, at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    if not check_mode:
        _statefile.write_json_atomic(path, {"drains": records}, RECORD_MODE)
    return True, records


def clear(path: str, balancers: t.Sequence[str],
          check_mode: bool = False) -> t.Tuple[bool, t.Dict[str, t.Dict[str, t.Any]]]:
    """Remove the entries of `balancers` (the host is back in service there); the file goes when none is left."""
    records = read(path)
    left = {k: v for k, v in records.items() if k not in balancers}
    if left == records:
        return False, records
    if not check_mode:
        if left:
            _statefile.write_json_atomic(path, {"drains": left}, RECORD_MODE)
        else:
            os.unlink(path)
    return True, left


def render(records: t.Mapping[str, t.Mapping[str, t.Any]]) -> str:
    """The record as --diff shows it: what the file holds, or nothing when there is no file."""
    return json.dumps({"drains": records}, indent=2, sort_keys=True) + "\n" if records else ""
