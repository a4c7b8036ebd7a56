#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: server_info
short_description: Check, read-only, whether a GPU server runs as desired and what keeps it from being right
version_added: 0.3.0
description:
  - Compares the desired O(fingerprint) with the one recorded at the last launch, checks that the launcher (pidfile,
    confirmed as in RV(running)) is alive and is the launch recorded then (a later launch whose checks failed is not,
    as M(gpufleet.serving.server_restart) marks the record unverified before each launch), that processes carrying
    the launch tag hold the GPUs, that no other process holds them, and that the GPU-holding workers carry
    O(expected_env). RV(needs_restart) is false only when all of that holds; RV(reasons) says why otherwise.
  - "A running launcher that carries O(fingerprint) in its environment (O(tag_name)C(_FINGERPRINT), set by
    M(gpufleet.serving.server_restart) at a process launch) while the record does not name it, and does not say its
    launch failed its checks, is a verified launch whose record could not be written (a full state filesystem): it
    is not a reason to restart (RV(unrecorded), and a note in RV(notes)). Such a host is not RV(up_to_date): the
    locked check of M(gpufleet.serving.server_state) writes the record again."
  - With O(launchable) it first verifies that the server could be launched (its executable, user and working
    directory exist) and fails when it could not; a server that cannot be relaunched must never be stopped. When a
    restart is needed it also fails when a bare command is not on the server's PATH (O(launchable.path)), or the
    files the restart writes (O(launchable.log_path), O(state_file), O(pidfile), O(lock_file)) or O(rotation_file)
    could not be written (a path under a regular file, an unwritable directory, no room left), with the message of
    M(gpufleet.serving.server_restart)'s preflight (it says nothing was stopped). A O(gpus) index the host lacks
    fails it as the restart's preflight says it.
  - It never writes and never takes the host lock, also in a run that is not in check mode (C(changed) is always
    false). The gpu_server role's audit and the rollout's fast path (M(gpufleet.serving.rollout_check)) use it; the
    role's check before a restart is M(gpufleet.serving.server_state)'s, the same check under the host lock.
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
  - gpufleet.serving._attributes.INFO_MODULE
  - gpufleet.serving._attributes.NVML
  - gpufleet.serving._server_check
options:
  lock_file:
    description:
      - The host lock of this service (M(gpufleet.serving.server_state)'s), only looked at, never taken or changed. A
        lock of another run that is not past its expiry makes RV(up_to_date) false and is returned in RV(lock_holder)
        (a host that another run may be restarting is not "already right").
    type: path
seealso:
  - module: gpufleet.serving.server_state
    description: The same check under the host lock, and the record and the lock a restart writes.
"""

EXAMPLES = r"""
- name: Does the server need a restart?
  gpufleet.serving.server_info:
    name: sglang
    state_file: /var/lib/gpufleet/sglang.json
    pidfile: /run/gpufleet/sglang.pid
    fingerprint: "{{ fingerprint }}"
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    expected_env: {NCCL_PROTO: LL}
    lock_file: /run/gpufleet/sglang.lock
  register: st

- name: Say why
  ansible.builtin.debug:
    msg: "{{ st.reasons if st.needs_restart else 'up to date' }}"
"""

RETURN = r"""
running_fingerprint:
  version_added: 0.2.0
  description:
    - The fingerprint of the definition the host runs now - the one its launcher carries (a process
      launch carries it, O(tag_name)C(_FINGERPRINT)), else the record's when the launcher is the verified launch on
      record; V(null) when no verified server of a known definition runs.
  returned: success
  type: str
last_good:
  version_added: 0.2.0
  description:
    - The host's last known good generations and its last gate measurement, as the audit shows them -
      fingerprints, times and numbers, never a definition (its environment values are secret).
  returned: success
  type: dict
  contains:
    newest:
      description: The newest generation (C(fingerprint), C(recorded_at), C(gate_median)), V(null) when there is none.
      type: dict
    generations:
      description: Every generation kept, newest first, as C(newest) shows one.
      type: list
      elements: dict
    rolled_back:
      description: The last rollback by hand (C(from), C(to), C(at)), V(null) when there is none (or a rollout
        recorded another definition since).
      type: dict
    gate:
      description: The record's gate measurement, the host's baseline - C(median), C(metric), C(unit) (V(output tokens/s)
        or V(requests/s)), C(measured_at) and the C(fingerprint) it measured; V(null) when none was recorded.
      type: dict
rollback:
  version_added: 0.2.0
  description:
    - With O(rollback), the generation the host goes back to - C(fingerprint), C(recorded_at), C(from) (what the host
      runs now, RV(running_fingerprint)) and C(inventory_fingerprint) (O(fingerprint) as given).
  returned: when rollback is set
  type: dict
decision:
  version_added: 0.2.0
  description:
    - With O(decide), what the gpu_server role does with the host (decided by the action plugin on the controller).
    - C(do_restart) (bool); C(result), the host's summary row so far (C(restarted) V(false), C(reasons), C(workers),
      C(workers_verified) - the GPU-holding workers whose environment is as expected, V(0) when the server is not
      running - and C(record_missing)); C(return_only), true for an up-to-date host an earlier run left out of
      rotation on gpufleet's drain record, with C(rotation), the entries it goes back into. C(result.service) is
      O(name).
  returned: when decide is set
  type: dict
  sample: {do_restart: false, return_only: false,
           result: {service: sglang, restarted: false, reasons: [], workers: 3, workers_verified: 2, record_missing: ""}}
