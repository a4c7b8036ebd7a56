# SPDX-License-Identifier: GPL-3.0-or-later
"""_nvml over the fake pynvml (NVML boundary), a stand-in nvidia-smi executable, and the real nvidia-ml-py."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from smi_stub import calls, gpu_row, write_smi

from ansible_collections.gpufleet.serving.plugins.module_utils import _nvml


def test_product_binds_the_fake_here():
    # The fake is first on sys.path in unit tests; the product does not know, it just imports pynvml.
    assert _nvml.pynvml is not None and _nvml.pynvml.__file__.endswith("tests/fakes/nvml/pynvml.py")


def test_nvml_idle_gpu_v2(nvml):
    with _nvml.NvmlBackend() as b:
        assert b.count() == 2
        g = b.info(1)
        sysinfo = b.system()
    assert g["index"] == 1
    assert g["name"] == "NVIDIA H200"
    assert g["uuid"].startswith("GPU-")
    assert g["pci_bus_id"] == "00000000:19:00.0"
    assert (g["total_mib"], g["used_mib"], g["reserved_mib"], g["free_mib"]) == (143771, 0, 615, 143771 - 615)
    assert g["memory_api"] == "v2"
    assert g["processes"] == []
    # NOT_SUPPORTED on NVLink is handled per call: recorded, and the rest of the answer is intact.
    assert g["nvlink"] == {"supported": False, "active_links": 0}
    assert g["errors"] == {"nvlink": "Not Supported"}
    assert sysinfo == {"backend": "nvml", "driver_version": "560.35.03", "cuda_driver_version": "12.6", "errors": {}}


def test_nvml_v1_folds_reserved_into_used(nvml):
    nvml.configure(gpus=1, memory_v2=False)
    holder = nvml.hold(gpu=0, mib=2000)
    with _nvml.NvmlBackend() as b:
        m = b.memory(0)
        m_again = b.memory(0)
    assert m == {"total_mib": 143771, "used_mib": 2615, "free_mib": 143771 - 615 - 2000, "reserved_mib": None, "memory_api": "v1"}
    assert m_again == m  # the v1 fallback is remembered
    assert holder.poll() is None


def test_nvml_processes_are_real_holders(nvml):
    a = nvml.hold(gpu=0, mib=30000)
    b = nvml.hold(gpu=0, mib=1000)
    c = nvml.hold(gpu=1, mib=5)
    with _nvml.NvmlBackend() as be:
        g0, g1 = be.info(0), be.info(1)
    assert g0["used_mib"] == 31000
    assert sorted((p["pid"], p["used_mib"], p["type"]) for p in g0["processes"]) == sorted(
        [(a.pid, 30000, "compute"), (b.pid, 1000, "compute")])
    assert [p["pid"] for p in g1["processes"]] == [c.pid]


@pytest.mark.parametrize("links,expected,errors", [
    (0, {"supported": False, "active_links": 0}, {"nvlink": "Not Supported"}),
    (4, {"supported": True, "active_links": 4}, {}),
    (18, {"supported": True, "active_links": 18}, {}),
])
def test_nvlink(nvml, links, expected, errors):
    nvml.configure(gpus=1, nvlink_links=links)
    with _nvml.NvmlBackend() as b:
        g = b.info(0)
    assert g["nvlink"] == expected
    assert g["errors"] == errors
    assert g["used_mib"] == 0  # one failing query never hides the others


@pytest.mark.parametrize("wanted,result", [(None, [0, 1]), ([], [0, 1]), ([1], [1]), ([1, 0, 1], [0, 1])])
def test_resolve_indices(nvml, wanted, result):
    with _nvml.NvmlBackend() as b:
        assert _nvml.resolve_indices(b, wanted) == result


@pytest.mark.parametrize("gpus,wanted,msg", [
    (2, [2], "GPU index 2 does not exist on this host (it has 2 GPUs: 0..1)"),
    (2, [0, 5, -1], "GPU index 5, -1 does not exist on this host (it has 2 GPUs: 0..1)"),
    (1, [3], "GPU index 3 does not exist on this host (it has 1 GPU: 0..0)"),
])
def test_resolve_indices_bad(nvml, gpus, wanted, msg):
    nvml.configure(gpus=gpus)
    with _nvml.NvmlBackend() as b:
        with pytest.raises(_nvml.GpuError) as e:
            _nvml.resolve_indices(b, wanted)
    assert str(e.value) == msg


def test_handle_error_is_gpu_error(nvml):
    with _nvml.NvmlBackend() as b:
        with pytest.raises(_nvml.GpuError, match="GPU 7: nvmlDeviceGetHandleByIndex failed: Invalid Argument"):
            b.memory(7)


@pytest.mark.parametrize("api,mib", [("v2", 16), ("nvidia-smi", 16), ("v1", 1024)])
def test_default_threshold(api, mib):
    assert _nvml.default_threshold_mib(api) == mib


# --- backend choice and fallback ---

def test_open_backend_prefers_nvml(nvml, tmp_path, monkeypatch):
    write_smi(tmp_path / "bin", {"gpus": [gpu_row(0)]})
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    b = _nvml.open_backend()
    try:
        assert b.name == "nvml"
    finally:
        b.close()
    assert calls(tmp_path / "bin") == []
    s = _nvml.open_backend("nvidia-smi")
    assert isinstance(s, _nvml.SmiBackend) and s.count() == 1


def test_library_not_found_falls_back_to_nvidia_smi(nvml, tmp_path, monkeypatch):
    nvml.configure(gpus=2, init_error="LIBRARY_NOT_FOUND")
    write_smi(tmp_path / "bin", {"gpus": [gpu_row(0), gpu_row(1, used=4096)],
                                 "apps": [{"gpu_uuid": "GPU-smi-1", "pid": 4242, "used_memory": 4090}]})
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    b = _nvml.open_backend()
    assert b.name == "nvidia-smi"
    assert _nvml.resolve_indices(b, None) == [0, 1]
    g1 = b.info(1)
    assert g1["used_mib"] == 4096 and g1["reserved_mib"] == 615 and g1["memory_api"] == "nvidia-smi"
    assert g1["processes"] == [{"pid": 4242, "used_mib": 4090, "type": "compute"}]
    assert g1["nvlink"] == {"supported": None, "active_links": None}
    assert b.info(0)["processes"] == []
    assert b.system()["driver_version"] == "550.54.15"
    with pytest.raises(_nvml.BackendUnavailable, match="nvmlInit failed: NVML Shared Library Not Found"):
        _nvml.open_backend("nvml")


def test_neither_backend_is_a_clear_error(nvml, tmp_path, monkeypatch):
    nvml.configure(gpus=2, init_error="LIBRARY_NOT_FOUND")
    monkeypatch.setenv("PATH", str(tmp_path))  # empty: no nvidia-smi
    with pytest.raises(_nvml.BackendUnavailable) as e:
        _nvml.open_backend()
    assert str(e.value) == ("No GPU backend available: nvmlInit failed: NVML Shared Library Not Found; "
                            "nvidia-smi not found on PATH")
    assert "Traceback" in e.value.exception
    with pytest.raises(_nvml.BackendUnavailable, match="nvidia-smi not found on PATH"):
        _nvml.open_backend("nvidia-smi")


def test_pynvml_missing(nvml, tmp_path, monkeypatch):
    monkeypatch.setattr(_nvml, "pynvml", None)
    monkeypatch.setattr(_nvml, "PYNVML_IMPORT_ERROR", "Traceback: ModuleNotFoundError")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(_nvml.BackendUnavailable, match="pynvml .nvidia-ml-py. is not importable; nvidia-smi not found"):
        _nvml.open_backend()
    write_smi(tmp_path, {"gpus": [gpu_row(0)]})
    assert _nvml.open_backend().name == "nvidia-smi"


def test_real_nvidia_ml_py_without_driver(tmp_path):
    """The real nvidia-ml-py on a GPU-less host: nvmlInit fails, and with no nvidia-smi that is the message."""
    mu = os.path.dirname(_nvml.__file__)
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from ansible_collections.gpufleet.serving.plugins.module_utils import _nvml\n"
            "print(_nvml.pynvml.__file__)\n"
            "try:\n    _nvml.open_backend()\nexcept _nvml.BackendUnavailable as e:\n    print(e)\n") % str(
                os.path.abspath(os.path.join(mu, *[".."] * 5)))
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    lines = r.stdout.strip().splitlines()
    assert "site-packages" in lines[0], r.stdout  # the real library, not the fake
    assert lines[1].startswith("No GPU backend available: nvmlInit failed: "), r.stdout
    assert lines[1].endswith("; nvidia-smi not found on PATH"), r.stdout


# --- nvidia-smi parsing ---

def test_smi_without_memory_reserved_field(tmp_path):
    d = tmp_path / "bin"
    write_smi(d, {"gpus": [gpu_row(0, used=12)], "unknown_fields": ["memory.reserved"]})
    b = _nvml.SmiBackend(str(d / "nvidia-smi"))
    assert b.memory(0) == {"total_mib": 143771, "used_mib": 12, "free_mib": 143771 - 615 - 12, "reserved_mib": None,
                           "memory_api": "nvidia-smi"}
    b.refresh()
    queries = [c[0] for c in calls(d) if c[0].startswith("--query-gpu")]
    assert "memory.reserved" in queries[0]
    assert all("memory.reserved" not in q for q in queries[1:]) and len(queries) == 3  # remembered after one miss


@pytest.mark.parametrize("used,reserved,exp_used,exp_reserved", [
    ("[N/A]", "[N/A]", None, None),
    ("[Not Supported]", 615, None, 615),
    (0, 0, 0, 0),
    ("7.0", 615, 7, 615),
])
def test_smi_na_values(tmp_path, used, reserved, exp_used, exp_reserved):
    row = gpu_row(0, reserved=reserved)
    row["memory.used"] = used
    write_smi(tmp_path, {"gpus": [row]})
    m = _nvml.SmiBackend(str(tmp_path / "nvidia-smi")).memory(0)
    assert (m["used_mib"], m["reserved_mib"]) == (exp_used, exp_reserved)


def test_smi_failure_is_gpu_error(tmp_path):
    write_smi(tmp_path, {"fail": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."})
    b = _nvml.SmiBackend(str(tmp_path / "nvidia-smi"))
    with pytest.raises(_nvml.GpuError, match="exited 9: NVIDIA-SMI has failed because it couldn't communicate"):
        b.count()


def test_smi_missing_gpu_and_missing_binary(tmp_path):
    write_smi(tmp_path, {"gpus": [gpu_row(0)]})
    b = _nvml.SmiBackend(str(tmp_path / "nvidia-smi"))
    with pytest.raises(_nvml.GpuError, match="GPU 3 not reported by nvidia-smi"):
        b.info(3)
    with pytest.raises(_nvml.GpuError, match="failed"):
        _nvml.SmiBackend(str(tmp_path / "absent")).count()


@pytest.mark.parametrize("text,rows", [
    ("", []),
    ("\n\n", []),
    ("0, GPU-a, 10\n1, GPU-b, [N/A]\n", [{"i": "0", "u": "GPU-a", "m": "10"}, {"i": "1", "u": "GPU-b", "m": "[N/A]"}]),
    ('0, "NVIDIA H200, NVL", 5\n', [{"i": "0", "u": "NVIDIA H200, NVL", "m": "5"}]),
])
def test_parse_csv(text, rows):
    assert _nvml.parse_csv(text, ["i", "u", "m"]) == rows


def test_parse_csv_bad_line():
    with pytest.raises(_nvml.GpuError, match="unexpected nvidia-smi output line"):
        _nvml.parse_csv("0, 1\n", ["i", "u", "m"])


@pytest.mark.parametrize("v,out", [(None, None), ("", None), ("[N/A]", None), ("[Not Supported]", None), ("x", None),
                                   ("12", 12), ("12.9", 12), ("0", 0)])
def test_int(v, out):
    assert _nvml._int(v) == out


def test_backend_results_are_json_serialisable(nvml):
    nvml.hold(gpu=0, mib=10)
    with _nvml.NvmlBackend() as b:
        json.dumps([b.info(0), b.system()])
