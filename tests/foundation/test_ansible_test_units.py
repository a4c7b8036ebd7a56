# SPDX-License-Identifier: GPL-3.0-or-later
"""`ansible-test units` runs the unit tests from an installed copy of the collection (tests/run_units.py).

ansible-test exits 0 when it collects nothing (it did, while the unit conftest imported a private copy made
with scripts/, which an installed copy does not have): this test counts the tests in ansible-test's junit
output and fails on none run or any failed.
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import ROOT

pytestmark = pytest.mark.slow


def test_ansible_test_units_runs_every_unit_test_and_all_pass():
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "run_units.py")], cwd=str(ROOT), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=900, check=False)
    m = re.search(r"^UNITS: (\d+) passed, (\d+) failed, (\d+) errors, (\d+) skipped$", r.stdout, re.M)
    assert m, r.stdout[-6000:]
    passed, failed, errors, _skipped = (int(x) for x in m.groups())
    assert r.returncode == 0 and failed == 0 and errors == 0, r.stdout[-6000:]
    # Every test function in tests/unit is a test ansible-test must have run (parametrized ones run several times).
    defined = sum(len(re.findall(r"^def test_", p.read_text(), re.M)) for p in (ROOT / "tests" / "unit").rglob("test_*.py"))
    assert defined > 100 and passed >= defined, (passed, defined)
