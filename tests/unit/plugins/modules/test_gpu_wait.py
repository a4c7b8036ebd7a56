# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_wait main() in-process (patch_module_args), real exit_json/fail_json, fake NVML + real holders."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from smi_stub import gpu_row, write_smi

from ansible_collections.gpufleet.serving.plugins.module_utils import _nvml, _proc
from ansible_collections.gpufleet.serving.plugins.modules import gpu_wait


def test_clean(nvml, run_module):
    r = run_module(gpu_wait.main, {"timeout": 5})
    assert r["changed"] is False and "failed" not in r
    assert r["backend"] == "nvml" and r["max_used_mib"] == 16 and r["holders"] == []
    assert r["polls"] == 1 and r["waited_s"] < 1
    assert [g["index"] for g in r["gpus"]] == [0, 1]
    assert set(r["gpus"][0]) >= {"index", "used_mib", "total_mib", "free_mib", "reserved_mib", "memory_api", "processes"}


def test_check_mode_is_the_same_read(nvml, run_module):
    holder = nvml.hold(gpu=0, mib=500)
    r = run_module(gpu_wait.main, {"gpus": [1], "timeout": 2}, check_mode=True)
    assert r["changed"] is False and [g["index"] for g in r["gpus"]] == [1]
    assert holder.poll() is None


def test_returns_after_holder_dies(nvml, run_module):
    holder = nvml.hold(gpu=0, mib=60000)
    t_kill = []

    def kill() -> None:
        time.sleep(0.3)
        t_kill.append(time.monotonic())
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()

    th = threading.Thread(target=kill)
    th.start()
    r = run_module(gpu_wait.main, {"gpus": [0], "timeout": 10})
    done = time.monotonic()
    th.join()
    assert "failed" not in r, r
    assert 0.3 <= r["waited_s"] < 1.0
    assert done - t_kill[0] < 0.15 + 0.1  # fake driver release delay + a few 20 ms polls


def test_timeout_failure_lists_holders(nvml, run_module):
    holder = nvml.hold(gpu=1, mib=12345)
    r = run_module(gpu_wait.main, {"timeout": 0.2, "poll_interval": 0.05})
    assert r["failed"] is True
    assert r["msg"].startswith("GPUs not clean after 0.2 s (GPU 0 0 MiB used, GPU 1 12345 MiB used; threshold 16 MiB).")
    assert "GPU 1 pid %d (%s, 12345 MiB): " % (holder.pid, _proc.user_name(os.geteuid())) in r["msg"]
    # The message cuts each command line at 160 characters (a long interpreter path, as in ansible-test's
    # venv, leaves less of the arguments); the holders list keeps 300.
    cmdline = _proc.read_proc(holder.pid).command
    assert "fake_gpu.py hold --gpu 1 --mib 12345" in cmdline
    assert r["holders"][0]["cmdline"] == cmdline[:300]
    assert "): %s" % cmdline[:160] in r["msg"]
    assert r["holders"][0]["pid"] == holder.pid and r["holders"][0]["used_mib"] == 12345
    assert r["backend"] == "nvml" and "waited_s" in r and "gpus" in r


@pytest.mark.parametrize("args,msg", [
    ({"timeout": 0}, "timeout must be greater than 0 seconds, got 0.0"),
    ({"timeout": -3}, "timeout must be greater than 0 seconds, got -3.0"),
    ({"poll_interval": 0}, "poll_interval must be greater than 0 seconds, got 0.0"),
    ({"gpus": [2]}, "GPU index 2 does not exist on this host (it has 2 GPUs: 0..1)"),
    ({"gpus": [0, 7]}, "GPU index 7 does not exist on this host (it has 2 GPUs: 0..1)"),
    ({"state": "idle"}, "value of state must be one of: clean, busy, got: idle"),
    ({"timeout": "soon"}, "timeout"),
    # A threshold or count that can never be met would wait out the whole timeout.
    ({"max_used_mib": -5}, "max_used_mib must be >= 0, got -5"),
    # NaN compares false with everything: a wait that never ends, or an error that names no option.
    ({"timeout": "nan"}, "timeout must be greater than 0 seconds, got nan"),
    ({"poll_interval": "nan"}, "poll_interval must be greater than 0 seconds, got nan"),
    ({"state": "busy", "min_processes": -1}, "min_processes must be >= 0, got -1"),
    ({"state": "busy", "min_used_mib": -1}, "min_used_mib must be >= 0, got -1"),
])
def test_bad_input(nvml, run_module, args, msg):
    r = run_module(gpu_wait.main, args)
    assert r["failed"] is True
    assert msg in r["msg"], r["msg"]


def test_busy(nvml, run_module):
    a, b = nvml.hold(gpu=0, mib=9000), nvml.hold(gpu=1, mib=9000)
    r = run_module(gpu_wait.main, {"state": "busy", "min_used_mib": 8000, "timeout": 5})
    assert "failed" not in r and {h["pid"] for h in r["holders"]} == {a.pid, b.pid}
    r = run_module(gpu_wait.main, {"state": "busy", "min_processes": 2, "timeout": 0.1})
    assert r["failed"] and r["msg"].startswith("GPUs not busy after")


def test_v1_default_threshold(nvml, run_module):
    nvml.configure(gpus=1, memory_v2=False)
    r = run_module(gpu_wait.main, {"timeout": 1})
    assert "failed" not in r and r["max_used_mib"] == 1024 and r["gpus"][0]["memory_api"] == "v1"


def test_nvidia_smi_backend(nvml, run_module, tmp_path, monkeypatch):
    nvml.configure(gpus=2, init_error="LIBRARY_NOT_FOUND")
    write_smi(tmp_path, {"gpus": [gpu_row(0, used=3)]})
    monkeypatch.setenv("PATH", str(tmp_path))
    r = run_module(gpu_wait.main, {"timeout": 1})
    assert "failed" not in r and r["backend"] == "nvidia-smi" and r["gpus"][0]["used_mib"] == 3


def test_no_backend(nvml, run_module, tmp_path, monkeypatch):
    nvml.configure(gpus=2, init_error="LIBRARY_NOT_FOUND")
    monkeypatch.setenv("PATH", str(tmp_path))
    r = run_module(gpu_wait.main, {"timeout": 1})
    assert r["failed"] is True
    assert r["msg"] == "No GPU backend available: nvmlInit failed: NVML Shared Library Not Found; nvidia-smi not found on PATH"


def test_no_pynvml_names_the_library(nvml, run_module, tmp_path, monkeypatch):
    monkeypatch.setattr(_nvml, "pynvml", None)
    monkeypatch.setenv("PATH", str(tmp_path))
    r = run_module(gpu_wait.main, {"timeout": 1})
    assert r["failed"] is True
    assert "Failed to import the required Python library (nvidia-ml-py)" in r["msg"]
    assert "nvidia-smi not found on PATH" in r["msg"]
