# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""AnsibleModule for no_log options that hold many short values (a server environment, HTTP headers).

ansible hides the value of a no_log option wherever it appears in the module's result, by substring, and replaces a
number containing it whole. A server environment's values are often short flags: with HF_HUB_OFFLINE="1" among them,
pid 12345, every count and every timing with a 1 in it would come back as VALUE_SPECIFIED_IN_NO_LOG_PARAMETER.
NoLogModule masks its no_log options in the echoed arguments (the result's `invocation`, what -vvv and
ansible-runner's job events show) whatever their length, as ansible does; elsewhere in the result it hides only
values of at least MIN_MASKED characters. The modules never return these options' values, so a shorter value could
only come back if the server itself printed it into the log tail of a failure.
"""

from __future__ import annotations

import copy
import typing as t

from ansible.module_utils.basic import AnsibleModule

MIN_MASKED = 8
MASK = "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"


def _strings(value: t.Any) -> t.Iterator[str]:
    """The scalar values inside a no_log option, as ansible collects them (dict values, list items)."""
    if isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)
    elif value is not None and not isinstance(value, bool) and str(value):
        yield str(value)


def _masked(value: t.Any) -> t.Any:
    """The value as ansible shows a no_log option: each scalar replaced by MASK, the keys of a dict kept."""
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_masked(v) for v in value]
    if value is None or isinstance(value, bool):
        return value
    return MASK


def mask_no_log(spec: t.Mapping[str, t.Any], params: t.Any) -> t.Tuple[t.Any, t.List[str]]:
    """(params with every no_log option masked, the secret strings found), following suboptions."""
    if not isinstance(params, dict):
        return params, []
    out, found = dict(params), []
    for name, opts in spec.items():
        value = params.get(name)
        if value is None:
            continue
        if opts.get("no_log"):
            out[name] = _masked(value)
            found += list(_strings(value))
        elif opts.get("options"):
            items = value if isinstance(value, list) else [value]
            done = []
            for item in items:
                m, f = mask_no_log(opts["options"], item)
                done.append(m)
                found += f
            out[name] = done if isinstance(value, list) else done[0]
    return out, found


class NoLogModule(AnsibleModule):
    """AnsibleModule whose no_log options are masked in `invocation` whatever their length, and elsewhere in the
    result only from MIN_MASKED characters on (see the module docstring)."""

    def __init__(self, *args: t.Any, **kwargs: t.Any) -> None:
        # Until validation is done, a failure is reported as AnsibleModule does it (every no_log value masked).
        self._gpufleet_invocation: t.Optional[t.Dict[str, t.Any]] = None
        super().__init__(*args, **kwargs)
        masked, found = mask_no_log(self.argument_spec, copy.deepcopy(self.params))
        self.no_log_values.difference_update(v for v in found if len(v) < MIN_MASKED)
        self._gpufleet_invocation = {"module_args": masked}

    def _add_invocation(self, kwargs: t.Dict[str, t.Any]) -> None:
        if self._gpufleet_invocation is not None:
            kwargs.setdefault("invocation", self._gpufleet_invocation)

    def exit_json(self, **kwargs: t.Any) -> t.NoReturn:
        self._add_invocation(kwargs)
        super().exit_json(**kwargs)

    def fail_json(self, msg: str, **kwargs: t.Any) -> t.NoReturn:  # pylint: disable=arguments-differ
        self._add_invocation(kwargs)
        super().fail_json(msg, **kwargs)
