# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_wait and gpu_info through the real ansible-playbook CLI against localhost, with the fake GPUs,
a stand-in nvidia-smi, and a host with neither."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import typing as t
from pathlib import Path

from helpers import FAKE_NVML_DIR, PY, service_tag, wait_for
from playbook_steps import HERE, play


def test_gpu_wait_returns_after_holder_dies(fake_gpus, tmp_path, spawned):
    ready = tmp_path / "holder.ready"
    holder = subprocess.Popen([PY, str(HERE / "holder_then_die.py"), "--gpu", "1", "--mib", "60000",
                               "--ready", str(ready), "--after", "4"], env=fake_gpus.env)
    spawned.popens.append(holder)
    wait_for(ready.exists, 60, "holder ready")
    [w] = play(tmp_path, [{"module": "gpu_wait", "args": {"gpus": [1], "timeout": 60}}], fake_gpus.env)
    assert not w.get("failed"), w
    assert holder.wait(timeout=5) == -signal.SIGKILL
    assert w["polls"] > 1, "gpu_wait returned without ever seeing the holder"
    assert w["waited_s"] < 10, "waited %.1f s of a 60 s timeout" % w["waited_s"]
    assert w["holders"] == [] and w["gpus"][0]["used_mib"] == 0 and w["backend"] == "nvml"


def test_kill_then_wait_sees_the_release(launch, fake_gpus, tmp_path):
    """The restart gate: kill the tagged server, then gpu_wait returns once the driver releases (~0.15 s)."""
    tree = launch(workers=2, tag=service_tag("pb-gate"), mib=40000)
    k, w = play(tmp_path, [{"module": "process_kill", "args": {"tag": service_tag("pb-gate")}},
                           {"module": "gpu_wait", "args": {"timeout": 20}}], fake_gpus.env)
    assert k["changed"] and tree.alive() == []
    assert not w.get("failed") and w["waited_s"] < 5


def test_gpu_wait_and_info_with_holder(fake_gpus, tmp_path):
    holder = fake_gpus.hold(gpu=0, mib=20480)
    steps = [
        {"module": "gpu_info", "args": {}},
        {"module": "gpu_info", "args": {"gpus": [1]}, "check": True},
        {"module": "gpu_wait", "args": {"timeout": 0.5, "poll_interval": 0.05}},
        {"module": "gpu_wait", "args": {"gpus": [1], "timeout": 5}},
        {"module": "gpu_wait", "args": {"timeout": 0}},
        {"module": "gpu_wait", "args": {"timeout": -1}},
        {"module": "gpu_wait", "args": {"gpus": [0, 4]}},
        {"module": "gpu_wait", "args": {"state": "busy", "gpus": [0], "min_used_mib": 20000, "timeout": 5}},
    ]
    info, info1, tmo, clean1, zero, neg, badidx, busy = play(tmp_path, steps, fake_gpus.env)
    assert info["changed"] is False and info["backend"] == "nvml" and info["gpu_count"] == 2
    assert info["driver_version"] == "560.35.03" and info["cuda_driver_version"] == "12.6"
    assert info["nvlink_active"] is False
    g0 = info["gpus"][0]
    assert set(g0) >= {"index", "uuid", "name", "pci_bus_id", "total_mib", "used_mib", "free_mib", "reserved_mib",
                       "memory_api", "nvlink", "processes", "errors"}
    assert g0["used_mib"] == 20480 and g0["memory_api"] == "v2" and g0["reserved_mib"] == 615
    [p] = g0["processes"]
    assert p["pid"] == holder.pid and p["used_mib"] == 20480 and p["user"] and "fake_gpu.py hold" in p["cmdline"]
    assert [g["index"] for g in info1["gpus"]] == [1]

    assert tmo["failed"] is True
    assert tmo["msg"].startswith("GPUs not clean after 0.5 s (GPU 0 20480 MiB used, GPU 1 0 MiB used; threshold 16 MiB).")
    assert "GPU 0 pid %d (%s, 20480 MiB): " % (holder.pid, p["user"]) in tmo["msg"]
    assert "fake_gpu.py hold --gpu 0 --mib 20480" in tmo["msg"]
    assert tmo["holders"][0]["pid"] == holder.pid
    assert not clean1.get("failed") and clean1["waited_s"] < 1
    assert zero["failed"] and zero["msg"] == "timeout must be greater than 0 seconds, got 0.0"
    assert neg["failed"] and neg["msg"] == "timeout must be greater than 0 seconds, got -1.0"
    assert badidx["failed"] and badidx["msg"] == "GPU index 4 does not exist on this host (it has 2 GPUs: 0..1)"
    assert not busy.get("failed") and busy["holders"][0]["pid"] == holder.pid
    assert holder.poll() is None


def _bare_env(tmp_path: Path) -> t.Dict[str, str]:
    """A target without the fake pynvml on its path and without nvidia-smi on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FAKE_NVML_CONFIG")}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    assert shutil.which("nvidia-smi", path=env["PATH"]) is None
    return env


def test_host_without_nvml_or_nvidia_smi(tmp_path):
    env = _bare_env(tmp_path)
    steps = [{"module": "gpu_info", "args": {}}, {"module": "gpu_wait", "args": {"timeout": 1}},
             {"module": "process_kill", "args": {"gpu_holders": [0]}}]
    for r in play(tmp_path, steps, env):
        assert r["failed"] is True
        # the real nvidia-ml-py is installed, so the driver library is what is missing
        assert r["msg"].startswith("No GPU backend available: nvmlInit failed: "), r["msg"]
        assert r["msg"].endswith("; nvidia-smi not found on PATH"), r["msg"]


def test_host_with_only_nvidia_smi(tmp_path):
    from smi_stub import gpu_row, write_smi

    env = _bare_env(tmp_path)
    write_smi(tmp_path / "bin", {"gpus": [gpu_row(0, used=2048)], "unknown_fields": ["memory.reserved"],
                                 "apps": [{"gpu_uuid": "GPU-smi-0", "pid": 1, "used_memory": 2040}]})
    env["PATH"] = str(tmp_path / "bin") + ":" + env["PATH"]
    info, wait = play(tmp_path, [{"module": "gpu_info", "args": {}},
                                 {"module": "gpu_wait", "args": {"timeout": 0.3}}], env)
    assert info["backend"] == "nvidia-smi" and info["gpu_count"] == 1 and info["driver_version"] == "550.54.15"
    g = info["gpus"][0]
    assert g["used_mib"] == 2048 and g["reserved_mib"] is None and g["processes"][0]["pid"] == 1
    assert g["nvlink"] == {"supported": None, "active_links": None} and info["nvlink_active"] is None
    assert wait["failed"] is True
    assert "GPU 0 2048 MiB used; threshold 16 MiB). Holders: GPU 0 pid 1 (root, 2040 MiB): " in wait["msg"], wait["msg"]


def test_fake_is_not_on_the_default_path():
    """Guard for the tests above: without FakeGpus.env the venv resolves the real nvidia-ml-py."""
    out = subprocess.run([PY, "-c", "import pynvml; print(pynvml.__file__)"], env=_bare_env(Path("/tmp")),
                         stdout=subprocess.PIPE, text=True, check=True).stdout
    assert str(FAKE_NVML_DIR) not in out and "site-packages" in out
