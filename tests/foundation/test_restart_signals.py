# SPDX-License-Identifier: GPL-3.0-or-later
"""server_restart through the real ansible-playbook CLI with the local connection: a SIGTERM to ansible-playbook in the
middle of a restart does not stop the cycle on the host. ansible-playbook passes SIGTERM on to its workers' process
groups, and with the local connection the module is in one (over ssh it is not: test_rel_faults_lock)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from helpers import PY, ROOT, VENV_BIN, pid_alive

pytestmark = pytest.mark.slow
DEMO = ROOT / "tests" / "sandbox" / "demo_server.py"
PLAY = """
- name: Restart the demo server
  hosts: all
  gather_facts: false
  tasks:
    - name: Restart it
      gpufleet.serving.server_restart: "{{ restart_args }}"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tagged(tag: str) -> list:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if tag.encode() in open("/proc/%s/environ" % d, "rb").read().split(b"\0"):
                    out.append(int(d))
            except OSError:
                pass
    return out


def test_sigterm_to_ansible_playbook_mid_restart_does_not_stop_the_cycle(fake_gpus, tmp_path):
    port = _free_port()
    lock, state, pidfile = tmp_path / "demo.lock", tmp_path / "demo.json", tmp_path / "demo.pid"
    args = {
        "name": "demo%d" % os.getpid(), "tag_name": "GPUFLEET_TEST_SIGNALS",
        # Loading for 4 s: the SIGTERM comes while the cycle waits for the new server.
        "command": [sys.executable, str(DEMO), "--port", str(port), "--host", "127.0.0.1", "--tp", "1", "--gpus", "0",
                    "--mib", "2000", "--startup-delay", "4", "--state-dir", str(tmp_path / "demo")],
        "env": {k: v for k, v in fake_gpus.env.items() if k in ("FAKE_NVML_CONFIG", "PYTHONPATH")},
        "log_path": str(tmp_path / "demo.log"), "pidfile": str(pidfile), "gpus": [0],
        "kill": {"grace": 2, "final_wait": 2},
        "wait_clean": {"timeout": 10},
        "wait_ready": {"health_url": "http://127.0.0.1:%d/health" % port, "timeout": 60, "interval": 0.1},
        "record": {"state_file": str(state), "fingerprint": "f" * 64},
        "release_lock": {"lock_file": str(lock), "owner": "ctl:1:signals"},
    }
    lock.write_text(json.dumps({"owner": "ctl:1:signals", "acquired": time.time(), "expires": time.time() + 600}))
    os.chmod(lock, 0o600)
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "vars.json").write_text(json.dumps({"restart_args": args}))
    env = dict(fake_gpus.env, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    out = open(tmp_path / "play.log", "w")
    try:
        p = subprocess.Popen([str(VENV_BIN / "ansible-playbook"), str(tmp_path / "play.yml"), "-i", "localhost,",
                              "-c", "local", "-e", "ansible_python_interpreter=%s" % PY, "-e", "@%s" % (tmp_path / "vars.json")],
                             cwd=str(ROOT), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        # The cycle has started on the host once the lock names the module's process; the server is then loading.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "worker" not in lock.read_text():
            time.sleep(0.05)
        worker = json.loads(lock.read_text()).get("worker")
        assert worker, (tmp_path / "play.log").read_text()[-3000:]
        time.sleep(1.0)
        p.send_signal(signal.SIGTERM)  # to ansible-playbook's pid alone, as an operator's `kill PID` does
        p.wait(timeout=30)
        # The module goes on: the lock is released and the new server recorded once it answers.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (lock.exists() or not state.exists()):
            time.sleep(0.1)
        log = (tmp_path / "play.log").read_text()[-3000:]
        assert not lock.exists(), "the restart died with its controller: lock left behind\n" + log
        recorded = json.loads(state.read_text())
        assert recorded["pid"] == int(pidfile.read_text().split()[0]) and pid_alive(recorded["pid"]), recorded
        assert recorded["pid"] in _tagged("GPUFLEET_TEST_SIGNALS=" + args["name"])
    finally:
        out.close()
        for pid in _tagged("GPUFLEET_TEST_SIGNALS=" + args["name"]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
