# SPDX-License-Identifier: GPL-3.0-or-later
"""Faults provoked on localhost with real processes, real files and real ansible-playbook runs (issue 24):

- a server whose launcher and workers all ignore SIGTERM, killed by process_kill with a grace;
- an operator's edit outside gpufleet's block that makes the sitecustomize.py fail to import;
- a host that goes unreachable in the middle of its server_restart task (an ssh that answers 255, as OpenSSH does when
  ServerAlive gives up on a host whose network went away).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from collection_copy import private_collections
from helpers import PY, run_playbook
from rel_helpers import local_play

TAG = "GPUFLEET_REL_KILL_%d" % os.getpid()
# A launcher and its worker (both carrying the tag), both ignoring SIGTERM: a stale server that no TERM stops.
STUBBORN = r'''
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
w = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "print('w', flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
w.stdout.readline()
print(w.pid, flush=True)
time.sleep(600)
'''


@pytest.mark.reliability(
    section="fault", case="The kill grace bounds the whole kill",
    provoked="a tagged launcher and its worker that both ignore SIGTERM; process_kill (order launcher_first, the "
             "default) with grace 2 and final_wait 2, through ansible-playbook",
    outcome="both get SIGTERM then SIGKILL and are gone; the kill takes about the grace (elapsed_s < 3.5), not the "
            "grace twice (the launcher's grace, then a second one for the rest of the tree: kill_s was 10.01 with a "
            "grace of 5)")
def test_the_grace_bounds_the_whole_kill_of_a_server_ignoring_sigterm(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, **{TAG: "demo"}), start_new_session=True)
    try:
        worker = int(p.stdout.readline())
        task = {"name": "Kill the server", "gpufleet.serving.process_kill": {
            "tag": "%s=demo" % TAG, "grace": 2, "final_wait": 2}, "register": "kill"}
        proc, res = local_play(tmp_path, [task], ["kill"],
                               env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(private_collections())))
        assert proc.returncode == 0, proc.stdout[-3000:]
        k = res["kill"]
        by_pid = {x["pid"]: x for x in k["processes"]}
        assert set(by_pid) == {p.pid, worker}, k
        assert all(x["signals_sent"] == ["SIGTERM", "SIGKILL"] and not x["survived"] for x in by_pid.values()), k
        assert 2.0 <= k["elapsed_s"] < 3.5, k["elapsed_s"]
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


@pytest.mark.reliability(
    section="fault", case="An operator's error outside gpufleet's block in the sitecustomize.py",
    provoked="sitecustomize_env writes its block into a sitecustomize.py on the interpreter's path; then an operator's "
             "line above it that fails to import (a missing module, line 2); sitecustomize_env again, then in check "
             "mode (what the audit runs), through ansible-playbook",
    outcome="the run fails with '<path> fails to import outside gpufleet's block, at line 2: ModuleNotFoundError: "
            "No module named ...; so <python> started with an empty environment has NCCL_PROTO unset' (before: only "
            "'not exported as asked (got null)', the cause in a warning); check mode lists the same sentence in "
            "import_failures (the audit's reason for 'NCCL layers differ from the profile'); the operator's lines are "
            "left as they are")
def test_an_operators_import_error_outside_the_block_is_named_with_its_line(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    path = site / "sitecustomize.py"
    args = {"path": str(path), "env": {"NCCL_PROTO": "LL"}, "interpreters": [PY], "name": "nccl",
            "probe_env": {"PYTHONPATH": str(site)}}
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(private_collections()))
    proc, res = local_play(tmp_path, [{"name": "Write the block", "gpufleet.serving.sitecustomize_env": args,
                                       "register": "first"}], ["first"], env=env, name="first")
    assert res["first"]["changed"] is True, proc.stdout[-3000:]
    edit = "import os\nimport gpufleet_operator_module_gone\n"
    path.write_text(edit + path.read_text())
    tasks = [{"name": "Apply again", "gpufleet.serving.sitecustomize_env": args, "register": "again",
              "ignore_errors": True},
             {"name": "Check like the audit", "gpufleet.serving.sitecustomize_env": args, "register": "audit",
              "check_mode": True}]
    proc, res = local_play(tmp_path, tasks, ["again", "audit"], env=env, name="again")
    want = ("%s fails to import outside gpufleet's block, at line 2: ModuleNotFoundError: No module named "
            "'gpufleet_operator_module_gone'" % path)
    assert res["again"]["failed"] is True and res["again"]["msg"] == (
        "%s; so %s started with an empty environment has NCCL_PROTO unset" % (want, PY)), res["again"]["msg"]
    assert res["audit"]["import_failures"] == [want] and res["audit"]["not_effective"] == [PY], res["audit"]
    assert path.read_text().startswith(edit)


@pytest.mark.reliability(
    section="fault", case="A host unreachable in the middle of its restart",
    provoked="two hosts behind an ssh that exits 255 ('Timeout, server gpu1 not responding.', what OpenSSH says when "
             "ServerAlive gives up): gpu1 goes unreachable at its server_restart task, gpu2 at an earlier task",
    outcome="rc 4; the summary says 'unknown (unreachable during the restart)' for gpu1 (JSON restarted null; before: "
            "'no', while the restart had finished on the host) with ssh's message, and 'no' for gpu2")
def test_a_host_unreachable_during_its_restart_is_reported_as_unknown(tmp_path):
    fake_ssh = tmp_path / "fake_ssh"
    fake_ssh.write_text("#!/bin/sh\necho 'Timeout, server gpu1 not responding.' >&2\nexit 255\n")
    fake_ssh.chmod(0o755)
    pb = tmp_path / "pb.yml"
    pb.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Record a result like the gpu_server role\n"
        "      ansible.builtin.set_fact:\n        gpufleet_server_result: {restarted: false, reasons: [forced]}\n"
        "      delegate_to: localhost\n      delegate_facts: false\n"
        "    - name: Wait like the role's drain\n      ansible.builtin.ping:\n      when: inventory_hostname == 'gpu2'\n"
        "    - name: Restart the server\n      gpufleet.serving.server_restart:\n        name: demo\n"
        "        command: [/bin/true]\n        log_path: /tmp/x.log\n        pidfile: /tmp/x.pid\n")
    inv = tmp_path / "inv.ini"
    inv.write_text("".join("%s ansible_connection=ssh ansible_ssh_executable=%s ansible_host=127.0.0.1\n"
                           % (h, fake_ssh) for h in ("gpu1", "gpu2")))
    out = tmp_path / "summary"
    env = dict(os.environ, GPUFLEET_SUMMARY_DIR=str(out), ANSIBLE_COLLECTIONS_PATH=str(private_collections()),
               ANSIBLE_CALLBACKS_ENABLED="gpufleet.serving.rollout_summary")
    t0 = time.monotonic()
    r = run_playbook(pb, inventory=str(inv), env=env, timeout=120)
    assert r.returncode == 4, r.stdout
    rows = {h["host"]: h for h in json.loads((out / "rollout-summary.json").read_text())["hosts"]}
    assert rows["gpu1"]["restart"] == "unknown (unreachable during the restart)" and rows["gpu1"]["restarted"] is None
    assert "not responding" in rows["gpu1"]["failure"], rows["gpu1"]
    assert rows["gpu2"]["status"] == "unreachable" and rows["gpu2"]["restart"] == "no", rows["gpu2"]
    assert time.monotonic() - t0 < 120
