# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: balancer_entries
short_description: The gpu_server role's load balancer entries, each named and with the machine that reaches it
version_added: 0.2.0
description:
  - >-
    C(gpufleet_server_balancers) as the role's drain, return to service, capacity guard and audit use it. Entries of
    type V(none) (or with no type) are left out; each other entry gets a C(name) unless it has one (its type, numbered
    among the entries kept when several have the same type, V(haproxy-1) and V(haproxy-2)) and a C(delegate_to)
    (default V(localhost)).
options:
  _input:
    description: C(gpufleet_server_balancers), a list of dicts (the role's argument specs check their form).
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: Name the balancers
  ansible.builtin.debug:
    msg: "{{ gpufleet_server_balancers | gpufleet.serving.balancer_entries | map(attribute='name') | list }}"
"""

RETURN = r"""
_value:
  description: The entries kept, in their order, each with C(name) and C(delegate_to) set.
  type: list
  elements: dict
"""

from ansible_collections.gpufleet.serving.plugins.plugin_utils._preflight import balancer_entries


class FilterModule:
    def filters(self):
        return {"balancer_entries": balancer_entries}
