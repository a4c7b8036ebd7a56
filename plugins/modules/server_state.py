#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: server_state
short_description: Check a GPU server under the host lock, record what was launched, and lock the host
version_added: 0.1.0
description:
  - The jobs of a run that may restart the server. The read-only check (an audit, the rollout's fast path) is
    M(gpufleet.serving.server_info); this module's O(action=check) is the same check, by the same code and with the
    same options, under the host lock. Without O(owner) it takes no lock and is deprecated for
    M(gpufleet.serving.server_info).
  - O(action=check) with O(lock_file) and O(owner) takes the lock first and releases it again when no restart is
    needed (unless O(keep_lock=true)), so an up-to-date host costs one round trip. RV(locked) says whether the
    lock is still held, and C(changed) is true exactly then (the call left a lock file behind); a lock taken and
    released again leaves the host as it was. A lock this O(owner) already held before the call (O(action=lock), or
    an earlier check that kept it) is kept and is no change. In check mode no lock is taken, and C(changed) says
    whether the real call would leave one behind (a restart is needed, or O(keep_lock=true)).
  - "Under the lock, the check writes the record of a running server that is a verified launch of O(fingerprint)
    the record does not name (RV(gpufleet.serving.server_info#module:unrecorded): a full state filesystem kept the
    restart that verified it from writing it) again (RV(recorded)); a record that still cannot be written is a
    warning."
  - "With O(owner), when a restart is wanted (the check finds one needed, or O(keep_lock=true)), the check also fails
    before the drain and the kill when a process the restart's kill would not end listens on the port of
    O(launchable.urls) or holds the server's GPUs (O(launchable.clean_timeout)), with the messages and phases of
    M(gpufleet.serving.server_restart), whose own checks before its kill would refuse them after the drain; and when
    a balancer entry's worker URL set by hand is not this host's (O(worker_urls))."
  - O(action=record) writes the state file (fingerprint, pid, timings) after a launch. A pidfile naming a live process
    that does not carry the launch tag O(tag_name)=O(name) (or a pid reused since) is refused, not recorded.
  - O(action=lock) and O(action=unlock) take and release a host-side lock so two rollouts never interleave
    kill and launch on one host. A lock past its TTL is stale and is broken. C(changed) says whether the lock file
    changed (taken from nobody or from a stale holder; removed), also in check mode.
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
  - gpufleet.serving._attributes.NVML
  - gpufleet.serving._server_check
attributes:
  check_mode:
    support: full
    details: V(check) writes nothing in check mode; V(record), V(lock) and V(unlock) report what they would change.
  diff_mode:
    support: none
  idempotent:
    support: full
seealso:
  - module: gpufleet.serving.server_info
    description: The read-only check, with what it returns.
options:
  action:
    description: What to do.
    type: str
    choices: [check, record, lock, unlock]
    default: check
  timings:
    description: With V(record), timings to store (seconds).
    type: dict
    default: {}
  lock_file:
    description:
      - With V(lock)/V(unlock), the lock file.
      - With V(check) and O(owner), the lock to take (see O(keep_lock)).
      - With V(check) and no O(owner), only looked at, never taken or changed; a lock of another run that is not
        past its expiry makes RV(gpufleet.serving.server_info#module:up_to_date) false and is returned in
        RV(gpufleet.serving.server_info#module:lock_holder) (a host that another run may be
        restarting is not "already right").
    type: path
  owner:
    description: With V(lock)/V(unlock), an id of this run (controller host, pid, time).
    type: str
  lock_ttl:
    description: Seconds after which a lock is stale; must be > 0.
    type: float
    default: 1800
  lock_wait:
    description:
      - Seconds to wait for another run's lock before failing; must be >= 0.
      - Wait-die, when both run ids carry their start time (the gpufleet.serving.run lookup's ids do) - the lock of
        an earlier run fails the call at once, whatever this value ("host is locked by an earlier gpufleet run");
        only the lock of a later run is waited for, and the wait is reported in a warning and in RV(lock_waited). An
        owner id without a start time is waited for as a later run's.
    type: float
    default: 0
  fail_msg:
    version_added: 0.3.0
    description:
      - With V(unlock), read by the action plugin only (the module ignores it) - after the release, the task fails with
        this message. The gpu_server role's last task releases a lock its flow still holds and fails the host whose
        flow failed, in one task execution where it was two (issue 25). A release that fails too is named after it.
    type: str
  break_owner:
    description:
      - With V(lock) or V(check), break a lock held by this owner (a run known to be dead).
      - When the lock names a host process still working under it (a M(gpufleet.serving.server_restart) that goes on
        after its controller died), that process is waited for first, up to O(lock_ttl) seconds; it releases the lock
        itself when done.
    type: str
  keep_lock:
    description: With V(check) and a lock, keep the lock even when no restart is needed.
    type: bool
    default: false
  tune:
    version_added: 0.3.0
    description:
      - With V(check), read by the action plugin only (the module ignores it). The gpu_server role's check when the
        rollout writes an explicit profile's NCCL layers under the host lock. Before the check, the action takes the
        host lock (as O(action=lock) does, a dead run's lock of this controller taken over), then writes the layers
        with M(gpufleet.serving.nccl_layers) under it (in check mode it takes no lock and only predicts the write),
        then checks; RV(layers) is that write's result and C(changed) includes it, as its diff does with C(--diff).
        A lock or a write that fails fails the task before the check, with nothing after it done; the lock, once
        taken, is held (RV(locked)) for the role to release.
      - Three task executions of every host were one each (the lock, the write, the check).
    type: dict
    suboptions:
      sitecustomize:
        description: O(gpufleet.serving.nccl_layers#module:sitecustomize).
        type: dict
      nccl_conf:
        description: O(gpufleet.serving.nccl_layers#module:nccl_conf).
        type: dict
      backup:
        description: O(gpufleet.serving.nccl_layers#module:backup).
        type: bool
        default: false
      keep_previous:
        description: O(gpufleet.serving.nccl_layers#module:keep_previous).
        type: path
      tags:
        description:
          - The tags the lock and the write carry as steps of their own. They run only where C(--tags) and
            C(--skip-tags) select a task with these tags and those the task inherits. Empty, they run whenever the
            task does.
        type: list
        elements: str
        default: []
"""

EXAMPLES = r"""
- name: Take the host lock and check the server under it (the lock is kept when a restart is needed)
  gpufleet.serving.server_state:
    action: check
    name: sglang
    state_file: /var/lib/gpufleet/sglang.json
    pidfile: /run/gpufleet/sglang.pid
    fingerprint: "{{ fingerprint }}"
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    expected_env: {NCCL_PROTO: LL}
    lock_file: /run/gpufleet/sglang.lock
    owner: "{{ lookup('gpufleet.serving.run') }}"
  register: st

- name: Release the lock when nothing was restarted
  gpufleet.serving.server_state:
    action: unlock
    name: sglang
    state_file: /var/lib/gpufleet/sglang.json
    lock_file: /run/gpufleet/sglang.lock
    owner: "{{ lookup('gpufleet.serving.run') }}"
  when: st.locked
"""

RETURN = r"""
service:
  version_added: 0.3.0
  description:
    - O(name), the service of the host this call was for, also on a failure (the action plugin adds it). The rollout
      summary keeps one row per host and service by it.
  returned: always
  type: str
  sample: sglang
took_over_from:
  version_added: 0.2.0
  description: With O(decide), the owner id of the dead run whose host lock this call took over.
  returned: when it took one over
  type: str
layers:
  version_added: 0.3.0
  description:
    - With O(tune), the result of the NCCL layers' write under the lock (M(gpufleet.serving.nccl_layers)'s return
      values, C(changed) included).
  returned: when O(tune) wrote (or, in check mode, predicted) the layers
  type: dict
  sample: {"changed": true, "previous_kept": "/run/gpufleet/demo.layers-previous.json", "access_fixes": []}
checked:
  version_added: 0.3.0
  description: With O(tune), false when C(--tags)/C(--skip-tags) left the check out (O(decide.tags)); the lock and
    the write may still have run.
  returned: when O(tune) is set and the check did not run
  type: bool
  sample: false
recorded:
  description:
    - With V(check), the record of an RV(gpufleet.serving.server_info#module:unrecorded) server was written again by this call.
    - When the restart that verified this server could not write its record, it put the server's last known good
      generation aside beside O(pidfile) (C(NAME.last_good-pending.json), 0600); this call then also makes it the
      newest generation (RV(gpufleet.serving.server_info#module:last_good) shows it) and removes the pending file.
  returned: when action is check and it was
  type: bool
  version_added: 0.2.0
last_good_kept:
  description: With V(check), the generation put aside for the running server was made the newest last known good by
    this call (under the lock), and the file it was put aside in removed.
  returned: when action is check and it was
  type: bool
  version_added: 0.3.0
locked:
  description: With V(check) or V(lock), whether this run holds the host lock after the call.
  returned: when a lock was asked for
  type: bool
holder:
  description: On failure to lock, the owner id of the run that holds the lock.
  returned: when the lock is held by another run
  type: str
lock_waited:
  version_added: 0.2.0
  description: With V(check), how long this call waited for the lock of a later run (wait-die), and for which run.
  returned: when the call waited for another run's lock
  type: dict
  contains:
    for:
      description: The owner id of the run that held the lock.
      type: str
    s:
      description: Seconds waited.
      type: float
state:
  description: With V(record), the state written.
  returned: when action is record
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _state
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError, fail
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step


def main() -> None:
    module = AnsibleModule(
        argument_spec=_state.argument_spec(),
        required_if=[("action", "record", ("fingerprint", "pidfile")),
                     ("action", "lock", ("lock_file", "owner")),
                     ("action", "unlock", ("lock_file", "owner"))],
        supports_check_mode=True,
    )
    if module.params["action"] == "check" and not module.params["owner"]:
        # The check split by job (issue 25): without an owner it takes no lock and writes nothing, server_info's job.
        module.deprecate("server_state's action=check without owner is the read-only check of gpufleet.serving.server_info, "
                         "with the same options (less action); use that module", version="1.0.0",
                         collection_name="gpufleet.serving")
    try:
        result = _state.run(module.params, Step.of(module))
    except StepError as e:
        fail(module, e)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
