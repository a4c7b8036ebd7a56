# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: batch_settings_problems
short_description: What is wrong with a rollout's batch settings, each in the words the refusal shows
version_added: 0.3.0
description:
  - The check of the rollout and clean playbooks' batch settings before any host is touched (the gpu_server role's
    C(batch_begin) tasks), one problem per setting, in this order.
  - C(max_fail_percentage) must be a number from 0 to 100; C(serial) a batch size (a number of hosts >= 1 or a
    percentage such as V(50%)) or a list of them, not null and not an empty list (ansible-core crashed on null and made
    one batch of every host of an empty list); C(fast_check) a boolean (the C(bool) filter reads anything else as
    false, silently); C(min_in_service) one value on every host of the play (the
    P(gpufleet.serving.hostvar_values#filter) filter's list, one entry per distinct value).
options:
  _input:
    description: The settings, as the play has them.
    type: dict
    required: true
    suboptions:
      max_fail_percentage:
        description: C(gpufleet_rollout_max_fail_percentage).
        type: raw
      serial:
        description: C(gpufleet_rollout_serial).
        type: raw
      fast_check:
        description: C(gpufleet_rollout_fast_check).
        type: raw
      min_in_service:
        description: The distinct values of C(gpufleet_rollout_min_in_service) with their hosts.
        type: list
        elements: str
"""

EXAMPLES = r"""
- name: Check the batch settings
  ansible.builtin.assert:
    that: _problems | length == 0
    fail_msg: "{{ _problems | join('; ') }}"
  vars:
    _problems: >-
      {{ {'max_fail_percentage': gpufleet_rollout_max_fail_percentage | default(0),
          'serial': gpufleet_rollout_serial | default([1, '100%']),
          'fast_check': gpufleet_rollout_fast_check | default(true),
          'min_in_service': []} | gpufleet.serving.batch_settings_problems }}
  run_once: true
"""

RETURN = r"""
_value:
  description: The problems, empty when the settings are usable.
  type: list
  elements: str
"""

import re
import typing as t

try:
    from ansible.module_utils.datatag import native_type_name
except ImportError:  # before ansible-core 2.19 values carry no tags
    def native_type_name(value: object, /) -> str:  # type: ignore[misc]
        return type(value).__name__

_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?$")
# A 0 would put every host into one batch and drop the canary without a word.
_BATCH = re.compile(r"([1-9][0-9]*|[1-9][0-9]*(\.[0-9]+)?%)$")
_BOOLS = ("true", "false", "yes", "no", "on", "off", "1", "0")
_SETTINGS = ("max_fail_percentage", "serial", "fast_check", "min_in_service")


def _cut(text: str, length: int = 40) -> str:
    """A value shown in a refusal, cut as Jinja's truncate(40) cuts it (at a word, within its leeway of 5)."""
    if len(text) <= length + 5:
        return text
    return text[:length - 3].rsplit(" ", 1)[0] + "..."


def batch_settings_problems(settings: t.Mapping[str, t.Any]) -> t.List[str]:
    if not isinstance(settings, t.Mapping) or set(settings) - set(_SETTINGS):
        raise TypeError("batch_settings_problems takes a dict of %s" % ", ".join(_SETTINGS))
    problems = []
    max_fail = settings.get("max_fail_percentage", 0)
    if not (_NUMBER.match(str(max_fail)) and float(str(max_fail)) <= 100):
        problems.append("gpufleet_rollout_max_fail_percentage must be a number from 0 to 100 (got %s %s)"
                        % (native_type_name(max_fail), _cut(str(max_fail))))
    serial = settings.get("serial", [1, "100%"])
    sizes = list(serial) if isinstance(serial, (list, tuple)) else [serial]
    bad = [str(s) for s in sizes if not _BATCH.match(str(s))] if sizes else ["[] (an empty list)"]
    if bad:
        problems.append('gpufleet_rollout_serial must be a batch size (a number of hosts >= 1 or a percentage such as '
                        '"50%%"), or a list of them (got %s)' % ", ".join(bad))
    fast_check = settings.get("fast_check", True)
    if str(fast_check).lower() not in _BOOLS:
        problems.append("gpufleet_rollout_fast_check must be true or false (got %s)" % _cut(str(fast_check)))
    mins = list(settings.get("min_in_service") or [])
    if len(mins) > 1:
        problems.append("gpufleet_rollout_min_in_service is the minimum of the whole fleet, so it must be the same on "
                        "every host of the play (got %s): set it in extra vars or in the group_vars of the whole group; "
                        "nothing was touched" % "; ".join(str(m) for m in mins))
    return problems


class FilterModule:
    def filters(self):
        return {"batch_settings_problems": batch_settings_problems}
