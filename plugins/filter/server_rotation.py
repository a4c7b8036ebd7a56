# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: server_rotation
short_description: Where a host of the gpu_server role stands in its load balancers, from what its steps registered
version_added: 0.3.0
description:
  - The gpu_server role's C(gpufleet_server_rotation) fact, composed from the check's start and the registered results
    of the drain's and the return's steps that have run, in their order. The role publishes it once, at the end of the
    host's flow or in its rescue, instead of a C(set_fact) after each step.
  - C(out_of) lists the entries the host is out of, in the entries' order.
options:
  _input:
    description: Where the drain starts (the check's decision, or the stop's); V({}) for a host whose balancers the run
      does not touch, which stays V({}).
    type: dict
    required: true
  names:
    description: The host's balancer entry names, in order.
    type: list
    elements: str
    required: true
  check_mode:
    description: Whether the run is a C(--check) run.
    type: bool
    required: true
  drain:
    description: The drain's registered loop result (M(gpufleet.serving.rotation_step)'s steps).
    type: dict
  slow:
    description:
      - The drain's slow path's registered loop result (its V(verdict) step, when the first slice ended with requests
        in flight), which says drained, past the timeout under V(proceed), or a balancer has the host back in rotation.
    type: dict
  back:
    description: The put-back calls' registered loop result.
    type: dict
  retake:
    description: The take-out again after a failed put-back.
    type: dict
"""

EXAMPLES = r"""
- name: Where the host stands in its balancers
  ansible.builtin.debug:
    msg: "{{ __check.decision.rotation | gpufleet.serving.server_rotation(['haproxy'], ansible_check_mode, drain=__drain) }}"
"""

RETURN = r"""
_value:
  description: The rotation (C(out_of), C(balancers), C(found), C(left_as_found), C(renamed), C(drained), ...).
  type: dict
"""

from ansible_collections.gpufleet.serving.plugins.plugin_utils._flow import rotation


def server_rotation(start, names, check_mode, drain=None, slow=None, back=None, retake=None):
    return rotation(start, names or [], bool(check_mode), drain=drain, slow=slow, back=back, retake=retake)


class FilterModule:
    def filters(self):
        return {"server_rotation": server_rotation}
