# SPDX-License-Identifier: GPL-3.0-or-later
"""The systemd launcher's unit files put back by a rollback (_systemd.put_back), on real files.

What systemctl says of a unit (_systemd.definition_files, environment_files) is read from a real systemd 252 in the
podman sandbox hosts: tests/reliability/test_rel_systemd.py (rows 107 and 108 of docs/reliability.md) keep a unit with
its own drop-in and environment file as a generation and check each comes back byte for byte. No systemctl output is
made up here: a canned one would only repeat what the parser assumes."""
from __future__ import annotations

import contextlib
import os
import stat
import uuid

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _systemd

UNIT = "gpufleet-sglang.service"


def test_put_back_restores_each_file_with_its_mode_writes_nothing_when_they_are_as_kept_and_leaves_no_temp(tmp_path):
    unit = tmp_path / UNIT
    envf = tmp_path / "sglang.env"
    kept = [{"path": str(unit), "mode": "0644", "content": "[Service]\nExecStart=/usr/bin/python3 -m sglang\n"},
            {"path": str(envf), "mode": "0600", "content": "HF_TOKEN=hf_secret\n"}]
    unit.write_text("[Service]\nExecStart=/usr/bin/python3 -m broken\n")  # the failed restart's unit; its env file gone
    assert _systemd.put_back(kept) == [str(unit), str(envf)]
    assert unit.read_text().endswith("-m sglang\n") and envf.read_text() == "HF_TOKEN=hf_secret\n"
    assert stat.S_IMODE(envf.stat().st_mode) == 0o600 and stat.S_IMODE(unit.stat().st_mode) == 0o644
    assert _systemd.put_back(kept) == []  # as they were: nothing written
    envf.chmod(0o644)  # the same content under a mode that shows the secret: written again, root-only
    assert _systemd.put_back(kept) == [str(envf)] and stat.S_IMODE(envf.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == sorted([UNIT, "sglang.env"])  # no temp file left


def test_only_the_dropins_the_failed_run_removed_are_put_back(tmp_path):
    """Found by the new-user passes (issue 26): a rollback rewrote a drop-in the operator had edited since the last known
    good (EXTRA=2 back to EXTRA=1), then brought back one the operator had deleted. Drop-ins are the operator's: only
    one the failed run removed (gpufleet_server_systemd_dropins remove) comes back."""
    d = tmp_path / (UNIT + ".d")
    d.mkdir()
    edited = d / "override.conf"
    edited.write_text("[Service]\nEnvironment=EXTRA=2\n")
    removed_by_run, deleted_by_hand = d / "10-removed.conf", d / "20-deleted.conf"
    kept = [{"path": str(edited), "mode": "0644", "content": "[Service]\nEnvironment=EXTRA=1\n"},
            {"path": str(removed_by_run), "mode": "0644", "content": "[Service]\nEnvironment=OTHER=1\n"},
            {"path": str(deleted_by_hand), "mode": "0644", "content": "[Service]\nEnvironment=GONE=1\n"}]
    assert _systemd.put_back(kept, dropins=[str(removed_by_run), str(edited)]) == [str(removed_by_run)]
    assert edited.read_text().endswith("EXTRA=2\n") and removed_by_run.read_text().endswith("OTHER=1\n")
    assert not deleted_by_hand.exists()


@contextlib.contextmanager
def _etc_dropin(dir_name: str, name: str, content: str):
    """A drop-in under /etc/systemd/system/DIR_NAME (where systemd reads it), removed with its directory after."""
    d = "/etc/systemd/system/%s" % dir_name
    try:
        os.makedirs(d)
    except PermissionError:
        pytest.skip("needs to write /etc/systemd/system")
    path = os.path.join(d, name)
    try:
        with open(path, "w") as f:
            f.write(content)
        yield path
    finally:
        for entry in os.listdir(d):
            os.unlink(os.path.join(d, entry))
        os.rmdir(d)


def test_dropins_made_before_the_unit_is_installed_are_found_on_disk():
    """Found by the new-user pass (issue 26): a drop-in made for the unit before the first rollout was not reported
    (systemd lists no DropInPaths for a unit it has not loaded), so gpufleet_server_systemd_dropins did not apply to it,
    and the next audit failed on it. Read where systemd will read it once the unit is installed."""
    unit = "gpufleet-ut-%s.service" % uuid.uuid4().hex[:8]
    with _etc_dropin(unit + ".d", "override.conf", "[Service]\nEnvironment=EXTRA=1\n") as path:
        assert _systemd.foreign_dropins({"LoadState": "not-found", "DropInPaths": ""}, unit) == [path]
        # A loaded unit: what systemd says is what applies.
        assert _systemd.foreign_dropins({"LoadState": "loaded", "DropInPaths": ""}, unit) == []


def test_a_removed_dropin_is_put_back_as_the_operator_had_it(tmp_path):
    """Found by the new-user pass (issue 26): with gpufleet_server_systemd_dropins remove, the rollback wrote back the
    last known good generation's copy of a drop-in (EXTRA=1) over the operator's edit (EXTRA=2), and lost one made
    since. The restart keeps what it removes (snapshot) and the rollback puts that back."""
    d = tmp_path / (UNIT + ".d")
    d.mkdir()
    edited, made_since = d / "override.conf", d / "zz-ops.conf"
    edited.write_text("[Service]\nEnvironment=EXTRA=2\n")
    made_since.write_text("[Service]\nEnvironment=ZZ=ops\n")
    made_since.chmod(0o600)
    kept = _systemd.snapshot([str(edited), str(made_since), str(d / "gone.conf")])
    assert [x["path"] for x in kept] == [str(edited), str(made_since)] and kept[1]["mode"] == "0600"
    edited.unlink()
    made_since.unlink()
    assert _systemd.put_back(kept, dropins=[x["path"] for x in kept]) == [str(edited), str(made_since)]
    assert edited.read_text().endswith("EXTRA=2\n") and made_since.read_text().endswith("ZZ=ops\n")
    assert stat.S_IMODE(made_since.stat().st_mode) == 0o600


def test_dropins_of_a_name_prefix_made_before_the_unit_is_installed_are_found():
    """Found by the new-user pass (issue 26): a gpufleet-.service.d/ drop-in (it applies to every gpufleet-*.service)
    went unreported on the first rollout of a service."""
    prefix = "gpufleetut%s-" % uuid.uuid4().hex[:6]
    with _etc_dropin(prefix + ".service.d", "pfx.conf", "[Service]\nEnvironment=PFX=1\n") as path:
        assert _systemd.foreign_dropins({"LoadState": "not-found", "DropInPaths": ""}, prefix + "demo3.service") == [path]
