# SPDX-License-Identifier: GPL-3.0-or-later
"""The README's and the quickstart's main command: the demo (./scripts/demo runs tools/demo.py after
./scripts/setup). A real run on a 3-host sandbox fleet: audit fails, the rollout restarts every host,
a second rollout restarts nothing, the audit passes, the fleet is torn down."""
from __future__ import annotations

import re
import sys

import pytest

from release_helpers import ROOT, clean_env, run

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]


def test_demo():
    from sandbox.fixtures import skip_reason

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    r = run([sys.executable, str(ROOT / "tools" / "demo.py")], env=clean_env(), timeout=540)
    out = r.stdout
    assert r.returncode == 0, out[-6000:]
    assert out.rstrip().endswith("demo OK"), out[-2000:]
    steps = re.findall(r"^==> (.*)$", out, re.M)
    assert [s.split(":")[0].split(" (")[0] for s in steps] == [
        "Bring up 3 sandbox hosts", "Start a stale, untuned server on every host by hand", "Audit",
        "Rollout", "Rollout again", "Audit again", "Tear the fleet down"], steps
    summaries = re.findall(r"^### gpufleet (\w+): (OK|FAILED) \(rc (\d+)\)$", out, re.M)
    assert summaries == [("audit", "FAILED", "2"), ("rollout", "OK", "0"), ("rollout", "OK", "0"), ("audit", "OK", "0")], summaries
    tables = re.split(r"^### gpufleet ", out, flags=re.M)[1:]
    rows = [[[c.strip() for c in ln.split("|")[1:-1]] for ln in tb.splitlines() if re.match(r"^\| host\d ", ln)] for tb in tables]
    first, second = rows[1], rows[2]
    assert [(r[0], r[1], r[2]) for r in first] == [("host%d" % i, "ok", "yes") for i in (1, 2, 3)], first
    assert all(int(r[7]) >= 1 for r in first), first  # workers verified on every host
    assert [(r[0], r[1], r[2]) for r in second] == [("host%d" % i, "ok", "no") for i in (1, 2, 3)], second
    assert "second rollout restarted: nothing" in out
    # The audit failed for the stale servers, with the reasons in the summary.
    assert all("drifted" in r[-1] for r in rows[0]), rows[0]
