# SPDX-License-Identifier: GPL-3.0-or-later
"""bench/task_counts.py: its callback counts one execution per task and host (a loop once, an include and a skipped
task each once, a run_once task for the host it ran on), and the counts docs/benchmarks.md shows are those of the
evidence file the script wrote."""
from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from helpers import PY, run_playbook  # noqa: E402

EVIDENCE = ROOT / "docs" / "evidence" / "task-counts-8.json"


def test_the_callback_counts_one_execution_per_task_and_host(tmp_path):
    (tmp_path / "inc.yml").write_text("- name: included\n  ansible.builtin.debug: {msg: x}\n")
    play = tmp_path / "play.yml"
    play.write_text(textwrap.dedent("""\
        - hosts: all
          gather_facts: false
          tasks:
            - name: plain
              ansible.builtin.debug: {msg: x}
            - name: looped
              ansible.builtin.debug: {msg: "{{ item }}"}
              loop: [1, 2, 3]
            - name: skipped
              ansible.builtin.debug: {msg: x}
              when: false
            - name: include
              ansible.builtin.include_tasks: inc.yml
            - name: once
              ansible.builtin.command: "true"
              run_once: true
            - name: failed on b only
              ansible.builtin.fail: {msg: x}
              when: inventory_hostname == 'b'
              ignore_errors: true
        """))
    (tmp_path / "hosts").write_text("a ansible_connection=local ansible_python_interpreter=%s\n"
                                    "b ansible_connection=local ansible_python_interpreter=%s\n" % (PY, PY))
    out = tmp_path / "counts.json"
    env = dict(os.environ, GPUFLEET_TASK_COUNTS=str(out), ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "bench" / "callback"),
               ANSIBLE_CALLBACKS_ENABLED="task_counts")
    cp = run_playbook(play, env=env, inventory=str(tmp_path / "hosts"))
    assert cp.returncode == 0, cp.stdout[-3000:]
    hosts = json.loads(out.read_text())["hosts"]
    assert [t for t, _ in hosts["a"]["tasks"]] == ["plain", "looped", "skipped", "include", "included", "once",
                                                   "failed on b only"], hosts["a"]
    assert hosts["a"]["executions"] == 7 and hosts["b"]["executions"] == 6, hosts
    assert dict(hosts["b"]["tasks"]) == {"plain": "ok", "looped": "ok", "skipped": "skipped", "include": "ok",
                                         "included": "ok", "failed on b only": "failed"}, hosts["b"]
    assert dict(hosts["a"]["tasks"])["once"] == "changed" and dict(hosts["a"]["tasks"])["failed on b only"] == "skipped"


def test_the_documented_counts_are_the_evidence_files():
    import task_counts
    res = json.loads(EVIDENCE.read_text())
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    assert task_counts.table(res) in doc, task_counts.table(res)
    for name in ("noop", "restart"):  # every host of the run, the counts the table shows
        r = res[name]
        assert r["per_host"] == sorted(r["hosts"].values())[len(r["hosts"]) // 2], r["hosts"]
        assert r["per_host"] == len([t for t in r["tasks"]]) and all(s["status"] == "ok" for s in r["summary"].values())
    assert all(s["restarted"] for s in res["restart"]["summary"].values())
    # The prose under the table: how many of the restart's executions are skipped, and the drain's share.
    names = [t for t, _ in res["restart"]["tasks"]]
    skipped = sum(1 for _, st in res["restart"]["tasks"] if st == "skipped")
    drain = names.index("gpufleet.serving.gpu_server : Restart the server (kill, verify clean, launch, wait ready, verify the "
                        "workers' environment, record)") - names.index(
        "gpufleet.serving.gpu_server : Take the host out of its balancers and let its requests in flight finish (each step "
        "where it runs)")
    assert "Of the restart's %d, %d are skipped tasks" % (res["restart"]["per_host"], skipped) in " ".join(doc.split())
    assert "the check before the kill) is %d." % drain in " ".join(doc.split())
    assert not any(s["restarted"] for s in res["noop"]["summary"].values())
