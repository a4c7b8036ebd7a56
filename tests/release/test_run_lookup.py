# SPDX-License-Identifier: GPL-3.0-or-later
"""The run id and the takeover decision come from the gpufleet.serving.run lookup (Python on the controller), not
from shell lookups: a run id names this ansible-playbook process, and only a run of this controller that is gone is
'dead' (another controller's run is unknown, never dead)."""
from __future__ import annotations

import json
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
        content: "{{ {'me': me, 'again': lookup('gpufleet.serving.run'),
                  'alive_me': lookup('gpufleet.serving.run', 'alive', owner=me),
                  'alive_dead': lookup('gpufleet.serving.run', 'alive', owner=me.split(':')[0] ~ ':' ~ dead_pid ~ ':x'),
                  'alive_elsewhere': lookup('gpufleet.serving.run', 'alive', owner='another-controller:1:x')} | to_json }}"
"""


def test_run_ids_name_this_playbook_process_and_liveness_is_known_only_for_this_controller(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that existed and is gone
    (tmp_path / "pb.yml").write_text(PLAY)
    base = private_collection(tmp_path / "collections")
    env = clean_env(ANSIBLE_COLLECTIONS_PATH=str(base), HOME=str(tmp_path))
    p = subprocess.Popen([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
                          "ansible_python_interpreter=%s dead_pid=%d out=%s" % (PY, dead.pid, tmp_path / "out.json"),
                          str(tmp_path / "pb.yml")],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    out = p.communicate(timeout=120)[0]
    assert p.returncode == 0, out[-3000:]
    msg = json.loads((tmp_path / "out.json").read_text())
    host, pid, uid = msg["me"].split(":")
    assert int(pid) == p.pid, (msg, p.pid)  # the ansible-playbook process itself
    assert re.fullmatch(r"[0-9a-f-]{36}", uid) and msg["again"] != msg["me"]
    assert msg["alive_me"] is True and msg["alive_dead"] is False and msg["alive_elsewhere"] is None, msg


def test_no_shell_lookups_in_playbooks_or_roles():
    for path in list(ROOT.glob("playbooks/*.yml")) + list(ROOT.glob("roles/*/tasks/*.yml")):
        assert "ansible.builtin.pipe" not in path.read_text() and "lookup('pipe'" not in path.read_text(), path
