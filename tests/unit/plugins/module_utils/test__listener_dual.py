# SPDX-License-Identifier: GPL-3.0-or-later
"""listener_dual_cases.py in a mount namespace of its own whose /etc/hosts names `gpufleet-dual` as ::1 and 127.0.0.1
(Ubuntu's `localhost`): the cases need a host name with two addresses, which this machine's /etc/hosts may not have,
and must not change it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("listener_dual_cases.py")


def test_the_two_address_cases_pass_with_a_hosts_file_of_their_own(tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a mount namespace of its own")
    hosts = tmp_path / "hosts"
    hosts.write_text("::1\tgpufleet-dual\n127.0.0.1\tgpufleet-dual\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), PYTHONDONTWRITEBYTECODE="1")
    script = 'mount --bind "$1" /etc/hosts && shift && exec "$@"'
    cp = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(hosts),
                         sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
                        capture_output=True, text=True, timeout=600, env=env, check=False)
    out = cp.stdout + cp.stderr
    assert cp.returncode == 0, out[-6000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) == 4 and "skipped" not in out, out[-3000:]
