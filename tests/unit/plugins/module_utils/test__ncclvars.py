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


# --- which names the layers may write host-wide (issue 13) ---------------------------------------------------------

def test_nccl_names_pass_without_an_allow_list():
    _ncclvars.check_allowed(["NCCL_PROTO", "NCCL_PROTOCOL", "NCCL_NET_PLUGIN"], [])


@pytest.mark.parametrize("name", ["FOO", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "CUDA_DEVICE_MAX_CONNECTIONS", "nccl_proto"])
def test_other_names_are_refused_unless_listed(name):
    with pytest.raises(_ncclvars.NotAllowed) as e:
        _ncclvars.check_allowed(["NCCL_PROTO", name], [])
    assert "%s is not an NCCL variable (NCCL_*); list each exact name in allow_vars" % name in str(e.value)
    assert "nothing was changed" in str(e.value)
    assert e.value.extra == {"forbidden_vars": {}, "not_allowed_vars": [name], "bad_allow_vars": []}
    _ncclvars.check_allowed(["NCCL_PROTO", name], [name])


@pytest.mark.parametrize("name,why", [
    ("LD_PRELOAD", "dynamic loader"), ("LD_LIBRARY_PATH", "dynamic loader"), ("ld_preload", "dynamic loader"),
    ("GLIBC_TUNABLES", "dynamic loader"), ("MALLOC_ARENA_MAX", "C library"),
    ("PYTHONPATH", "Python interpreter"), ("PYTHONSTARTUP", "Python interpreter"), ("PYTHONHOME", "Python interpreter"),
    ("PATH", "every program or shell"), ("BASH_ENV", "every program or shell"), ("LC_ALL", "locale"),
    ("NODE_OPTIONS", "runtime"), ("https_proxy", "network"), ("SSL_CERT_FILE", "TLS"),
])
def test_process_wide_names_are_refused_even_when_listed(name, why):
    for allow in ([], [name]):
        with pytest.raises(_ncclvars.NotAllowed) as e:
            _ncclvars.check_allowed([name], allow)
        msg = str(e.value)
        assert "%s (" % name in msg and why in msg and "never written host-wide, even when listed in allow_vars" in msg
        assert e.value.extra["forbidden_vars"] == {name: _ncclvars.forbidden_reason(name)}
        assert e.value.extra["not_allowed_vars"] == []


def test_a_forbidden_name_in_the_allow_list_alone_is_refused():
    with pytest.raises(_ncclvars.NotAllowed, match="LD_PRELOAD .*never written host-wide"):
        _ncclvars.check_allowed(["NCCL_PROTO"], ["LD_PRELOAD"])


@pytest.mark.parametrize("entry", ["TORCH_NCCL_*", "NVSHMEM_.*", "A B", "", 3])
def test_allow_list_takes_exact_names_only(entry):
    with pytest.raises(_ncclvars.NotAllowed, match=r"allow_vars must list exact variable names \(no patterns\)"):
        _ncclvars.check_allowed(["NCCL_PROTO"], [entry])


def test_one_message_names_every_refused_variable_and_the_option():
    with pytest.raises(_ncclvars.NotAllowed) as e:
        _ncclvars.check_allowed(["NCCL_PROTO", "FOO", "BAR", "PYTHONPATH", "LD_PRELOAD"], ["X_*"],
                                option="gpufleet_nccl_allow_vars")
    msg = str(e.value)
    assert "gpufleet_nccl_allow_vars must list exact variable names (no patterns), got 'X_*'" in msg
    assert "LD_PRELOAD (the dynamic loader" in msg and "PYTHONPATH (the Python interpreter" in msg
    assert "are never written host-wide" in msg
    assert "BAR, FOO are not NCCL variables (NCCL_*); list each exact name in gpufleet_nccl_allow_vars" in msg


def test_nccl_names_are_never_forbidden():
    assert not any(_ncclvars.forbidden_reason(n) for n in _ncclvars.KNOWN)
    assert _ncclvars.forbidden_reason("TORCH_SYMM_MEM_DISABLE_MULTICAST") is None
    assert _ncclvars.forbidden_reason("PYTORCH_CUDA_ALLOC_CONF") is None


def test_allow_listed_nccl_name_is_not_unknown():
    assert "NCCL_NEWER_THAN_KNOWN" in _ncclvars.check_names(["NCCL_NEWER_THAN_KNOWN"]).unknown
    assert _ncclvars.check_names(["NCCL_NEWER_THAN_KNOWN"], ["NCCL_NEWER_THAN_KNOWN"]).unknown == {}


def test_role_forbidden_list_equals_the_module_utils_list():
    groups = yaml.safe_load((ROOT / "roles" / "nccl_tuning" / "vars" / "main.yml").read_text())["_gpufleet_nccl_forbidden"]
    assert {n: g["why"] for g in groups for n in g["names"]} == _ncclvars.FORBIDDEN_NAMES
    assert {p: g["why"] for g in groups for p in g["prefixes"]} == _ncclvars.FORBIDDEN_PREFIXES
