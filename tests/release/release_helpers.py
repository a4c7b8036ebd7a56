# SPDX-License-Identifier: GPL-3.0-or-later
"""Helpers of the release tests: a private collection copy, a clean environment, CLI runs."""
from __future__ import annotations

import os
import subprocess
import sys
import typing as t
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def clean_env(**extra: str) -> t.Dict[str, str]:
    """os.environ without ANSIBLE_* (other conftests set ANSIBLE_COLLECTIONS_PATH), venv bin first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k not in ("FAKE_NVML_CONFIG", "PYTHONPATH")}
    env["PATH"] = str(BIN) + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["NO_COLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    env.update(extra)
    return env


def private_collection(base: Path) -> Path:
    """Copy the checkout to BASE/ansible_collections/gpufleet/serving (scripts/install-collection); returns BASE."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "install-collection"), str(base)], check=True,
                   stdout=subprocess.DEVNULL)
    return base


def run(argv: t.Sequence[str], cwd: t.Union[str, Path] = ROOT, env: t.Optional[t.Dict[str, str]] = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(check=False, args=list(argv), cwd=str(cwd), env=env if env is not None else clean_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
