# SPDX-License-Identifier: GPL-3.0-or-later
"""The gpu_server role's controller-side checks of a server definition (plugin_utils/_preflight.py), which were Jinja
in tasks/preflight.yml and vars/main.yml: the messages a user sees, one per broken rule, and the balancer entries."""
from __future__ import annotations

import typing as t

import pytest

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _preflight as pf

GOOD: t.Dict[str, t.Any] = {
    "gpufleet_server_name": "sglang", "gpufleet_server_command": ["python3", "-m", "sglang.launch_server"],
    "gpufleet_server_env": {"HF_TOKEN": "s3cr3t"}, "gpufleet_server_launcher": "process", "gpufleet_server_umask": "0022",
    "gpufleet_server_health_url": "http://127.0.0.1:30000/health", "gpufleet_server_health_request": {},
    "gpufleet_server_start_timeout": 600, "gpufleet_server_clean_timeout": 30, "gpufleet_server_ready_interval": 1.0,
    "gpufleet_server_lock_ttl": 3600, "gpufleet_server_kill_grace": 10, "gpufleet_server_kill_final_wait": 5,
    "gpufleet_server_lock_wait": 0, "gpufleet_server_gate": None,
}


def refusal(stop_only: bool = False, **over: t.Any) -> str:
    return pf.definition_refusal(dict(GOOD, **{"gpufleet_server_" + k: v for k, v in over.items()}), stop_only)


def test_a_usable_definition_has_no_problem():
    assert refusal() == ""
    assert refusal(launcher="systemd", umask="027") == ""


@pytest.mark.parametrize("over, text", [
    ({"name": ".."}, 'gpufleet_server_name must be a string of 1 to 200 letters, digits, "_", "." and "-" (got str "..")'),
    ({"name": "a\n"}, 'gpufleet_server_name must be a string of 1 to 200'),
    ({"name": ["a", "b"]}, '(got list ["a", "b"])'),
    ({"name": "n" * 201}, '(got str "%s...)' % ("n" * 56)),
    ({"command": "python3 -m x"}, 'gpufleet_server_command must be a list (an argument vector, no shell), for example '
                                  '[python3, -m, sglang.launch_server, --port, "30000"] (got str "python3 -m x")'),
    ({"command": {"a": 1}}, "(got dict)"),
    ({"command": []}, "gpufleet_server_command must not be empty and its first element must be the executable"),
    ({"command": [""]}, "gpufleet_server_command must not be empty and its first element must be the executable"),
    ({"env": ["A=1"]}, "gpufleet_server_env must be a dict of NAME: value (got list)"),
    ({"launcher": "docker"}, 'gpufleet_server_launcher must be process or systemd (got "docker")'),
    ({"umask": 18}, 'gpufleet_server_umask must be three or four octal digits in quotes, such as "0022" or "027" '
                    '(got int 18; YAML reads an unquoted 0022 as the number 18)'),
    ({"umask": "0088"}, '(got str "0088")'),
    ({"health_url": ""}, "gpufleet_server_health_url or gpufleet_server_health_request must be set (the readiness gate)"),
    ({"start_timeout": "soon"}, "gpufleet_server_start_timeout must be a number"),
    ({"start_timeout": 0}, "gpufleet_server_start_timeout must be > 0."),
    ({"ready_interval": "0.0"}, "gpufleet_server_ready_interval must be > 0."),
    ({"lock_ttl": -5}, "gpufleet_server_lock_ttl must be > 0."),
    ({"kill_grace": -1}, "gpufleet_server_kill_grace must be >= 0."),
    ({"gate": "fast"}, "gpufleet_server_gate must be a dict of server_bench's options (got str)"),
])
def test_each_broken_rule_is_named_alone(over, text):
    got = refusal(**over)
    assert got.startswith("gpu_server: invalid server definition: ") and got.endswith("."), got
    assert text in got, got
    assert got.count("; gpufleet_server_") == 0, got  # one rule broken, one sentence


def test_every_broken_rule_is_named_in_one_message_and_no_value_of_the_env_is_shown():
    got = refusal(name="..", command=[], umask=22, start_timeout=-1, kill_grace=-2, lock_wait="x", health_url="")
    assert got.count("; gpufleet_server_") == 6, got
    order = ["gpufleet_server_name", "gpufleet_server_command", "gpufleet_server_umask", "gpufleet_server_health_url",
             "gpufleet_server_lock_wait must be a number", "gpufleet_server_kill_grace must be >= 0",
             "gpufleet_server_start_timeout must be > 0"]
    assert [got.index(o) for o in order] == sorted(got.index(o) for o in order), got
    assert "s3cr3t" not in got


def test_the_clean_playbook_needs_no_command_and_no_readiness_gate():
    assert refusal(stop_only=True, command=None, health_url="") == ""
    assert "gpufleet_server_name" in refusal(stop_only=True, command=None, name="")


def test_the_environment_is_checked_once_the_definition_is_usable():
    assert refusal(env={"BAD NAME": "1", "1X": "2", "OK": "3"}) == (
        'gpufleet_server_env: invalid variable name(s) "BAD NAME", "1X" (names must match ^[A-Za-z_][A-Za-z0-9_]*$).')
    # A broken rule comes first: the environment's message waits for a usable definition.
    assert refusal(env={"BAD NAME": "1"}, umask=1).startswith("gpu_server: invalid server definition:")
    inj = {"X": "a\nExecStartPre=/bin/touch /tmp/pwned", "Y": "fine"}
    assert refusal(launcher="systemd", env=inj, command=["srv", "--x\r"]) == (
        "gpufleet_server_env / gpufleet_server_command: X, command contain a line break, which a systemd unit line "
        "cannot hold.")
    assert refusal(launcher="process", env=inj) == ""  # argv and environ hold line breaks as they are
    assert "pwned" not in refusal(launcher="systemd", env=inj)


def test_types_are_named_as_yaml_has_them_not_by_ansibles_classes():
    class _AnsibleTaggedStr(str):
        pass

    assert pf.type_name(_AnsibleTaggedStr("x")) == "str"
    names = ["null", "bool", "int", "float", "dict", "list", "list"]
    assert [pf.type_name(v) for v in (None, True, 3, 1.5, {}, [], ())] == names
    assert "(got str " in refusal(name=_AnsibleTaggedStr("a b"))


def test_truncate_reads_as_jinjas():
    assert pf.truncate("x" * 65, 60) == "x" * 65
    assert pf.truncate("aaa bbb " * 10, 20) == "aaa bbb aaa bbb..."


def test_balancer_entries_are_named_and_delegated():
    got = pf.balancer_entries([
        {"type": "haproxy", "socket": "/a"}, {"type": "none"}, {"url": "x"}, "not a dict",
        {"type": "haproxy", "socket": "/b", "delegate_to": "lb2"}, {"type": "sglang_router", "url": "u", "delegate_to": ""},
        {"type": "http", "name": "mine", "delegate_to": None},
    ])
    assert [(e["name"], e["delegate_to"]) for e in got] == [
        ("haproxy-1", "localhost"), ("haproxy-2", "lb2"), ("sglang_router", "localhost"), ("mine", "localhost")]
    assert got[0]["socket"] == "/a"
    assert pf.balancer_entries([]) == [] and pf.balancer_entries(None) == []
