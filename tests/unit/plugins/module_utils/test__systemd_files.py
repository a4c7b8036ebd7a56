# SPDX-License-Identifier: GPL-3.0-or-later
"""The systemd launcher's unit files put back by a rollback (_systemd.put_back), on real files.

What systemctl says of a unit (_systemd.definition_files, environment_files) is read from a real systemd 252 in the
podman sandbox hosts: tests/reliability/test_rel_systemd.py (rows 107 and 108 of docs/reliability.md) keep a unit with
its own drop-in and environment file as a generation and check each comes back byte for byte. No systemctl output is
made up here: a canned one would only repeat what the parser assumes."""
from __future__ import annotations

import os
import stat

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
