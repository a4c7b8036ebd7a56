# SPDX-License-Identifier: GPL-3.0-or-later
"""The run id and the takeover decision come from the gpufleet.serving.run lookup (Python on the controller), not
from shell lookups: a run id names this ansible-playbook process (pid, this boot's id, its start ticks), and only a
run of this controller - same hostname AND boot id - that is gone is 'dead' (another controller's run is unknown, never
dead, even when the two controllers share a hostname)."""
from __future__ import annotations

import json
import os
import re
import subprocess

from helpers import PY
from release_helpers import BIN, ROOT, clean_env, private_collection

PLAY = """
- hosts: localhost
  gather_facts: false
  vars:
    me: "{{ lookup('gpufleet.serving.run') }}"
  tasks:
    - name: Ask
      ansible.builtin.copy:
        dest: "{{ out }}"
        content: "{{ {'me': me, 'again': lookup('gpufleet.serving.run'), 'process': lookup('gpufleet.serving.run', 'process'),
                  'alive_me': lookup('gpufleet.serving.run', 'alive', owner=me),
                  'alive_dead': lookup('gpufleet.serving.run', 'alive', owner=host ~ ':' ~ dead_pid ~ ':' ~ boot ~ '.1.x'),
                  'alive_reused': lookup('gpufleet.serving.run', 'alive',
                                         owner=host ~ ':' ~ live_pid ~ ':' ~ boot ~ '.' ~ (live_ticks | int + 1) ~ '.x'),
                  'alive_live': lookup('gpufleet.serving.run', 'alive',
                                       owner=host ~ ':' ~ live_pid ~ ':' ~ boot ~ '.' ~ live_ticks ~ '.x'),
                  'alive_other_boot': lookup('gpufleet.serving.run', 'alive',
                                             owner=host ~ ':' ~ live_pid ~ ':' ~ other_boot ~ '.' ~ live_ticks ~ '.x'),
                  'alive_other_boot_dead': lookup('gpufleet.serving.run', 'alive',
                                                  owner=host ~ ':' ~ dead_pid ~ ':' ~ other_boot ~ '.1.x'),
                  'alive_old_format': lookup('gpufleet.serving.run', 'alive', owner=host ~ ':' ~ dead_pid ~ ':x'),
                  'alive_elsewhere': lookup('gpufleet.serving.run', 'alive', owner='another-controller:1:x')} | to_json }}"
      vars:
        host: "{{ me.split(':')[0] }}"
        boot: "{{ me.split(':')[2].split('.')[0] }}"

    # Another task, so another worker process of the same run.
    - name: Ask again
      ansible.builtin.copy:
        dest: "{{ out }}.process"
        content: "{{ lookup('gpufleet.serving.run', 'process') }}"
"""


def _ticks(pid):
    stat = open("/proc/%d/stat" % pid).read()
    return int(stat[stat.rfind(")") + 2:].split()[19])


def test_run_ids_name_this_playbook_process_and_liveness_is_known_only_for_this_controller(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that existed and is gone
    live = subprocess.Popen(["sleep", "300"])  # a live pid: with other start ticks it is a reused pid
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    other_boot = "%s%s" % (boot[:-1], "0" if boot[-1] != "0" else "1")  # same hostname, another machine (or boot)
    (tmp_path / "pb.yml").write_text(PLAY)
    base = private_collection(tmp_path / "collections")
    env = clean_env(ANSIBLE_COLLECTIONS_PATH=str(base), HOME=str(tmp_path))
    p = subprocess.Popen([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
                          "ansible_python_interpreter=%s dead_pid=%d live_pid=%d live_ticks=%d other_boot=%s out=%s"
                          % (PY, dead.pid, live.pid, _ticks(live.pid), other_boot, tmp_path / "out.json"),
                          str(tmp_path / "pb.yml")],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    try:
        out = p.communicate(timeout=120)[0]
    finally:
        live.kill()
        live.wait()
    assert p.returncode == 0, out[-3000:]
    msg = json.loads((tmp_path / "out.json").read_text())
    host, pid, token, started = msg["me"].split(":")
    assert int(pid) == p.pid, (msg, p.pid)  # the ansible-playbook process itself
    # When the ansible-playbook process started (boot time + its start ticks): orders runs for the host lock.
    btime = next(int(ln.split()[1]) for ln in open("/proc/stat") if ln.startswith("btime "))
    assert abs(float(started) - (btime + int(token.split(".")[1]) / os.sysconf("SC_CLK_TCK"))) < 0.02, msg
    assert msg["again"].split(":")[3] == started, msg  # the same for every id of the run (each batch makes one)
    me_boot, me_ticks, uid = token.split(".")
    assert me_boot == boot, msg  # this boot
    assert re.fullmatch(r"[0-9]+", me_ticks) and re.fullmatch(r"[0-9a-f-]{36}", uid) and msg["again"] != msg["me"]
    assert msg["alive_me"] is True, msg  # the ansible-playbook process itself
    assert msg["alive_dead"] is False, msg  # this boot, a pid that is gone
    assert msg["alive_reused"] is False, msg  # this boot, a live pid whose start ticks differ: the pid was reused
    assert msg["alive_live"] is True, msg
    # same hostname, another boot id: a controller that shares the hostname (or this one before a reboot)
    assert msg["alive_other_boot"] is None and msg["alive_other_boot_dead"] is None, msg
    assert msg["alive_old_format"] is None and msg["alive_elsewhere"] is None, msg
    # V(process): one id for the whole run, whichever worker asks (the gpu_server role's lock owner without a set_fact).
    process = msg["process"]
    assert process.split(":")[1] == str(p.pid) and process.split(":")[3] == started, msg
    assert re.fullmatch(r"[0-9a-f-]{36}", process.split(":")[2].split(".")[2]) and process != msg["me"], msg
    assert (tmp_path / "out.json.process").read_text() == process, msg


def test_no_shell_lookups_in_playbooks_or_roles():
    for path in list(ROOT.glob("playbooks/*.yml")) + list(ROOT.glob("roles/*/tasks/*.yml")):
        assert "ansible.builtin.pipe" not in path.read_text() and "lookup('pipe'" not in path.read_text(), path
