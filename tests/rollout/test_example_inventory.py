# SPDX-License-Identifier: GPL-3.0-or-later
"""inventories/example parses, and every host's gpufleet_* variables pass the roles' argument_specs.

Validation runs ansible.builtin.validate_argument_spec on the controller against each host's variables,
with the example's own connection settings (no host is contacted: the action never connects).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

from collection_copy import private_collections
from rollout_helpers import ROOT
from helpers import VENV_BIN, run_playbook

EXAMPLE = ROOT / "inventories" / "example"

VALIDATE = """
- name: Validate the inventory against the role argument specs
  hosts: gpufleet_servers
  gather_facts: false
  tasks:
    - name: Validate gpufleet_server_* against gpufleet.serving.gpu_server's argument_spec
      ansible.builtin.validate_argument_spec:
        argument_spec: "{{ (lookup('ansible.builtin.file', roles ~ '/gpu_server/meta/argument_specs.yml')
                           | from_yaml).argument_specs.main.options }}"
        provided_arguments: "{{ hostvars[inventory_hostname] | dict2items | selectattr('key', 'match', '^gpufleet_server_')
                                | items2dict }}"

    - name: Validate gpufleet_nccl_* against gpufleet.serving.nccl_tuning's argument_spec
      ansible.builtin.validate_argument_spec:
        argument_spec: "{{ (lookup('ansible.builtin.file', roles ~ '/nccl_tuning/meta/argument_specs.yml')
                           | from_yaml).argument_specs.main.options }}"
        provided_arguments: "{{ hostvars[inventory_hostname] | dict2items | selectattr('key', 'match', '^gpufleet_nccl_')
                                | items2dict }}"

    - name: Save what was validated
      ansible.builtin.copy:
        content: "{{ hostvars[inventory_hostname] | dict2items | selectattr('key', 'match', '^gpufleet_')
                     | items2dict | to_nice_json }}"
        dest: "{{ out }}/{{ inventory_hostname }}.json"
        mode: "0644"
      delegate_to: localhost
      vars:
        ansible_connection: local
        ansible_become: false
        ansible_python_interpreter: "{{ ansible_playbook_python }}"
"""


def validate(inventory, tmp_path, *args):
    pb = tmp_path / "validate.yml"
    pb.write_text(VALIDATE)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    roles = private_collections() / "ansible_collections" / "gpufleet" / "serving" / "roles"
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(private_collections()))
    r = run_playbook(pb, *args, inventory=str(inventory), env=env, extra_vars={"roles": str(roles), "out": str(out)},
                     timeout=120)
    return r, out


def test_example_inventory_parses_into_the_documented_groups():
    p = subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(EXAMPLE), "--list"], cwd=str(ROOT), check=False,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "WARNING" not in p.stderr and "ERROR" not in p.stderr, p.stderr
    inv = json.loads(p.stdout)
    assert sorted(inv["gpufleet_servers"]["children"]) == ["nvlink_vllm", "pcie_sglang"]
    assert len(inv["pcie_sglang"]["hosts"]) == 4 and len(inv["nvlink_vllm"]["hosts"]) == 2
    hv = inv["_meta"]["hostvars"]
    for h in inv["pcie_sglang"]["hosts"]:
        assert hv[h]["gpufleet_server_name"] == "sglang" and hv[h]["gpufleet_nccl_profile"] == "pcie_only"
        assert "sglang.launch_server" in hv[h]["gpufleet_server_command"]
    for h in inv["nvlink_vllm"]["hosts"]:
        assert hv[h]["gpufleet_server_name"] == "vllm" and hv[h]["gpufleet_nccl_profile"] == "auto"
    for h, v in hv.items():
        assert v["gpufleet_server_health_url"] and v["gpufleet_server_health_request"]["url"], h
        assert "gpufleet_rollout_serial" not in v  # a play keyword: extra vars only (see group_vars comment)


def test_every_example_host_passes_the_role_argument_specs_without_connecting(tmp_path):
    r, out = validate(EXAMPLE, tmp_path)
    assert r.returncode == 0, r.stdout[-4000:]
    hosts = sorted(p.stem for p in out.iterdir())
    assert len(hosts) == 6, hosts
    for h in hosts:
        v = json.loads((out / (h + ".json")).read_text())
        assert v["gpufleet_server_command"] and v["gpufleet_server_name"] in ("sglang", "vllm")
    assert "UNREACHABLE" not in r.stdout


def test_validation_catches_a_broken_definition(tmp_path):
    """The same check on a copy with mistakes fails naming each field, so the test above can fail."""
    inv = tmp_path / "inv"
    shutil.copytree(EXAMPLE, inv)
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "gpu-pcie-02.example.internal.yml").write_text(
        "gpufleet_server_launcher: docker\ngpufleet_server_gpus: [zero]\ngpufleet_server_comand: [x]\n"
        "gpufleet_nccl_layers: sitecustomize\n")
    r = validate(inv, tmp_path)[0]
    assert r.returncode == 2, r.stdout[-4000:]
    assert "gpu-pcie-02.example.internal" in r.stdout
    assert "value of gpufleet_server_launcher must be one of: process, systemd, got: docker" in r.stdout
    assert "gpufleet_server_gpus" in r.stdout and "gpufleet_server_comand" in r.stdout
    failed = [line for line in r.stdout.splitlines() if "failed=1" in line]
    assert len(failed) == 1 and failed[0].startswith("gpu-pcie-02.example.internal"), failed
