# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Parse NCCL's own record of the variables it read (NCCL_DEBUG=INFO).

NCCL logs a variable when it first reads it, as
  ``HOST:PID:TID [DEV] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS``
Integer parameters end with a period (``NCCL_BUFFSIZE set by environment to 16777216.``), and an
unparsable one is logged as ``Invalid value X for NCCL_Y, using default Z.``. Values that NCCL took
from /etc/nccl.conf or NCCL_CONF_FILE are logged the same way (NCCL setenv()s them first), which makes
the log the only proof for the nccl.conf layer. Launchers prefix lines (mpirun ``[1,0]<stdout>:``,
torchrun ``[default0]:``, vLLM ``(VllmWorker rank=0 pid=N)``), so the pattern is searched, not anchored.
A variable is only logged when NCCL reads it: a size-1 communicator never reads NCCL_PROTO/NCCL_ALGO.
"""

from __future__ import annotations

import glob
import re
import typing as t

_PREFIX = r"(?:(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) (?:\[[^\]]*\] )?)?NCCL INFO "
SET_RE = re.compile(_PREFIX + r"(?P<name>[A-Z][A-Z0-9_]*) set by environment to (?P<value>.*?)\s*$")
INVALID_RE = re.compile(_PREFIX + r"Invalid value (?P<value>.*) for (?P<name>[A-Z][A-Z0-9_]*), using default (?P<default>.*?)\s*$")
_INT_RE = re.compile(r"[+-]?\d+")


class Entry(t.NamedTuple):
    pid: t.Optional[int]
    name: str
    value: str  # as NCCL logged it, trailing integer period removed
    invalid: bool  # NCCL rejected the value and used its default
    line: int
    path: str


def _clean(value: str) -> str:
    value = value.strip()
    if value.endswith(".") and _INT_RE.fullmatch(value[:-1].strip()):
        return value[:-1].strip()
    return value


def parse_text(text: str, path: str = "<log>") -> t.List[Entry]:
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        if "NCCL INFO" not in raw:
            continue
        m = SET_RE.search(raw)
        invalid = False
        if m is None:
            m = INVALID_RE.search(raw)
            invalid = m is not None
        if m is None:
            continue
        pid = int(m.group("pid")) if m.group("pid") else None
        out.append(Entry(pid, m.group("name"), _clean(m.group("value")), invalid, n, path))
    return out


def parse_files(paths: t.Sequence[str]) -> t.Tuple[t.List[Entry], t.List[str]]:
    """Entries of all readable files, and notes about the files that could not be read."""
    entries: t.List[Entry] = []
    notes: t.List[str] = []
    expanded: t.List[str] = []
    for p in paths:
        # NCCL_DEBUG_FILE=/var/log/nccl.%h.%p writes a file per process: accept shell globs.
        if glob.has_magic(p):
            hits = sorted(glob.glob(p))
            if not hits:
                notes.append("no NCCL log matches %s" % p)
            expanded.extend(hits)
        else:
            expanded.append(p)
    for p in expanded:
        try:
            with open(p, "rb") as f:
                text = f.read().decode("utf-8", "replace")
        except OSError as e:
            notes.append("cannot read NCCL log %s: %s" % (p, e.strerror or e))
            continue
        entries.extend(parse_text(text, p))
    return entries, notes


def _num(v: str) -> t.Optional[int]:
    """Parse like C strtoll(v, NULL, 0), which NCCL uses: 0x hex, leading-0 octal, else decimal."""
    s = v.strip()
    sign = -1 if s.startswith("-") else 1
    s = s.lstrip("+-")
    try:
        if s[:2].lower() == "0x":
            return sign * int(s[2:], 16)
        if len(s) > 1 and s.startswith("0"):
            return sign * int(s[1:], 8)
        return sign * int(s, 10)
    except ValueError:
        return None


def same_value(expected: str, logged: str) -> bool:
    if expected == logged:
        return True
    a, b = _num(expected), _num(logged)
    if a is not None and b is not None:
        return a == b
    # NCCL compares names case-insensitively (NCCL_PROTO=simple, NCCL_LAUNCH_MODE=group).
    return expected.strip().lower() == logged.strip().lower()


def judge(entries: t.Sequence[Entry], expected: t.Mapping[str, str],
          pids: t.Optional[t.Collection[int]] = None) -> t.Dict[str, t.Any]:
    """Per pid and per expected variable: confirmed / contradicted / not_logged.

    Only entries of `pids` count when given (logs are appended across restarts, and an old
    process's line says nothing about the running one); lines without a pid prefix always count
    and are reported under the key 'unknown'. The LAST entry of a pid for a name wins.
    """
    latest: t.Dict[t.Tuple[t.Optional[int], str], Entry] = {}
    seen_pids: t.Set[int] = set()
    for e in entries:
        if e.pid is not None:
            seen_pids.add(e.pid)
            if pids is not None and e.pid not in pids:
                continue
        if e.name in expected:
            latest[(e.pid, e.name)] = e
    per_pid: t.Dict[str, t.Dict[str, t.Dict[str, t.Any]]] = {}
    pid_keys = sorted({k[0] for k in latest}, key=lambda x: (x is None, x or 0))
    for pid in pid_keys:
        row = {}
        for name, want in sorted(expected.items()):
            e = latest.get((pid, name))
            if e is None:
                row[name] = {"status": "not_logged"}
            elif e.invalid or not same_value(want, e.value):
                row[name] = {"status": "contradicted", "logged": e.value, "invalid": e.invalid,
                             "source": "%s:%d" % (e.path, e.line)}
            else:
                row[name] = {"status": "confirmed", "logged": e.value, "source": "%s:%d" % (e.path, e.line)}
        per_pid["unknown" if pid is None else str(pid)] = row
    summary = {}
    for name in sorted(expected):
        states = [row[name]["status"] for row in per_pid.values()]
        summary[name] = ("contradicted" if "contradicted" in states
                         else "confirmed" if "confirmed" in states else "not_logged")
    return {
        "pids": per_pid,
        "summary": summary,
        "confirmed": sorted(n for n, s in summary.items() if s == "confirmed"),
        "contradicted": sorted(n for n, s in summary.items() if s == "contradicted"),
        "not_logged": sorted(n for n, s in summary.items() if s == "not_logged"),
        "other_pids": sorted(seen_pids - set(pids)) if pids is not None else [],
    }
