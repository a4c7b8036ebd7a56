# SPDX-License-Identifier: GPL-3.0-or-later
"""docs/reliability.md lists exactly the reliability tests: its table is what gen_table.py generates from them."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_reliability_doc_table_matches_the_tests():
    r = subprocess.run([sys.executable, str(HERE / "gen_table.py"), "--check"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=300, check=False)
    assert r.returncode == 0, "docs/reliability.md is out of date with tests/reliability:\n%s\n%s" % (r.stdout, r.stderr[-3000:])
