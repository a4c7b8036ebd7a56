# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: server_problems
short_description: Why the gpu_server role refuses a server definition, as one message
version_added: 0.2.0
description:
  - >-
    The gpu_server role's preflight on the controller, before anything on any host is read, locked or changed: the
    rules its argument specs cannot say. The server's name (1 to 200 letters, digits, C(_), C(.), C(-); not C(.) or
    C(..)), the command (a non-empty list whose first element is the executable), the environment (a dict), the
    launcher, the umask (octal digits in quotes), a readiness gate (health URL or request), the timings (numbers, with
    their signs) and C(gpufleet_server_gate) (see P(gpufleet.serving.gate_problems#filter)).
  - Every broken rule is named in one message; only once the definition is usable, the environment's names (and, for
    the systemd launcher, line breaks in its values or the command) are checked, with their own message.
  - Types are named as YAML has them (str, int, list, dict, null), not by ansible-core's internal classes.
options:
  _input:
    description: The role's variables by name (C(gpufleet_server_name), C(gpufleet_server_command), ...).
    type: dict
    required: true
  stop_only:
    description: The definition only stops a server (the clean playbook), so it needs no command and no readiness gate.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Refuse an unusable server definition
  ansible.builtin.fail:
    msg: "{{ _problem }}"
  when: _problem | length > 0
  vars:
    _problem: >-
      {{ {'gpufleet_server_name': gpufleet_server_name, 'gpufleet_server_command': gpufleet_server_command}
         | gpufleet.serving.server_problems }}
"""

RETURN = r"""
_value:
  description: >-
    The refusal, starting with C(gpu_server: invalid server definition:) or C(gpufleet_server_env); empty when the
    definition is usable.
  type: str
"""

from ansible_collections.gpufleet.serving.plugins.plugin_utils._preflight import definition_refusal


class FilterModule:
    def filters(self):
        return {"server_problems": definition_refusal}
