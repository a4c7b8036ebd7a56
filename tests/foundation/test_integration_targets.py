# SPDX-License-Identifier: GPL-3.0-or-later
"""The module integration targets (tests/integration/targets) run for real with `ansible-test integration --local`
(tests/run_integration.py), each against this machine with the fake NVML; every target must have run and passed."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import ROOT

pytestmark = pytest.mark.slow
TARGETS = sorted(p.name for p in (ROOT / "tests" / "integration" / "targets").iterdir()
                 if p.is_dir() and "hidden" not in (p / "aliases").read_text().split())


def test_every_module_target_runs_and_passes():
    assert {"gpu_info", "gpu_wait", "process_kill", "process_env", "nccl_conf", "sitecustomize_env"} <= set(TARGETS)
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "run_integration.py")], cwd=str(ROOT), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=900, check=False)
    assert r.returncode == 0, r.stdout[-8000:]
    ran = re.findall(r"^Running (\S+) integration test role$", r.stdout, re.M)
    assert sorted(ran) == TARGETS, r.stdout[-8000:]
    recaps = re.findall(r"^testhost\s+: ok=(\d+) .*failed=(\d+)", r.stdout, re.M)
    assert len(recaps) == len(TARGETS) and all(int(ok) > 3 and failed == "0" for ok, failed in recaps), recaps
