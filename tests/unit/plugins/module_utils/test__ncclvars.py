# SPDX-License-Identifier: GPL-3.0-or-later
"""_ncclvars: typo suggestions, debugging knobs, deprecations; the profiles, which are the nccl_tuning role's table."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.serving.plugins.module_utils import _errors, _ncclvars

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


def _profiles():  # the one table: the nccl_tuning role's
    return yaml.safe_load((ROOT / "roles" / "nccl_tuning" / "vars" / "main.yml").read_text())["_gpufleet_nccl_profiles"]


def test_seed_set_is_known_debug_knobs_and_one_is_deprecated():
    rep = _ncclvars.check_names(_profiles()["pcie_only"])
    assert rep.unknown == {}
    assert rep.debug_knobs == sorted(_profiles()["pcie_only"])
    assert list(rep.deprecated) == ["NCCL_MAX_NCHANNELS"]
    text = " ".join(rep.warnings())
    assert "debugging knobs" in text and "hangs" in text and "2.17" in text and "NCCL_MAX_CTAS" in text


def test_non_nccl_names_are_not_judged():
    rep = _ncclvars.check_names(["CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_DEBUG"])
    assert rep == _ncclvars.NameReport({}, [], {})


def test_pcie_only_profile_is_the_seed_set():
    assert _profiles()["pcie_only"] == {
        "NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS",
        "NCCL_MAX_NCHANNELS": "16", "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}
    assert _profiles()["nvlink"] == {}


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


_FORBIDDEN_TAIL = " never written host-wide, even when listed in gpufleet_nccl_allow_vars; give %s to the server alone " \
    "(gpufleet_server_env)"
_NOT_NCCL_TAIL = " (NCCL_*): list each exact name in gpufleet_nccl_allow_vars to write it host-wide, or give it to the " \
    "server alone (gpufleet_server_env)"
_LOADER = "the dynamic loader or the C library reads it in every program"
_NET = "it redirects the network traffic or the TLS trust of every program that honours it"


@pytest.mark.parametrize("env, profile, allow, expected", [
    ({"NCCL_PROTO": "LL"}, "custom", [], ""),
    ({"NCCL_PROTO": "LL", "LD_PRELOAD": "x"}, "custom", [], "LD_PRELOAD (%s) is" % _LOADER + _FORBIDDEN_TAIL % "it"),
    ({"LD_PRELOAD": "x"}, "custom", ["LD_PRELOAD"], "LD_PRELOAD (%s) is" % _LOADER + _FORBIDDEN_TAIL % "it"),
    ({"FOO": "bar", "NCCL_PROTO": "LL"}, "custom", [], "FOO in gpufleet_nccl_env is not an NCCL variable" + _NOT_NCCL_TAIL),
    ({"TORCH_X": "1", "FOO": "2"}, "pcie_only", ["TORCH_X"], "FOO in gpufleet_nccl_env is not an NCCL variable" + _NOT_NCCL_TAIL),
    # Sorted ignoring case, as the role's Jinja did.
    ({"ZED": "1", "alpha": "2", "Beta": "3"}, "pcie_only", [],
     "alpha, Beta, ZED in gpufleet_nccl_env are not NCCL variables" + _NOT_NCCL_TAIL),
    ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}, "custom", ["TORCH_NCCL_*"],
     'gpufleet_nccl_allow_vars must list exact variable names (no patterns), got "TORCH_NCCL_*"; '
     "TORCH_NCCL_ASYNC_ERROR_HANDLING in gpufleet_nccl_env is not an NCCL variable" + _NOT_NCCL_TAIL),
    # Each spelling is named by itself (the Jinja this replaces kept one of two spellings differing only in case).
    ({"http_proxy": "x", "HTTP_PROXY": "y"}, "pcie_only", [],
     "http_proxy (%s), HTTP_PROXY (%s) are" % (_NET, _NET) + _FORBIDDEN_TAIL % "them"),
    # An allow-list entry with a line break is not an exact name.
    ({"NCCL_A": "1"}, "custom", ["PATH\n"], 'gpufleet_nccl_allow_vars must list exact variable names (no patterns), '
                                            'got "PATH\\n"'),
    # Not judged: profile none (the blocks are removed), invalid names (the modules name them), wrong types.
    ({"LD_PRELOAD": "x", "FOO": "1"}, "none", ["PATH", "X*"], ""),
    ({"NCCL PROTO": "LL", "9X": "1"}, "pcie_only", [], ""),
    (["NCCL_PROTO=LL"], "pcie_only", "FOO", ""),
    ({"A": "1"}, "pcie_only", {"A": 1}, "A in gpufleet_nccl_env is not an NCCL variable" + _NOT_NCCL_TAIL),
])
def test_role_names_refused(env, profile, allow, expected):
    assert _ncclvars.role_names_refused(env, profile, allow) == expected


@pytest.mark.parametrize("env, allow", [
    ({"NCCL_PROTO": "LL"}, []), ({"LD_PRELOAD": "x"}, ["LD_PRELOAD"]), ({"ld_preload": "x"}, []), ({"FOO": "1"}, []),
    ({"FOO": "1"}, ["FOO"]), ({"NCCL_X": "1"}, ["PATH"]), ({"NCCL_X": "1"}, ["path"]), ({"NCCL_X": "1"}, ["X*"]),
    ({"PYTHONPATH": "/x", "NCCL_A": "1"}, ["PYTHONPATH"]), ({"TORCH_A": "1", "TORCH_B": "2"}, ["TORCH_A"]),
])
def test_role_refuses_what_the_layer_modules_refuse(env, allow):
    # The role's check before the host is touched must refuse exactly what the modules would refuse on it.
    try:
        _ncclvars.check_allowed(env, allow, option="gpufleet_nccl_allow_vars")
        refused_by_modules = False
    except _ncclvars.NotAllowed:
        refused_by_modules = True
    assert bool(_ncclvars.role_names_refused(env, "custom", allow)) is refused_by_modules


def test_the_role_checks_names_through_the_filter():
    # One list of forbidden names (this module's): the role's vars call the filter, they hold no copy.
    text = (ROOT / "roles" / "nccl_tuning" / "vars" / "main.yml").read_text()
    assert "gpufleet.serving.nccl_names_refused(" in text and "LD_" not in text
    from ansible_collections.gpufleet.serving.plugins.filter.nccl_names_refused import FilterModule
    assert FilterModule().filters()["nccl_names_refused"] is _ncclvars.role_names_refused


@pytest.mark.parametrize("env, allow, policy", [
    ({"NCCL_PROTOCOL": "LL"}, [], "fail"), ({"NCCL_PROTOCOL": "LL"}, [], "warn"),
    ({"NCCL_PROTO": "LL"}, [], "fail"), ({"NCCL_NEWER_KNOB": "1"}, ["NCCL_NEWER_KNOB"], "fail"),
    ({"NCCL_A": "1", "NCCL_PROTO": "LL"}, [], "fail"),
])
def test_role_refuses_unknown_names_as_the_modules_do_with_fail(env, allow, policy):
    # With gpufleet_nccl_unknown_vars=fail the rollout's pre-tasks refuse a typo before any host of the batch is locked
    # or changed (max_fail_percentage then stops the batch at that task); exactly the names the modules would refuse.
    try:
        _ncclvars.apply_name_policy(lambda _msg: None, env, policy, allow)
        refused_by_modules = False
    except _errors.StepError:
        refused_by_modules = True
    refused = _ncclvars.role_names_refused(env, "custom", allow, unknown_vars=policy)
    assert bool(refused) is refused_by_modules
    if refused:
        assert "NCCL_PROTOCOL is not a known NCCL environment variable (did you mean NCCL_PROTO?)" in refused \
            or "NCCL_A is not a known" in refused, refused


def test_auto_resolves_pcie_only_only_where_no_nvlink_is_active_and_says_why_when_unknown():
    assert _ncclvars.auto_profile({"nvlink_active": False, "backend": "nvml"}) == {"profile": "pcie_only", "warning": None}
    assert _ncclvars.auto_profile({"nvlink_active": True, "backend": "nvml"}) == {"profile": "nvlink", "warning": None}
    unknown = _ncclvars.auto_profile({"nvlink_active": None, "backend": "nvidia-smi"})
    assert unknown["profile"] == "nvlink"
    assert unknown["warning"].startswith("gpu_info could not tell whether NVLink is active (backend nvidia-smi)")
