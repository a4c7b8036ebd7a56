#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: process_kill
short_description: Kill a server's processes, workers and orphans included, with TERM, grace, KILL escalation
version_added: 0.1.0
description:
  - Replaces C(ps aux | grep python3 | xargs kill -9) and C(fuser -k /dev/nvidia*) with a selection that
    kills exactly the processes asked for.
  - Processes are selected by any of O(tag), O(pidfile), O(pids), O(cmdline_regex), O(user), O(gpu_holders),
    then extended with their descendants and the members of the sessions and process groups they lead.
  - O(tag) finds every process whose exec-time environment has C(NAME=VALUE); a launch tag is inherited by
    all workers, so workers orphaned to PID 1 after their launcher died (a known SGLang/vLLM failure) are found.
  - O(pidfile) selects its process only when the process confirms it is the server - it carries O(tag), or its
    command line matches O(pidfile_cmdline_regex) or O(cmdline_regex). The start time a pidfile records
    (C(PID START_TIME)) only tells a stale pidfile, never confirms on its own, so a pidfile naming an unrelated
    process (its pid, or its pid and real start time) never gets it killed (RV(pidfile) says why it was left alone).
  - Each process is pinned by pid and start time (field 22 of C(/proc/PID/stat)) and signalled through a
    pidfd where the kernel has them, so a pid reused by another process is never signalled.
  - PID 1, kernel threads, this module's own process and its ancestors (the ssh/ansible chain) are never signalled;
    O(exclude_regex) removes host agents (nvidia-persistenced, DCGM, exporters) by default.
  - A process that is already gone counts as success. The module fails, listing them, when processes
    survive the last signal (for example in uninterruptible sleep, state C(D)).
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
  - gpufleet.serving._attributes.NVML
  - gpufleet.serving._selector
attributes:
  check_mode:
    support: full
    details: Lists the processes that would be signalled and signals none.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: A second run finds nothing to kill and reports C(changed=false).
options:
  signals:
    description: Signals to send in turn to processes still alive, for example V([TERM, KILL]).
    type: list
    elements: str
    default: [TERM, KILL]
  grace:
    description: Seconds to wait after each signal but the last before escalating.
    type: float
    default: 10
  final_wait:
    description: Seconds to wait after the last signal before reporting survivors.
    type: float
    default: 5
  poll_interval:
    description: Seconds between liveness checks (pidfds also wake the wait at once).
    type: float
    default: 0.01
  order:
    description:
      - V(launcher_first) sends the first signal to the server's launcher alone - the process O(pidfile) names when it
        is confirmed and selected, otherwise each selected process whose parent is not selected - and gives it up to
        O(grace) seconds to exit; then the rest of the selection (workers, orphans) gets the first signal and what is
        left of the same O(grace) seconds, then the next signals go to every process still alive, as with
        V(all_at_once). The next signal comes at most O(grace) seconds after the first, in either order.
      - SGLang and vLLM finish their requests in flight on SIGTERM while their workers are left alone; signalling every
        process at once kills the workers under the launcher's drain and those requests fail.
      - A launcher that ignores the first signal leaves its workers no time of their own before the next signal, as
        O(grace) bounds the whole step, not each part of it.
    type: str
    choices: [launcher_first, all_at_once]
    default: launcher_first
    version_added: 0.2.0
  fail_on_survivor:
    description: Fail when a process survives the last signal.
    type: bool
    default: true
notes:
  - Reading other users' C(/proc/PID/environ) needs root; use C(become) for O(tag).
seealso:
  - module: gpufleet.serving.gpu_wait
"""

EXAMPLES = r"""
- name: Kill every process of the sglang service, orphans included
  gpufleet.serving.process_kill:
    tag: GPUFLEET_SERVICE=sglang
    grace: 15
  become: true

- name: Kill what the pidfile names, only if it is really the server
  gpufleet.serving.process_kill:
    pidfile: /run/gpufleet/sglang.pid
    pidfile_cmdline_regex: sglang\.launch_server

- name: Show what would be killed on GPUs 0-7 (check mode)
  gpufleet.serving.process_kill:
    gpu_holders: [0, 1, 2, 3, 4, 5, 6, 7]
  check_mode: true
"""

RETURN = r"""
processes:
  description:
    - One entry per selected process with C(pid), C(ppid), C(start_time), C(user), C(cmdline), C(matched_by),
      and after signalling C(signals_sent), C(already_gone), C(exited_after_s), C(survived) (and C(state) if it survived).
  returned: always
  type: list
  elements: dict
signalled:
  description: Number of processes that were (or in check mode would be) signalled.
  returned: always
  type: int
survivors:
  description: Pids still alive after the last signal.
  returned: always
  type: list
  elements: int
excluded:
  description: Processes matched but left alone, with the reason (protected, zombie, exclude_regex, or another service's launch tag).
  returned: always
  type: list
  elements: dict
signalled_first:
  description: Pids that got the first signal alone (O(order=launcher_first)); empty when every process got it at once.
  returned: always
  type: list
  elements: int
  version_added: 0.2.0
notes:
  description: Facts about the selection, such as a stale or unconfirmed pidfile.
  returned: always
  type: list
  elements: str
pidfile:
  version_added: 0.2.0
  description:
    - What O(pidfile) names - C(path), C(pid), C(status), C(reason), C(confirmed_by) (V(tag),
      V(pidfile_cmdline_regex) or V(cmdline_regex); V(null) unless confirmed), and the C(user) and C(cmdline) of a
      live process.
    - C(status) is V(confirmed) (the process is selected), V(unconfirmed) (a live process nothing confirms, left
      alone, even when the recorded start time matches), V(stale) (the recorded start time differs, or the process
      started after the pidfile was written),
      V(not_running) or V(missing).
  returned: when pidfile is set
  type: dict
  sample: {path: /run/gpufleet/sglang.pid, pid: 4242, status: unconfirmed, confirmed_by: null, user: alice,
           cmdline: "python3 train.py", reason: "pidfile /run/gpufleet/sglang.pid is unconfirmed: ..."}
elapsed_s:
  description: Seconds from the first signal until every process was gone (or the wait ended).
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _killmod
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError, fail
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step


def main() -> None:
    module = AnsibleModule(
        argument_spec=_killmod.selector_argspec(fail_on_survivor=dict(type="bool", default=True),
                                                **_killmod.signal_argspec()),
        supports_check_mode=True,
    )
    try:
        result = _killmod.run(module.params, Step.of(module))
    except StepError as e:
        fail(module, e)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
