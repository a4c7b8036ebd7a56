# SPDX-License-Identifier: GPL-3.0-or-later
"""The server_state action's refusal of a host lock under an independent strategy (a real play: tests/reliability)."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.action.server_state import independent_strategy, strategy_refusal


@pytest.mark.parametrize("name, independent", [
    ("free", True), ("ansible.builtin.free", True), ("host_pinned", True), ("mitogen_free", True),
    ("linear", False), ("ansible.builtin.linear", False), (None, False), ("", False),
])
def test_independent_strategy(name, independent):
    assert independent_strategy(name) is independent


@pytest.mark.parametrize("task_vars", [{}, {"gpufleet_nccl_changed": False}, {"gpufleet_nccl_changed": "False"}])
def test_refusal_says_nothing_was_changed_when_no_layer_was_written(task_vars):
    msg = strategy_refusal("free", task_vars)
    assert "under the play's strategy free" in msg
    assert "nothing was changed on this host" in msg
    assert "Set 'strategy: linear' on the play" in msg


@pytest.mark.parametrize("changed", [True, "True", "true"])
def test_refusal_owns_up_to_layers_written_earlier_in_the_run(changed):
    # The nccl_tuning role run for no service takes no lock: its writes came before this refusal.
    msg = strategy_refusal("host_pinned", {"gpufleet_nccl_changed": changed})
    assert "nothing was changed on this host" not in msg
    assert "NCCL layers were changed earlier in this run" in msg
