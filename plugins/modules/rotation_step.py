#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# The work is done by the action plugin of the same name (plugins/action/rotation_step.py): this file documents it.

from __future__ import annotations

DOCUMENTATION = r"""
module: rotation_step
short_description: One step of a host's drain out of its load balancers, or of its return, as an item of one loop
version_added: 0.3.0
description:
  - The gpu_server role's drain before a restart or a stop, and its return to service after the verify, each as one
    task per host. The task loops over the steps the P(gpufleet.serving.rotation_steps#filter) filter lists, each with
    C(delegate_to) set to the machine it runs on and O(index) to its place in the loop; each step calls a module there
    and keeps what it found for the next one.
  - V(plan) reads every balancer (M(gpufleet.serving.balancer) in check mode, also in a real run) before the host
    leaves any; V(record) writes the drain record on the host (M(gpufleet.serving.rotation_record)) before the
    take-out; V(out) takes the host out (M(gpufleet.serving.balancer)); V(wait) waits one slice for the requests in
    flight (M(gpufleet.serving.inflight_wait)); V(recheck) reads the balancers again; V(settle) says the outcome, and
    when a balancer has the host back in rotation (or cannot be read) drops the records of the entries back in every
    backend and fails the host, nothing killed.
  - A step fails the host as the module it calls did; the steps after a failed one do nothing (an V(out) step still
    runs on every machine, so what each took out is known). With requests still in flight after the first slice,
    V(recheck) and V(settle) leave the rest to the slow path, a loop of its own.
  - The slow path's steps (the role runs them only when the drain's first slice ended with requests in flight) are
    rounds of V(reread) (the balancers read again, on each machine of an entry that can be read) and V(slice) (the
    next slice of the wait, on the host) until no request is in flight or the drain timeout (from the start of the
    first slice, O(first)) has passed, then V(final) (the read right before the kill) and V(verdict) (on the host).
    A balancer that has the host back in rotation, or cannot be read, ends the rounds; V(verdict) then drops the
    records of the entries back in every backend and fails the host, nothing killed. Requests still in flight at the
    timeout fail the host, nothing killed, unless O(wait)'s C(on_timeout) is V(proceed) (said as a warning). The
    rounds a drained or failed host no longer needs return at once.
  - The return's steps are V(back) on each balancer machine (M(gpufleet.serving.balancer) with
    O(gpufleet.serving.balancer#module:state=in), each entry back to the state it was found in, and UP), then V(clear)
    on the host (the drain record cleared, a renamed entry's old name included, except the records of other servers the
    put-back kept). A V(back) that fails
    leaves the record; the role then takes the host out again.
  - In check mode only V(plan) runs (its prediction is the drain's whole answer); the other steps are skipped.
  - The steps share what they found inside the worker process that runs the loop's items one after another. A step
    that finds no state of the steps before it fails the host before it touches anything.
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
attributes:
  check_mode:
    support: full
    details: Only V(plan) runs, a read; every other step is skipped.
  diff_mode:
    support: none
  idempotent:
    support: none
    details: The take-out changes the balancers; a second drain finds the host out and changes nothing there.
options:
  step:
    description: The step this item runs.
    type: str
    required: true
    choices: [plan, record, out, wait, recheck, settle, reread, slice, final, verdict, back, clear]
  index:
    description: The item's place in the loop; V(0) starts a new drain.
    type: int
    required: true
  balancers:
    description: The balancer entries the item's machine reaches (M(gpufleet.serving.balancer)'s O(gpufleet.serving.balancer#module:balancers)).
    type: list
    elements: dict
    default: []
  server:
    description: The host's name, for HAProxy entries without C(server).
    type: str
    default: ''
  worker_url:
    description: The host's worker URL, for router entries without C(worker_url).
    type: str
    default: ''
  names:
    description: Every balancer entry name of the host (a record under one of them is not a renamed entry's; V(clear) clears them).
    type: list
    elements: str
    default: []
  records:
    description: The host's drain record as its check read it (the drain) or as the drain wrote it (the return); read from the loop's first item.
    type: dict
    default: {}
  record:
    description: Where the drain record is (C(path)) and the run that writes it (C(run)).
    type: dict
    default: {}
  wait:
    description:
      - The in-flight wait (C(url), C(metrics), C(timeout), C(slice), C(interval), C(alive_url)), as
        M(gpufleet.serving.inflight_wait) takes them; the first slice waits at most C(slice) seconds.
      - For the slow path also C(on_timeout) (V(fail) or V(proceed), C(gpufleet_server_drain_on_timeout)).
      - Empty, no wait.
    type: dict
    default: {}
  rotation:
    description:
      - Where the host stands in its balancers (the role's C(gpufleet_server_rotation) so far), for V(back) and
        V(clear); its C(found) (each entry's state before the drain), C(left_as_found) (the entries the drain left as
        an operator had set them) and C(renamed) (old names of entries renamed since the drain, whose records V(clear)
        clears too).
      - Read from the loop's first item (O(index=0)), as O(records) is; the later items may leave both out.
    type: dict
    default: {}
  first:
    description:
      - The slow path's start, the drain's first slice (its V(wait) step's result, C(waited_s), C(inflight),
        C(gauges)). The drain timeout counts from its start.
      - Read from the loop's first item, as O(records) is.
    type: dict
    default: {}
  up_timeout:
    description: Seconds V(back) waits for each balancer to report the host UP.
    type: float
    default: 120
  release_lock:
    version_added: 0.3.0
    description:
      - With V(clear), the host lock to release once the drain record is cleared (C(name), C(state_file), C(lock_file),
        C(owner), as M(gpufleet.serving.server_state)'s O(gpufleet.serving.server_state#module:action=unlock) takes
        them), in the same task; RV(lock_released) says whether it was. Not released when a balancer did not take the
        host back (the clear is skipped and the host fails; the role releases it after its rescue).
      - The gpu_server role keeps the lock a restart behind balancers took until the host is back in service, so no
        other run drains or puts back the host while this one does.
    type: dict
notes:
  - An action plugin; it must run with C(delegate_to) set to each step's machine, in a loop whose O(index) counts from
    V(0).
seealso:
  - module: gpufleet.serving.balancer
  - module: gpufleet.serving.rotation_record
  - module: gpufleet.serving.inflight_wait
"""

