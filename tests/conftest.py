# SPDX-License-Identifier: GPL-3.0-or-later
"""Shared test harness.

- The collection is copied (not symlinked) into collections/ansible_collections/gpufleet/serving
  once per session, so playbooks run by FQCN exercise the current checkout.
- `fake_gpus` writes a config for the test-only fake pynvml (tests/fakes/nvml) and returns the
  environment that puts it first on a target interpreter's path.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from helpers import FakeGpus, install_collection  # noqa: E402

pytest_plugins = ["sandbox.fixtures"]  # sandbox_fleet / sandbox_fleet_module (tests/sandbox/fixtures.py)


@pytest.fixture(scope="session", autouse=True)
def installed_collection() -> Path:
    return install_collection()


@pytest.fixture
def fake_gpus(tmp_path):
    """Two fake PCIe-only H200s; tests may call .configure(...) to change them."""
    fg = FakeGpus(tmp_path / "nvml")
    fg.configure(gpus=2)
    yield fg
    fg.cleanup()
