# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: server_result
short_description: A host's summary row of the gpu_server role, from what its steps registered
version_added: 0.3.0
description:
  - The gpu_server role's C(gpufleet_server_result) fact, composed from the check's decision and the restart's
    registered result (in check mode, what it would do, nothing killed or timed). A failed restart adds nothing; the
    role's rescue records its failure. The role publishes it once, at the end of the host's flow or in its rescue.
options:
  _input:
    description: The row the check's decision starts.
    type: dict
    required: true
  check_mode:
    description: Whether the run is a C(--check) run.
    type: bool
    required: true
  restart:
    description: The restart's registered result (V({}) when it did not run).
    type: dict
"""

EXAMPLES = r"""
- name: The host's row
  ansible.builtin.debug:
    msg: "{{ __check.decision.result | gpufleet.serving.server_result(ansible_check_mode, restart=__restart) }}"
"""

RETURN = r"""
_value:
  description: The row (C(restarted), C(would_restart), C(killed), C(timings), C(workers_verified), C(reasons), ...).
  type: dict
"""

from ansible_collections.gpufleet.serving.plugins.plugin_utils._flow import result


def server_result(start, check_mode, restart=None):
    return result(start, bool(check_mode), restart=restart)


class FilterModule:
    def filters(self):
        return {"server_result": server_result}
