#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_wait
short_description: Wait until GPUs are clean (or busy), polling NVML every few milliseconds
version_added: 0.1.0
description:
  - Replaces the hand-run C(sleep 3 && nvidia-smi --query-gpu=index,memory.used) check.
  - With O(state=clean), returns as soon as every selected GPU has no compute process and at most
    O(max_used_mib) MiB used. An H200 frees memory 0.12-0.19 s after its holder dies and one NVML
    read costs about 7 microseconds, so the default 20 ms poll returns within one interval of the driver.
  - On timeout it fails and lists every holder (GPU, pid, user, command line, MiB) and each GPU's used memory.
  - With O(state=busy), waits until every selected GPU has at least O(min_processes) processes and
    O(min_used_mib) MiB used, a readiness signal for servers that load weights.
  - On a host without any GPU it fails at once (a wait on no GPUs would pass without meaning anything).
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
  - gpufleet.serving._attributes.INFO_MODULE
  - gpufleet.serving._attributes.NVML
options:
  gpus:
    description: GPU indices to wait for. Empty means all GPUs.
    type: list
    elements: int
    default: []
  state:
    description: Wait for V(clean) GPUs or for V(busy) ones.
    type: str
    choices: [clean, busy]
    default: clean
  timeout:
    description: Seconds to wait before failing. Must be greater than 0.
    type: float
    default: 30
  poll_interval:
    description: Seconds between polls. Must be greater than 0.
    type: float
    default: 0.02
  max_used_mib:
    description:
      - Highest used memory (MiB) that still counts as clean.
      - Unset means 16 MiB when the driver reports NVML v2 memory or via nvidia-smi (reserved memory
        is reported apart), and 1024 MiB with NVML v1 (which folds in ~615 MiB driver reservation on an H200).
    type: int
  min_processes:
    description: With O(state=busy), processes each GPU must have.
    type: int
    default: 1
  min_used_mib:
    description: With O(state=busy), MiB each GPU must have in use.
    type: int
    default: 0
seealso:
  - module: gpufleet.serving.gpu_info
  - module: gpufleet.serving.process_kill
"""

EXAMPLES = r"""
- name: Verify the GPUs are clean before launching (hard gate)
  gpufleet.serving.gpu_wait:
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    timeout: 20

- name: Wait until the server's workers hold every GPU
  gpufleet.serving.gpu_wait:
    state: busy
    min_used_mib: 10000
    timeout: 600
"""

RETURN = r"""
waited_s:
  description: Seconds spent waiting.
  returned: when the GPUs were read (success, and a wait that timed out)
  type: float
  sample: 0.161
state:
  description: The state waited for, V(clean) or V(busy).
  returned: when the GPUs were read (success, and a wait that timed out)
  type: str
  sample: clean
polls:
  description: How many times the GPUs were read.
  returned: when the GPUs were read (success, and a wait that timed out)
  type: int
  sample: 9
backend:
  description: V(nvml) or V(nvidia-smi).
  returned: when a GPU backend was opened
  type: str
max_used_mib:
  description: The clean threshold that was applied.
  returned: when the GPUs were read (success, and a wait that timed out)
  type: int
gpus:
  description: Final reading per GPU (index, used_mib, total_mib, free_mib, reserved_mib, memory_api, processes).
  returned: when the GPUs were read (success, and a wait that timed out)
  type: list
  elements: dict
holders:
  description: Processes still holding the GPUs at the end (gpu, pid, user, cmdline, used_mib).
  returned: when the GPUs were read (success, and a wait that timed out)
  type: list
  elements: dict
"""

import math

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _gpumod
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError, fail


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            _gpumod.clean_gate_argspec(),
            state=dict(type="str", choices=["clean", "busy"], default="clean"),
            min_processes=dict(type="int", default=1),
            min_used_mib=dict(type="int", default=0),
        ),
        supports_check_mode=True,
    )
    p = module.params
    # `not x > 0` also refuses NaN (every comparison with it is false: a wait that never ends).
    if not 0 < p["timeout"] < math.inf:
        module.fail_json(msg="timeout must be greater than 0 seconds, got %s" % p["timeout"])
    if not 0 < p["poll_interval"] < math.inf:
        module.fail_json(msg="poll_interval must be greater than 0 seconds, got %s" % p["poll_interval"])
    # A negative threshold or count can never be met: it would wait out the whole timeout.
    for k in ("max_used_mib", "min_processes", "min_used_mib"):
        if (p[k] or 0) < 0:
            module.fail_json(msg="%s must be >= 0, got %s" % (k, p[k]))
    try:
        res = _gpumod.wait_or_fail(p, state=p["state"], min_processes=p["min_processes"],
                                   min_used_mib=p["min_used_mib"])
    except StepError as e:
        fail(module, e)
    module.exit_json(changed=False, **res)


if __name__ == "__main__":
    main()
