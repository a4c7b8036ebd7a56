# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""GPU state through NVML (nvidia-ml-py, imported as pynvml) or, failing that, nvidia-smi.

This is the only file of the collection that imports pynvml. Every NVML call is made
through _call() so that one unsupported query (NVLink on a PCIe board reads
NOT_SUPPORTED) never hides the rest of the answer.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import traceback
import typing as t

PYNVML_IMPORT_ERROR: str | None = None
try:
    import pynvml  # nvidia-ml-py
except ImportError:
    pynvml = None
    PYNVML_IMPORT_ERROR = traceback.format_exc()

MIB = 1024 * 1024


class GpuError(Exception):
    """Any GPU backend failure, with a one-line message fit for fail_json."""


class BackendUnavailable(GpuError):
    def __init__(self, msg: str, exception: str | None = None) -> None:
        super().__init__(msg)
        self.exception = exception


def _mib(nbytes: t.Optional[int]) -> t.Optional[int]:
    return None if nbytes is None else int(nbytes) // MIB


def _text(v: t.Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class NvmlBackend:
    """One nvmlInit for the life of the object (nvmlInit ~13 ms, a memory read ~7 us)."""

    name = "nvml"

    def __init__(self) -> None:
        if pynvml is None:
            raise BackendUnavailable("pynvml (nvidia-ml-py) is not importable", PYNVML_IMPORT_ERROR)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise BackendUnavailable("nvmlInit failed: %s" % e, traceback.format_exc())
        self._handles: t.Dict[int, t.Any] = {}
        self._v2: t.Optional[bool] = None if hasattr(pynvml, "nvmlMemory_v2") else False

    def refresh(self) -> None:
        """NVML reads are live; nothing to refresh (nvidia-smi's backend re-queries here)."""

    def close(self) -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass

    def __enter__(self) -> "NvmlBackend":
        return self

    def __exit__(self, *exc: t.Any) -> None:
        self.close()

    def _call(self, errors: t.Dict[str, str], key: str, fn: t.Callable[..., t.Any], *args: t.Any) -> t.Any:
        try:
            return fn(*args)
        except pynvml.NVMLError as e:
            errors[key] = str(e)
            return None

    def count(self) -> int:
        try:
            return int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as e:
            raise GpuError("nvmlDeviceGetCount failed: %s" % e)

    def handle(self, index: int) -> t.Any:
        h = self._handles.get(index)
        if h is None:
            try:
                h = self._handles[index] = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError as e:
                raise GpuError("GPU %d: nvmlDeviceGetHandleByIndex failed: %s" % (index, e))
        return h

    def minor(self, index: int) -> int:
        """Minor number of /dev/nvidiaN for this GPU (not always equal to the NVML index)."""
        try:
            return int(pynvml.nvmlDeviceGetMinorNumber(self.handle(index)))
        except (pynvml.NVMLError, AttributeError):
            return index

    def memory(self, index: int) -> t.Dict[str, t.Any]:
        """v2 separates driver-reserved memory from 'used' (idle H200: v1 used 615 MiB, v2 used 0)."""
        h = self.handle(index)
        if self._v2 is not False:
            try:
                m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
                self._v2 = True
                return {"total_mib": _mib(m.total), "used_mib": _mib(m.used), "free_mib": _mib(m.free),
                        "reserved_mib": _mib(m.reserved), "memory_api": "v2"}
            except (pynvml.NVMLError, AttributeError, TypeError):
                # Old driver (no _v2 symbol) or old binding: remember and use v1.
                self._v2 = False
        try:
            m = pynvml.nvmlDeviceGetMemoryInfo(h)
        except pynvml.NVMLError as e:
            raise GpuError("GPU %d: nvmlDeviceGetMemoryInfo failed: %s" % (index, e))
        return {"total_mib": _mib(m.total), "used_mib": _mib(m.used), "free_mib": _mib(m.free),
                "reserved_mib": None, "memory_api": "v1"}

    def processes(self, index: int, errors: t.Optional[t.Dict[str, str]] = None) -> t.List[t.Dict[str, t.Any]]:
        errs = {} if errors is None else errors
        h = self.handle(index)
        out: t.Dict[int, t.Dict[str, t.Any]] = {}
        for kind, fn in (("compute", pynvml.nvmlDeviceGetComputeRunningProcesses),
                         ("graphics", pynvml.nvmlDeviceGetGraphicsRunningProcesses)):
            for p in self._call(errs, kind + "_processes", fn, h) or []:
                pid = int(p.pid)
                if pid in out:
                    out[pid]["type"] = "compute+graphics"
                    continue
                out[pid] = {"pid": pid, "used_mib": _mib(getattr(p, "usedGpuMemory", None)), "type": kind}
        return [out[k] for k in sorted(out)]

    def nvlink(self, index: int, errors: t.Dict[str, str]) -> t.Dict[str, t.Any]:
        h = self.handle(index)
        active = 0
        supported = False
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                state = pynvml.nvmlDeviceGetNvLinkState(h, link)
            except pynvml.NVMLError as e:
                # NOT_SUPPORTED on link 0 means the board has no NVLink at all (PCIe-only box).
                if link == 0:
                    errors["nvlink"] = str(e)
                break
            supported = True
            if state == getattr(pynvml, "NVML_FEATURE_ENABLED", 1):
                active += 1
        return {"supported": supported, "active_links": active}

    def info(self, index: int) -> t.Dict[str, t.Any]:
        errors: t.Dict[str, str] = {}
        h = self.handle(index)
        pci = self._call(errors, "pci", pynvml.nvmlDeviceGetPciInfo, h)
        d: t.Dict[str, t.Any] = {
            "index": index,
            "name": _text(self._call(errors, "name", pynvml.nvmlDeviceGetName, h) or ""),
            "uuid": _text(self._call(errors, "uuid", pynvml.nvmlDeviceGetUUID, h) or ""),
            "pci_bus_id": _text(getattr(pci, "busId", "") or "") if pci is not None else "",
        }
        d.update(self.memory(index))
        d["processes"] = self.processes(index, errors)
        d["nvlink"] = self.nvlink(index, errors)
        d["errors"] = errors
        return d

    def system(self) -> t.Dict[str, t.Any]:
        errors: t.Dict[str, str] = {}
        drv = self._call(errors, "driver_version", pynvml.nvmlSystemGetDriverVersion)
        cuda = self._call(errors, "cuda_driver_version", pynvml.nvmlSystemGetCudaDriverVersion)
        cuda_s = None
        if cuda:
            cuda_s = "%d.%d" % (int(cuda) // 1000, (int(cuda) % 1000) // 10)
        return {"backend": self.name, "driver_version": _text(drv) if drv else None,
                "cuda_driver_version": cuda_s, "errors": errors}


class SmiBackend:
    """nvidia-smi CSV fallback (~22 ms a call) for hosts without a usable pynvml."""

    name = "nvidia-smi"
    _GPU_FIELDS = ["index", "uuid", "name", "pci.bus_id", "memory.total", "memory.used", "memory.free",
                   "memory.reserved", "driver_version"]

    def __init__(self, path: str) -> None:
        self.path = path
        self._rows: t.Optional[t.List[t.Dict[str, str]]] = None
        self._apps: t.Optional[t.List[t.Dict[str, str]]] = None
        self._reserved = True

    def close(self) -> None:
        pass

    def __enter__(self) -> "SmiBackend":
        return self

    def __exit__(self, *exc: t.Any) -> None:
        self.close()

    def _query(self, flag: str, fields: t.List[str]) -> t.List[t.Dict[str, str]]:
        cmd = [self.path, "%s=%s" % (flag, ",".join(fields)), "--format=csv,noheader,nounits"]
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise GpuError("%s failed: %s" % (" ".join(cmd), e))
        if r.returncode != 0:
            raise GpuError("%s exited %d: %s" % (" ".join(cmd), r.returncode,
                                                 (r.stderr or r.stdout).decode(errors="replace").strip()))
        return parse_csv(r.stdout.decode(errors="replace"), fields)

    def refresh(self) -> None:
        fields = list(self._GPU_FIELDS)
        if not self._reserved:
            fields.remove("memory.reserved")
        try:
            self._rows = self._query("--query-gpu", fields)
        except GpuError:
            if not self._reserved:
                raise
            # Older nvidia-smi has no memory.reserved field.
            self._reserved = False
            fields.remove("memory.reserved")
            self._rows = self._query("--query-gpu", fields)
        self._apps = self._query("--query-compute-apps", ["gpu_uuid", "pid", "used_memory"])

    def _row(self, index: int) -> t.Dict[str, str]:
        if self._rows is None:
            self.refresh()
        for r in self._rows or []:
            if int(r["index"]) == index:
                return r
        raise GpuError("GPU %d not reported by nvidia-smi" % index)

    def minor(self, index: int) -> int:
        return index

    def count(self) -> int:
        self.refresh()
        return len(self._rows or [])

    def memory(self, index: int) -> t.Dict[str, t.Any]:
        r = self._row(index)
        return {"total_mib": _int(r.get("memory.total")), "used_mib": _int(r.get("memory.used")),
                "free_mib": _int(r.get("memory.free")), "reserved_mib": _int(r.get("memory.reserved")),
                "memory_api": "nvidia-smi"}

    def processes(self, index: int, errors: t.Optional[t.Dict[str, str]] = None) -> t.List[t.Dict[str, t.Any]]:
        uuid = self._row(index)["uuid"]
        return [{"pid": int(a["pid"]), "used_mib": _int(a.get("used_memory")), "type": "compute"}
                for a in self._apps or [] if a["gpu_uuid"] == uuid and a["pid"].isdigit()]

    def info(self, index: int) -> t.Dict[str, t.Any]:
        r = self._row(index)
        d: t.Dict[str, t.Any] = {"index": index, "name": r["name"], "uuid": r["uuid"], "pci_bus_id": r["pci.bus_id"]}
        d.update(self.memory(index))
        d["processes"] = self.processes(index)
        # nvidia-smi's CSV has no NVLink state; `nvidia-smi nvlink -s` output is not stable enough to parse.
        d["nvlink"] = {"supported": None, "active_links": None}
        d["errors"] = {"nvlink": "not available through nvidia-smi CSV"}
        return d

    def system(self) -> t.Dict[str, t.Any]:
        rows = self._rows or []
        if not rows:
            self.refresh()
            rows = self._rows or []
        return {"backend": self.name, "driver_version": rows[0]["driver_version"] if rows else None,
                "cuda_driver_version": None, "errors": {}}


def _int(v: t.Optional[str]) -> t.Optional[int]:
    try:
        return int(float(v)) if v not in (None, "", "[N/A]", "[Not Supported]") else None
    except ValueError:
        return None


def parse_csv(text: str, fields: t.List[str]) -> t.List[t.Dict[str, str]]:
    rows = []
    for rec in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not rec or all(not c.strip() for c in rec):
            continue
        if len(rec) != len(fields):
            raise GpuError("unexpected nvidia-smi output line: %r" % ",".join(rec))
        rows.append({f: c.strip() for f, c in zip(fields, rec)})
    return rows


Backend = t.Union[NvmlBackend, SmiBackend]


def open_backend(prefer: str = "auto", smi_path: t.Optional[str] = None) -> Backend:
    """NVML first (fast, exact, v2 memory); nvidia-smi when pynvml or libnvidia-ml is missing."""
    reasons = []
    trace = None
    if prefer in ("auto", "nvml"):
        try:
            return NvmlBackend()
        except BackendUnavailable as e:
            reasons.append(str(e))
            trace = e.exception
            if prefer == "nvml":
                raise
    if prefer in ("auto", "nvidia-smi"):
        path = smi_path or shutil.which("nvidia-smi")
        if path:
            return SmiBackend(path)
        reasons.append("nvidia-smi not found on PATH")
    raise BackendUnavailable("No GPU backend available: " + "; ".join(reasons), trace)


def resolve_indices(backend: Backend, wanted: t.Optional[t.Sequence[int]]) -> t.List[int]:
    n = backend.count()
    if not wanted:
        return list(range(n))
    bad = [i for i in wanted if not isinstance(i, int) or i < 0 or i >= n]
    if bad:
        has = "it has %d GPU%s: 0..%d" % (n, "" if n == 1 else "s", n - 1) if n else "it has no GPUs"
        raise GpuError("GPU index %s does not exist on this host (%s)" % (", ".join(str(b) for b in bad), has))
    return sorted(set(wanted))


def default_threshold_mib(memory_api: str) -> int:
    """What counts as 'clean' when the caller gives no threshold.

    NVML v2 and nvidia-smi report driver-reserved memory apart from 'used' (idle H200: 0),
    v1 folds it in (idle H200: 615 MiB), so v1 needs headroom.
    """
    return 1024 if memory_api == "v1" else 16
