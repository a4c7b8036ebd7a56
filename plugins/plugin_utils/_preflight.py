# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_server role's checks of a server definition on the controller, before anything on a host is read or changed.

The argument specs (roles/gpu_server/meta/argument_specs.yml) check each variable's type and choices; these are the
rules they cannot say (one variable's value against a pattern, two variables together, the numbers' signs) and the
balancer entries as the role's tasks use them. They were Jinja in the role (tasks/preflight.yml, vars/main.yml):
compiled again by every forked worker for every host, the costliest template of a rollout that changes nothing, and out
of reach of unit tests and sanity (issue 25). The messages are the ones the role printed.
"""

from __future__ import annotations

import json
import re
import typing as t

# min 1: must be > 0; min 0: must be >= 0, in the order the messages list them.
NUMBERS: t.Tuple[t.Tuple[str, int], ...] = (
    ("gpufleet_server_start_timeout", 1),
    ("gpufleet_server_clean_timeout", 1),
    ("gpufleet_server_ready_interval", 1),
    ("gpufleet_server_lock_ttl", 1),
    ("gpufleet_server_kill_grace", 0),
    ("gpufleet_server_kill_final_wait", 0),
    ("gpufleet_server_lock_wait", 0),
)
_NUMBER = re.compile(r"-?[0-9]+([.][0-9]+)?")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")
_UMASK = re.compile(r"0?[0-7]{3}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LINE_BREAK = re.compile(r"[\r\n]")


def type_name(value: t.Any) -> str:
    """The YAML-level type of a value. ansible-core 2.19 wraps inventory values in its own classes, whose names
    (_AnsibleTaggedStr, _AnsibleLazyTemplateList) mean nothing to whoever wrote the inventory."""
    if value is None:
        return "null"
    for kind, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"), (t.Mapping, "dict"),
                       ((list, tuple), "list")):
        if isinstance(value, kind):  # type: ignore[arg-type]
            return name
    return type(value).__name__


def plain(value: t.Any) -> t.Any:
    """The value as plain JSON types, for a message."""
    if isinstance(value, t.Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value if value is None else str(value)


def to_json(value: t.Any) -> str:
    return json.dumps(plain(value))


def truncate(text: str, length: int) -> str:
    """Jinja's truncate(length) with its defaults (kept so that messages read as before): a text up to 5 characters
    longer than `length` is kept; a longer one is cut at a word boundary and ends with '...'."""
    if len(text) <= length + 5:
        return text
    return text[:length - 3].rsplit(" ", 1)[0] + "..."


def _is_list(value: t.Any) -> bool:
    return isinstance(value, (list, tuple))


def number_problems(values: t.Mapping[str, t.Any]) -> t.List[str]:
    """Each timing variable must be a number (in any YAML or extra-var form: compared as text), with its sign."""
    texts = [(name, str(values.get(name)), minimum) for name, minimum in NUMBERS]
    numeric = [(n, v, m) for n, v, m in texts if _NUMBER.fullmatch(v)]
    return (["%s must be a number" % n for n, v, m in texts if not _NUMBER.fullmatch(v)]
            + ["%s must be >= 0" % n for n, v, m in numeric if m == 0 and v.startswith("-")]
            + ["%s must be > 0" % n for n, v, m in numeric if m == 1 and (v.startswith("-") or set(v) <= set("0."))])


_CONVERSION = re.compile(r"argument '([a-z_]+)' is of type \w+ and we were unable to convert to (int|float|bool)\b.*", re.S)


def _conversion_message(message: str, values: t.Mapping[str, t.Any]) -> str:
    """The validator's message for an option of the wrong type, said by name with the value (a count, a ratio or a
    timeout: none of them a secret); other messages as they are."""
    m = _CONVERSION.fullmatch(message)
    if not m or m.group(1) not in values:
        return message
    kind = {"int": "an integer", "float": "a number", "bool": "true or false"}[m.group(2)]
    return "%s must be %s, got %s %s" % (m.group(1), kind, type_name(values[m.group(1)]),
                                         truncate(to_json(values[m.group(1)]), 40))


def gate_problems(gate: t.Any) -> t.List[str]:
    """gpufleet_server_gate against server_bench's own rules (the same Python as on the host), one sentence each."""
    if gate is None or gate == {}:
        return []
    # Imported only for a gate: every host's preflight runs in a worker process of its own that compiles what it
    # imports from source (the collection loader keeps no bytecode); _bench and the argument spec validator were 18 %
    # of a no-op rollout's controller CPU when imported at the top (py-spy, 4 hosts, no gate set).
    # pylint: disable=import-outside-toplevel
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    from ansible_collections.gpufleet.serving.plugins.module_utils import _bench
    if not isinstance(gate, t.Mapping):
        return ["gpufleet_server_gate must be a dict of server_bench's options (got %s)" % type_name(gate)]
    # Plain types first: ansible-core 2.19's validator names the class of a value it cannot convert, and an
    # inventory's "abc" is an _AnsibleTaggedStr there ("<class '...._AnsibleTaggedStr'> cannot be converted").
    values = plain(gate)
    res = ArgumentSpecValidator(_bench.argument_spec()).validate(values)
    if res.error_messages:
        return ["gpufleet_server_gate: %s" % _conversion_message(m, values) for m in res.error_messages]
    return ["gpufleet_server_gate: %s" % m for m in _bench.input_problems(dict(res.validated_parameters, baseline=None))]


