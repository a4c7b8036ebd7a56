# SPDX-License-Identifier: GPL-3.0-or-later
"""The rollout_summary callback's fork_gc_freeze through a real ansible-playbook: what the garbage collector of the
worker that runs a task left frozen, read by a test-only action plugin inside that worker (docs/benchmarks.md; the
CPU it saves is measured by bench/fork_gc.py)."""
from __future__ import annotations

import json
import os

import pytest

from helpers import run_playbook

ACTION = """
import gc
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        return {"changed": False, "freeze_count": gc.get_freeze_count()}
"""

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Read the worker's garbage collector
      freeze_count:
      register: r
    - name: Keep it
      ansible.builtin.copy:
        dest: "{{ out }}"
        content: "{{ {'freeze_count': r.freeze_count} | to_json }}"
"""


@pytest.fixture
def play(tmp_path):
    (tmp_path / "action_plugins").mkdir()
    (tmp_path / "action_plugins" / "freeze_count.py").write_text(ACTION)
    (tmp_path / "play.yml").write_text(PLAY)
    return tmp_path


def _worker(play, env_over, callback=True):
    env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_FORK_GC_FREEZE"}
    env.update(env_over)
    if callback:
        env["ANSIBLE_CALLBACKS_ENABLED"] = "gpufleet.serving.rollout_summary"
    else:
        # No callback enabled (an empty ANSIBLE_CALLBACKS_ENABLED is refused by ansible-core): a configuration without
        # the repo's callbacks_enabled; the collections come from ANSIBLE_COLLECTIONS_PATH (tests/foundation/conftest).
        (play / "plain.cfg").write_text("[defaults]\ngathering = explicit\n")
        env["ANSIBLE_CONFIG"] = str(play / "plain.cfg")
        env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    out = play / "out.json"
    r = run_playbook(play / "play.yml", env=env, extra_vars={"out": str(out)})
    assert r.returncode == 0, r.stdout[-3000:]
    return json.loads(out.read_text())


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="needs os.register_at_fork (POSIX)")
def test_the_summary_callback_freezes_what_each_worker_inherits_unless_turned_off(play):
    assert _worker(play, {})["freeze_count"] > 1000  # the main process's heap, as inherited
    assert _worker(play, {"GPUFLEET_FORK_GC_FREEZE": "false"})["freeze_count"] == 0
    assert _worker(play, {}, callback=False)["freeze_count"] == 0  # ansible-core's workers as they are
