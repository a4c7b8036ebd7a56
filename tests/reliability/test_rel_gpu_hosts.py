# SPDX-License-Identifier: GPL-3.0-or-later
"""Targets where the GPU layer cannot answer: no pynvml and no nvidia-smi, and a host with zero GPUs.

Decided behaviour: gpu_info is a fact module and reports what it sees (gpu_count 0, gpus []); every module that would
act on GPUs (gpu_wait, process_kill gpu_holders, the gpu_server role's check step) fails with one clear sentence;
the gpu_server role fails in its read-only check step, so the running server is left alone. Module-level timeout
refusals are checked here too (they fail before any GPU query).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import typing as t
from pathlib import Path

import pytest

from helpers import FakeGpus, pid_alive
from rel_helpers import local_play, rescued_role

SYSTEM_PY = "/usr/bin/python3"
TAG = "relgpu"


# The gpu_server role's last task, after its rescue: the failure of its lock/check/restart block.
FAIL_HOST = "Release the host lock, and fail the host where its flow failed"


class Server:
    """A running 'server' (tagged sleeper) with the role's pidfile, log and state file, in `base`."""

    def __init__(self, base: Path) -> None:
        self.dirs = {k: base / k for k in ("run", "log", "state")}
        for d in self.dirs.values():
            d.mkdir()
        self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                                     env=dict(os.environ, GPUFLEET_SERVICE=TAG))
        start = int(open("/proc/%d/stat" % self.proc.pid).read().rsplit(")", 1)[1].split()[19])
        (self.dirs["run"] / (TAG + ".pid")).write_text("%d %d\n" % (self.proc.pid, start))
        (self.dirs["log"] / (TAG + ".log")).write_text("serving\n")
        (self.dirs["state"] / (TAG + ".json")).write_text('{"fingerprint": "old"}\n')
        self.vars = {"gpufleet_server_name": TAG, "gpufleet_server_command": [sys.executable, "-c", "pass"],
                     "gpufleet_server_health_url": "http://127.0.0.1:9/health", "gpufleet_server_kill_grace": 0.5,
                     "gpufleet_server_clean_timeout": 2, "gpufleet_server_start_timeout": 3,
                     "gpufleet_server_run_dir": str(self.dirs["run"]), "gpufleet_server_log_dir": str(self.dirs["log"]),
                     "gpufleet_server_state_dir": str(self.dirs["state"])}

    def state(self) -> t.Dict[str, t.Any]:
        files = {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for d in self.dirs.values() for f in sorted(d.iterdir())}
        return {"alive": pid_alive(self.proc.pid), "files": files}

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


GPU_STEPS = [
    {"name": "gpu_info", "gpufleet.serving.gpu_info": {}, "register": "info", "ignore_errors": True},
    {"name": "gpu_wait clean", "gpufleet.serving.gpu_wait": {"timeout": 1}, "register": "wait_clean", "ignore_errors": True},
    {"name": "gpu_wait busy", "gpufleet.serving.gpu_wait": {"state": "busy", "timeout": 1}, "register": "wait_busy",
     "ignore_errors": True},
    {"name": "process_kill gpu_holders", "gpufleet.serving.process_kill": {"gpu_holders": [0]}, "register": "kill",
     "ignore_errors": True},
]
GPU_REGS = ["info", "wait_clean", "wait_busy", "kill", "srv", "nccl"]


@pytest.mark.skipif(not os.path.exists(SYSTEM_PY), reason="needs a python3 without pynvml at %s" % SYSTEM_PY)
@pytest.mark.reliability(
    section="input", case="Target without pynvml and without nvidia-smi",
    provoked="modules run by an interpreter that cannot import pynvml (/usr/bin/python3), with no nvidia-smi on PATH; "
             "gpu_info, gpu_wait, process_kill gpu_holders, the gpu_server role (server running) and nccl_tuning "
             "profile auto",
    outcome="each fails with 'No GPU backend available: pynvml (nvidia-ml-py) is not importable; nvidia-smi not "
            "found on PATH. Failed to import the required Python library (nvidia-ml-py) ...' (the host's reason first, "
            "so the head of the role's failure summary keeps it); the role fails in its read-only check step; the "
            "server process, pidfile, log and state are unchanged")
def test_host_without_any_gpu_backend(tmp_path):
    out = subprocess.run([SYSTEM_PY, "-c", "import pynvml"], stderr=subprocess.DEVNULL, check=False)
    if out.returncode == 0:
        pytest.skip("%s can import pynvml" % SYSTEM_PY)
    server = Server(tmp_path)
    try:
        _no_backend(tmp_path, server)
    finally:
        server.stop()


