# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_info main() in-process with the fake NVML and real holder processes."""
from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _proc
from ansible_collections.gpufleet.serving.plugins.modules import gpu_info


def test_facts(nvml, run_module):
    holder = nvml.hold(gpu=1, mib=777)
    r = run_module(gpu_info.main, {})
    assert r["changed"] is False
    assert (r["backend"], r["driver_version"], r["cuda_driver_version"], r["gpu_count"]) == ("nvml", "560.35.03", "12.6", 2)
    assert r["nvlink_active"] is False
    g0, g1 = r["gpus"]
    assert g0["processes"] == [] and g0["used_mib"] == 0
    [p] = g1["processes"]
    assert p["pid"] == holder.pid and p["used_mib"] == 777 and p["type"] == "compute"
    assert p["user"] == _proc.user_name(os.geteuid())
    assert "fake_gpu.py hold --gpu 1 --mib 777" in p["cmdline"]
    assert g1["errors"] == {"nvlink": "Not Supported"}


def test_subset_and_check_mode(nvml, run_module):
    r = run_module(gpu_info.main, {"gpus": [1]}, check_mode=True)
    assert [g["index"] for g in r["gpus"]] == [1] and r["gpu_count"] == 2


def test_nvlink_active(nvml, run_module):
    nvml.configure(gpus=2, nvlink_links=18)
    r = run_module(gpu_info.main, {})
    assert r["nvlink_active"] is True
    assert all(g["nvlink"] == {"supported": True, "active_links": 18} and g["errors"] == {} for g in r["gpus"])


@pytest.mark.parametrize("gpus,msg", [([2], "GPU index 2 does not exist"), ([-1], "GPU index -1 does not exist")])
def test_bad_index(nvml, run_module, gpus, msg):
    r = run_module(gpu_info.main, {"gpus": gpus})
    assert r["failed"] and msg in r["msg"] and r["backend"] == "nvml"
