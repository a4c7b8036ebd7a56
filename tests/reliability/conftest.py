# SPDX-License-Identifier: GPL-3.0-or-later
"""Fault, bad-input and security suite (issue 8). Every test carries a `reliability` marker:

    @pytest.mark.reliability(section="fault", case="...", provoked="...", outcome="...")

tests/reliability/gen_table.py turns the markers into the table of docs/reliability.md, and
test_rel_table.py fails when the two differ.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
for p in (HERE, ROOT / "tests" / "unit", ROOT / "tools"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from collection_copy import use_private_collections  # noqa: E402

# Imports and ansible runs use a private copy of the collection that no concurrent pytest rewrites.
use_private_collections()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "reliability(section, case, provoked, outcome): one row of docs/reliability.md (tests/reliability/gen_table.py)")
