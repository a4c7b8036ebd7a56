# SPDX-License-Identifier: GPL-3.0-or-later
"""The graceful kill order (issue 17): the launcher alone first, its grace, then the rest, then KILL.

A real launcher with a real worker child: on SIGTERM the launcher "finishes its requests in flight" (needs its worker
alive for 0.3 s), writes how that went, stops its worker and exits - what SGLang and vLLM do."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import typing as t

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _kill, _killmod, _proc

LAUNCHER = r'''
import os, signal, subprocess, sys, time
out, mode = sys.argv[1], sys.argv[2]
w = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; "
                      + ("signal.signal(signal.SIGTERM, signal.SIG_IGN); " if mode == "ignore_all" else "")
                      + "print('w', flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
w.stdout.readline()
def drain(*_):
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.3:  # the requests in flight need the worker
        if w.poll() is not None:
            open(out, "w").write("worker died during the drain")
            os._exit(1)
        time.sleep(0.01)
    open(out, "w").write("drained")
    w.terminate(); w.wait()
    os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode in ("ignore", "ignore_all") else drain)
print(w.pid, flush=True)
time.sleep(600)
'''


@pytest.fixture
def server(tmp_path):
    started: t.List[subprocess.Popen] = []

    def start(mode: str = "drain") -> t.Tuple[_proc.Proc, _proc.Proc, str]:
        out = str(tmp_path / ("out-%d" % len(started)))
        p = subprocess.Popen([sys.executable, "-c", LAUNCHER, out, mode], stdout=subprocess.PIPE, text=True)
        started.append(p)
        wpid = int(p.stdout.readline())
        launcher, worker = _proc.read_proc(p.pid), _proc.read_proc(wpid)
        assert launcher is not None and worker is not None
        return launcher, worker, out

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def _result(path: str) -> str:
    return open(path).read() if os.path.exists(path) else ""


def test_launcher_first_lets_the_launcher_drain(server):
    launcher, worker, out = server()
    rep = {r["pid"]: r for r in _kill.kill([launcher, worker], grace=5, final_wait=2, first=[launcher.pid])}
    assert _result(out) == "drained"
    assert rep[launcher.pid]["signals_sent"] == ["SIGTERM"]
    # The launcher stopped its own worker: we never signalled it.
    assert rep[worker.pid]["signals_sent"] == [] and not rep[worker.pid]["survived"]


def test_all_at_once_kills_the_worker_under_the_drain(server):
    """The old order: what made in-flight requests fail (the issue's first cause). Fails if the fixture cannot tell."""
    launcher, worker, out = server()
    _kill.kill([launcher, worker], grace=5, final_wait=2)
    deadline = time.monotonic() + 5
    while not _result(out) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _result(out) == "worker died during the drain"


def test_launcher_ignoring_term_escalates(server):
    launcher, worker = server("ignore")[:2]
    t0 = time.monotonic()
    rep = {r["pid"]: r for r in _kill.kill([launcher, worker], grace=0.3, final_wait=2, first=[launcher.pid])}
    took = time.monotonic() - t0
    assert rep[launcher.pid]["signals_sent"] == ["SIGTERM", "SIGKILL"]
    # The launcher used the whole grace, which bounds the whole first step (as systemd's KillMode=mixed does): the
    # worker gets its SIGTERM then, and the SIGKILL with everything left, whether or not it is gone by then.
    assert rep[worker.pid]["signals_sent"][0] == "SIGTERM"
    assert not any(r["survived"] for r in rep.values())
    assert 0.3 <= took < 3  # the launcher's grace, then the worker's TERM and the KILL


def test_the_grace_bounds_the_whole_first_step_whatever_the_order(server):
    """Issue 24: a launcher and a worker that both ignore SIGTERM, grace 1 s: KILL comes about 1 s after the first
    TERM, not 1 s for the launcher and another 1 s for the rest of the tree (kill_s was twice the grace)."""
    launcher, worker = server("ignore_all")[:2]
    t0 = time.monotonic()
    rep = {r["pid"]: r for r in _kill.kill([launcher, worker], grace=1.0, final_wait=2, first=[launcher.pid])}
    took = time.monotonic() - t0
    assert rep[launcher.pid]["signals_sent"] == ["SIGTERM", "SIGKILL"]
    assert rep[worker.pid]["signals_sent"] == ["SIGTERM", "SIGKILL"]
    assert not any(r["survived"] for r in rep.values())
    assert all(r["exited_after_s"] >= 1.0 for r in rep.values())
    assert 1.0 <= took < 1.9, took


def _procs(*pairs: t.Tuple[int, int]) -> t.Dict[int, t.Any]:
    class P:
        def __init__(self, pid: int, ppid: int) -> None:
            self.pid, self.ppid = pid, ppid
    return {pid: P(pid, ppid) for pid, ppid in pairs}


@pytest.mark.parametrize("selected,pidfile,order,expected", [
    # the confirmed pidfile process goes first
    ([10, 11, 12], {"status": "confirmed", "pid": 10}, "launcher_first", [10]),
    # an unconfirmed pidfile names nothing: the tops of the selected trees (launcher 10, an orphan 20 under PID 1)
    ([10, 11, 12, 20], {"status": "unconfirmed", "pid": 99}, "launcher_first", [10, 20]),
    ([10, 11, 12, 20], None, "launcher_first", [10, 20]),
    # every selected pid a top (unrelated processes): no order to keep
    ([10, 20], None, "launcher_first", []),
    ([10, 11, 12], {"status": "confirmed", "pid": 10}, "all_at_once", []),
    ([10], {"status": "confirmed", "pid": 10}, "launcher_first", []),
])
def test_leaders(selected, pidfile, order, expected):
    procs = _procs((10, 1), (11, 10), (12, 11), (20, 1), (99, 1))
    chosen: t.Dict[str, t.Any] = {"selected": {pid: ["tag"] for pid in selected}}
    if pidfile:
        chosen["pidfile"] = pidfile
    assert _killmod.leaders(chosen, procs, order) == expected


def test_bad_order_is_an_input_error():
    p = dict(grace=1.0, final_wait=1.0, poll_interval=0.01, signals=["TERM", "KILL"], order="random")
    assert "order must be one of launcher_first, all_at_once" in _killmod.kill_input_error(p)
