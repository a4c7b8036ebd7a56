# SPDX-License-Identifier: GPL-3.0-or-later
"""`ansible-test sanity` on a copy of the collection laid out as ansible_collections/gpufleet/serving.

Runs offline through tests/run_sanity.py (get-pip stand-in, cached venvs). ~2-4 min cold, less warm.
This is .venv's ansible-core (2.19); test_core_newest.py runs it with the newest core.
Fix the plugin rather than the ignore list; a line there (community.docker's way) says why after `#`.
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import ROOT


def test_every_ignore_line_says_why():
    assert (ROOT / "tests" / "sanity" / "ignore-2.19.txt").exists()
    for path in sorted((ROOT / "tests" / "sanity").glob("ignore-*.txt")):
        for ln in path.read_text().splitlines():
            assert re.fullmatch(r"\S+ \S+ +# \S.{20,}", ln), "%s: `PATH TEST[:CODE]  # reason` expected, got %r" % (path.name, ln)


@pytest.mark.slow
def test_ansible_test_sanity_passes():
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "run_sanity.py")], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=1500, check=False)
    errors = [ln for ln in r.stdout.splitlines() if ln.startswith(("ERROR:", "FATAL:"))]
    assert r.returncode == 0, "\n".join(errors) or r.stdout[-6000:]
    assert "Running sanity test \"validate-modules\"" in r.stdout and "Running sanity test \"pylint\"" in r.stdout
