# SPDX-License-Identifier: GPL-3.0-or-later
"""Fixtures of the NCCL tuning tests (real interpreters laid out in the test's own directory)."""
from __future__ import annotations

import os

import pytest

from nccl_helpers import SysPython, base_python


@pytest.fixture(scope="session")
def _base_python():
    return base_python()


@pytest.fixture
def syspy(tmp_path, _base_python):
    return SysPython(tmp_path / "prefix", *_base_python)


@pytest.fixture
def syspy_nolink(tmp_path, _base_python):
    return SysPython(tmp_path / "prefix", *_base_python, with_link=False)


@pytest.fixture(autouse=True)
def _no_nccl_in_env(monkeypatch):
    # The tests start servers and interpreters whose NCCL variables must come only from what they test.
    for k in list(os.environ):
        if k.startswith("NCCL_"):
            monkeypatch.delenv(k)
