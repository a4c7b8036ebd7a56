# SPDX-License-Identifier: GPL-3.0-or-later
"""_kill against real child processes: escalation, survivors, already-gone, pid reuse, permissions."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _kill, _proc

SLEEPER = "import signal, sys, time\nif 'ignore' in sys.argv: signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(600)\n"


@pytest.fixture
def spawn():
    started = []

    def start(*args: str) -> _proc.Proc:
        p = subprocess.Popen([sys.executable, "-c", SLEEPER] + list(args), stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"  # handler installed before we signal
        started.append(p)
        info = _proc.read_proc(p.pid)
        assert info is not None
        return info

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


@pytest.mark.parametrize("name,expected", [
    ("TERM", signal.SIGTERM), ("SIGKILL", signal.SIGKILL), ("int", signal.SIGINT), ("9", signal.SIGKILL),
    (15, signal.SIGTERM), ("hup", signal.SIGHUP),
])
def test_parse_signal(name, expected):
    assert _kill.parse_signal(name) == expected


@pytest.mark.parametrize("name,msg", [("NOPE", "unknown signal 'NOPE'"), ("999", "unknown signal number 999"), ("", "unknown signal")])
def test_parse_signal_bad(name, msg):
    with pytest.raises(_kill.KillError, match=msg):
        _kill.parse_signal(name)


@pytest.mark.parametrize("kw,msg", [
    (dict(signals=[]), "at least one signal"),
    (dict(grace=-1), "grace and final_wait"),
    (dict(final_wait=-0.1), "grace and final_wait"),
    (dict(poll_interval=0), "poll_interval"),
    (dict(signals=["TERM", "BOGUS"]), "unknown signal"),
])
def test_bad_arguments_signal_nothing(spawn, kw, msg):
    p = spawn()
    with pytest.raises(_kill.KillError, match=msg):
        _kill.kill([p], **kw)
    assert _proc.is_alive(p.identity)


def test_term_is_enough(spawn):
    p = spawn()
    [r] = _kill.kill([p], grace=5, final_wait=2)
    assert r["signals_sent"] == ["SIGTERM"]
    assert not r["survived"] and not r["already_gone"]
    assert r["exited_after_s"] is not None and r["exited_after_s"] < 1.0
    assert not _proc.is_alive(p.identity)


def test_term_ignored_escalates_to_kill(spawn):
    p = spawn("ignore")
    t0 = time.monotonic()
    [r] = _kill.kill([p], grace=0.3, final_wait=2)
    took = time.monotonic() - t0
    assert r["signals_sent"] == ["SIGTERM", "SIGKILL"]
    assert not r["survived"]
    assert 0.3 <= r["exited_after_s"] < 1.5, r
    assert took < 2.0
    assert not _proc.is_alive(p.identity)


def test_zero_grace_exit_is_not_a_survivor(spawn):
    """Regression: a process that died between steps must be reported exited, not survived."""
    for _attempt in range(5):
        p = spawn()
        [r] = _kill.kill([p], grace=0, final_wait=1)
        assert not r["survived"], r
        assert r["exited_after_s"] is not None


def test_survivor_reported_with_state(spawn):
    p = spawn("ignore")
    [r] = _kill.kill([p], signals=["TERM"], final_wait=0.2)
    assert r["survived"] is True
    assert r["signals_sent"] == ["SIGTERM"]
    assert r["exited_after_s"] is None
    assert r["state"] in ("S", "R")
    assert _proc.is_alive(p.identity)


def test_already_gone_is_success(spawn):
    p = spawn()
    os.kill(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while _proc.is_alive(p.identity):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    [r] = _kill.kill([p], grace=1, final_wait=1)
    assert r["already_gone"] is True
    assert r["signals_sent"] == []
    assert r["survived"] is False


def test_reused_pid_is_never_signalled(spawn):
    """An identity whose start time does not match the live pid is a different process: untouched."""
    p = spawn()
    ghost = p._replace(start_time=p.start_time - 1)
    [r] = _kill.kill([ghost], grace=0.1, final_wait=0.1)
    assert r["already_gone"] is True and r["signals_sent"] == []
    time.sleep(0.05)
    assert _proc.is_alive(p.identity)


def test_many_targets_mixed(spawn):
    obey, ignore, gone = spawn(), spawn("ignore"), spawn()
    os.kill(gone.pid, signal.SIGKILL)
    while _proc.is_alive(gone.identity):
        time.sleep(0.01)
    bystander = spawn()
    rep = {r["pid"]: r for r in _kill.kill([obey, ignore, gone], grace=0.3, final_wait=2)}
    assert rep[obey.pid]["signals_sent"] == ["SIGTERM"]
    assert rep[ignore.pid]["signals_sent"] == ["SIGTERM", "SIGKILL"]
    assert rep[gone.pid]["already_gone"]
    assert not any(r["survived"] for r in rep.values())
    assert _proc.is_alive(bystander.identity)
    # the report carries what an operator needs
    assert set(rep[obey.pid]) >= {"pid", "start_time", "cmdline", "user", "signals_sent", "already_gone",
                                  "exited_after_s", "survived"}
    assert rep[obey.pid]["user"] == _proc.user_name(os.geteuid())


@pytest.mark.parametrize("pidfd", [True, False])
def test_kill_latency_is_one_poll(spawn, monkeypatch, pidfd):
    """With or without pidfds, an exit is noticed within a few poll intervals."""
    monkeypatch.setattr(_kill, "_HAVE_PIDFD", pidfd and _kill._HAVE_PIDFD)
    p = spawn()
    [r] = _kill.kill([p], signals=["KILL"], final_wait=2, poll_interval=0.01)
    assert r["exited_after_s"] < 0.2


def test_permission_denied_is_reported_not_raised(spawn):
    """An unprivileged killer cannot signal root's process: a survivor with an error, no exception."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process the unprivileged killer cannot signal")
    victim = spawn()
    d = tempfile.mkdtemp(prefix="gpufleet-kill-")
    try:
        mu = os.path.join(d, "ansible_collections", "gpufleet", "serving", "plugins", "module_utils")
        os.makedirs(mu)
        for name in ("_proc.py", "_kill.py"):
            shutil.copy(os.path.join(os.path.dirname(_kill.__file__), name), mu)
        for base, dirs, files in os.walk(d):
            os.chmod(base, 0o755)
            for f in files:
                os.chmod(os.path.join(base, f), 0o644)
        code = ("import sys, json; sys.path.insert(0, %r)\n"
                "from ansible_collections.gpufleet.serving.plugins.module_utils import _kill, _proc\n"
                "print(json.dumps(_kill.kill([_proc.read_proc(%d)], grace=0.1, final_wait=0.1)))\n") % (d, victim.pid)

        def drop() -> None:
            os.setgid(65534)
            os.setuid(65534)

        out = subprocess.run(["/usr/bin/python3", "-c", code], preexec_fn=drop, stdout=subprocess.PIPE, check=False,
                             stderr=subprocess.PIPE, text=True, cwd=d)
    finally:
        shutil.rmtree(d)
    assert out.returncode == 0, out.stderr
    import json

    [r] = json.loads(out.stdout)
    assert r["survived"] is True
    assert "permission denied" in r["error"] and "become" in r["error"]
    assert r["signals_sent"] == []
    assert _proc.is_alive(victim.identity)
