# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""TEST DOUBLE of nvidia-ml-py's `pynvml`, for GPU-less machines. Never shipped.

Tests put this directory first on a target interpreter's path. "GPU memory" is held by
real, live processes: each holder registers a file under the state dir (see fake_gpu.py)
and its memory stays "used" until the process is gone plus `release_delay_s` (the H200
driver frees 20-100 GiB 0.12-0.19 s after the holder's death).

Config: $FAKE_NVML_CONFIG or fake_nvml.json beside this file:
  {"gpus": [{"name": "NVIDIA H200", "memory_mib": 143771, "reserved_mib": 615, "nvlink_links": 0}],
   "driver_version": "560.35.03", "cuda_version": 12060, "memory_v2": true,
   "release_delay_s": 0.15, "state_dir": "...", "init_error": null}
"""

import json
import os
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1024 * 1024

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 18
nvmlMemory_v2 = 0x02000028

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
}


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return _MESSAGES.get(self.value, "Unknown Error")


class _Struct(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)


_state = {"init": 0}


def _config():
    path = os.environ.get("FAKE_NVML_CONFIG") or os.path.join(_HERE, "fake_nvml.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.setdefault("state_dir", os.path.join(os.path.dirname(path), "fake_nvml_state"))
    return cfg


def _check_init():
    if _state["init"] <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _alive(pid, start):
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except OSError:
        return False
    rest = data[data.rindex(")") + 2:].split()
    return rest[0] not in ("Z", "X") and int(rest[19]) == start


def _holds(gpu):
    """[(pid, mib)] of live holders of `gpu`, plus dead ones still inside the release delay."""
    cfg = _config()
    d = cfg["state_dir"]
    delay = float(cfg.get("release_delay_s", 0.15))
    out = []
    try:
        names = os.listdir(d)
    except OSError:
        return out
    now = time.time()
    for n in names:
        if not n.startswith("hold-") or n.endswith(".dead"):
            continue
        try:
            g, pid, start = (int(x) for x in n.split("-")[1:])
        except ValueError:
            continue
        if g != gpu:
            continue
        path = os.path.join(d, n)
        try:
            with open(path) as f:
                mib = int(f.read().strip() or 0)
        except (OSError, ValueError):
            continue
        if not _alive(pid, start):
            # The first reader to see the death stamps it; memory is released `delay` later.
            dead = path + ".dead"
            try:
                fd = os.open(dead, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                os.write(fd, repr(now).encode())
                os.close(fd)
                died = now
            except FileExistsError:
                try:
                    with open(dead) as f:
                        died = float(f.read() or now)
                except (OSError, ValueError):
                    died = now
            if now - died >= delay:
                for p in (path, dead):
                    try:
                        os.unlink(p)
                    except OSError:
                        pass
                continue
        out.append((pid, mib))
    return out


def nvmlInit():
    err = _config().get("init_error")
    if err:
        raise NVMLError(globals()["NVML_ERROR_" + err])
    _state["init"] += 1


def nvmlInitWithFlags(flags):
    nvmlInit()


def nvmlShutdown():
    _check_init()
    _state["init"] -= 1


def nvmlSystemGetDriverVersion():
    return _config().get("driver_version", "560.35.03")


def nvmlSystemGetCudaDriverVersion():
    return _config().get("cuda_version", 12060)


def nvmlDeviceGetCount():
    _check_init()
    return len(_config()["gpus"])


def nvmlDeviceGetHandleByIndex(index):
    _check_init()
    if not 0 <= index < len(_config()["gpus"]):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Struct(index=index)


def _gpu(handle):
    _check_init()
    return _config()["gpus"][handle.index]


def nvmlDeviceGetName(handle):
    return _gpu(handle).get("name", "NVIDIA H200")


def nvmlDeviceGetUUID(handle):
    return _gpu(handle).get("uuid", "GPU-fake0000-0000-0000-0000-%012d" % handle.index)


def nvmlDeviceGetPciInfo(handle):
    return _Struct(busId="00000000:%02X:00.0" % (0x18 + handle.index))


def nvmlDeviceGetMinorNumber(handle):
    _gpu(handle)
    return handle.index


def nvmlDeviceGetMemoryInfo(handle, version=None):
    g = _gpu(handle)
    cfg = _config()
    total = g.get("memory_mib", 143771) * MIB
    reserved = g.get("reserved_mib", 615) * MIB
    used = sum(m for _pid, m in _holds(handle.index)) * MIB
    if version:
        if not cfg.get("memory_v2", True):
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        return _Struct(version=version, total=total, reserved=reserved, used=used,
                       free=total - reserved - used)
    # v1 folds the driver's reservation into 'used', as a real driver does.
    return _Struct(total=total, used=used + reserved, free=total - reserved - used)


def nvmlDeviceGetComputeRunningProcesses(handle):
    _gpu(handle)
    return [_Struct(pid=pid, usedGpuMemory=mib * MIB, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
            for pid, mib in _holds(handle.index)]


def nvmlDeviceGetGraphicsRunningProcesses(handle):
    _gpu(handle)
    return []


def nvmlDeviceGetNvLinkState(handle, link):
    links = _gpu(handle).get("nvlink_links", 0)
    if links == 0:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if link >= links:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return NVML_FEATURE_ENABLED