service:
  version_added: 0.3.0
  description:
    - O(name), the service of the host this call was for, also on a failure (the action plugin adds it). The rollout
      summary keeps one row per host and service by it.
  returned: always
  type: str
  sample: sglang
unrecorded:
  description: The running server is a verified launch of O(fingerprint) that the record does not name.
  returned: when it is so
  type: bool
  version_added: 0.2.0
last_good_pending:
  description:
    - The record names the running server, but its last known good generation is still put aside
      beside O(pidfile) (its restart, or the check that wrote its record again, could not write the last known good
      file). The host is then not RV(up_to_date), and the rollout's locked check keeps the generation.
  returned: when it is so
  type: bool
  version_added: 0.3.0
record_missing:
  description: Why the record of an RV(unrecorded) server still could not be written (the file and the
    error, a full filesystem say); the server is kept, and the sentence is also a warning.
  returned: when it is so
  type: str
  version_added: 0.2.0
needs_restart:
  description: Whether the server must be (re)started.
  returned: success
  type: bool
reasons:
  description: Why a restart is needed.
  returned: success
  type: list
  elements: str
running:
  description:
    - Whether the process named by the pidfile is alive and confirmed to be the server by the launch tag in its
      environment (every server gpufleet launches carries it, with either launcher).
    - A pidfile naming a process without the launch tag is never taken for the server, even when it records that
      process's real start time (C(PID START_TIME), as gpufleet writes it); the start time only tells a stale pidfile.
      See RV(pidfile).
  returned: success
  type: bool
pidfile:
  version_added: 0.2.0
  description:
    - With O(pidfile), what the pidfile names - C(path), C(pid), C(status), C(reason), C(confirmed_by)
      (V(tag) when confirmed, else V(null)), and the C(user) and C(cmdline) of a live process.
    - C(status) is V(confirmed), V(unconfirmed) (a live process without the launch tag, whatever start time the
      pidfile records), V(stale) (the
      recorded start time differs, or the process started after the pidfile was written), V(not_running),
      V(missing) or V(unreadable).
  returned: when pidfile is set
  type: dict
  sample: {path: /run/gpufleet/sglang.pid, pid: 4242, status: unconfirmed, confirmed_by: null, user: alice,
           cmdline: "python3 train.py", reason: "pidfile /run/gpufleet/sglang.pid is unconfirmed: ..."}
fingerprint_recorded:
  description: Fingerprint stored at the last launch.
  returned: success
  type: str
workers:
  description:
    - Live processes carrying the launch tag that are the server's - the running launcher and its descendants, and
      tagged processes of the launcher's user or of O(launchable.user).
    - Another user's process carrying the tag is not a worker (anyone can put the tag into a process's environment);
      holding the server's GPUs it is a stray, named in the reason.
  returned: success
  type: list
  elements: dict
  contains:
    pid:
      description: Its pid.
      type: int
    ppid:
      description: Its parent's pid (V(1) for an orphan).
      type: int
    cmdline:
      description: Its command line (first 300 characters).
      type: str
    holds_gpu:
      description: Whether it holds one of the GPUs (the gpu_server role counts these as the verified workers).
      type: bool
