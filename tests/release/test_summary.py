# SPDX-License-Identifier: GPL-3.0-or-later
"""The rollout summary callback: a padded per-host table at the end of the run (readable in a terminal and
valid Markdown), plus rollout-summary.json / rollout-summary.md in GPUFLEET_SUMMARY_DIR.

A tiny playbook on two local hosts records gpufleet_server_result like the gpu_server role does; one host
then fails like the role's rescue."""
from __future__ import annotations

import json

import pytest

from helpers import PY
from release_helpers import BIN, clean_env, private_collection, run

FAILURE = ("sglang: GPUs not clean after 30.0 s (GPU 0 20000 MiB used; threshold 16 MiB). "
           "Holders: GPU 0 pid 4242 (root, 20000 MiB): python3 -m stale | tail")
PLAYBOOK = """
- name: Pretend rollout
  hosts: all
  gather_facts: false
  tasks:
    - name: Record a result like the gpu_server role
      ansible.builtin.set_fact:
        gpufleet_server_result:
          restarted: "{{ inventory_hostname == 'hosta' }}"
          reasons: "{{ ['desired state changed'] if inventory_hostname == 'hosta' else [] }}"
          workers_verified: "{{ 2 if inventory_hostname == 'hosta' else 0 }}"
          timings: "{{ {'kill_s': 1.5, 'clean_s': 0.16, 'launch_s': 0.02, 'ready_s': 12.25}
                       if inventory_hostname == 'hosta' else {} }}"

    - name: Fail one host like the role's rescue
      ansible.builtin.fail:
        msg: "%s"
      when: inventory_hostname == 'hostbb'
""" % FAILURE.replace('"', '\\"')


@pytest.fixture(scope="module")
def summary_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("summary")
    base = private_collection(tmp / "collections")
    (tmp / "pb.yml").write_text(PLAYBOOK)
    out = tmp / "out"
    env = clean_env(ANSIBLE_COLLECTIONS_PATH=str(base), ANSIBLE_CALLBACKS_ENABLED="gpufleet.serving.rollout_summary",
                    GPUFLEET_SUMMARY_DIR=str(out), HOME=str(tmp))
    r = run([str(BIN / "ansible-playbook"), "-i", "hosta,hostbb,", "-c", "local", "-e", "ansible_python_interpreter=%s" % PY,
             str(tmp / "pb.yml")], cwd=tmp, env=env, timeout=120)
    return r, out


def test_terminal_table(summary_run):
    r, _out = summary_run
    assert r.returncode == 2, r.stdout  # a host failed
    text = r.stdout[r.stdout.index("GPUFLEET ROLLOUT SUMMARY"):]
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert len(lines) == 4, text
    header, sep, a, b = lines
    assert [c.strip() for c in header.split("|")[1:-1]] == [
        "host", "status", "restarted", "kill_s", "clean_s", "launch_s", "ready_s", "workers_verified", "failure"]
    assert set(sep.replace("|", "")) == {"-"}
    # Padded: every column but the last starts at the same offset on every line.
    bars = [[i for i, ch in enumerate(ln) if ch == "|"][:9] for ln in lines]
    assert all(x == bars[0] for x in bars), "\n".join(lines)
    assert [c.strip() for c in a.split("|")[1:-1]] == ["hosta", "ok", "yes", "1.50", "0.16", "0.02", "12.25", "2", "-"]
    cells = [c.strip() for c in b.split("|")[1:-1]]
    assert cells[:3] == ["hostbb", "failed", "no"] and cells[3:7] == ["-"] * 4 and cells[7] == "0"
    # The failure reason is kept whole on one row ('|' in it cannot break the table).
    assert cells[8] == FAILURE.replace("|", "/")


def test_json_and_markdown_files(summary_run):
    r, out = summary_run
    data = json.loads((out / "rollout-summary.json").read_text())
    hosts = {h["host"]: h for h in data["hosts"]}
    assert list(hosts) == ["hosta", "hostbb"]
    a, b = hosts["hosta"], hosts["hostbb"]
    assert (a["status"], a["restarted"], a["kill_s"], a["ready_s"], a["workers_verified"], a["failure"]) == (
        "ok", True, 1.5, 12.25, 2, None)
    assert a["reasons"] == ["desired state changed"]
    assert (b["status"], b["restarted"], b["failure"]) == ("failed", False, FAILURE)
    md = (out / "rollout-summary.md").read_text()
    terminal = r.stdout[r.stdout.index("GPUFLEET ROLLOUT SUMMARY"):]
    assert md.splitlines() == [ln for ln in terminal.splitlines() if ln.startswith("|")]
