# SPDX-License-Identifier: GPL-3.0-or-later
"""A play of the user's own with `serial` and `max_fail_percentage` that includes the gpu_server role stops after a
batch whose host failed in the role: the role fails its host after its block, not inside its rescue (ansible-core
does not count a host failing inside a rescue whose block has an always: ansible/ansible#86574)."""
from __future__ import annotations

import json

import pytest

from helpers import PY
from release_helpers import BIN, clean_env, private_collection, run

PLAY = """
- name: My own rolling restart
  hosts: all
  serial: [2, 1]
  max_fail_percentage: 0
  gather_facts: false
  tasks:
    - name: Restart with gpufleet's role
      ansible.builtin.include_role:
        name: gpufleet.serving.gpu_server
      # `second` has nothing to do here: its batch then has one failed host of two (a whole failed batch ends the
      # play in any case).
      when: inventory_hostname != 'second'
"""


def test_a_users_play_with_serial_stops_after_the_role_failed_a_host(tmp_path):
    (tmp_path / "pb.yml").write_text(PLAY)
    gv = {"gpufleet_server_name": "mine", "gpufleet_server_command": ["/nonexistent/bin/server"],
          "gpufleet_server_health_url": "http://127.0.0.1:1/health", "gpufleet_server_run_dir": str(tmp_path / "run"),
          "gpufleet_server_state_dir": str(tmp_path / "state"), "gpufleet_server_log_dir": str(tmp_path / "log"),
          "ansible_connection": "local", "ansible_python_interpreter": PY}
    (tmp_path / "inv.json").write_text(json.dumps({"all": {"hosts": {"first": None, "second": None, "third": None}, "vars": gv}}))
    base = private_collection(tmp_path / "collections")
    r = run([str(BIN / "ansible-playbook"), "-i", str(tmp_path / "inv.json"), str(tmp_path / "pb.yml")],
            cwd=tmp_path, env=clean_env(ANSIBLE_COLLECTIONS_PATH=str(base), HOME=str(tmp_path)), timeout=120)
    assert r.returncode == 2, r.stdout[-3000:]
    assert "cannot run this server" in r.stdout and "/nonexistent/bin/server" in r.stdout, r.stdout[-3000:]
    recap = r.stdout[r.stdout.rindex("PLAY RECAP"):]
    assert "first" in recap and "second" in recap and "third" not in recap, recap  # the second batch never started
    assert "NO MORE HOSTS LEFT" in r.stdout


@pytest.mark.parametrize("extra, says", [
    ({"gpufleet_rollout_max_fail_percentage": -5}, "gpufleet_rollout_max_fail_percentage must be a number from 0 to 100 "
                                                   "(got int -5)"),
    ({"gpufleet_rollout_max_fail_percentage": "lots"}, "gpufleet_rollout_max_fail_percentage must be a number"),
    ({"gpufleet_rollout_serial": [0, "50%"]}, "gpufleet_rollout_serial must be a batch size"),
    ({"gpufleet_rollout_serial": ["0%", 2]}, "(got 0%)"),
    # Not a number at all: ansible-core itself crashed on these (rc 250, no summary) before any task ran.
    ({"gpufleet_rollout_serial": "abc"}, "(got abc)"),
    ({"gpufleet_rollout_serial": [1, "lots"]}, "(got lots)"),
])
@pytest.mark.parametrize("playbook", ["rollout", "clean"])
def test_bad_batch_settings_are_refused_by_name_before_any_host_is_touched(tmp_path, playbook, extra, says):
    """ansible-core applies serial and max_fail_percentage before any task: a negative limit ended the play after its
    first task without a word, and a 0 batch size silently dropped the canary."""
    base = private_collection(tmp_path / "collections")
    ev = dict(extra, gpufleet_target="all", ansible_python_interpreter=PY, gpufleet_server_name="mine",
              gpufleet_server_run_dir=str(tmp_path / "run"), gpufleet_server_state_dir=str(tmp_path / "state"))
    r = run([str(BIN / "ansible-playbook"), "gpufleet.serving." + playbook, "-i", "first,second,", "-c", "local",
             "-e", json.dumps(ev)], cwd=tmp_path, env=clean_env(ANSIBLE_COLLECTIONS_PATH=str(base), HOME=str(tmp_path)),
            timeout=120)
    assert r.returncode == 2, r.stdout[-3000:]
    assert says in r.stdout, r.stdout[-3000:]
    assert "Check the batch settings" in r.stdout and "Validate the server definition" not in r.stdout, r.stdout[-3000:]
    assert not (tmp_path / "run").exists() and not (tmp_path / "state").exists()
