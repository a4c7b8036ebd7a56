# SPDX-License-Identifier: GPL-3.0-or-later
"""The README's and the quickstart's main command: the demo (./scripts/demo runs tools/demo.py after
./scripts/setup). A real run on a 3-host sandbox fleet behind a real HAProxy: audit fails, the rollout restarts every
host, draining each out of HAProxy, while the load generator sends requests through it (none fails), a second rollout
restarts nothing, the audit passes, HAProxy and the fleet are torn down."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
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
    # Torn down whole: its state directory (logs, HAProxy's configuration, the load results) is gone too.
    state = re.search(r"^demo state directory \(removed at the end unless --keep\): (/\S+)$", out, re.M)
    assert state and not os.path.exists(state.group(1)), state
    steps = re.findall(r"^==> (.*)$", out, re.M)
    assert [s.split(":")[0].split(" (")[0] for s in steps] == [
        "Bring up 3 sandbox hosts", "Start a stale, untuned server on every host by hand",
        "Put a real HAProxy in front of every server", "Audit", "Rollout", "Rollout again", "Audit again",
        "Tear the fleet down"], steps
    assert re.search(r"^haproxy: http://10\.200\.0\.1:\d+/generate -> host1 UP, host2 UP, host3 UP$", out, re.M), out[:3000]
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
    # The drain under load: the load generator's line, printed once, after the first rollout and before the second.
    loads = re.findall(r"^(\d+) requests during the rollout, (\d+) failed$", out, re.M)
    assert len(loads) == 1, loads
    n, failed = map(int, loads[0])
    assert n > 0 and failed == 0, loads
    first_rollout = out.index("### gpufleet rollout: OK")
    assert first_rollout < out.index("requests during the rollout") < out.index("==> Rollout again"), out[-6000:]
    # Each host was taken out of HAProxy and put back (the rollout's task lines), in the first rollout only.
    again = out.index("==> Rollout again")
    for h in ("host1", "host2", "host3"):
        assert re.search(r"^\[ *[\d.]+s\] %s +changed +%s$" % (h, re.escape(DRAIN_TASK)), out[:again], re.M), h
        assert re.search(r"^\[ *[\d.]+s\] %s +\w+ +%s$" % (h, re.escape(RETURN_TASK)), out[:again], re.M), h
    assert DRAIN_TASK not in out[again:]


DRAIN_TASK = "Take the host out of its balancers and let its requests in flight finish (each step where it runs)"
RETURN_TASK = "Put the host back into each balancer, wait until each reports it UP, then clear its drain record"


def test_demo_without_haproxy_says_so_and_fails(monkeypatch, capsys):
    """No HAProxy: the demo names what is missing and how to get it, fails, and brings nothing up (no silent skip of
    the drain)."""
    spec = importlib.util.spec_from_file_location("gpufleet_demo_under_test", ROOT / "tools" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    real_access, real_which, real_load_balancer = os.access, shutil.which, demo.load_balancer

    def load_balancer_without_haproxy():
        bal = real_load_balancer()
        monkeypatch.setattr(bal.shutil, "which", lambda name, *a, **k: None if name == "haproxy" else real_which(name))
        monkeypatch.setattr(bal.os, "access", lambda p, m, *a, **k: False if "haproxy" in str(p) else real_access(p, m))
        return bal

    started = []
    monkeypatch.setattr(demo, "load_balancer", load_balancer_without_haproxy)
    monkeypatch.setattr(demo.subprocess, "run", lambda *a, **k: started.append(a))
    monkeypatch.setattr(demo.tempfile, "mkdtemp", lambda *a, **k: started.append(("mkdtemp",)))
    monkeypatch.setattr(sys, "argv", ["demo.py"])
    rc = demo.main()
    out, err = capsys.readouterr()
    assert rc == 1
    assert "haproxy is not installed" in err and "./scripts/setup" in err and "cannot run without it" in err, err
    assert out.rstrip().endswith("demo FAILED"), out
    assert started == [], started
