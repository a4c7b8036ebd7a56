# SPDX-License-Identifier: GPL-3.0-or-later
"""The layer-sharing cases (layershare_cases.py) in a pid namespace of their own, with its own /proc.

The layer check reads every process of the host for another gpufleet service's launch tag. In the root pid namespace
it also sees the other tests' tagged servers and the sandbox hosts' (each host's pid namespace is a child of this one,
so its processes show here), and those are other services to it: the cases would pass or fail with whatever else runs
on the machine. In a new pid namespace the processes a case starts are the only ones there are.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("layershare_cases.py")


def test_the_layer_sharing_cases_pass_in_a_pid_namespace_of_their_own():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a pid namespace of its own")
    # The child imports what this process imports (the private collection copy, the fake NVML) from the same paths.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), PYTHONDONTWRITEBYTECODE="1")
    cp = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "pytest", "-q",
                         "-p", "no:cacheprovider", str(CASES)],
                        capture_output=True, text=True, timeout=600, env=env, check=False)
    out = cp.stdout + cp.stderr
    assert cp.returncode == 0, out[-6000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 10 and "skipped" not in out, out[-3000:]
