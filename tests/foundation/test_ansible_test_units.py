# SPDX-License-Identifier: GPL-3.0-or-later
"""`ansible-test units` runs the unit tests from an installed copy of the collection (tests/run_units.py), with the
newest ansible-core where scripts/setup made .venv-core-newest (else .venv's 2.19): the suite's own pytest already runs
tests/unit on 2.19 in-process, so this run brings the newest core and the installed-copy layout, not a third run of the
same tests on the same core (it was one of the suite's longest).

ansible-test exits 0 when it collects nothing (it did, while the unit conftest imported a private copy made
with scripts/, which an installed copy does not have): this test counts the tests in ansible-test's junit
output and fails on none run or any failed.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT

NEWEST_PY = ROOT / ".venv-core-newest" / "bin" / "python"

pytestmark = pytest.mark.slow


def _env(python: str) -> dict:
    """The newest venv's tools first on PATH, without what this pytest run set for .venv's (as test_core_newest)."""
    if python == sys.executable:
        return dict(os.environ)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANSIBLE_", "PYTEST_")) and k not in ("PYTHONPATH", "FAKE_NVML_CONFIG")}
    env["PATH"] = str(NEWEST_PY.parent) + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    return env


def test_ansible_test_units_runs_every_unit_test_and_all_pass():
    python = str(NEWEST_PY) if NEWEST_PY.exists() else sys.executable
    r = subprocess.run([python, str(ROOT / "tests" / "run_units.py")], cwd=str(ROOT), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=900, check=False, env=_env(python))
    m = re.search(r"^UNITS: (\d+) passed, (\d+) failed, (\d+) errors, (\d+) skipped$", r.stdout, re.M)
    assert m, r.stdout[-6000:]
    passed, failed, errors, _skipped = (int(x) for x in m.groups())
    assert r.returncode == 0 and failed == 0 and errors == 0, r.stdout[-6000:]
    # Every test function in tests/unit is a test ansible-test must have run (parametrized ones run several times).
    defined = sum(len(re.findall(r"^def test_", p.read_text(), re.M)) for p in (ROOT / "tests" / "unit").rglob("test_*.py"))
    assert defined > 100 and passed >= defined, (passed, defined)
