# SPDX-License-Identifier: GPL-3.0-or-later
"""The nccl_tuning role through real ansible-playbook runs: profiles, auto on fake GPUs, layers, typos, none."""
from __future__ import annotations

import os

from nccl_helpers import ORIGINAL_SITECUSTOMIZE, play

PCIE = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}
FACTS = ["gpufleet_nccl_changed", "gpufleet_nccl_effective_env", "gpufleet_nccl_profile_resolved"]


def role(**role_vars):
    return {"name": "Apply the NCCL tuning", "ansible.builtin.include_role": {"name": "gpufleet.serving.nccl_tuning"},
            "vars": role_vars}


def test_pcie_only_on_both_layers_check_real_idempotent(tmp_path, syspy):
    conf = tmp_path / "nccl.conf"
    v = dict(gpufleet_nccl_profile="pcie_only", gpufleet_nccl_layers=["sitecustomize", "nccl_conf"],
             gpufleet_nccl_interpreters=[str(syspy.python)], gpufleet_nccl_conf_path=str(conf),
             gpufleet_nccl_env={"NCCL_DEBUG": "WARN"})
    proc, res = play(tmp_path, [role(**v)], FACTS, name="check", check=True, diff=True)
    assert proc.returncode == 0, proc.stdout
    assert res["gpufleet_nccl_changed"] is True and res["gpufleet_nccl_profile_resolved"] == "pcie_only"
    assert syspy.etc_file.read_text() == ORIGINAL_SITECUSTOMIZE and not conf.exists()  # check mode wrote nothing
    # NVIDIA's warnings, once each although two layers report them.
    assert proc.stdout.count("are NCCL debugging knobs") == 1, proc.stdout
    assert "NCCL_MAX_NCHANNELS is deprecated since NCCL 2.17 in favour of NCCL_MAX_CTAS" in proc.stdout

    proc, res = play(tmp_path, [role(**v)], FACTS, name="real")
    assert proc.returncode == 0, proc.stdout
    want = dict(PCIE, NCCL_DEBUG="WARN")
    assert res["gpufleet_nccl_changed"] is True and res["gpufleet_nccl_effective_env"] == want
    assert syspy.env_of(syspy.python, list(want)) == want
    assert "NCCL_PROTO=LL\n" in conf.read_text() and "NCCL_DEBUG=WARN\n" in conf.read_text()

    proc, res = play(tmp_path, [role(**v)], FACTS, name="again")
    assert proc.returncode == 0, proc.stdout
    assert res["gpufleet_nccl_changed"] is False
    assert "changed=0" in proc.stdout


def test_auto_picks_pcie_only_without_nvlink_and_nvlink_with_it(tmp_path, syspy, fake_gpus):
    v = dict(gpufleet_nccl_profile="auto", gpufleet_nccl_interpreters=[str(syspy.python)])
    fake_gpus.configure(gpus=2, nvlink_links=0)
    proc, res = play(tmp_path, [role(**v)], FACTS, name="pcie", env=fake_gpus.env)
    assert proc.returncode == 0, proc.stdout
    assert res["gpufleet_nccl_profile_resolved"] == "pcie_only" and res["gpufleet_nccl_effective_env"] == PCIE
    assert syspy.env_of(syspy.python, list(PCIE)) == PCIE

    fake_gpus.configure(gpus=2, nvlink_links=4)
    proc, res = play(tmp_path, [role(**v)], FACTS, name="nvlink", env=fake_gpus.env)
    assert proc.returncode == 0, proc.stdout
    # nvlink sets no overrides: the block goes, the file is the distro's again.
    assert res["gpufleet_nccl_profile_resolved"] == "nvlink" and res["gpufleet_nccl_effective_env"] == {}
    assert res["gpufleet_nccl_changed"] is True
    assert syspy.etc_file.read_text() == ORIGINAL_SITECUSTOMIZE
    assert syspy.env_of(syspy.python, ["NCCL_PROTO"]) == {"NCCL_PROTO": None}


def test_typos_warned_or_refused_and_profile_none_restores(tmp_path, syspy):
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_DEBUG=WARN\n")
    base = dict(gpufleet_nccl_layers=["sitecustomize", "nccl_conf"], gpufleet_nccl_interpreters=[str(syspy.python)],
                gpufleet_nccl_conf_path=str(conf))
    typo = dict(base, gpufleet_nccl_profile="custom", gpufleet_nccl_env={"NCCL_PROTOCOL": "LL", "NCCL_ALGO": "Ring"})

    proc, _out = play(tmp_path, [role(**dict(typo, gpufleet_nccl_unknown_vars="fail"))], [], name="refused")
    assert proc.returncode != 0
    assert "NCCL_PROTOCOL is not a known NCCL environment variable (did you mean NCCL_PROTO?)" in proc.stdout
    assert syspy.etc_file.read_text() == ORIGINAL_SITECUSTOMIZE and conf.read_text() == "NCCL_DEBUG=WARN\n"

    proc, res = play(tmp_path, [role(**typo)], FACTS, name="warned")
    assert proc.returncode == 0, proc.stdout
    assert "[WARNING]: NCCL_PROTOCOL is not a known NCCL environment variable (did you mean NCCL_PROTO?)" in proc.stdout
    assert res["gpufleet_nccl_effective_env"] == {"NCCL_PROTOCOL": "LL", "NCCL_ALGO": "Ring"}

    proc, res = play(tmp_path, [role(**dict(base, gpufleet_nccl_profile="none"))], FACTS, name="none")
    assert proc.returncode == 0, proc.stdout
    assert res["gpufleet_nccl_changed"] is True and res["gpufleet_nccl_effective_env"] == {}
    assert syspy.etc_file.read_bytes() == ORIGINAL_SITECUSTOMIZE.encode()
    assert conf.read_bytes() == b"NCCL_DEBUG=WARN\n"
    assert os.path.islink(syspy.link)


def test_bad_role_input_fails_before_any_change(tmp_path, syspy):
    v = dict(gpufleet_nccl_profile="pcie_only", gpufleet_nccl_layers=["sitecustomize", "systemd"],
             gpufleet_nccl_interpreters=[str(syspy.python)])
    proc, _out = play(tmp_path, [role(**v)], [], name="bad")
    assert proc.returncode != 0
    assert "gpufleet_nccl_layers" in proc.stdout
    assert syspy.etc_file.read_text() == ORIGINAL_SITECUSTOMIZE
