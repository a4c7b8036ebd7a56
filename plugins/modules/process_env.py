#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: process_env
short_description: Check that running server processes carry the expected environment (NCCL tuning propagation)
version_added: 0.1.0
description:
  - Selects processes like M(gpufleet.serving.process_kill) (O(tag), O(pidfile), O(pids), O(cmdline_regex), O(user),
    O(gpu_holders), plus descendants and led sessions and groups) and compares each one's C(/proc/PID/environ) with
    O(expected).
  - Only the expected keys are read and returned, never any other variable (environments hold tokens).
  - C(/proc/PID/environ) shows the environment at exec (proc_pid_environ(5)). A launcher whose C(sitecustomize)
    set the variables does not show them, while the workers it starts with multiprocessing C(spawn) do (measured on
    an H200). So by default (O(target=workers)) only GPU-holding processes and their descendants are checked.
  - A checked process that lacks the values is reported as C(explained) (the C(status) of an entry of RV(processes)), not as a failure,
    when a descendant it started with exec carries every expected value (a launcher), or when it is a fork-started
    copy of its parent (same executable, command line and environ block) whose runtime environment is vouched for.
  - With O(nccl_log), NCCL's own log lines (C(NCCL INFO NCCL_PROTO set by environment to LL)) of the selected pids are
    a second proof, and the only one for values NCCL read from C(/etc/nccl.conf). A value the log confirms for a pid
    counts as carried, a value it contradicts fails the pid. NCCL logs a variable only when it reads it (a size-1
    communicator never reads C(NCCL_PROTO) or C(NCCL_ALGO)), so not-logged variables fail only with
    O(require_confirmed=true).
  - The module fails when any checked process is wrong, and when nothing was checked, unless O(allow_empty=true).
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
  - gpufleet.serving._attributes.INFO_MODULE
  - gpufleet.serving._attributes.NVML
  - gpufleet.serving._selector
options:
  expected:
    description: Variables and the values every checked process must carry. Values are compared as strings.
    type: dict
    required: true
  target:
    description:
      - V(workers) checks the selected processes that hold a GPU (NVML's process list or an open C(/dev/nvidiaN))
        and their selected descendants.
      - V(all_selected) checks every selected process (launchers, tokenizers, detokenizers included).
    type: str
    choices: [workers, all_selected]
    default: workers
  allow_empty:
    description: Succeed when no process is checked, instead of failing.
    type: bool
    default: false
  nccl_log:
    description:
      - NCCL log files (written with C(NCCL_DEBUG=INFO), for example through C(NCCL_DEBUG_FILE) or the server's log) to
        read as a second proof. Only lines of selected pids count (logs are appended across restarts); lines without
        the C(host:pid:tid) prefix always count.
      - Shell globs are expanded, for the per-process files of C(NCCL_DEBUG_FILE=/var/log/nccl.%h.%p).
    type: list
    elements: path
    default: []
  require_confirmed:
    description: Fail when the log does not confirm every expected variable.
    type: bool
    default: false
notes:
  - Reading other users' C(/proc/PID/environ) needs root; use C(become).
seealso:
  - module: gpufleet.serving.sitecustomize_env
  - module: gpufleet.serving.nccl_conf
  - module: gpufleet.serving.process_kill
"""

EXAMPLES = r"""
- name: Check that the sglang workers carry the NCCL tuning
  gpufleet.serving.process_env:
    tag: GPUFLEET_SERVICE=sglang
    expected: "{{ gpufleet_nccl_effective_env }}"
  become: true

- name: Check the nccl.conf layer through NCCL's own log
  gpufleet.serving.process_env:
    gpu_holders: [0, 1, 2, 3, 4, 5, 6, 7]
    expected: {NCCL_P2P_LEVEL: SYS, NCCL_BUFFSIZE: "16777216"}
    nccl_log: [/var/log/sglang/nccl.log]
"""

RETURN = r"""
processes:
  description:
    - One entry per checked process with C(pid), C(ppid), C(cmdline), C(matched_by), C(role) (V(worker),
      V(worker_descendant) or V(other)), C(env) (only the expected keys, null when unset), C(missing),
      C(mismatched), C(nccl_log_contradicted), C(status) (V(ok), V(explained) or V(wrong)) and C(explanation).
  returned: always
  type: list
  elements: dict
checked:
  description: Number of processes checked.
  returned: always
  type: int
ok:
  description: Number of checked processes that carry every expected value.
  returned: always
  type: int
explained:
  description: Number of checked processes that lack values for a reason explained by the exec-time rule.
  returned: always
  type: int
wrong:
  description: Pids of checked processes that lack values without explanation.
  returned: always
  type: list
  elements: int
gone:
  description: Checked pids that exited while the module ran.
  returned: always
  type: list
  elements: int
selected:
  description: Number of processes the selection matched (before O(target) filtering).
  returned: always
  type: int
nccl_log:
  description:
    - With O(nccl_log), the verdict per pid (C(pids), keyed by pid or V(unknown) for lines without prefix) and per
      variable (C(summary), and the lists C(confirmed), C(contradicted), C(not_logged)); C(other_pids) lists pids in
      the log that are not selected. Null without O(nccl_log).
  returned: always
  type: dict
excluded:
  description: Processes matched but left out, with the reason.
  returned: always
  type: list
  elements: dict
notes:
  description: Facts about the selection, the GPU backend and unreadable logs.
  returned: always
  type: list
  elements: str
pidfile:
  version_added: 0.2.0
  description:
    - What O(pidfile) names and whether it was confirmed, as M(gpufleet.serving.process_kill) returns it
      (C(confirmed_by) V(tag), V(pidfile_cmdline_regex) or V(cmdline_regex); a recorded start time never confirms on
      its own); an unconfirmed or stale pidfile selects nothing.
  returned: when pidfile is set
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _envcheck, _killmod
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError, fail
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step


def main() -> None:
    module = AnsibleModule(
        argument_spec=_killmod.selector_argspec(
            expected=dict(type="dict", required=True),
            target=dict(type="str", choices=["workers", "all_selected"], default="workers"),
            allow_empty=dict(type="bool", default=False),
            nccl_log=dict(type="list", elements="path", default=[]),
            require_confirmed=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    try:
        result = _envcheck.run(module.params, Step.of(module))
    except StepError as e:
        fail(module, e)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
