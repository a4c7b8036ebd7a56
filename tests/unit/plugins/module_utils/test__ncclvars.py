# SPDX-License-Identifier: GPL-3.0-or-later
"""_ncclvars: typo suggestions, debugging knobs, deprecations, profiles (and the role's copy of them)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.serving.plugins.module_utils import _ncclvars

ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.parametrize("typo,want", [
    ("NCCL_PROTOCOL", "NCCL_PROTO"),
    ("NCCL_ALGORITHM", "NCCL_ALGO"),
    ("NCCL_BUFSIZE", "NCCL_BUFFSIZE"),
    ("NCCL_P2P_LEVL", "NCCL_P2P_LEVEL"),
    ("NCCL_MAX_NCHANNEL", "NCCL_MAX_NCHANNELS"),
    ("NCCL_SOCKET_IFNAMES", "NCCL_SOCKET_IFNAME"),
])
def test_typos_are_unknown_with_the_right_suggestion(typo, want):
    rep = _ncclvars.check_names([typo])
    assert typo in rep.unknown and rep.unknown[typo][0] == want
    assert "did you mean %s" % want in rep.warnings()[0]


def test_seed_set_is_known_debug_knobs_and_one_is_deprecated():
    rep = _ncclvars.check_names(_ncclvars.PROFILES["pcie_only"])
    assert rep.unknown == {}
    assert rep.debug_knobs == sorted(_ncclvars.PROFILES["pcie_only"])
    assert list(rep.deprecated) == ["NCCL_MAX_NCHANNELS"]
    text = " ".join(rep.warnings())
    assert "debugging knobs" in text and "hangs" in text and "2.17" in text and "NCCL_MAX_CTAS" in text


def test_non_nccl_names_are_not_judged():
    rep = _ncclvars.check_names(["CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_DEBUG"])
    assert rep == _ncclvars.NameReport({}, [], {})


def test_pcie_only_profile_is_the_seed_set():
    assert _ncclvars.PROFILES["pcie_only"] == {
        "NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS",
        "NCCL_MAX_NCHANNELS": "16", "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}
    assert _ncclvars.PROFILES["nvlink"] == {}


def test_role_profiles_equal_the_module_utils_profiles():
    data = yaml.safe_load((ROOT / "roles" / "nccl_tuning" / "vars" / "main.yml").read_text())
    assert data["_gpufleet_nccl_profiles"] == _ncclvars.PROFILES


@pytest.mark.parametrize("active,profile", [(False, "pcie_only"), (True, "nvlink"), (None, "nvlink")])
def test_auto_profile(active, profile):
    assert _ncclvars.auto_profile(active)[0] == profile


def test_role_defaults_equal_argument_specs():
    role = ROOT / "roles" / "nccl_tuning"
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(defaults) == set(spec)
    for k, v in defaults.items():
        assert spec[k]["default"] == v, k
