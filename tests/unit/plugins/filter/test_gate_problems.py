# SPDX-License-Identifier: GPL-3.0-or-later
"""The gpu_server role's check of gpufleet_server_gate on the controller (filter gate_problems)."""
from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.filter.gate_problems import gate_problems

URL = "http://127.0.0.1:30000/generate"


def test_no_gate_and_a_good_gate_have_no_problem():
    assert gate_problems(None) == [] and gate_problems({}) == []
    assert gate_problems({"request": {"url": URL, "body": {"text": "x"}, "headers": {"Authorization": "Bearer t"}},
                          "concurrency": 8, "min_ratio": 0.8}) == []


def test_every_broken_rule_is_named_and_no_secret_shown():
    got = gate_problems({"request": {"url": "ftp://h/x", "body": "s3cr3tbody"}, "concurrency": 0,
                         "rounds": 0, "min_ratio": 1.5, "timeout": 0})
    text = "; ".join(got)
    for rule in ("concurrency must be >= 1, got 0", "rounds must be >= 1, got 0", "timeout must be greater than 0",
                 "min_ratio must be greater than 0 and at most 1, got 1.5", "request.url must be an http:// or https://"):
        assert "gpufleet_server_gate: " + rule in text, text
    assert all(x.startswith("gpufleet_server_gate: ") for x in got) and "s3cr3t" not in text
    got = gate_problems({"request": {"url": URL, "headers": {"X-Key": "s3cr3t\nvalue"}}})
    assert got == ["gpufleet_server_gate: request.headers: the value of X-Key contains a line break or a NUL byte"], got


def test_types_and_unknown_keys_are_refused_by_the_argument_spec():
    assert gate_problems("fast") == ["gpufleet_server_gate must be a dict of server_bench's options (got str)"]
    got = " ".join(gate_problems({"concurrency": 4}))
    assert "missing required arguments: request" in got, got
    got = " ".join(gate_problems({"request": {"url": URL}, "concurency": 4}))
    assert "concurency" in got, got
    got = " ".join(gate_problems({"request": {"url": URL}, "requests": "many"}))
    assert "requests" in got and "int" in got, got


def test_a_value_of_the_wrong_type_is_named_with_its_value():
    """issue 26: the validator's "<class '...'> cannot be converted to a float" said by name and value (in the
    gpu_server role its argument spec refuses such a value first: tests/reliability/test_rel_bad_input_server.py)."""
    got = gate_problems({"request": {"url": URL}, "min_ratio": "abc", "requests": "x", "rounds": 2})
    assert got == ['gpufleet_server_gate: requests must be an integer, got str "x"',
                   'gpufleet_server_gate: min_ratio must be a number, got str "abc"'], got
