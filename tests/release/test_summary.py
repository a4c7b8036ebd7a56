# SPDX-License-Identifier: GPL-3.0-or-later
"""The rollout summary callback: a padded per-host table at the end of the run (readable in a terminal and
valid Markdown), plus rollout-summary.json / rollout-summary.md in GPUFLEET_SUMMARY_DIR.

A tiny playbook on two local hosts records gpufleet_server_result like the gpu_server role does; one host
then fails like the role's rescue."""
from __future__ import annotations

import json
import re
import sys

import pytest

from helpers import PY
from release_helpers import BIN, ROOT, clean_env, private_collection, run

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


# A failed server_restart as the module returns it: what it killed, the timings of the steps that ran, the phase.
FAKE_RESTART = '''#!/usr/bin/python
from ansible.module_utils.basic import AnsibleModule
m = AnsibleModule(argument_spec=dict(phase=dict(type="str"), killed=dict(type="int"), timings=dict(type="dict"),
                                     new_server=dict(type="dict"), rollback_failed=dict(type="dict")))
m.fail_json(msg="demo: failed in step %s" % m.params["phase"], **m.params)
'''
FAILED_RESTARTS = """
- name: Pretend rollout whose restarts fail after the kill
  hosts: all
  gather_facts: false
  vars:
    restart:
      hclean: {phase: clean, killed: 3, timings: {kill_s: 2.5}}
      hstartup: {phase: startup, killed: 3, timings: {kill_s: 1.25, clean_s: 0.1, launch_s: 0.02},
                 new_server: {kept: false, stopped: true, killed: 1}}
      hkept: {phase: ready, killed: 3, timings: {kill_s: 1.0}, new_server: {kept: true, stopped: false}}
      henv: {phase: verify_env, killed: 3, timings: {kill_s: 1.0, clean_s: 0.1, launch_s: 0.02, ready_s: 4.0}}
      hnothing: {phase: clean, killed: 0, timings: {kill_s: 0.0}}
      hdied: {phase: startup, killed: 3, timings: {kill_s: 1.0}, new_server: {kept: false, stopped: true, killed: 0}}
      hrbfail: {phase: startup, killed: 3, timings: {kill_s: 1.0}, new_server: {kept: false, stopped: true, killed: 1},
                rollback_failed: {fingerprint: 0123456789abcdef, error: "FileExistsError: /var/lib/demo"}}
  tasks:
    - name: Decide like the gpu_server role
      ansible.builtin.set_fact:
        gpufleet_server_result: {restarted: false, reasons: [forced], workers: 2, workers_verified: 0}

    - name: Restart like the gpu_server role
      block:
        - name: Restart the server
          fake_restart: "{{ restart[inventory_hostname] }}"
      rescue:
        - name: Record the failure like the role's rescue
          ansible.builtin.set_fact:
            gpufleet_server_result: "{{ gpufleet_server_result | combine({'failed': true, 'failure': ansible_failed_result.msg})
                                        | combine({'rollback_failed': ansible_failed_result.rollback_failed}
                                                  if ansible_failed_result.rollback_failed else {}) }}"

        - name: Fail the host
          ansible.builtin.fail:
            msg: "{{ gpufleet_server_result.failure }}"
"""


def _play(tmp, playbook, hosts, *args):
    base = private_collection(tmp / "collections")
    out = tmp / "out"
    env = clean_env(ANSIBLE_COLLECTIONS_PATH=str(base), ANSIBLE_CALLBACKS_ENABLED="gpufleet.serving.rollout_summary",
                    GPUFLEET_SUMMARY_DIR=str(out), HOME=str(tmp))
    r = run([str(BIN / "ansible-playbook"), "-i", ",".join(hosts) + ",", "-c", "local", "-e",
             "ansible_python_interpreter=%s" % PY, str(playbook)] + list(args), cwd=tmp, env=env, timeout=120)
    return r, json.loads((out / "rollout-summary.json").read_text())


def _cells(stdout, title):
    text = stdout[stdout.index(title):]
    return {c[0]: c for c in ([x.strip() for x in ln.split("|")[1:-1]] for ln in text.splitlines()[1:]
                              if ln.startswith("|"))}


