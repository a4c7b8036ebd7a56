# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: capacity_refusal
short_description: Why a batch may not be drained, by the rollout's capacity guard (empty when it may)
version_added: 0.3.0
description:
  - The decision of the gpu_server role's capacity guard (C(gpufleet_rollout_min_in_service)) for one batch, from the
    balancers' reads (M(gpufleet.serving.balancer) with O(gpufleet.serving.balancer#module:report=capacity)).
  - A host is in service when every balancer of it has it in rotation. The batch must leave the minimum of the fleet's
    hosts in service, unless it drains nobody in rotation anywhere (it cannot lower the capacity then). With a minimum
    set, no pool a request is routed to (an HAProxy backend, a router) that has a server in rotation now is left without
    one, whatever the fleet's count says (a host out of one backend still carries another's requests).
  - A minimum that is not a number of servers or a percentage, and a balancer that could not be read, are refusals too.
options:
  _input:
    description: The batch and what the guard knows of the fleet.
    type: dict
    required: true
    suboptions:
      reads:
        description: The balancer module's results, one per delegate (their C(out_hosts), C(pools), C(unread), C(msg)).
        type: list
        elements: dict
      fleet:
        description: The play's group's hosts that have balancers.
        type: list
        elements: str
      batch:
        description: C(ansible_play_batch).
        type: list
        elements: str
      drained:
        description: The batch's hosts of the fleet that would be drained (not found up to date).
        type: list
        elements: str
      left_out:
        description: Fleet hosts out whatever the balancers say (this run's failed hosts, the clean playbook's stopped ones).
        type: list
        elements: str
      min_in_service:
        description: C(gpufleet_rollout_min_in_service), a number of servers or a percentage of the fleet such as V(75%).
        type: raw
"""

EXAMPLES = r"""
- name: Refuse a batch that would leave too few servers in rotation
  ansible.builtin.assert:
    that: _refusal | length == 0
    fail_msg: "{{ _refusal }}"
  vars:
    _refusal: >-
      {{ {'reads': read.results, 'fleet': fleet, 'batch': ansible_play_batch, 'drained': drained, 'left_out': [],
          'min_in_service': gpufleet_rollout_min_in_service} | gpufleet.serving.capacity_refusal }}
"""

RETURN = r"""
_value:
  description: The refusal, empty when the batch may go on.
  type: str
"""

import math
import re
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils._balancer import capacity_refusal as _refusal


def minimum(raw: t.Any, fleet_size: int) -> t.Optional[int]:
    """The minimum as a number of servers (a percentage of the fleet rounded up), None when it is neither."""
    text = str(raw if raw is not None else 0)
    if re.match(r"[0-9]+$", text):
        return int(text)
    m = re.match(r"([0-9]+(\.[0-9]+)?)%$", text)
    if m and float(m.group(1)) <= 100:
        return int(math.ceil(float(m.group(1)) * fleet_size / 100))
    return None


def capacity_refusal(guard: t.Mapping[str, t.Any]) -> str:
    reads = [r for r in guard.get("reads") or [] if isinstance(r, t.Mapping)]
    fleet = [str(h) for h in guard.get("fleet") or []]
    n = minimum(guard.get("min_in_service"), len(fleet))
    if n is None:
        return ('gpufleet_rollout_min_in_service must be a number of servers (>= 0) or a percentage such as "75%%" (got '
                '%s)' % str(guard.get("min_in_service"))[:40])
    unread = [str(u) for r in reads for u in r.get("unread") or []] + [str(r["msg"]) for r in reads if r.get("msg")]
    if unread:
        return ("gpufleet_rollout_min_in_service: could not read %s to count the servers in rotation; nothing was "
                "touched" % "; ".join(unread))
    return _refusal(reads, fleet, [str(h) for h in guard.get("batch") or []], [str(h) for h in guard.get("drained") or []],
                    [str(h) for h in guard.get("left_out") or []], n) or ""


class FilterModule:
    def filters(self):
        return {"capacity_refusal": capacity_refusal}
