# SPDX-License-Identifier: GPL-3.0-or-later
"""server_restart's failure result: how many workers are verified after it (the rollout summary's count, read by the
gpu_server role's rescue), and after a rollback whether the NCCL layers differ from before the run (its nccl_changed).
The real restarts that fail at each step are in tests/unit/plugins/modules and tests/rollout."""
from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _envblock
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step
from ansible_collections.gpufleet.serving.plugins.module_utils._restart import (
    drop_layers_snapshot, fail_result, restore_layers_for_rollback)

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


# -- after a rollback: do the NCCL layers differ from before the run? (the summary's nccl_changed) --------------------

class _Files:
    """FileOps over the real filesystem: what AnsibleModule's atomic_move does for a layer file, without a module."""

    def backup_local(self, fn):
        raise AssertionError("no backup asked for")

    def atomic_move(self, src, dest, unsafe_writes=False, keep_dest_attrs=True):
        os.replace(src, dest)


def _write_through_snapshot(tmp_path, writes):
    """This run's writes of layer files, each kept first in one real _envblock.Previous snapshot (as nccl_layers does)."""
    snap = str(tmp_path / "layers-previous.json")
    files = _envblock.Previous(_Files(), snap)
    for path, data in writes:
        tmp = str(path) + ".new"
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        files.atomic_move(tmp, str(path))
    return snap


def _call(path, check_mode=False):
    """The (params, step) a restart's steps take (Step.of(module) in the module)."""
    return {"layers_previous": path}, Step(check_mode=check_mode, warn=lambda msg: None)


def test_a_rollback_first_undoes_what_the_run_wrote_to_the_layers_a_created_file_included(tmp_path):
    layer, created = tmp_path / "sitecustomize.py", tmp_path / "nccl.conf"
    layer.write_bytes(b"A\n")
    layer.chmod(0o644)
    snap = _write_through_snapshot(tmp_path, [(layer, b"B\n"), (created, b"NCCL_ALGO=Tree\n")])
    assert layer.read_bytes() == b"B\n" and created.exists()
    # A generation without layers of its own: the undo alone, so the layers are as before the run.
    assert restore_layers_for_rollback(*_call(snap), {"layers": None}) is False
    assert layer.read_bytes() == b"A\n" and not created.exists() and not os.path.exists(snap)


def test_without_a_snapshot_a_generation_without_layers_changes_nothing(tmp_path):
    layer = tmp_path / "sitecustomize.py"
    layer.write_bytes(b"B\n")
    assert restore_layers_for_rollback(*_call(None), {"layers": None}) is False
    assert layer.read_bytes() == b"B\n"


def test_an_unreadable_snapshot_fails_the_rollback_rather_than_guess(tmp_path):
    snap = tmp_path / "layers-previous.json"
    snap.write_text("not json")
    with pytest.raises(StepError, match="is not a snapshot of the NCCL layers"):
        restore_layers_for_rollback(*_call(str(snap)), {"layers": None})


def test_a_restart_that_passed_removes_the_snapshot_but_not_in_check_mode(tmp_path):
    snap = tmp_path / "layers-previous.json"
    snap.write_text("{}")
    drop_layers_snapshot(*_call(str(snap), check_mode=True))
    assert snap.exists()
    drop_layers_snapshot(*_call(str(snap)))
    assert not snap.exists()
    drop_layers_snapshot(*_call(str(snap)))  # already gone: nothing to say
    drop_layers_snapshot(*_call(None))
