# SPDX-License-Identifier: GPL-3.0-or-later
"""failure_text: why a task failed, whole; the rollout summary's failure column is the same text, cut to fit."""
from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.callback.rollout_summary import failure_text as column
from ansible_collections.gpufleet.serving.plugins.filter.failure_text import FilterModule

F = FilterModule().filters()["failure_text"]


def test_a_loops_failure_is_each_failed_items_message():
    res = {"msg": "One or more items failed", "results": [
        {"failed": False, "msg": "fine"}, {"failed": True, "msg": "haproxy lb: cannot read /run/haproxy.sock"},
        {"failed": True}]}
    assert F(res) == "haproxy lb: cannot read /run/haproxy.sock; failed"
    assert column(res) == F(res)


def test_a_commands_stderr_and_what_a_module_printed_are_kept():
    assert F({"msg": "non-zero return code", "stderr": "Failed to enable unit: Unit x.service not found.\n"}) == (
        "non-zero return code: Failed to enable unit: Unit x.service not found.")
    res = {"msg": "MODULE FAILURE\nSee stdout/stderr for the exact error", "module_stderr": "sudo: a password is required\n"}
    assert F(res) == "MODULE FAILURE\nSee stdout/stderr for the exact error: sudo: a password is required"
    # The summary's column: the same text on one line.
    assert column(res) == "MODULE FAILURE See stdout/stderr for the exact error: sudo: a password is required"


def test_a_plain_failure_and_no_result():
    assert F({"msg": "cannot run this server, nothing was stopped: x"}) == "cannot run this server, nothing was stopped: x"
    assert F({}) == "failed" and F(None) == "failed"
