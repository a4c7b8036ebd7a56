# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: rotation_steps
short_description: The steps of a host's drain or return to service, and the machine each runs on
version_added: 0.3.0
description:
  - The items of the loop that runs M(gpufleet.serving.rotation_step) for a host, each C({step, where}).
  - The drain (O(flow=drain)) is V(plan) on each machine that reaches a balancer (the entries' C(delegate_to)),
    V(record) on the host, V(out) on each balancer machine, V(wait) on the host, V(recheck) on each machine of an entry
    that can be read (not C(http)), then V(settle) on the host.
  - The return to service (O(flow=return)) is V(back) on each balancer machine, then V(clear) on the host.
  - The drain's slow path (O(flow=slow)) is rounds of V(reread) on each machine of an entry that can be read and
    V(slice) on the host, as many as O(timeout) leaves slices of O(slice) seconds after the first, then V(final) on each
    of those machines and V(verdict) on the host.
options:
  _input:
    description: The entries, as P(gpufleet.serving.balancer_entries#filter) returns them.
    type: list
    elements: dict
    required: true
  host:
    description: The host (C(inventory_hostname)), where its drain record and its in-flight wait are.
    type: str
    required: true
  flow:
    description: Which loop.
    type: str
    choices: [drain, return, slow]
    default: drain
  timeout:
    description: With O(flow=slow), the drain timeout in seconds (C(gpufleet_server_drain_timeout)).
    type: float
    default: 0
  slice:
    description: With O(flow=slow), the seconds of one slice of the wait.
    type: float
    default: 10
"""

EXAMPLES = r"""
- name: The drain's steps
  ansible.builtin.debug:
    msg: "{{ gpufleet_server_balancers | gpufleet.serving.balancer_entries | gpufleet.serving.rotation_steps(inventory_hostname) }}"

- name: The drain's slow path's steps, when requests are still in flight after its first slice
  ansible.builtin.debug:
    msg: >-
      {{ gpufleet_server_balancers | gpufleet.serving.balancer_entries
         | gpufleet.serving.rotation_steps(inventory_hostname, flow='slow', timeout=300, slice=10) }}

- name: The return's steps
  ansible.builtin.debug:
    msg: >-
      {{ gpufleet_server_balancers | gpufleet.serving.balancer_entries
         | gpufleet.serving.rotation_steps(inventory_hostname, flow='return') }}
"""

RETURN = r"""
_value:
  description: The steps in order, each C({step, where}).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.serving.plugins.plugin_utils._drainflow import return_steps, slow_steps, steps


def rotation_steps(entries, host, flow="drain", timeout=0, slice=10):  # pylint: disable=redefined-builtin  # the option's name
    if flow not in ("drain", "return", "slow"):
        raise AnsibleFilterError("rotation_steps: flow must be drain, return or slow, not %r" % (flow,))
    entries = [e for e in entries or [] if isinstance(e, dict)]
    if flow == "slow":
        return slow_steps(entries, str(host), float(timeout), float(slice))
    which = steps if flow == "drain" else return_steps
    return which(entries, str(host))


class FilterModule:
    def filters(self):
        return {"rotation_steps": rotation_steps}