EXAMPLES = r"""
- name: Drain the host (each step where it runs)
  gpufleet.serving.rotation_step:
    step: "{{ item.step }}"
    index: "{{ idx }}"
    balancers: "{{ entries | selectattr('delegate_to', 'equalto', item.where) | list }}"
    server: "{{ inventory_hostname }}"
    worker_url: http://10.0.0.5:30000
    names: "{{ entries | map(attribute='name') | list }}"
    record:
      path: /var/lib/gpufleet/sglang.rotation.json
      run: "{{ gpufleet_run_id }}"
    wait:
      url: http://127.0.0.1:30000/metrics
      metrics: ["sglang:num_running_reqs", "sglang:num_queue_reqs"]
      timeout: 300
      slice: 10
      interval: 0.5
  delegate_to: "{{ item.where }}"
  loop: "{{ entries | gpufleet.serving.rotation_steps(inventory_hostname) }}"
  loop_control:
    index_var: idx
    label: "{{ item.step }} on {{ item.where }}"
  vars:
    entries: "{{ gpufleet_server_balancers | gpufleet.serving.balancer_entries }}"
"""

RETURN = r"""
lock_released:
  version_added: 0.3.0
  description: With O(release_lock), whether the host lock was released after the clear.
  returned: with release_lock, when the clear ran
  type: bool
step:
  description: The step this item ran.
  returned: always
  type: str
drains:
  description: What the host would be taken out of (V(plan), as M(gpufleet.serving.balancer) returns it).
  returned: by plan
  type: list
  elements: dict
rotation:
  description: What the take-out did (V(out), as M(gpufleet.serving.balancer) returns it).
  returned: by out
  type: dict
inflight:
  description: Requests in flight at the end of the first slice (V(wait)).
  returned: by wait
  type: float
outcome:
  description:
    - The drain's outcome (V(settle)); V(drained), V(lost) (a balancer has the host back in rotation, or cannot be
      read, and the host fails), V(deferred) (requests still in flight, for the role's slow path), V(aborted) (a
      step failed) or V(check_mode).
  returned: by recheck and settle when they did not run, and by settle
  type: str
back_in_rotation:
  description: The entries a re-read found back in rotation (V(settle)).
  returned: by settle
  type: list
  elements: dict
inflight_left:
  description: Requests in flight when the host was drained (V(settle)).
  returned: by settle
  type: float
"""
