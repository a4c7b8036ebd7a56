# SPDX-License-Identifier: GPL-3.0-or-later
"""process_kill main() in-process against real child processes."""
from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from ansible_collections.gpufleet.serving.plugins.modules import process_kill

from helpers import pid_alive

SLEEPER = "import signal, sys, time\nif 'ignore' in sys.argv: signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(600)\n"


@pytest.fixture
def marker():
    return "gpufleet-unit-%s" % uuid.uuid4().hex[:10]


@pytest.fixture
def spawn():
    started = []

    def start(*args: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", SLEEPER] + list(args), stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_check_then_real_then_again(run_module, spawn, marker):
    victim = spawn(marker)
    bystander = spawn("bystander-" + marker[::-1])
    args = {"cmdline_regex": marker, "grace": 2, "final_wait": 2}

    r = run_module(process_kill.main, args, check_mode=True)
    assert r["changed"] is True and r["signalled"] == 1
    assert [p["pid"] for p in r["processes"]] == [victim.pid]
    assert r["processes"][0]["matched_by"] == ["cmdline"] and "signals_sent" not in r["processes"][0]
    assert pid_alive(victim.pid), "check mode must signal nothing"

    r = run_module(process_kill.main, args)
    assert r["changed"] is True and r["signalled"] == 1 and r["survivors"] == []
    [p] = r["processes"]
    assert p["pid"] == victim.pid and p["signals_sent"] == ["SIGTERM"] and p["survived"] is False
    assert victim.wait(timeout=5) == -15

    r = run_module(process_kill.main, args)
    assert r["changed"] is False and r["processes"] == [] and r["signalled"] == 0
    assert pid_alive(bystander.pid)


def test_survivor_fails_with_details(run_module, spawn, marker):
    stubborn = spawn(marker, "ignore")
    r = run_module(process_kill.main, {"pids": [stubborn.pid], "signals": ["TERM"], "final_wait": 0.2})
    assert r["failed"] is True
    assert r["msg"].startswith("1 process(es) survived TERM: pid %d state S" % stubborn.pid)
    assert r["survivors"] == [stubborn.pid]
    r = run_module(process_kill.main, {"pids": [stubborn.pid], "signals": ["TERM"], "final_wait": 0.1,
                                       "fail_on_survivor": False})
    assert "failed" not in r and r["survivors"] == [stubborn.pid]


def test_gpu_holders(nvml, run_module):
    on0 = nvml.hold(gpu=0, mib=100)
    on1 = nvml.hold(gpu=1, mib=100)
    r = run_module(process_kill.main, {"gpu_holders": [0], "grace": 2})
    assert [p["pid"] for p in r["processes"]] == [on0.pid] and r["processes"][0]["matched_by"] == ["gpu_holder"]
    assert on0.wait(timeout=5) is not None
    assert on1.poll() is None
    r = run_module(process_kill.main, {"gpu_holders": [5]})
    assert r["failed"] and "GPU index 5 does not exist" in r["msg"]


@pytest.mark.parametrize("args,msg", [
    ({}, "No selector given: set at least one of tag, pidfile, pids, cmdline_regex, user, gpu_holders"),
    ({"pids": [1], "signals": ["TERM", "NOPE"]}, "signals: unknown signal 'NOPE'"),
    ({"pids": [1], "signals": []}, "signals must name at least one signal"),
    ({"cmdline_regex": "(unclosed"}, "cmdline_regex: invalid regular expression '(unclosed': missing ), unterminated subpattern"),
    ({"pids": [1], "exclude_regex": ["*"]}, "exclude_regex: invalid regular expression '*'"),
    ({"pids": [1], "grace": -1}, "grace must be >= 0 seconds, got -1.0"),
    ({"pids": [1], "grace": "nan"}, "grace must be >= 0 seconds, got nan"),
    ({"pids": [1], "final_wait": -1}, "final_wait must be >= 0 seconds"),
    ({"pids": [1], "poll_interval": 0}, "poll_interval must be > 0 seconds"),
    ({"tag": "NOEQUALS"}, "tag must look like NAME=VALUE"),
    ({"user": "no-such-user-gpufleet"}, "user 'no-such-user-gpufleet' does not exist on this host"),
    ({"pids": ["x"]}, "pids"),
])
def test_bad_input_changes_nothing(run_module, spawn, args, msg):
    bystander = spawn()
    r = run_module(process_kill.main, args)
    assert r["failed"] is True
    assert msg in r["msg"], r["msg"]
    assert pid_alive(bystander.pid)


def test_protected_chain(run_module):
    import os

    r = run_module(process_kill.main, {"pids": [1, os.getpid(), os.getppid()]})
    assert r["changed"] is False and r["processes"] == []
    assert {e["pid"] for e in r["excluded"]} == {1, os.getpid(), os.getppid()}
