# SPDX-License-Identifier: GPL-3.0-or-later
"""The module integration targets (tests/integration/targets) run for real with `ansible-test integration --local`
(tests/run_integration.py), each against this machine with the fake NVML; every target must have run and passed."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

pytestmark = pytest.mark.slow
TARGETS = sorted(p.name for p in (ROOT / "tests" / "integration" / "targets").iterdir()
                 if p.is_dir() and "hidden" not in (p / "aliases").read_text().split())


def test_every_module_target_runs_and_passes():
    # Every module has its target (a new module without one fails here).
    modules = {p.stem for p in (ROOT / "plugins" / "modules").glob("*.py") if not p.name.startswith("_")}
    assert modules and modules <= set(TARGETS), sorted(modules - set(TARGETS))
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "run_integration.py")], cwd=str(ROOT), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=900, check=False)
    assert r.returncode == 0, r.stdout[-8000:]
    ran = re.findall(r"^Running (\S+) integration test role$", r.stdout, re.M)
    assert sorted(ran) == TARGETS, r.stdout[-8000:]
    recaps = re.findall(r"^testhost\s+: ok=(\d+) .*failed=(\d+)", r.stdout, re.M)
    assert len(recaps) == len(TARGETS) and all(int(ok) > 3 and failed == "0" for ok, failed in recaps), recaps
    # Every process a target started is gone: the demo servers, their workers, the clients and GPU holders all name
    # the copy under test on their command line or in their environment (the fake NVML's paths). The copy is this
    # run's (run_integration.py locks it for the run).
    copy = re.search(r"^\+ \(cd (\S+) && ", r.stdout, re.M).group(1)
    assert _left_behind(copy.encode()) == []


def _left_behind(path: bytes) -> list:
    left = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            environ = (d / "environ").read_bytes()
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if path in environ or path in cmdline:
            left.append((int(d.name), cmdline.decode("utf-8", "replace")[:200]))
    return left
