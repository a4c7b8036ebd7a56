# SPDX-License-Identifier: GPL-3.0-or-later
"""The systemd launcher's unit files kept for a last known good generation and put back by a rollback
(_systemd.definition_files, environment_files, put_back): what systemctl says is parsed, real files are written."""
from __future__ import annotations

import os
import stat
import typing as t

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _systemd

UNIT = "gpufleet-sglang.service"


def runner(tmp: t.Any, env_files: t.Sequence[str], dropins: t.Sequence[str], fragment: str) -> _systemd.Runner:
    """systemctl show as systemd 252 prints it (one EnvironmentFiles= line per file)."""
    def run(argv: t.List[str]) -> t.Tuple[int, str, str]:
        assert argv[:2] == ["systemctl", "show"] and argv[-1] == UNIT, argv
        if argv[2] == "--property=EnvironmentFiles":
            return 0, "".join("EnvironmentFiles=%s (ignore_errors=%s)\n" % (e, "yes" if e.startswith("-") else "no")
                              for e in env_files), ""
        return 0, "LoadState=loaded\nFragmentPath=%s\nDropInPaths=%s\nMainPID=42\n" % (fragment, " ".join(dropins)), ""
    return run


def test_environment_files_one_line_each_the_optional_dash_dropped():
    run = runner(None, ["/etc/gpufleet/sglang.env", "-/etc/default/sglang"], [], "/etc/systemd/system/" + UNIT)
    assert _systemd.environment_files(run, UNIT) == ["/etc/gpufleet/sglang.env", "/etc/default/sglang"]
    assert _systemd.environment_files(runner(None, [], [], "/x"), UNIT) == []


def test_definition_files_are_the_unit_its_own_dropins_and_env_files_and_put_back_restores_them(tmp_path, monkeypatch):
    unit = tmp_path / UNIT
    unit.write_text("[Service]\nExecStart=/usr/bin/python3 -m sglang\n")
    envf = tmp_path / "sglang.env"
    envf.write_text("HF_TOKEN=hf_secret\n")
    envf.chmod(0o600)
    own = "/etc/systemd/system/%s.d/override.conf" % UNIT
    # The drop-in directories under /etc are the real ones: a drop-in path is read where systemd says it is; this test
    # reads and writes only under tmp_path, so the unit's own drop-in is named by systemd but redirected here.
    shared = "/etc/systemd/system/service.d/10-host.conf"
    real_open = open

    def redirect(path: t.Any) -> t.Any:
        return str(tmp_path / "dropin.conf") if str(path).startswith(own) else path

    (tmp_path / "dropin.conf").write_text("[Service]\nEnvironment=EXTRA=1\n")
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(redirect(p), *a, **k))
    run = runner(tmp_path, [str(envf)], [own, shared], str(unit))
    files = _systemd.definition_files(run, UNIT)
    assert [f["path"] for f in files] == [str(unit), own, str(envf)]  # the type-wide drop-in is the host's
    assert files[2] == {"path": str(envf), "mode": "0600", "content": "HF_TOKEN=hf_secret\n"}
    monkeypatch.setattr("builtins.open", real_open)

    kept = [f for f in files if f["path"] != own]
    unit.write_text("[Service]\nExecStart=/usr/bin/python3 -m broken\n")
    envf.unlink()
    assert _systemd.put_back(kept) == [str(unit), str(envf)]
    assert unit.read_text().endswith("-m sglang\n") and envf.read_text() == "HF_TOKEN=hf_secret\n"
    assert stat.S_IMODE(envf.stat().st_mode) == 0o600
    assert _systemd.put_back(kept) == []  # as they were: nothing written
    assert sorted(os.listdir(tmp_path)) == sorted(["dropin.conf", UNIT, "sglang.env"])  # no temp file left


def test_a_unit_not_loaded_from_a_file_has_no_definition_files(tmp_path):
    run = runner(tmp_path, [], [], "")
    with pytest.raises(_systemd.SystemdError, match="not loaded from a unit file"):
        _systemd.definition_files(run, UNIT)