strays:
  description: GPU holders without the launch tag (gpu, pid, cmdline).
  returned: success
  type: list
  elements: dict
env_problems:
  description: Per worker pid, the expected keys that are missing or different (only expected keys are read).
  returned: success
  type: dict
up_to_date:
  version_added: 0.2.0
  description: True when no restart is needed, the O(nccl_layers) (if given) are as asked and the
    unit (O(systemd)) has no drift.
  returned: success
  type: bool
nccl_layers:
  version_added: 0.2.0
  description:
    - With O(nccl_layers), per layer whether it is up to date (C(up_to_date), C(files), or C(error)).
    - C(access) lists why a layer's file is not up to date although its content is, when other users cannot read it
      (the file, or its directory, lacks read or search for group and others).
  returned: when nccl_layers is set
  type: dict
  contains:
    up_to_date:
      description: Whether every asked layer is up to date.
      type: bool
    sitecustomize:
      description: The sitecustomize layer's C(up_to_date), C(files), C(error) and C(access).
      type: dict
    nccl_conf:
      description: The nccl.conf layer's C(up_to_date), C(files), C(error) and C(access).
      type: dict
launch_problems:
  description: With O(launchable), what the launch would miss (the check failed because of it).
  returned: failure
  type: list
  elements: str
drain_records:
  version_added: 0.2.0
  description:
    - With O(rotation_file), the drain record's records (balancer name to its drain), empty when there is
      none; also with a refusal of the restart (RV(launch_problems)).
  returned: with rotation_file, when it could be read
  type: dict
left_out_of_rotation:
  version_added: 0.3.0
  description:
    - With O(decide), when the check refused the restart (RV(launch_problems)), the host's entries (O(decide.balancers))
      whose drain record says an earlier run of gpufleet took the host out of them (a record of another server under
      an entry's name excluded). The host stays out of those; the rollout summary lists them.
  returned: failure
  type: list
  elements: str
drain_record_error:
  version_added: 0.2.0
  description: With O(rotation_file), why the drain record could not be read (RV(up_to_date) is then false).
  returned: with rotation_file, when it could not be read
  type: str
lock_holder:
  version_added: 0.2.0
  description: With O(lock_file), the owner id of the run that holds the lock (not expired).
  returned: when such a lock exists
  type: str
unit:
  version_added: 0.2.0
  description: With O(systemd), the unit as systemd has it.
  returned: when systemd is set
  type: dict
  contains:
    loaded:
      description: Whether systemd has the unit loaded (false for a unit not installed yet).
      type: bool
    active_state:
      description: The unit's ActiveState.
      type: str
    main_pid:
      description: The unit's main pid (V(0) when none).
      type: int
    main_confirmed:
      description: Whether that process carries the launch tag (the server runs).
      type: bool
    unit_file_state:
      description: C(systemctl is-enabled)'s answer (UnitFileState).
      type: str
    enabled_ok:
      description: Whether the unit is loaded and enabled (or disabled) as O(systemd.enabled) asks.
      type: bool
    content_matches:
      description: Whether the unit file is byte for byte O(systemd.unit_content) (null when not compared).
      type: bool
    dropins:
      description: The unit's drop-ins, none of which gpufleet writes.
      type: list
      elements: str
    restart_reasons:
      description: What makes the running unit differ from the desired one; also in RV(reasons).
      type: list
      elements: str
    drift:
      description: Drift a restart does not fix (enablement, drop-ins kept by O(systemd.dropins=warn)).
      type: list
      elements: str
notes:
  version_added: 0.2.0
  description: What was found and is not a reason to restart (a unit restarted outside gpufleet).
  returned: when there is one
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _state
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError, fail
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step


def main() -> None:
    module = AnsibleModule(argument_spec=_state.check_argument_spec(), supports_check_mode=True)
    try:
        result = _state.info(module.params, Step.of(module))
    except StepError as e:
        fail(module, e)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
