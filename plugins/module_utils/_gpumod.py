# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Glue between AnsibleModule and the GPU backend, shared by the GPU modules."""

from __future__ import annotations

import contextlib
import math
import traceback
import typing as t

from ansible.module_utils.basic import missing_required_lib

from ansible_collections.gpufleet.serving.plugins.module_utils import _gpuwait, _nvml
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError


def clean_gate_argspec() -> t.Dict[str, t.Any]:
    """Options of a clean wait, as gpu_wait takes them and server_restart's wait_clean does (less gpus and backend)."""
    return dict(
        gpus=dict(type="list", elements="int", default=[]),
        timeout=dict(type="float", default=30.0),
        poll_interval=dict(type="float", default=0.02),
        max_used_mib=dict(type="int"),
        backend=dict(type="str", choices=["auto", "nvml", "nvidia-smi"], default="auto"),
    )


def gate_input_error(opts: t.Mapping[str, t.Any]) -> t.Optional[str]:
    """What is wrong with a wait_clean option (clean_gate_argspec), or None."""
    if not 0 < opts["timeout"] < math.inf or not 0 < opts["poll_interval"] < math.inf:  # NaN too
        return "wait_clean: timeout and poll_interval must be greater than 0 seconds, got %s and %s" % (
            opts["timeout"], opts["poll_interval"])
    if (opts.get("max_used_mib") or 0) < 0:
        return "wait_clean: max_used_mib must be >= 0 MiB, got %s" % opts["max_used_mib"]
    return None


@contextlib.contextmanager
def backend_or_fail(name: t.Optional[str] = None) -> t.Iterator[_nvml.Backend]:
    """The GPU backend `name` (auto when unset), closed at the end; its failures raise StepError."""
    try:
        backend = _nvml.open_backend(name or "auto")
    except _nvml.BackendUnavailable as e:
        msg = str(e)
        if _nvml.pynvml is None:
            # The host's reason first: run summaries truncate long messages, and the library text is boilerplate.
            msg = msg + ". " + missing_required_lib("nvidia-ml-py", reason="GPU queries (and nvidia-smi was not found either)")
        raise StepError(msg, exception=e.exception)
    try:
        yield backend
    except StepError:
        raise  # the caller's own failure, inside the with block
    except _nvml.GpuError as e:
        raise StepError(str(e), backend=backend.name)
    except Exception as e:  # pragma: no cover - reported with traceback for bug reports
        raise StepError("Unexpected GPU backend error: %s" % e, exception=traceback.format_exc())
    finally:
        backend.close()


def gpus_preflight(p: t.Mapping[str, t.Any]) -> None:
    """A GPU index this host lacks, or no GPU backend at all; `p` needs only `gpus` and `backend`. server_restart runs
    it before its kill and server_state's check before its lock (here, not in _restart, so that the check, run on every
    host of every rollout, does not import the whole restart engine)."""
    if p["gpus"]:
        try:
            with backend_or_fail(p["backend"]) as backend:
                _nvml.resolve_indices(backend, p["gpus"])
        except StepError as e:
            raise StepError("gpus: %s; nothing was stopped" % e, **dict(e.details, phase="preflight"))


def gpu_facts(backend: _nvml.Backend, wanted: t.Sequence[int]) -> t.Dict[str, t.Any]:
    indices = _nvml.resolve_indices(backend, wanted)
    gpus = [backend.info(i) for i in indices]
    holders = {(h["gpu"], h["pid"]): h for h in _gpuwait.enrich_holders(gpus)}
    for g in gpus:
        for p in g["processes"]:
            h = holders[(g["index"], p["pid"])]
            p["user"] = h["user"]
            p["cmdline"] = h["cmdline"]
    sysinfo = backend.system()
    links = [g["nvlink"]["active_links"] for g in gpus if g["nvlink"]["supported"] is not None]
    nvlink_known = [g["nvlink"]["supported"] for g in gpus if g["nvlink"]["supported"] is not None]
    return {
        "backend": backend.name,
        "driver_version": sysinfo["driver_version"],
        "cuda_driver_version": sysinfo["cuda_driver_version"],
        "gpu_count": backend.count(),
        "nvlink_active": (any(n > 0 for n in links) if nvlink_known else None),
        "gpus": gpus,
    }


def holders_text(holders: t.Iterable[t.Mapping[str, t.Any]]) -> str:
    """One line per holder, as an SRE reads it: GPU, pid, user, MiB held, command line (cut at 160)."""
    return "; ".join("GPU %d pid %d (%s, %s MiB): %s" % (h["gpu"], h["pid"], h["user"], h["used_mib"], h["cmdline"][:160])
                     for h in holders)


def not_ready_message(res: t.Mapping[str, t.Any]) -> str:
    used = ", ".join("GPU %d %s MiB used" % (g["index"], g["used_mib"]) for g in res["gpus"])
    if res["state"] == "clean":
        who = holders_text(res["holders"]) or "no process listed"
        return "GPUs not clean after %.1f s (%s; threshold %s MiB). Holders: %s" % (
            res["waited_s"], used, res["max_used_mib"], who)
    return "GPUs not busy after %.1f s (%s)" % (res["waited_s"], used)


def wait_or_fail(opts: t.Mapping[str, t.Any], state: str = "clean", min_processes: int = 1,
                 min_used_mib: int = 0, result_key: t.Optional[str] = None, **fail_extra: t.Any) -> t.Dict[str, t.Any]:
    """Wait until the GPUs of `opts` (clean_gate_argspec) are clean or busy and return the reading; raise StepError
    listing the holders when they are not, with the reading under `result_key` (top level when None)."""
    with backend_or_fail(opts.get("backend")) as backend:
        indices = _nvml.resolve_indices(backend, opts["gpus"])
        if not indices:
            # "All of no GPUs are clean/busy" is vacuous; a GPU gate on a host without GPUs is a mistake.
            raise StepError("gpus: this host has no GPUs, so there is nothing to wait for", backend=backend.name,
                            **fail_extra)
        res = _gpuwait.wait(backend, indices, state=state, timeout=opts["timeout"], poll_interval=opts["poll_interval"],
                            max_used_mib=opts.get("max_used_mib"), min_processes=min_processes, min_used_mib=min_used_mib)
        ok = res.pop("ok")
        res["backend"] = backend.name
        if not ok:
            details = {result_key: res} if result_key else res
            raise StepError(not_ready_message(res), **dict(details, **fail_extra))
        return res
