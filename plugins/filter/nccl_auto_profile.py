# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: nccl_auto_profile
short_description: The NCCL profile that gpufleet_nccl_profile auto resolves to on a host, from its gpu_info result
version_added: 0.3.0
description:
  - C(pcie_only) when M(gpufleet.serving.gpu_info) reports no active NVLink
    (RV(gpufleet.serving.gpu_info#module:nvlink_active) false), else C(nvlink), with a warning when the NVLink state is
    unknown. The same rule as the rollout's check (the C(rollout_check) action), from the same Python.
options:
  _input:
    description: The registered result of M(gpufleet.serving.gpu_info).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Resolve the auto profile
  ansible.builtin.set_fact:
    profile: "{{ (__gpu | gpufleet.serving.nccl_auto_profile).profile }}"
"""

RETURN = r"""
_value:
  description: C(profile) (C(pcie_only) or C(nvlink)) and C(warning) (why nvlink was chosen, or null).
  type: dict
"""

from ansible_collections.gpufleet.serving.plugins.module_utils._ncclvars import auto_profile


def nccl_auto_profile(gpu_info):
    return auto_profile(gpu_info or {})


class FilterModule:
    def filters(self):
        return {"nccl_auto_profile": nccl_auto_profile}
