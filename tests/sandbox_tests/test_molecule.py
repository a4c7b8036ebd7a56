# SPDX-License-Identifier: GPL-3.0-or-later
"""`molecule test -s default` on the sandbox fleet: create, converge, idempotence, check, verify, destroy."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.fixtures import skip_reason

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent.parent
VENV_BIN = Path(sys.executable).parent


def _netns() -> set:
    try:
        return set(os.listdir("/run/netns"))
    except OSError:
        return set()


def test_molecule_default_scenario_passes_and_leaves_no_fleet_behind():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    if not (VENV_BIN / "molecule").exists():
        pytest.skip("molecule is not installed in this venv (./scripts/setup installs it)")
    before = _netns()
    env = dict(os.environ, PATH="%s%s%s" % (VENV_BIN, os.pathsep, os.environ.get("PATH", "")),
               NO_COLOR="1", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", PY_COLORS="0")
    env.pop("ANSIBLE_CONFIG", None)
    p = subprocess.run([str(VENV_BIN / "molecule"), "test", "-s", "default"], cwd=str(ROOT), env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-6000:]
    for step in ("create", "converge", "idempotence", "check", "verify", "destroy"):
        assert re.search(r"^default (>|➜) %s: Executed: Successful$" % step, p.stdout, re.M), p.stdout[-6000:]
    assert _netns() <= before, "molecule's destroy left network namespaces: %s" % (_netns() - before)
