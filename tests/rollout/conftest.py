# SPDX-License-Identifier: GPL-3.0-or-later
"""Fixtures of the rollout tests: one 3-host sandbox fleet per test file, reset between tests."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout_helpers import RolloutFleet  # noqa: E402


@pytest.fixture(scope="module")
def rf(sandbox_fleet_module, tmp_path_factory) -> RolloutFleet:
    """The module's fleet (3 hosts, 2 fake PCIe GPUs each) with the demo server definition."""
    fleet = sandbox_fleet_module(hosts=3, gpus=2)
    r = RolloutFleet(fleet, tmp_path_factory.mktemp("rollout"))
    yield r
    r.reset()


@pytest.fixture
def rolled_out(rf: RolloutFleet) -> RolloutFleet:
    """Every host runs the tagged, tuned demo server of the default definition (rolled out once).

    Reuses the previous test's fleet when that test left it so (rf.clean_rollout); a test that changes
    hosts leaves the flag False, so the next one starts from a fresh rollout.
    """
    if not rf.clean_rollout:
        rf.rolled_out()
    rf.clean_rollout = False
    return rf


@pytest.fixture
def stale(rf: RolloutFleet) -> RolloutFleet:
    """Every host runs an untagged, untuned demo server started by hand; no gpufleet state."""
    rf.clean_rollout = False
    rf.reset()
    rf.start_stale()
    return rf
