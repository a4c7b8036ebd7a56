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

A message that shortens a log line ("..." + the last 297 characters, a command line cut at 300) can cut through a
secret the server printed; ansible's substring match then misses the part that is left. So every string of the result
(keys included, `invocation` aside) is also searched for what a cut leaves of a secret of MIN_MASKED or more
characters: its end or its beginning, MIN_MASKED characters or more, at the cut (mask_fragment_text), masked too. A
number, a short value and a word that no long secret contains are left alone.
"""

from __future__ import annotations

import copy
import typing as t

from ansible.module_utils.basic import AnsibleModule

MIN_MASKED = 8
MASK = "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"
FRAGMENT_MASK = "********"  # what ansible writes for a no_log value found in the result


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


def _cut_before(text: str, i: int) -> bool:
    """Whether a run starting at text[i] can follow a cut: it starts the string or follows a character that is not a
    letter or a digit ("..." before what is left)."""
    return i == 0 or not text[i - 1].isalnum()


def _cut_after(text: str, i: int) -> bool:
    """Whether a run ending before text[i] can precede a cut: it ends the string or precedes a character that is not
    a letter or a digit (" (" after it)."""
    return i == len(text) or not text[i].isalnum()


def mask_fragment_text(text: str, secrets: t.Iterable[str], size: int = MIN_MASKED) -> str:
    """text with each piece of a secret (of `size` or more characters) that a cut left replaced by FRAGMENT_MASK.

    A piece is a longest run of `size` or more characters that text shares with a secret and that is the secret
    whole, or its end (a suffix: the start of the secret cut away) starting the string or after a character that is
    not a letter or digit, or its beginning (a prefix: the end cut away) ending the string or before such a character.
    A path that merely shares a directory with a path-valued secret ("/data/models/" in "/data/models/x.log" for
    HF_HOME=/data/models/hf) is not a cut, and is kept. Two substring searches per secret: cheap for a log tail."""
    spans: t.List[t.Tuple[int, int]] = []
    for sec in secrets:
        n = len(sec)
        if n < size or len(text) < size:
            continue
        tail, head = sec[-size:], sec[:size]
        p = text.find(tail)
        while p >= 0:  # runs ending where the secret ends
            q, a = p, n - size
            while q > 0 and a > 0 and text[q - 1] == sec[a - 1]:
                q, a = q - 1, a - 1
            if a == 0 or _cut_before(text, q):
                spans.append((q, p + size))
            p = text.find(tail, p + 1)
        p = text.find(head)
        while p >= 0:  # runs starting where the secret starts
            e, b = p + size, size
            while e < len(text) and b < n and text[e] == sec[b]:
                e, b = e + 1, b + 1
            if b == n or _cut_after(text, e):
                spans.append((p, e))
            p = text.find(head, p + 1)
    if not spans:
        return text
    merged: t.List[t.List[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:  # overlapping or adjacent pieces are masked as one
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    out, pos = [], 0
    for start, end in merged:
        out += [text[pos:start], FRAGMENT_MASK]
        pos = end
    out.append(text[pos:])
    return "".join(out)


def mask_fragments(value: t.Any, secrets: t.Sequence[str]) -> t.Any:
    """value with mask_fragment_text applied to every string inside it (dict keys and values, list items)."""
    if not secrets:
        return value
    if isinstance(value, str):
        return mask_fragment_text(value, secrets)
    if isinstance(value, dict):
        return {mask_fragments(k, secrets): mask_fragments(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(mask_fragments(v, secrets) for v in value)
    return value


class NoLogModule(AnsibleModule):
    """AnsibleModule whose no_log options are masked in `invocation` whatever their length, and elsewhere in the
    result only from MIN_MASKED characters on (see the module docstring)."""

    def __init__(self, *args: t.Any, **kwargs: t.Any) -> None:
        # Until validation is done, a failure is reported as AnsibleModule does it (every no_log value masked).
        self._gpufleet_invocation: t.Optional[t.Dict[str, t.Any]] = None
        self._gpufleet_secrets: t.List[str] = []
        super().__init__(*args, **kwargs)
        masked, found = mask_no_log(self.argument_spec, copy.deepcopy(self.params))
        self.no_log_values.difference_update(v for v in found if len(v) < MIN_MASKED)
        self._gpufleet_secrets = sorted({v for v in found if len(v) >= MIN_MASKED})
        self._gpufleet_invocation = {"module_args": masked}

    def _add_invocation(self, kwargs: t.Dict[str, t.Any]) -> None:
        # A piece of a secret left by a truncated message is masked too (the module docstring).
        for k in list(kwargs):
            if k != "invocation":
                kwargs[k] = mask_fragments(kwargs[k], self._gpufleet_secrets)
        if self._gpufleet_invocation is not None:
            kwargs.setdefault("invocation", self._gpufleet_invocation)

    def exit_json(self, **kwargs: t.Any) -> t.NoReturn:
        self._add_invocation(kwargs)
        super().exit_json(**kwargs)

    def fail_json(self, msg: str, **kwargs: t.Any) -> t.NoReturn:  # pylint: disable=arguments-differ
        self._add_invocation(kwargs)
        msg = mask_fragments(msg, self._gpufleet_secrets)
        super().fail_json(msg, **kwargs)