def test_a_host_that_failed_after_the_kill_shows_its_old_server_killed_and_the_kill_time(tmp_path):
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "fake_restart.py").write_text(FAKE_RESTART)
    (tmp_path / "pb.yml").write_text(FAILED_RESTARTS)
    hosts = ["hclean", "hstartup", "hkept", "henv", "hnothing", "hdied", "hrbfail"]
    r, data = _play(tmp_path, tmp_path / "pb.yml", hosts)
    assert r.returncode == 2, r.stdout
    cells = _cells(r.stdout, "GPUFLEET ROLLOUT SUMMARY")
    # host, status, restarted, kill_s, clean_s, launch_s, ready_s, workers_verified, failure
    assert cells["hclean"][1:5] == ["failed", "killed, not relaunched", "2.50", "-"], cells["hclean"]
    # A new server that died or never got ready serves nobody: stopped (the default) or kept for debugging.
    assert cells["hstartup"][1:6] == ["failed", "killed, not serving (failed new server stopped)", "1.25", "0.10",
                                      "0.02"], cells["hstartup"]
    assert cells["hkept"][1:4] == ["failed", "killed, failed new server kept", "1.00"], cells["hkept"]
    assert cells["henv"][1:7] == ["failed", "yes", "1.00", "0.10", "0.02", "4.00"], cells["henv"]
    assert cells["hnothing"][1:3] == ["failed", "no"], cells["hnothing"]
    assert cells["hclean"][8] == "demo: failed in step clean"
    hosts = {h["host"]: h for h in data["hosts"]}
    assert [(hosts[n]["restarted"], hosts[n]["killed"], hosts[n]["phase"]) for n in ("hclean", "hstartup", "hnothing")] == [
        (True, 3, "clean"), (True, 3, "startup"), (False, 0, "clean")]
    assert hosts["hkept"]["new_server"] == {"kept": True, "stopped": False, "killed": None, "error": None}
    assert hosts["hdied"]["new_server"] == {"kept": False, "stopped": True, "killed": 0, "error": None}
    # A new server that had died by itself: its stop ended nothing (the message says "not running any more").
    assert cells["hdied"][2] == "killed, not serving", cells["hdied"]
    # A rollback that failed too: said in the column and kept in the JSON row.
    assert cells["hrbfail"][2] == "killed, not serving (failed new server stopped); rollback to 0123456789ab failed", cells
    assert hosts["hrbfail"]["rollback_failed"] == {"fingerprint": "0123456789abcdef", "error": "FileExistsError: /var/lib/demo"}
    assert hosts["hstartup"]["rollback_failed"] is None


AUDIT = """
- name: Pretend audit
  hosts: all
  gather_facts: false
  tasks:
    - name: Check like the gpu_server role's audit entry point
      ansible.builtin.set_fact:
        gpufleet_server_result: {restarted: false, reasons: [], workers: 2, workers_verified: 2}
"""


@pytest.mark.parametrize("entry", ["audit.yml", "site.yml"])
def test_the_table_is_titled_after_the_playbook(tmp_path, entry):
    (tmp_path / "audit.yml").write_text(AUDIT)
    # CI's site.yml (gpufleet_ci, ansible-runner) imports the playbook: the play's own file names it.
    (tmp_path / "site.yml").write_text("- name: gpufleet audit\n  ansible.builtin.import_playbook: audit.yml\n")
    r, data = _play(tmp_path, tmp_path / entry, ["hosta"])
    assert r.returncode == 0, r.stdout
    assert "GPUFLEET AUDIT SUMMARY" in r.stdout and "ROLLOUT SUMMARY" not in r.stdout, r.stdout
    assert data["playbook"] == "audit"


