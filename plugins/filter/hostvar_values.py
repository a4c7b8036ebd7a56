# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: hostvar_values
short_description: Each value a variable has across hosts, with the hosts that have it
version_added: 0.3.0
description:
  - For a setting that must be the same on every host of a play (the rollout's C(gpufleet_rollout_min_in_service)),
    each distinct value, as text, with the hosts that have it, in the order first seen. One entry means one value.
options:
  _input:
    description: The hosts (C(ansible_play_hosts_all)).
    type: list
    elements: str
    required: true
  hostvars:
    description: C(hostvars).
    type: raw
    required: true
  name:
    description: The variable.
    type: str
    required: true
  default:
    description: The value of a host that does not set it.
    type: raw
"""

EXAMPLES = r"""
- name: Refuse a fleet minimum that differs between hosts
  ansible.builtin.assert:
    that: _values | length <= 1
    fail_msg: "gpufleet_rollout_min_in_service must be the same on every host (got {{ _values | join('; ') }})"
  vars:
    _values: "{{ ansible_play_hosts_all | gpufleet.serving.hostvar_values(hostvars, 'gpufleet_rollout_min_in_service', 0) }}"
  run_once: true
"""

RETURN = r"""
_value:
  description: One C(VALUE on HOST, HOST, ...) per distinct value.
  type: list
  elements: str
"""

import typing as t


def hostvar_values(hosts: t.Iterable[t.Any], hostvars: t.Any, name: str, default: t.Any = None) -> t.List[str]:
    by: t.Dict[str, t.List[str]] = {}
    for h in hosts or []:
        hv = hostvars[h]
        # Each host's value templated on access (ansible-core's HostVars), as hostvars[h].NAME in Jinja.
        value = hv[name] if name in hv else default
        by.setdefault(str(value), []).append(str(h))
    return ["%s on %s" % (v, ", ".join(hs)) for v, hs in by.items()]


class FilterModule:
    def filters(self):
        return {"hostvar_values": hostvar_values}
