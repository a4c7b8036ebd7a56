# SPDX-License-Identifier: GPL-3.0-or-later
"""_killmod, the glue of process_kill/process_env: the signalling input checks, which pids get the first signal
alone (launcher_first), the selector built from a real AnsibleModule's parameters, and GPU holders from the fake
NVML plus real /dev/nvidia* holders."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import wait_for
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.serving.plugins.module_utils import _killmod, _proc
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError

KILL_DEFAULTS = dict(signals=["TERM", "KILL"], grace=10.0, final_wait=5.0, poll_interval=0.05, order="launcher_first")


def proc(pid, ppid):
    return _proc.Proc(pid=pid, ppid=ppid, pgid=pid, sid=pid, uid=0, state="S", start_time=1, flags=0, comm="python3",
                      cmdline=["python3"])


@pytest.mark.parametrize("change,msg", [
    ({}, None),
    ({"grace": -1}, "grace must be >= 0 seconds, got -1"),
    ({"final_wait": -0.5}, "final_wait must be >= 0 seconds, got -0.5"),
    ({"poll_interval": 0}, "poll_interval must be > 0 seconds, got 0"),
    ({"signals": []}, "signals must name at least one signal"),
    ({"signals": ["TERM", "NOPE"]}, "signals: "),
    ({"order": "random"}, "order must be one of launcher_first, all_at_once, got 'random'"),
    ({"grace": 0, "final_wait": 0}, None),
])
def test_kill_input_error(change, msg):
    err = _killmod.kill_input_error(dict(KILL_DEFAULTS, **change))
    if msg is None:
        assert err is None
    else:
        assert err is not None and err.startswith(msg), err


# A launcher 10 with workers 11, 12 (12 has child 13); an orphaned worker 20 (its parent 1 not selected).
PROCS = {p.pid: p for p in (proc(10, 1), proc(11, 10), proc(12, 10), proc(13, 12), proc(20, 1))}


@pytest.mark.parametrize("selected,pidfile,order,want", [
    ([10, 11, 12, 13], None, "launcher_first", [10]),
    ([10, 11, 12, 13, 20], None, "launcher_first", [10, 20]),
    ([10, 11, 12, 13], None, "all_at_once", []),
    ([11], None, "launcher_first", []),  # one process: nothing to order
    ([11, 20], None, "launcher_first", []),  # every selected pid is a top: all at once
    ([10, 11, 12, 13], {"status": "confirmed", "pid": 12}, "launcher_first", [12]),  # the pidfile's process leads
    ([10, 11, 12, 13], {"status": "unconfirmed", "pid": 12}, "launcher_first", [10]),
    ([10, 11], {"status": "confirmed", "pid": 99}, "launcher_first", [10]),  # the pidfile's pid is not selected
])
def test_leaders(selected, pidfile, order, want):
    chosen = {"selected": {pid: ["tag"] for pid in selected}}
    if pidfile:
        chosen["pidfile"] = pidfile
    assert _killmod.leaders(chosen, PROCS, order) == want


def params(args):
    """The selector options as process_kill's AnsibleModule validates them (defaults filled in)."""
    with patch_module_args(args):
        return AnsibleModule(argument_spec=_killmod.selector_argspec(), supports_check_mode=True).params


def test_selector_argspec_takes_extra_options():
    spec = _killmod.selector_argspec(expected=dict(type="dict"))
    assert spec["expected"] == dict(type="dict") and spec["backend"]["default"] == "auto"
    assert spec["gpu_holders"] == dict(type="list", elements="int", default=[])


def test_build_selector_without_a_selector_fails():
    with pytest.raises(StepError, match="No selector given"):
        _killmod.build_selector(params({}), _proc.snapshot())


def test_select_or_fail_selects_a_real_process_by_regex_and_its_children():
    marker = "gpufleet-killmod-%d" % os.getpid()
    code = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code, marker], start_new_session=True)
    try:
        wait_for(lambda: _proc.descendants([p.pid], _proc.snapshot()), 10, "child started")
        chosen, procs = _killmod.select_or_fail(params({"cmdline_regex": marker, "include_groups": False}))
        child = _proc.descendants([p.pid], procs)
        assert set(chosen["selected"]) == {p.pid} | child and len(child) == 1
        assert chosen["selected"][p.pid] == ["cmdline"]
        assert _killmod.leaders(chosen, procs, "launcher_first") == [p.pid]
    finally:
        os.killpg(p.pid, 9)
        p.wait()


def test_gpu_holder_pids_lists_the_holders_of_the_asked_gpus_only(nvml):
    holder = nvml.hold(gpu=1, mib=4096)
    assert holder.pid in _killmod.gpu_holder_pids("nvml", [1], _proc.snapshot())
    assert holder.pid not in _killmod.gpu_holder_pids("nvml", [0], _proc.snapshot())