def test_gpufleet_ci_renders_the_summary_with_the_callbacks_renderer():
    sys.path.insert(0, str(ROOT / "tools"))
    from gpufleet_ci.__main__ import render_markdown, summary_renderer

    hosts = [{"host": "h1", "status": "failed", "restarted": True, "restart": "killed, not relaunched", "kill_s": 2.5,
              "failure": "GPUs not clean", "out_of_rotation": ["haproxy"]},
             {"host": "h2", "status": "ok", "restarted": False, "would_restart": True, "restart": "would"},
             {"host": "h3", "status": "ok", "restarted": None, "restart": None}]  # no summary callback (stats only)
    halted = {"msg": "rollout halted: 1 of 1 host(s) of the batch failed (h1)"}
    md = render_markdown({"playbook": "rollout", "ok": False, "rc": 2, "hosts": hosts, "halted": halted})
    title, body = md.split("\n\n", 1)
    assert title == "### gpufleet rollout: FAILED (rc 2)"
    # One renderer: the report's body is what the callback writes to rollout-summary.md for the same rows.
    assert body == summary_renderer().render_markdown(hosts, halted)
    cells = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[1:-1]] for ln in body.splitlines()
             if re.match(r"^\| h\d ", ln)}
    assert cells["h1"][:5] == ["h1", "failed", "killed, not relaunched", "2.50", "-"], cells
    assert cells["h2"][:4] == ["h2", "ok", "would", "-"] and cells["h3"][:4] == ["h3", "ok", "-", "-"], cells
    assert body.rstrip().endswith("**%s**\n\n**left out of rotation: h1 (haproxy); the next rollout puts it back once "
                                  "the cause is fixed (docs/runbook.md)**" % halted["msg"]), body


# What OpenSSH prints when a host key changed (the @-banner, then what to do), from a real `ssh` run.
HOST_KEY_CHANGED = r"""@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
Someone could be eavesdropping on you right now (man-in-the-middle attack)!
It is also possible that a host key has just been changed.
The fingerprint for the ED25519 key sent by the remote host is
SHA256:3b0mE7XfRfU4PjT5ZlQn7mJd0VdQ6u2xQw1oHq9r8sY.
Please contact your system administrator.
Add correct host key in /root/.ssh/known_hosts to get rid of this message.
Offending ED25519 key in /root/.ssh/known_hosts:7
  remove with:
  ssh-keygen -f '/root/.ssh/known_hosts' -R 'gpu17'
Host key for gpu17 has changed and you have requested strict checking.
Host key verification failed."""


def test_the_summary_keeps_the_cause_of_a_module_failure_and_of_an_unreachable_host(tmp_path):
    """sudo with requiretty under pipelining: the module prints no JSON, only sudo's complaint; a changed host key:
    OpenSSH's message ends with the offending line and its ssh-keygen -R fix. The summary shows both causes."""
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "sudo_says_no.py").write_text(
        "#!/bin/sh\necho 'sudo: sorry, you must have a tty to run sudo' >&2\nexit 1\n")
    fake_ssh = tmp_path / "fake_ssh"
    fake_ssh.write_text("#!/bin/sh\ncat >&2 <<'EOF'\n%s\nEOF\nexit 255\n" % HOST_KEY_CHANGED)
    fake_ssh.chmod(0o755)
    (tmp_path / "pb.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Record a result like the gpu_server role\n"
        "      ansible.builtin.set_fact:\n        gpufleet_server_result: {restarted: false}\n"
        "      delegate_to: localhost\n      delegate_facts: false\n"
        "    - name: A module behind sudo\n      sudo_says_no:\n")
    (tmp_path / "inv.ini").write_text(
        "sudohost ansible_connection=local ansible_python_interpreter=%s\n"
        "gpu17 ansible_connection=ssh ansible_ssh_executable=%s ansible_host=127.0.0.1\n" % (PY, fake_ssh))
    base = private_collection(tmp_path / "collections")
    out = tmp_path / "out"
    env = clean_env(ANSIBLE_COLLECTIONS_PATH=str(base), ANSIBLE_CALLBACKS_ENABLED="gpufleet.serving.rollout_summary",
                    GPUFLEET_SUMMARY_DIR=str(out), HOME=str(tmp_path), ANSIBLE_LIBRARY=str(tmp_path / "library"))
    r = run([str(BIN / "ansible-playbook"), "-i", str(tmp_path / "inv.ini"), str(tmp_path / "pb.yml")],
            cwd=tmp_path, env=env, timeout=120)
    assert r.returncode != 0, r.stdout
    rows = {h["host"]: h for h in json.loads((out / "rollout-summary.json").read_text())["hosts"]}
    sudo = rows["sudohost"]["failure"]
    assert "sudo: sorry, you must have a tty to run sudo" in sudo, rows["sudohost"]
    unreachable = rows["gpu17"]
    assert unreachable["status"] == "unreachable", unreachable
    for part in ("REMOTE HOST IDENTIFICATION HAS CHANGED", "Offending ED25519 key in /root/.ssh/known_hosts:7",
                 "ssh-keygen -f '/root/.ssh/known_hosts' -R 'gpu17'", "Host key verification failed."):
        assert part in unreachable["failure"], unreachable["failure"]
    assert "@@@@" not in unreachable["failure"]
    table = r.stdout[r.stdout.index("GPUFLEET"):]
    assert "sudo: sorry, you must have a tty" in table and "ssh-keygen -f" in table, table


