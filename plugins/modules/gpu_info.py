#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_info
short_description: Read NVIDIA GPU facts and the processes holding each GPU
version_added: 0.1.0
description:
  - Reports, per GPU, index, UUID, name, PCI bus id, memory (total, used, free, reserved),
    NVLink state, and the compute and graphics processes holding it with their user and command line.
  - Uses NVML C(nvmlMemory_v2) where the driver has it, so driver-reserved memory is reported
    apart from C(used) (an idle H200 reads v1 used 615 MiB but v2 used 0).
  - Each NVML query is handled on its own; one that fails (NVLink on a PCIe-only board reads
    C(Not Supported)) is listed under RV(gpus[].errors) and the rest is still returned.
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
  - gpufleet.serving._attributes.INFO_MODULE
  - gpufleet.serving._attributes.NVML
options:
  gpus:
    description:
      - GPU indices to report. Empty means all GPUs.
    type: list
    elements: int
    default: []
seealso:
  - module: gpufleet.serving.gpu_wait
  - module: gpufleet.serving.process_kill
"""

EXAMPLES = r"""
- name: Read GPU facts
  gpufleet.serving.gpu_info:
  register: gpu

- name: Show who holds GPU 0
  ansible.builtin.debug:
    msg: "{{ gpu.gpus[0].processes }}"
"""

RETURN = r"""
backend:
  description: Which backend answered, V(nvml) or V(nvidia-smi).
  returned: success
  type: str
  sample: nvml
driver_version:
  description: NVIDIA driver version.
  returned: success
  type: str
  sample: 560.35.03
cuda_driver_version:
  description: Highest CUDA version the driver supports (NVML backend only).
  returned: success
  type: str
  sample: "12.6"
gpu_count:
  description: Number of GPUs on the host.
  returned: success
  type: int
  sample: 8
nvlink_active:
  description: True when any reported GPU has an active NVLink; V(false) on PCIe-only boards; null when unknown.
  returned: success
  type: bool
gpus:
  description: One entry per requested GPU.
  returned: success
  type: list
  elements: dict
  contains:
    index: {description: GPU index., type: int, returned: always}
    uuid: {description: GPU UUID., type: str, returned: always}
    name: {description: Product name., type: str, returned: always}
    pci_bus_id: {description: PCI bus id., type: str, returned: always}
    total_mib: {description: Total memory in MiB., type: int, returned: always}
    used_mib: {description: Used memory in MiB (v2 excludes driver-reserved memory)., type: int, returned: always}
    free_mib: {description: Free memory in MiB., type: int, returned: always}
    reserved_mib: {description: Driver-reserved memory in MiB; null with NVML v1., type: int, returned: always}
    memory_api: {description: "V(v2), V(v1) or V(nvidia-smi).", type: str, returned: always}
    nvlink:
      description: C(supported) (false when the board has no NVLink) and C(active_links).
      type: dict
      returned: always
    processes:
      description: Processes holding the GPU, with C(pid), C(used_mib), C(type), C(user) and C(cmdline).
      type: list
      elements: dict
      returned: always
    errors:
      description: NVML queries that failed on this GPU, by name, with NVML's message.
      type: dict
      returned: always
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _gpumod
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError, fail


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            gpus=dict(type="list", elements="int", default=[]),
            backend=dict(type="str", choices=["auto", "nvml", "nvidia-smi"], default="auto"),
        ),
        supports_check_mode=True,
    )
    try:
        with _gpumod.backend_or_fail(module.params["backend"]) as backend:
            facts = _gpumod.gpu_facts(backend, module.params["gpus"])
    except StepError as e:
        fail(module, e)
    module.exit_json(changed=False, **facts)


if __name__ == "__main__":
    main()
