# SPDX-License-Identifier: GPL-3.0-or-later
"""_gpuwait over the fake NVML, with real holder processes that die while we wait."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _gpumod, _gpuwait, _nvml, _proc


def G(used, procs=(), index=0):
    return {"index": index, "used_mib": used, "processes": [{"pid": p, "used_mib": 1} for p in procs]}


@pytest.mark.parametrize("g,limit,clean", [
    (G(0), 16, True),
    (G(16), 16, True),
    (G(17), 16, False),
    (G(0, [123]), 16, False),     # a process holding a context with 0 MiB is still a holder
    (G(None), 16, True),          # unknown used (nvidia-smi [N/A]) counts on the process list alone
    (G(615), 1024, True),         # v1 idle H200
])
def test_gpu_clean(g, limit, clean):
    assert _gpuwait.gpu_clean(g, limit) is clean


@pytest.mark.parametrize("g,n,mib,busy", [
    (G(0, [1]), 1, 0, True),
    (G(0), 1, 0, False),
    (G(10000, [1, 2]), 2, 10000, True),
    (G(9999, [1, 2]), 2, 10000, False),
    (G(50000, [1]), 2, 0, False),
])
def test_gpu_busy(g, n, mib, busy):
    assert _gpuwait.gpu_busy(g, n, mib) is busy


@pytest.mark.parametrize("kw,msg", [
    (dict(timeout=0), "timeout must be > 0 seconds, got 0"),
    (dict(timeout=-5), "timeout must be > 0 seconds, got -5"),
    (dict(poll_interval=0), "poll_interval must be > 0 seconds"),
    (dict(state="idle"), "state must be clean or busy, got 'idle'"),
])
def test_bad_arguments(nvml, kw, msg):
    with _nvml.NvmlBackend() as b:
        with pytest.raises(_gpuwait.WaitError, match=msg):
            _gpuwait.wait(b, [0], **kw)


def test_clean_at_once(nvml):
    with _nvml.NvmlBackend() as b:
        r = _gpuwait.wait(b, [0, 1], timeout=5)
    assert r["ok"] and r["polls"] == 1 and r["waited_s"] < 0.5
    assert r["max_used_mib"] == 16 and r["holders"] == []
    assert [g["index"] for g in r["gpus"]] == [0, 1]


def test_waits_for_holder_death_then_release(nvml):
    holder = nvml.hold(gpu=1, mib=40000)
    other = nvml.hold(gpu=0, mib=100)  # on a GPU we do not wait for
    killed = []

    def kill_later() -> None:
        time.sleep(0.3)
        killed.append(time.monotonic())
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()

    th = threading.Thread(target=kill_later)
    with _nvml.NvmlBackend() as b:
        t0 = time.monotonic()
        th.start()
        r = _gpuwait.wait(b, [1], timeout=10, poll_interval=0.01)
        done = time.monotonic()
    th.join()
    assert r["ok"] is True, r
    after_kill = done - killed[0]
    # released 0.15 s after death (fake driver); we must see it within a couple of polls
    assert 0.15 <= after_kill < 0.15 + 0.1, after_kill
    assert r["waited_s"] == pytest.approx(done - t0, abs=0.05)
    assert r["polls"] > 10
    assert other.poll() is None


def test_timeout_lists_holders(nvml):
    holder = nvml.hold(gpu=0, mib=20480)
    with _nvml.NvmlBackend() as b:
        r = _gpuwait.wait(b, [0, 1], timeout=0.3, poll_interval=0.05)
    assert r["ok"] is False
    assert 0.3 <= r["waited_s"] < 1.0
    [h] = r["holders"]
    assert h["gpu"] == 0 and h["pid"] == holder.pid and h["used_mib"] == 20480
    assert h["user"] == _proc.user_name(os.geteuid())
    assert "fake_gpu.py hold --gpu 0 --mib 20480" in h["cmdline"]
    msg = _gpumod.not_ready_message(dict(r, state="clean"))
    assert msg.startswith("GPUs not clean after 0.3 s (GPU 0 20480 MiB used, GPU 1 0 MiB used; threshold 16 MiB). Holders: ")
    assert "GPU 0 pid %d (%s, 20480 MiB): " % (holder.pid, h["user"]) in msg
    # The message keeps the first 160 characters of each command line (a long interpreter path leaves less
    # of the arguments), the holder entry 300.
    assert "GPU 0 pid %d (%s, 20480 MiB): %s" % (holder.pid, h["user"], h["cmdline"][:160]) in msg


def test_explicit_threshold_tolerates_small_usage(nvml):
    nvml.configure(gpus=1)
    with _nvml.NvmlBackend() as b:
        r = _gpuwait.wait(b, [0], timeout=1, max_used_mib=0)
    assert r["ok"] and r["max_used_mib"] == 0


@pytest.mark.parametrize("v2,threshold,used", [(True, 16, 0), (False, 1024, 615)])
def test_default_threshold_by_memory_api(nvml, v2, threshold, used):
    """An idle GPU is clean under both APIs: v1's 615 MiB reservation is under its 1024 MiB default."""
    nvml.configure(gpus=1, memory_v2=v2)
    with _nvml.NvmlBackend() as b:
        r = _gpuwait.wait(b, [0], timeout=1)
    assert r["ok"] and r["max_used_mib"] == threshold and r["gpus"][0]["used_mib"] == used


def test_busy_until_workers_load(nvml):
    holders = []

    def load() -> None:
        time.sleep(0.2)
        holders.append(nvml.hold(gpu=0, mib=8000))
        holders.append(nvml.hold(gpu=1, mib=8000))

    th = threading.Thread(target=load)
    th.start()
    with _nvml.NvmlBackend() as b:
        r = _gpuwait.wait(b, [0, 1], state="busy", timeout=15, min_processes=1, min_used_mib=5000)
    th.join()
    assert r["ok"] and r["state"] == "busy"
    assert {h["pid"] for h in r["holders"]} == {p.pid for p in holders}
    assert r["waited_s"] >= 0.2


def test_busy_timeout_message(nvml):
    with _nvml.NvmlBackend() as b:
        r = _gpuwait.wait(b, [0], state="busy", timeout=0.1)
    assert r["ok"] is False
    assert _gpumod.not_ready_message(r) == "GPUs not busy after 0.1 s (GPU 0 0 MiB used)"


def test_holder_outside_pid_namespace(nvml):
    gpus = [{"index": 0, "processes": [{"pid": 999999999, "used_mib": 5}]}]
    [h] = _gpuwait.enrich_holders(gpus)
    assert h["user"] is None and "not visible" in h["cmdline"]