SERIAL_PLAYBOOK = """
- name: Pretend rollout in batches of one
  hosts: all
  gather_facts: false
  serial: 1
  tasks:
    - name: Fail the first host, which ends the play for every batch
      ansible.builtin.fail:
        msg: broken
      when: inventory_hostname == 'hosta'

    - name: Record a result like the gpu_server role
      ansible.builtin.set_fact:
        gpufleet_server_result: {restarted: true}
"""


def test_hosts_of_later_batches_are_listed_as_not_run(tmp_path):
    # The callback reads the play's hosts of every batch (ansible_play_hosts_all) and this batch
    # (ansible_play_batch) through the public VariableManager API; --limit leaves hostc out entirely.
    base = private_collection(tmp_path / "collections")
    (tmp_path / "pb.yml").write_text(SERIAL_PLAYBOOK)
    out = tmp_path / "out"
    env = clean_env(ANSIBLE_COLLECTIONS_PATH=str(base), ANSIBLE_CALLBACKS_ENABLED="gpufleet.serving.rollout_summary",
                    GPUFLEET_SUMMARY_DIR=str(out), HOME=str(tmp_path))
    r = run([str(BIN / "ansible-playbook"), "-i", "hosta,hostb,hostd,hostc,", "-c", "local", "--limit", "hosta,hostb,hostd",
             "-e", "ansible_python_interpreter=%s" % PY, str(tmp_path / "pb.yml")], cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2, r.stdout[-3000:]
    data = json.loads((out / "rollout-summary.json").read_text())
    assert [(h["host"], h["status"]) for h in data["hosts"]] == [("hosta", "failed"), ("hostb", "not run"),
                                                                 ("hostd", "not run")], data["hosts"]
    assert data["halted"]["batch"] == ["hosta"] and data["halted"]["not_started"] == ["hostb", "hostd"], data["halted"]
    md = (out / "rollout-summary.md").read_text()
    assert md.rstrip().endswith("**%s**" % data["halted"]["msg"]), md


def test_a_host_that_is_or_would_be_put_back_is_not_called_left_out():
    from gpufleet_ci.__main__ import summary_renderer
    r = summary_renderer()
    rows = [{"host": "h1", "status": "ok", "restarted": False, "out_of_rotation": ["haproxy"],
             "returned_to_service": ["haproxy"], "would_return": True},
            {"host": "h2", "status": "ok", "restarted": False, "out_of_rotation": [], "returned_to_service": ["haproxy"]},
            {"host": "h3", "status": "failed", "restarted": True, "out_of_rotation": ["haproxy"]}]
    md = r.render_markdown(rows, None)
    assert "would put back into rotation, left out by an earlier run (drain record): h1 (haproxy)" in md, md
    assert "put back into rotation, left out by an earlier run (drain record): h2 (haproxy)" in md, md
    assert "left out of rotation: h3 (haproxy);" in md and "h1 (haproxy); the next" not in md, md
    # The JSON says the same: a host the run puts back (under --check, would) is not left out (it listed h1 there).
    assert r.summary_json("rollout", rows, None)["out_of_rotation"] == {"h3": ["haproxy"]}
    # A host left out without a failure (the clean playbook's stop) has no cause to fix (helper-39).
    rows = [{"host": "h4", "status": "ok", "restarted": False, "stopped": True, "out_of_rotation": ["haproxy"]}]
    md = r.render_markdown(rows, None)
    assert "left out of rotation, as this playbook does: h4 (haproxy); the next rollout puts it back" in md, md
    assert "once the cause is fixed" not in md, md


def test_a_kept_server_whose_record_is_still_missing_is_named_after_the_table():
    """Bug F: the rerun while the state filesystem stays full keeps the server (rc 0); the summary says its record is
    still missing, not only a warning scrolled by."""
    from gpufleet_ci.__main__ import summary_renderer
    r = summary_renderer()
    why = ("the running server (pid 7) is up to date and kept, but its record still cannot be written "
           "(/var/lib/gpufleet/demo.json: No space left on device): the record is still missing; the next run writes it "
           "once there is room")
    rows = [{"host": "h1", "status": "ok", "restarted": False, "record_missing": why},
            {"host": "h2", "status": "ok", "restarted": False, "record_missing": None}]
    md = r.render_markdown(rows, None)
    assert "**record still missing, server kept: h1 (%s)**" % why in md, md
    assert "h2 (" not in md, md
    assert "record still missing" not in r.render_markdown(rows[1:], None)


def test_a_host_unreachable_during_its_restart_is_not_called_not_restarted(tmp_path):
    """Issue 24: the canary went away in the middle of its server_restart task (rc 4); the restart ran to its end on
    the host, but the summary said `restarted no`. No result came back, so the summary says it does not know. A host
    that went unreachable at another task keeps `no`."""
    fake_ssh = tmp_path / "fake_ssh"
    fake_ssh.write_text("#!/bin/sh\necho 'Timeout, server gpu1 not responding.' >&2\nexit 255\n")
    fake_ssh.chmod(0o755)
    (tmp_path / "pb.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Record a result like the gpu_server role\n"
        "      ansible.builtin.set_fact:\n        gpufleet_server_result: {restarted: false, reasons: [forced]}\n"
        "      delegate_to: localhost\n      delegate_facts: false\n"
        "    - name: Wait like the role's drain\n      ansible.builtin.ping:\n      when: inventory_hostname == 'gpu2'\n"
        "    - name: Restart the server\n      gpufleet.serving.server_restart:\n        name: demo\n"
        "        command: [/bin/true]\n        log_path: /tmp/x.log\n        pidfile: /tmp/x.pid\n")
    (tmp_path / "inv.ini").write_text(
        "gpu1 ansible_connection=ssh ansible_ssh_executable=%s ansible_host=127.0.0.1\n"
        "gpu2 ansible_connection=ssh ansible_ssh_executable=%s ansible_host=127.0.0.1\n" % (fake_ssh, fake_ssh))
    base = private_collection(tmp_path / "collections")
    out = tmp_path / "out"
    env = clean_env(ANSIBLE_COLLECTIONS_PATH=str(base), ANSIBLE_CALLBACKS_ENABLED="gpufleet.serving.rollout_summary",
                    GPUFLEET_SUMMARY_DIR=str(out), HOME=str(tmp_path))
    r = run([str(BIN / "ansible-playbook"), "-i", str(tmp_path / "inv.ini"), str(tmp_path / "pb.yml")],
            cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 4, r.stdout
    rows = {h["host"]: h for h in json.loads((out / "rollout-summary.json").read_text())["hosts"]}
    assert rows["gpu1"]["status"] == "unreachable" and rows["gpu1"]["restart"] == "unknown (unreachable during the restart)"
    assert rows["gpu1"]["restarted"] is None, rows["gpu1"]
    assert rows["gpu2"]["status"] == "unreachable" and rows["gpu2"]["restart"] == "no", rows["gpu2"]
    table = r.stdout[r.stdout.index("GPUFLEET"):]
    assert "unknown (unreachable during the restart)" in table and "not responding" in table, table


NCCL_ONLY_PLAYBOOK = """
- name: Pretend rollout under --tags nccl_tuning
  hosts: all
  gather_facts: false
  tasks:
    - name: Expose what the NCCL tuning changed, like the gpu_server role (no server task runs)
      ansible.builtin.set_fact:
        gpufleet_nccl_changed: "{{ inventory_hostname == 'hosta' }}"
"""


def test_a_run_that_only_tuned_nccl_still_lists_its_hosts(tmp_path):
    """Issue 24: `--tags nccl_tuning` printed no summary at all (no host had a gpufleet_server_result)."""
    base = private_collection(tmp_path / "collections")
    (tmp_path / "pb.yml").write_text(NCCL_ONLY_PLAYBOOK)
    out = tmp_path / "out"
    env = clean_env(ANSIBLE_COLLECTIONS_PATH=str(base), ANSIBLE_CALLBACKS_ENABLED="gpufleet.serving.rollout_summary",
                    GPUFLEET_SUMMARY_DIR=str(out), HOME=str(tmp_path))
    r = run([str(BIN / "ansible-playbook"), "-i", "hosta,hostb,", "-c", "local", "-e", "ansible_python_interpreter=%s" % PY,
             str(tmp_path / "pb.yml")], cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "GPUFLEET ROLLOUT SUMMARY" in r.stdout, r.stdout[-3000:]
    note = ("NCCL layers only, servers not checked or restarted (the run's tags left the gpu_server tasks out; a rollout "
            "without them restarts a server whose workers lack the tuning): hosta (layers changed); hostb (layers "
            "already as asked)")
    assert note in r.stdout, r.stdout[-3000:]
    data = json.loads((out / "rollout-summary.json").read_text())
    assert [(h["host"], h["status"], h["restart"], h["nccl_only"], h["nccl_changed"]) for h in data["hosts"]] == [
        ("hosta", "ok", "no", True, True), ("hostb", "ok", "no", True, False)], data["hosts"]
    assert "**%s**" % note in (out / "rollout-summary.md").read_text()
    # Under --check the layers' write only predicts: a change is "would change" (helper-42).
    r = run([str(BIN / "ansible-playbook"), "-i", "hosta,hostb,", "-c", "local", "-e", "ansible_python_interpreter=%s" % PY,
             "--check", str(tmp_path / "pb.yml")], cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
    assert note.replace("hosta (layers changed)", "hosta (layers would change)") in r.stdout, r.stdout[-3000:]
    assert [h["check_mode"] for h in json.loads((out / "rollout-summary.json").read_text())["hosts"]] == [True, True]


def test_the_rollback_says_what_each_host_went_back_to_and_that_the_inventory_is_unchanged(tmp_path):
    """Issue 26 item 4: the restarted column of the rollback playbook's rows says what each host rolled back to (would,
    already runs it); the hosts rolled back to a definition the inventory does not describe are named after the table,
    with what the next rollout does; a host whose inventory already describes it, a no-op and a failed host are not."""
    from gpufleet_ci.__main__ import summary_renderer
    # This checkout's callback (gpufleet_ci's own fallback is the checkout it was installed from).
    r = summary_renderer(str(private_collection(tmp_path / "collections")))
    a, b = "a" * 64, "b" * 64
    to = {"fingerprint": a, "recorded_at": "T", "from": b, "inventory_fingerprint": b}
    cell = r.rollback_cell
    assert cell({"status": "ok", "restarted": True, "rollback_to": to}, "yes") == "rolled back to " + a[:12]
    assert cell({"status": "ok", "would_restart": True, "rollback_to": to}, "would") == "would roll back to " + a[:12]
    assert cell({"status": "ok", "restarted": False, "rollback_to": to}, "no") == "no, runs %s already" % a[:12]
    assert cell({"status": "failed", "restarted": True, "rollback_to": to}, "killed, not relaunched") == \
        "killed, not relaunched"
    rows = [{"host": "h1", "status": "ok", "restarted": True, "rollback_to": to},
            {"host": "h2", "status": "ok", "restarted": True, "rollback_to": dict(to, inventory_fingerprint=a)},
            {"host": "h3", "status": "ok", "restarted": False, "rollback_to": to},
            {"host": "h4", "status": "failed", "restarted": True, "rollback_to": to}]
    md = r.render_markdown(rows, None)
    assert ("**rolled back: h1 (to %s, the inventory says %s); the inventory is unchanged, so the next rollout restarts "
            "these hosts to the inventory's definition again: change the inventory first (docs/runbook.md)**"
            % (a[:12], b[:12])) in md, md
    assert "h2 (" not in md and "h3 (" not in md and "h4 (" not in md, md
    would = r.render_markdown([dict(rows[0], restarted=False, would_restart=True)], None)
    assert "**would roll back: h1 (to %s" % a[:12] in would, would
    assert "rolled back" not in r.render_markdown(rows[1:], None)


def test_an_automatic_rollback_is_named_after_the_table_with_what_the_next_rollout_would_do():
    """helper-24: after an automatic rollback the inventory still describes the definition that failed; the next
    rollout would restart the host to it again (killing the healthy last known good), which the summary says."""
    from gpufleet_ci.__main__ import summary_renderer
    r = summary_renderer()
    rows = [{"host": "h1", "status": "failed", "restarted": True,
             "rolled_back": {"fingerprint": "0123456789abcdef", "pid": 7, "workers_verified": 2}},
            {"host": "h2", "status": "failed", "restarted": True, "rolled_back": None}]
    md = r.render_markdown(rows, None)
    assert ("rolled back to the last known good: h1 (to 0123456789ab); the inventory still describes the definition "
            "that failed, so the next rollout restarts these hosts to it again") in md, md
    assert "h2 (to" not in md and "rolled back to the last known good" not in r.render_markdown(rows[1:], None)


def test_a_rollback_where_no_server_ran_before_does_not_say_killed():
    """helper-24: a host with no server running whose failed restart went back to its last known good said 'killed,
    rolled back to X' (kill_s 0.00)."""
    from gpufleet_ci.__main__ import summary_renderer
    r = summary_renderer()
    g = {"fingerprint": "0123456789abcdef", "pid": 7, "workers_verified": 2}
    cb = r.CallbackModule()
    for name, killed in (("h1", 2), ("h2", 0)):  # server_restart's `killed`: how many processes it ended
        cb.hosts[name] = {"": {"host": name, "status": "failed", "restarted": True, "killed": killed, "phase": "startup",
                               "timings": {"kill_s": 0.0}, "rolled_back": g}}
    cells = {row["host"]: row["restart"] for row in cb.rows()}
    assert cells == {"h1": "killed, rolled back to 0123456789ab", "h2": "rolled back to 0123456789ab"}, cells


LONG_FAILURE = """
- name: Pretend rollout whose canary failed with a long systemd rollback message
  hosts: all
  gather_facts: false
  tasks:
    - name: Record the failure like the role's rescue (the whole message)
      ansible.builtin.set_fact:
        gpufleet_server_result: {restarted: true, failed: true, failure: "{{ long_failure }}"}

    - name: Fail the host
      ansible.builtin.fail:
        msg: "{{ gpufleet_server_result.failure }}"
"""


def test_a_long_failure_keeps_each_clause_in_the_summary_and_whole_in_the_hosts_failure(tmp_path):
    """Found by the new-user pass (issue 24/26): the role's rescue cut a long failure to its first 150 and last 445
    characters before the summary saw it, losing systemd's exit status and the rollback's own cause."""
    why = ("gpufleet-demo.service exited during start-up after 0.3 s; systemd: Result=exit-code, code=exited, status=1; "
           "journal (journalctl -u gpufleet-demo.service): " + "j" * 300 + " | status=1/FAILURE; log tail "
           "(/var/log/gpufleet/demo.log): " + "t" * 300 + " | RuntimeError: --fail-at-startup asked for")
    msg = ("the rollback to the last known good 0123456789ab failed too (launch of gpufleet-demo.service failed: "
           "systemctl start -- gpufleet-demo.service failed (rc=1)); the new server failed: " + why)
    (tmp_path / "pb.yml").write_text(LONG_FAILURE)
    r, data = _play(tmp_path, tmp_path / "pb.yml", ["h1"], "-e", json.dumps({"long_failure": msg}))
    assert r.returncode == 2, r.stdout
    failure = data["hosts"][0]["failure"]
    assert len(failure) <= 600, len(failure)
    for part in ("the rollback to the last known good 0123456789ab failed too", "; the new server failed: ",
                 "systemd: Result=exit-code, code=exited, status=1", "journal (journalctl -u gpufleet-demo.service)",
                 "log tail (/var/log/gpufleet/demo.log)", "RuntimeError: --fail-at-startup asked for"):
        assert part in failure, (part, failure)
    assert msg in " ".join(r.stdout.split()), r.stdout[-3000:]  # the host's own failure says all of it
