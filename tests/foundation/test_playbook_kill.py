# SPDX-License-Identifier: GPL-3.0-or-later
"""process_kill through the real ansible-playbook CLI against localhost: check, real, again, failures."""
from __future__ import annotations

import os
import time

from helpers import service_tag
from playbook_steps import play


def test_process_kill_check_real_again(launch, fake_gpus, tmp_path):
    tree = launch(workers=2, tag=service_tag("pb-cycle"), mib=3000)
    step = {"module": "process_kill", "args": {"tag": service_tag("pb-cycle"), "grace": 5}}

    [chk] = play(tmp_path, [dict(step)], fake_gpus.env, check=True, name="check")
    assert chk["changed"] is True and not chk.get("failed")
    assert {p["pid"] for p in chk["processes"]} == set(tree.members)
    assert chk["signalled"] == len(tree.members) and chk["survivors"] == []
    assert all("signals_sent" not in p for p in chk["processes"])
    assert tree.alive() == sorted(tree.members), "check mode signalled something"

    real, again, chk2 = play(tmp_path, [dict(step), dict(step), dict(step, check=True)], fake_gpus.env, name="real")
    assert real["changed"] is True and real["survivors"] == [] and real["signalled"] == len(tree.members)
    by_pid = {p["pid"]: p for p in real["processes"]}
    for w in tree.workers:
        p = by_pid[w]
        assert p["matched_by"][0] == "tag" and p["signals_sent"] == ["SIGTERM"] and p["survived"] is False
        assert set(p) >= {"pid", "ppid", "start_time", "user", "cmdline", "exited_after_s", "already_gone"}
    assert 0 <= real["elapsed_s"] < 5
    assert tree.alive() == []
    assert again["changed"] is False and again["processes"] == [] and again["signalled"] == 0
    assert chk2["changed"] is False and chk2["processes"] == []


def test_process_kill_escalation_pidfiles_protection(launch, sleeper, fake_gpus, tmp_path):
    stubborn = launch(workers=1, tag=service_tag("pb-stubborn"), worker_ignore_term=True, ignore_term=True)
    innocent = sleeper()
    st = int(open("/proc/%d/stat" % innocent.pid).read().rsplit(")", 1)[1].split()[19])
    stale = tmp_path / "stale.pid"
    stale.write_text("%d %d\n" % (innocent.pid, st + 3))
    foreign = tmp_path / "foreign.pid"
    foreign.write_text("%d\n" % innocent.pid)
    os.utime(foreign, (time.time() - 7200, time.time() - 7200))
    steps = [
        {"module": "process_kill", "args": {"tag": service_tag("pb-stubborn"), "grace": 0.4, "final_wait": 3}},
        {"module": "process_kill", "args": {"pidfile": str(stale)}},
        {"module": "process_kill", "args": {"pidfile": str(foreign)}},
        {"module": "process_kill", "args": {"pids": [1, os.getpid()]}},
    ]
    esc, st_res, fr_res, prot = play(tmp_path, steps, fake_gpus.env)
    assert esc["changed"] is True and esc["survivors"] == []
    for p in esc["processes"]:
        assert p["signals_sent"] == ["SIGTERM", "SIGKILL"], p
        assert p["exited_after_s"] >= 0.4
    assert stubborn.alive() == []
    assert st_res["changed"] is False and st_res["processes"] == []
    assert "now belongs to another process" in st_res["notes"][0]
    assert fr_res["changed"] is False and "started after the pidfile was written" in fr_res["notes"][0]
    assert innocent.poll() is None
    assert prot["changed"] is False and prot["processes"] == []
    assert {e["pid"] for e in prot["excluded"]} == {1, os.getpid()}
    assert all(e["reason"].startswith("protected") for e in prot["excluded"])


def test_process_kill_bad_input(sleeper, fake_gpus, tmp_path):
    bystander = sleeper()
    cases = [
        ({}, "No selector given: set at least one of tag, pidfile, pids, cmdline_regex, user, gpu_holders"),
        ({"pids": [bystander.pid], "signals": ["TERM", "SIGNOPE"]}, "signals: unknown signal 'SIGNOPE'"),
        ({"cmdline_regex": "([unclosed"}, "invalid regular expression"),
        ({"tag": "GPUFLEET_SERVICE"}, "tag must look like NAME=VALUE"),
        ({"pids": [bystander.pid], "grace": -2}, "grace must be >= 0 seconds"),
        ({"gpu_holders": [9]}, "GPU index 9 does not exist on this host (it has 2 GPUs: 0..1)"),
    ]
    res = play(tmp_path, [{"module": "process_kill", "args": a} for a, _msg in cases], fake_gpus.env)
    for (args, msg), r in zip(cases, res):
        assert r.get("failed") is True, (args, r)
        assert msg in r["msg"], (args, r["msg"])
    assert bystander.poll() is None
