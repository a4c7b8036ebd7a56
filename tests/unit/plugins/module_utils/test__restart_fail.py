# SPDX-License-Identifier: GPL-3.0-or-later
"""server_restart's failure result: how many workers are verified after it (the rollout summary's count, read by the
gpu_server role's rescue), and after a rollback whether the NCCL layers differ from before the run (its nccl_changed).
The real restarts that fail at each step are in tests/unit/plugins/modules and tests/rollout."""
from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _envblock
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError
from ansible_collections.gpufleet.serving.plugins.module_utils._restart import (
    drop_layers_snapshot, fail_result, layers_differ_from_before_run)

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


def _write_through_snapshot(tmp_path, path, data):
    """This run's write of a layer file, kept first in a real _envblock.Previous snapshot (as nccl_layers does)."""
    snap = str(tmp_path / "layers-previous.json")
    files = _envblock.Previous(_Files(), snap)
    tmp = str(path) + ".new"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    files.atomic_move(tmp, str(path))
    return snap


def test_a_rollback_that_put_back_what_the_run_replaced_leaves_the_layers_as_before(tmp_path):
    layer = tmp_path / "sitecustomize.py"
    layer.write_bytes(b"A\n")
    layer.chmod(0o644)
    snap = _write_through_snapshot(tmp_path, layer, b"B\n")
    assert layer.read_bytes() == b"B\n"
    layer.write_bytes(b"A\n")  # the rollback put the generation's layer back: the same bytes as before the run
    assert layers_differ_from_before_run(snap, rollback_changed=True) is False
    assert os.path.exists(snap)  # only read: removing it is drop_layers_snapshot's


def test_a_rollback_to_other_layers_than_before_the_run_changed_them(tmp_path):
    layer = tmp_path / "sitecustomize.py"
    layer.write_bytes(b"A\n")
    layer.chmod(0o644)
    snap = _write_through_snapshot(tmp_path, layer, b"B\n")
    layer.write_bytes(b"C\n")  # the generation's layer is neither
    assert layers_differ_from_before_run(snap, rollback_changed=True) is True


@pytest.mark.parametrize("rollback_changed", [True, False])
def test_without_a_snapshot_only_the_rollback_can_have_changed_the_layers(rollback_changed):
    assert layers_differ_from_before_run(None, rollback_changed) is rollback_changed


def test_an_unreadable_snapshot_is_not_taken_for_unchanged_layers(tmp_path):
    snap = tmp_path / "layers-previous.json"
    snap.write_text("not json")
    assert layers_differ_from_before_run(str(snap), rollback_changed=True) is True


class _Module:
    def __init__(self, path, check_mode=False):
        self.params = {"layers_previous": path}
        self.check_mode = check_mode
        self.warnings = []

    def warn(self, msg):
        self.warnings.append(msg)


def test_a_restart_that_passed_removes_the_snapshot_but_not_in_check_mode(tmp_path):
    snap = tmp_path / "layers-previous.json"
    snap.write_text("{}")
    drop_layers_snapshot(_Module(str(snap), check_mode=True))
    assert snap.exists()
    drop_layers_snapshot(_Module(str(snap)))
    assert not snap.exists()
    drop_layers_snapshot(_Module(str(snap)))  # already gone: nothing to say
    drop_layers_snapshot(_Module(None))
