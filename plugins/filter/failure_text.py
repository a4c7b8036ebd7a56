# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: failure_text
short_description: Why a task failed, whole, from its result (each failed loop item's message, what a module printed)
version_added: 0.3.0
description:
  - The gpu_server role's rescues say with it why the host failed, and the P(gpufleet.serving.rollout_summary#callback)
    callback's failure column is the same text, cut to the column (one composition of a failure's text).
  - A loop's failure (V(One or more items failed)) is each failed item's message, joined by semicolons. A command's
    (V(non-zero return code)) keeps what it printed on stderr. A module that printed no JSON keeps what it printed
    (C(module_stderr), C(module_stdout)).
options:
  _input:
    description: A task's result, for example C(ansible_failed_result) in a rescue.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Record why the host failed
  ansible.builtin.set_fact:
    my_failure: "{{ ansible_failed_result | gpufleet.serving.failure_text }}"
"""

RETURN = r"""
_value:
  description: The failure's text, whole (not cut).
  type: str
"""

# The callback keeps the function: it is loaded on its own by file (tools/gpufleet_ci), with no collection on the path.
from ansible_collections.gpufleet.serving.plugins.callback.rollout_summary import failure_cause


def failure_text(result):
    return failure_cause(result if isinstance(result, dict) else {})


class FilterModule:
    def filters(self):
        return {"failure_text": failure_text}
