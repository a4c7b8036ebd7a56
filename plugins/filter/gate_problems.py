# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gate_problems
short_description: Why the gpu_server role refuses its performance gate (gpufleet_server_gate), one sentence per rule
version_added: 0.2.0
description:
  - The gpu_server role's check of C(gpufleet_server_gate), run on the controller with the rest of the server
    definition (the role's preflight), before anything on any host is read, drained or changed. The same rules as
    M(gpufleet.serving.server_bench) and M(gpufleet.serving.server_restart)'s O(gpufleet.serving.server_restart#module:gate)
    apply on the host (the same Python), so a bad gate never reaches a host after its drain.
  - Types and unknown keys first (the options' argument spec), then the values (URL, counts, timeout, min_ratio,
    header names). A header's or the body's value is never shown.
options:
  _input:
    description: C(gpufleet_server_gate); null or an empty dict is no gate (no problem).
    type: raw
    required: true
"""

EXAMPLES = r"""
- name: Refuse a bad performance gate
  ansible.builtin.fail:
    msg: "invalid gpufleet_server_gate: {{ _problems | join('; ') }}"
  when: _problems | length > 0
  vars:
    _problems: "{{ gpufleet_server_gate | gpufleet.serving.gate_problems }}"
"""

RETURN = r"""
_value:
  description: One sentence per rule broken, each starting with C(gpufleet_server_gate); empty when the gate is fine.
  type: list
  elements: str
"""

from ansible_collections.gpufleet.serving.plugins.plugin_utils._preflight import gate_problems


class FilterModule:
    def filters(self):
        return {"gate_problems": gate_problems}
