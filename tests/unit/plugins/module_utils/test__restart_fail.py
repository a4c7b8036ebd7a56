# SPDX-License-Identifier: GPL-3.0-or-later
"""server_restart's failure result: how many workers are verified after it (the rollout summary's count, read by the
gpu_server role's rescue). The real restarts that fail at each step are in tests/unit/plugins/modules and tests/rollout."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError
from ansible_collections.gpufleet.serving.plugins.module_utils._restart import fail_result

ENV = {"processes": [{"pid": 11}, {"pid": 12}]}


def test_a_failed_record_after_the_verify_counts_the_verified_workers():
    out = fail_result(dict(phase="record", killed=3, env=ENV), StepError("record failed"))
    assert out["phase"] == "record" and out["workers_verified"] == 2


@pytest.mark.parametrize("phase", ["launch", "ready", "busy", "verify_env", "clean"])
def test_a_failure_after_the_kill_leaves_no_verified_worker(phase):
    out = fail_result(dict(phase=phase, killed=2, env=ENV), StepError("x"))
    assert out["workers_verified"] == 0


def test_a_kill_that_failed_on_survivors_still_counts_as_past_the_kill():
    out = fail_result(dict(phase="kill"), StepError("survivors", processes=[{"pid": 5}, {"pid": 6}], survivors=[6]))
    assert out["phase"] == "kill" and out["killed"] == 1 and out["workers_verified"] == 0


@pytest.mark.parametrize("details", [dict(phase="preflight"), dict(phase="clean", before_kill=True)])
def test_a_restart_refused_before_its_kill_leaves_the_count_to_the_check(details):
    out = fail_result(dict(phase="preflight", killed=0), StepError("refused", **details))
    assert "workers_verified" not in out