def definition_problems(d: t.Mapping[str, t.Any], stop_only: bool = False) -> t.List[str]:
    """The rules of a server definition that are broken, one sentence each (none: it is usable). `d` holds the role's
    variables by name; `stop_only` (the clean playbook) needs no command and no readiness gate."""
    name, command, umask = d.get("gpufleet_server_name"), d.get("gpufleet_server_command"), d.get("gpufleet_server_umask")
    env, launcher = d.get("gpufleet_server_env"), d.get("gpufleet_server_launcher")
    out: t.List[str] = []
    if not (isinstance(name, str) and _NAME.fullmatch(name) and name not in (".", "..")):
        out.append('gpufleet_server_name must be a string of 1 to 200 letters, digits, "_", "." and "-" (got %s %s)'
                   % (type_name(name), truncate(to_json(name), 60)))
    if not (stop_only or _is_list(command)):
        out.append('gpufleet_server_command must be a list (an argument vector, no shell), for example '
                   '[python3, -m, sglang.launch_server, --port, "30000"] (got %s%s)'
                   % (type_name(command), (" " + truncate(to_json(command), 60)) if isinstance(command, str) else ""))
    if not stop_only and _is_list(command) and (len(command) == 0 or len(str(command[0])) == 0):
        out.append("gpufleet_server_command must not be empty and its first element must be the executable")
    if not isinstance(env, t.Mapping):
        out.append("gpufleet_server_env must be a dict of NAME: value (got %s)" % type_name(env))
    if launcher not in ("process", "systemd"):
        out.append("gpufleet_server_launcher must be process or systemd (got %s)" % to_json(truncate(str(launcher), 40)))
    if not (isinstance(umask, str) and _UMASK.fullmatch(umask)):
        out.append('gpufleet_server_umask must be three or four octal digits in quotes, such as "0022" or "027" (got %s %s%s)'
                   % (type_name(umask), truncate(to_json(umask), 20),
                      "; YAML reads an unquoted 0022 as the number 18" if isinstance(umask, (int, float)) else ""))
    if not stop_only and not (str(d.get("gpufleet_server_health_url") or "") or d.get("gpufleet_server_health_request")):
        out.append("gpufleet_server_health_url or gpufleet_server_health_request must be set (the readiness gate)")
    return out + number_problems(d) + gate_problems(d.get("gpufleet_server_gate"))


def env_problem(d: t.Mapping[str, t.Any]) -> str:
    """The environment's problem ("" when there is none): names that are not variable names, then line breaks that a
    systemd unit line cannot hold."""
    env = d.get("gpufleet_server_env")
    env = env if isinstance(env, t.Mapping) else {}
    bad = [str(k) for k in env if not _ENV_NAME.fullmatch(str(k))]
    if bad:
        return ("gpufleet_server_env: invalid variable name(s) %s (names must match ^[A-Za-z_][A-Za-z0-9_]*$)."
                % ", ".join(to_json(k) for k in bad))
    if any(not isinstance(v, str) for v in env.values()):
        # The restart's own rule for the values (a string or a number), here before the lock and the drain: found by
        # server_restart after them, it left a drained host out of rotation with its server never stopped. Imported
        # only when a value is not a string (the module is large, and imports from source on every host's worker).
        from ansible_collections.gpufleet.serving.plugins.module_utils import _server
        try:
            _server.validate_env(plain(env), field="gpufleet_server_env")  # plain: its types named as YAML has them
        except _server.ServerError as e:
            return "%s." % e
    if d.get("gpufleet_server_launcher") == "systemd":
        command = d.get("gpufleet_server_command")
        multiline = [str(k) for k, v in env.items() if isinstance(v, str) and _LINE_BREAK.search(v)]
        if _is_list(command) and any(_LINE_BREAK.search(str(e)) for e in command):
            multiline.append("command")
        if multiline:
            return ("gpufleet_server_env / gpufleet_server_command: %s contain a line break, which a systemd unit line "
                    "cannot hold." % ", ".join(multiline))
    return ""


def definition_refusal(d: t.Mapping[str, t.Any], stop_only: bool = False) -> str:
    """The role's preflight message for a server definition, "" when it is usable: every broken rule, or else the
    environment's problem (checked only once the definition is usable)."""
    problems = definition_problems(d, stop_only)
    if problems:
        return "gpu_server: invalid server definition: %s." % "; ".join(problems)
    return env_problem(d)


def balancer_entries(balancers: t.Any) -> t.List[t.Dict[str, t.Any]]:
    """gpufleet_server_balancers as the role's tasks use them: entries of type none (or none given) left out, each with
    a name (its type, numbered among entries of the same type when there are several: haproxy-1, haproxy-2) and the
    machine that reaches it (delegate_to, default localhost). The argument specs checked the entries' form."""
    entries = [b for b in (balancers if _is_list(balancers) else []) if isinstance(b, t.Mapping)]
    out: t.List[t.Dict[str, t.Any]] = []
    for b in entries:
        kind = b.get("type", "none")
        if kind == "none":
            continue
        same = sum(1 for o in entries if "type" in o and o["type"] == kind)
        entry = {k: b[k] for k in b}  # item by item: ansible-core's lazy containers template on item access
        if "name" not in b:
            entry["name"] = "%s%s" % (kind, "" if same == 1 else "-%d" % (len(out) + 1))
        entry["delegate_to"] = str(b.get("delegate_to") or "localhost")
        out.append(entry)
    return out
