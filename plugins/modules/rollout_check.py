#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# The work is done by the action plugin of the same name (plugins/action/rollout_check.py): this file documents it.

from __future__ import annotations

DOCUMENTATION = r"""
module: rollout_check
short_description: Validate a host's server definition and NCCL tuning input, and check whether it is already right
version_added: 0.3.0
description:
  - The pre-flight of the gpufleet.serving rollout and rollback playbooks, for one host, in one task (an action plugin
    on the controller plus at most one M(gpufleet.serving.server_info) call on the host). It must run in the
    C(gpufleet.serving.gpu_server) role (its C(tasks_from) entry point C(rollout_check)), whose variables it reads.
  - First the server definition is validated against the gpu_server role's C(preflight) argument spec and the rules
    the spec cannot say (the server_problems filter). A definition with an error fails the host, also a host that is
    already right; nothing on the host is read.
  - With O(nccl=check), the NCCL tuning input is validated against the nccl_tuning role's C(validate) argument spec,
    its form and its variable names (the nccl_names_refused filter), and what the NCCL layers should hold is computed
    (RV(nccl_effective_env), RV(nccl_desired_layers)). The auto profile is resolved first, on the host, as the
    nccl_tuning role resolves it (M(gpufleet.serving.gpu_info) with C(gpufleet_nccl_gpu_backend), V(pcie_only) when no
    NVLink is active, else V(nvlink), with a warning when the NVLink state is unknown), in RV(nccl_profile_resolved);
    a host whose GPUs gpu_info cannot read fails here, nothing on it changed.
    O(nccl=compute) computes them without refusing anything (an unusable input, or an auto profile whose GPUs cannot be read, gives null), as
    the rollback playbook needs; O(nccl=none) leaves both null.
  - With O(fast_check=true), one M(gpufleet.serving.server_info) check (read-only) with the arguments the task's
    C(_gpufleet_rollout_check_args) variable gives says whether the host is already right (server, workers'
    environment, NCCL layers, no drain record of gpufleet's naming one of its balancers), in RV(up_to_date). A server
    that cannot be launched fails the host here. Any other outcome leaves the host to the role, which reports it.
  - Nothing is set as a fact. Register the result and pass it to the role's C(rollout) entry point as
    C(_gpufleet_server_checked).
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
attributes:
  check_mode:
    support: full
    details: Reads only; the same in check mode.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  nccl:
    description: What to do with the NCCL tuning input (the nccl_tuning role's variables).
    type: str
    choices: [check, compute, none]
    default: none
  fast_check:
    description: Check the host after the validation, to skip the roles when it is already right.
    type: bool
    default: false
notes:
  - Runs on the controller, with the play's variables for the host; the check runs on the host.
seealso:
  - module: gpufleet.serving.server_info
"""

EXAMPLES = r"""
# roles/gpu_server/tasks/rollout_check.yml, as the rollout playbook imports it
- name: Validate each host's input and check in one call whether it is already right
  ansible.builtin.import_role:
    name: gpufleet.serving.gpu_server
    tasks_from: rollout_check
  vars:
    _gpufleet_rollout_check_nccl: "{{ 'check' if hostvars[inventory_hostname]['gpufleet_nccl_profile'] is defined else 'none' }}"
    _gpufleet_rollout_check_fast: true
"""

RETURN = r"""
up_to_date:
  description: The host is already right and the roles can be skipped for it (only with O(fast_check=true)).
  returned: always
  type: bool
nccl_effective_env:
  description: The NCCL variables the layers should hold (the profile's with the user's merged over them); null when not computed.
  returned: always
  type: dict
nccl_desired_layers:
  description: The arguments of M(gpufleet.serving.nccl_layers) for each layer; null when not computed.
  returned: always
  type: dict
nccl_profile_resolved:
  description: What the auto profile resolved to on the host (V(pcie_only) or V(nvlink)).
  returned: with O(nccl=check) and the auto profile
  type: str
gpufleet_server_result:
  description: The rollout summary's row for a host that is already right.
  returned: when RV(up_to_date) is true
  type: dict
check_error:
  description: Why the check could not be made (a templating error in the host's variables); the role reports it.
  returned: when the check's arguments could not be templated
  type: str
launch_problems:
  description: Why the server could not be launched; the host fails, nothing on it was changed.
  returned: on that failure
  type: list
  elements: str
left_out_of_rotation:
  description:
    - With RV(launch_problems), the host's balancer entries whose drain record says an earlier run of gpufleet took
      the host out of them. It stays out of them; the rollout summary lists them. A record under an entry's name that
      names another server than the one the entry names for this host is not this host's drain, and is not listed.
  returned: on that failure, when there are such entries
  type: list
  elements: str
  version_added: 0.3.0
"""
