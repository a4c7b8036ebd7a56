# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: nccl_names_refused
short_description: Why the nccl_tuning role refuses the NCCL variable names it was given, or an empty string
version_added: 0.2.0
description:
  - The nccl_tuning role's name check, run on the controller before any host is touched. Both NCCL layers write
    host-wide, so a name in O(_input) (C(gpufleet_nccl_env)) must be C(NCCL_*) or listed exactly in O(allow_vars),
    and neither a name nor an allow-listed one may be a variable that changes every program, the interpreter or the
    loader (C(LD_PRELOAD), C(PYTHONPATH), C(PATH), proxies, ...), whatever its case.
  - The same rules the layer modules M(gpufleet.serving.sitecustomize_env) and M(gpufleet.serving.nccl_conf) apply,
    worded for the role's variables. In Python, so that a rollout does not template the check's Jinja once per host
    and reference.
  - Names that are not valid variable names are not judged here (the modules name them), nor is anything with
    O(profile=none) (the blocks are removed).
options:
  _input:
    description: The variables the layers would write (C(gpufleet_nccl_env)); anything that is not a dict is not judged.
    type: raw
    required: true
  profile:
    description: The NCCL profile (C(gpufleet_nccl_profile)).
    type: raw
    required: true
  allow_vars:
    description: The exact names allowed besides C(NCCL_*) (C(gpufleet_nccl_allow_vars)); anything that is not a list
      allows nothing.
    type: raw
    required: true
  unknown_vars:
    description:
      - C(gpufleet_nccl_unknown_vars). With C(fail), C(NCCL_*) names that are not known NCCL variables (and not in
        O(allow_vars)) are refused too, each with its close matches, as the modules' O(gpufleet.serving.nccl_conf#module:nccl_names=fail) does.
    type: raw
    default: warn
"""

EXAMPLES = r"""
- name: Assert the NCCL tuning variables are valid
  ansible.builtin.assert:
    that: _refused | length == 0
    fail_msg: "Refused NCCL tuning variable name(s), nothing was changed: {{ _refused }}."
  vars:
    _refused: >-
      {{ gpufleet_nccl_env | gpufleet.serving.nccl_names_refused(profile=gpufleet_nccl_profile,
                                                                 allow_vars=gpufleet_nccl_allow_vars,
                                                                 unknown_vars=gpufleet_nccl_unknown_vars) }}
"""

RETURN = r"""
_value:
  description: One sentence per rule broken, joined by C(; ); empty when the names are fine.
  type: str
"""

from ansible_collections.gpufleet.serving.plugins.module_utils._ncclvars import role_names_refused


class FilterModule:
    def filters(self):
        return {"nccl_names_refused": role_names_refused}
