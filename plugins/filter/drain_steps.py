# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: drain_steps
short_description: The steps of a host's drain and the machine each runs on, the items of M(gpufleet.serving.rotation_step)'s loop
version_added: 0.3.0
description:
  - V(plan) on each machine that reaches a balancer (the entries' C(delegate_to)), V(record) on the host, V(out) on each
    balancer machine, V(wait) on the host, V(recheck) on each machine of an entry that can be read (not C(http)), then
    V(settle) on the host. Each item is C({step, where}).
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
"""

EXAMPLES = r"""
- name: The drain's steps
  ansible.builtin.debug:
    msg: "{{ gpufleet_server_balancers | gpufleet.serving.balancer_entries | gpufleet.serving.drain_steps(inventory_hostname) }}"
"""

RETURN = r"""
_value:
  description: The steps in order, each C({step, where}).
  type: list
  elements: dict
"""

from ansible_collections.gpufleet.serving.plugins.plugin_utils._drainflow import steps


def drain_steps(entries, host):
    return steps([e for e in entries or [] if isinstance(e, dict)], str(host))


class FilterModule:
    def filters(self):
        return {"drain_steps": drain_steps}
