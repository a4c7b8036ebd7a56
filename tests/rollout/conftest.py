# SPDX-License-Identifier: GPL-3.0-or-later
"""Fixtures of the rollout tests: one 3-host sandbox fleet per test file, reset between tests (rf); the drain tests' 4-host
fleet behind a real HAProxy and smg (df)."""
from __future__ import annotations

import sys
import typing as t
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import drain_helpers  # noqa: E402
from drain_helpers import DrainFleet, skip_reason  # noqa: E402
from rollout_helpers import RolloutFleet  # noqa: E402


@pytest.fixture(scope="module")
def rf(sandbox_fleet_module, tmp_path_factory) -> RolloutFleet:
    """The module's fleet (3 hosts, 2 fake PCIe GPUs each) with the demo server definition."""
    fleet = sandbox_fleet_module(hosts=3, gpus=2)
    r = RolloutFleet(fleet, tmp_path_factory.mktemp("rollout"))
    yield r
    r.reset()


@pytest.fixture
def rolled_out(rf: RolloutFleet):
    """`rolled_out(*accepted)`: make sure the fleet is in one of the accepted states, else roll out afresh.

    States (rf.state) a test leaves behind, so the next test can often start without a new rollout:
    "clean" = every host runs the tagged, tuned server of the default definition; tests set others
    ("host2-override", "host2-down", ...) or leave "unknown" when they fail half-way.
    """
    def need(*accepted: str) -> RolloutFleet:
        if rf.state not in (accepted or ("clean",)):
            rf.rolled_out()
        rf.state = "unknown"  # until the test says what it left
        return rf

    return need


@pytest.fixture
def stale(rf: RolloutFleet) -> RolloutFleet:
    """Every host runs an untagged, untuned demo server started by hand; no gpufleet state."""
    rf.state = "unknown"
    rf.reset()
    rf.start_stale()
    return rf


@pytest.fixture(scope="module")
def df(sandbox_fleet_module, tmp_path_factory) -> t.Iterator[DrainFleet]:
    """The drain tests' fleet (test_drain.py, test_drain_recovery.py: one each): 4 hosts behind a real HAProxy and smg."""
    why = skip_reason()
    if why:
        pytest.skip(why)
    fleet = sandbox_fleet_module(hosts=drain_helpers.HOSTS, gpus=2)
    d = DrainFleet(fleet, tmp_path_factory.mktemp("drain"))
    d.reset()
    d.start_stale()
    try:
        d.haproxy.up()
        d.smg.up()
        d.all_in_rotation()
        yield d
    finally:
        d.haproxy.down()
        d.smg.down()
        d.reset()