def _no_backend(tmp_path: Path, server: Server) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FAKE_NVML_CONFIG")}
    env["PATH"] = os.path.dirname(sys.executable) + ":/usr/sbin:/usr/bin:/sbin:/bin"
    assert shutil.which("nvidia-smi", path=env["PATH"]) is None
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("# untouched\n")
    before = server.state()
    tasks = GPU_STEPS + [
        rescued_role("gpu_server role", "gpufleet.serving.gpu_server", server.vars, "srv"),
        rescued_role("nccl_tuning role, profile auto", "gpufleet.serving.nccl_tuning",
                     {"gpufleet_nccl_profile": "auto", "gpufleet_nccl_interpreters": [SYSTEM_PY],
                      "gpufleet_nccl_sitecustomize_path": str(site / "sitecustomize.py"),
                      "gpufleet_nccl_probe_env": {"PYTHONPATH": str(site)}}, "nccl"),
    ]
    proc, res = local_play(tmp_path, tasks, GPU_REGS, env, interpreter=SYSTEM_PY)
    want = "No GPU backend available: pynvml (nvidia-ml-py) is not importable; nvidia-smi not found on PATH"
    for k in ("info", "wait_clean", "wait_busy", "kill"):
        assert res[k]["failed"] is True, (k, res[k])
        assert res[k]["msg"].startswith(want + ". Failed to import the required Python library (nvidia-ml-py)"), res[k]["msg"]
    assert res["srv"]["failed"] is True and want in res["srv"]["msg"], res["srv"]
    assert res["srv"]["task"] == FAIL_HOST, res["srv"]
    assert res["nccl"]["failed"] is True and want in res["nccl"]["msg"], res["nccl"]
    assert res["nccl"]["task"] == "Read the NVLink state for the auto profile", res["nccl"]
    assert server.state() == before
    assert (site / "sitecustomize.py").read_text() == "# untouched\n"


TIMEOUT_STEPS = [
    {"name": "gpu_wait timeout 0", "gpufleet.serving.gpu_wait": {"timeout": 0}, "register": "w0", "ignore_errors": True},
    {"name": "gpu_wait poll 0", "gpufleet.serving.gpu_wait": {"poll_interval": 0}, "register": "p0", "ignore_errors": True},
    {"name": "server_ready timeout -1", "gpufleet.serving.server_ready": {"health_url": "http://127.0.0.1:9/", "timeout": -1},
     "register": "r", "ignore_errors": True},
    {"name": "process_kill grace -1", "gpufleet.serving.process_kill": {"tag": "GPUFLEET_SERVICE=" + TAG, "grace": -1},
     "register": "k", "ignore_errors": True},
]


@pytest.fixture(scope="module")
def zero_gpus(tmp_path_factory):
    """One run on a host whose fake NVML has no GPU: the GPU steps, the role, then the timeout refusals."""
    base = tmp_path_factory.mktemp("rel-zero-gpus")
    fg = FakeGpus(base / "nvml")
    fg.configure(gpus=0)
    server = Server(base)
    try:
        before = server.state()
        tasks = GPU_STEPS + [rescued_role("gpu_server role", "gpufleet.serving.gpu_server", server.vars, "srv")] + TIMEOUT_STEPS
        proc, res = local_play(base, tasks, GPU_REGS + ["w0", "p0", "r", "k"], fg.env)
        yield {"res": res, "before": before, "after": server.state()}
    finally:
        server.stop()


@pytest.mark.reliability(
    section="input", case="Target without any GPU",
    provoked="the fake NVML configured with zero GPUs; gpu_info, gpu_wait (clean and busy), process_kill "
             "gpu_holders [0], and the gpu_server role with its server running",
    outcome="gpu_info succeeds with gpu_count 0 and gpus []; gpu_wait fails 'gpus: this host has no GPUs, so there "
            "is nothing to wait for' (a vacuous pass would be wrong); process_kill: 'GPU index 0 does not exist on this "
            "host (it has no GPUs)'; the role fails in its check step ('no GPU server can run here') and changes nothing")
def test_host_with_zero_gpus(zero_gpus):
    res = zero_gpus["res"]
    info = res["info"]
    assert not info.get("failed") and info["gpu_count"] == 0 and info["gpus"] == [] and info["nvlink_active"] is None, info
    for k in ("wait_clean", "wait_busy"):
        assert res[k]["failed"] is True and res[k]["msg"] == "gpus: this host has no GPUs, so there is nothing to wait for", res[k]
    assert res["kill"]["failed"] is True
    assert res["kill"]["msg"] == "GPU index 0 does not exist on this host (it has no GPUs)", res["kill"]["msg"]
    assert res["srv"]["failed"] is True and res["srv"]["task"] == FAIL_HOST, res["srv"]
    assert "gpus: this host has no GPUs, so no GPU server can run here" in res["srv"]["msg"], res["srv"]
    assert zero_gpus["after"] == zero_gpus["before"]


@pytest.mark.reliability(
    section="input", case="Negative or zero timeouts (modules)",
    provoked="gpu_wait timeout 0 and poll_interval 0; server_ready timeout -1; process_kill grace -1 (selecting the "
             "running server by its tag)",
    outcome="each fails naming the option ('timeout must be greater than 0 seconds, got 0.0', 'grace must be >= 0 "
            "seconds, got -1.0', ...) before selecting or signalling anything; the server process is alive")
def test_module_timeouts_must_be_positive(zero_gpus):
    res = zero_gpus["res"]
    assert res["w0"]["msg"] == "timeout must be greater than 0 seconds, got 0.0"
    assert res["p0"]["msg"] == "poll_interval must be greater than 0 seconds, got 0.0"
    assert res["r"]["msg"] == "timeout must be greater than 0 seconds, got -1.0"
    assert res["k"]["msg"] == "grace must be >= 0 seconds, got -1.0"
    assert all(res[k]["failed"] is True for k in ("w0", "p0", "r", "k"))
    assert zero_gpus["after"]["alive"] is True
