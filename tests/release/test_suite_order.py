# SPDX-License-Identifier: GPL-3.0-or-later
"""scripts/test runs test files in parallel (pytest-xdist, one file per unit of work) in the order tests/conftest.py
gives: a renamed or removed long file must not silently drop out of that order and start last."""
from __future__ import annotations

import ast

from helpers import ROOT


def _longest_first() -> list:
    # Read, not imported: several conftest.py files share the module name.
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    [node] = [n for n in tree.body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "LONGEST_FIRST"]
    return ast.literal_eval(node.value)


def test_every_file_named_longest_first_exists_once():
    files = _longest_first()
    assert files and len(set(files)) == len(files)
    missing = [f for f in files if not (ROOT / f).is_file()]
    assert missing == []


def test_scripts_test_hands_out_whole_files():
    # Module-scoped sandbox fleets are made once per file only when a file stays on one worker.
    text = (ROOT / "scripts" / "test").read_text()
    assert "--dist loadfile" in text
