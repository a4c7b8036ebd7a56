# SPDX-License-Identifier: GPL-3.0-or-later
"""The fast tier (`pytest -m fast`, CONTRIBUTING.md) holds every unit test and only tests that run no playbook."""
from __future__ import annotations

import subprocess
import sys

from helpers import ROOT


def collected(*args: str) -> set:
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                       cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-4000:]
    return {ln for ln in r.stdout.splitlines() if "::" in ln}


def test_the_fast_tier_is_every_unit_test_plus_marked_pure_tests():
    fast, unit = collected("-m", "fast"), collected("tests/unit")
    assert len(unit) > 100 and unit <= fast, sorted(unit - fast)[:10]
    others = {t.split("::")[0] for t in fast - unit}
    # Outside tests/unit only modules marked fast themselves (pure: they read files).
    for path in others:
        assert "pytestmark = pytest.mark.fast" in (ROOT / path).read_text(), path
    assert not any(p.startswith(("tests/rollout", "tests/reliability", "tests/sandbox", "tests/molecule")) for p in others)
