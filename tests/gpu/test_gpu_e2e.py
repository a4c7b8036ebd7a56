# SPDX-License-Identifier: GPL-3.0-or-later
"""The real-GPU end-to-end run (tests/gpu/e2e.py) as a test; skipped, with the reason, without a real GPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gpu_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (writes the system sitecustomize.py and kills GPU processes)"
    probe = ("import pynvml, torch; pynvml.nvmlInit(); n = pynvml.nvmlDeviceGetCount(); "
             "assert n > 0 and torch.cuda.is_available(); print(n)")
    # A clean environment: the tests' fake pynvml must not answer for a real GPU.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FAKE_NVML_CONFIG")}
    r = subprocess.run([sys.executable, "-c", probe], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
    if r.returncode != 0:
        return "no real NVIDIA GPU with torch here (%s)" % (r.stderr.strip().splitlines() or ["?"])[-1][:160]
    return None


@pytest.mark.gpu
def test_h200_end_to_end(tmp_path):
    reason = _gpu_reason()
    if reason:
        pytest.skip(reason)
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu" / "e2e.py"), "--out", str(tmp_path)],
                       cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800, check=False)
    ev = json.loads((tmp_path / "e2e.json").read_text())
    assert ev["checks"]["every_spawn_worker_tuned"], ev["workers"]
    assert ev["checks"]["nccl_nothing_contradicted"], ev["nccl_verdict"]
    assert ev["checks"]["sitecustomize_restored_byte_for_byte"]
    assert r.returncode == 0 and ev["ok"], r.stdout[-4000:]
