# SPDX-License-Identifier: GPL-3.0-or-later
"""The demo inference server (tests/sandbox/demo_server.py) run locally against the fake NVML: its fault modes."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import pid_alive, wait_for

DEMO = Path(__file__).resolve().parent.parent / "sandbox" / "demo_server.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Demo:
    def __init__(self, fake_gpus, tmp_path: Path, *flags: str, env: dict = None) -> None:
        self.port = _free_port()
        self.state = tmp_path / ("demo-%d" % self.port)
        self.log = tmp_path / ("demo-%d.log" % self.port)
        e = dict(fake_gpus.env, **(env or {}))
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen([sys.executable, str(DEMO), "--host", "127.0.0.1", "--port", str(self.port),
                                          "--tp", "2", "--mib", "1000", "--state-dir", str(self.state)] + list(flags),
                                         env=e, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        self.workers: list = []

    def get(self, path: str, timeout: float = 2.0):
        return self.request("GET", path, None, timeout)

    def request(self, method: str, path: str, body, timeout: float = 2.0):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=data, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        except OSError:
            return 0, None

    def wait_healthy(self) -> None:
        wait_for(lambda: self.get("/health")[0] == 200, 20, "demo server healthy")
        self.workers = json.loads((self.state / "launcher.json").read_text())["workers"]

    def kill_all(self) -> None:
        for pid in [self.proc.pid] + self.workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)


@pytest.fixture
def demo(fake_gpus, tmp_path):
    made = []

    def make(*flags, env=None):
        d = Demo(fake_gpus, tmp_path, *flags, env=env)
        made.append(d)
        return d

    yield make
    for d in made:
        d.kill_all()


def _held_mib(fake_gpus, gpu: int) -> int:
    total = 0
    for n in os.listdir(fake_gpus.state):
        if n.startswith("hold-%d-" % gpu) and not n.endswith(".dead"):
            pid = int(n.split("-")[2])
            if pid_alive(pid):
                total += int((fake_gpus.state / n).read_text())
    return total


def test_generate_goes_through_every_worker_and_sigterm_stops_them(demo, fake_gpus):
    d = demo(env={"NCCL_DEBUG": "WARN", "NCCL_P2P_LEVEL": "NVL", "GPUFLEET_X": "1", "HF_TOKEN": "secret"})
    assert d.get("/health")[0] in (0, 503)
    d.wait_healthy()
    status, body = d.request("POST", "/generate", {"text": "a b c", "max_new_tokens": 8})
    assert status == 200 and [w["pid"] for w in body["meta_info"]["workers"]] == d.workers
    assert _held_mib(fake_gpus, 0) == 1000 and _held_mib(fake_gpus, 1) == 1000
    recs = d.get("/workers")[1]["workers"]
    # The suite's own GPUFLEET_ANSIBALLZ_MEMO (tests/conftest.py) reaches every process it starts: not the demo's concern.
    envs = [{k: v for k, v in r["env"].items() if k != "GPUFLEET_ANSIBALLZ_MEMO"} for r in recs]
    assert envs == [{"GPUFLEET_X": "1", "NCCL_DEBUG": "WARN", "NCCL_P2P_LEVEL": "NVL"}] * 2
    assert "NCCL INFO" not in d.log.read_text()  # only with NCCL_DEBUG=INFO
    os.kill(d.proc.pid, signal.SIGTERM)
    assert d.proc.wait(10) == 0
    wait_for(lambda: not any(pid_alive(p) for p in d.workers), 10, "workers stopped with the launcher")


def test_hang_after_health_answers_health_but_never_generate(demo):
    d = demo("--hang-after-health")
    d.wait_healthy()
    assert d.request("POST", "/generate", {"text": "x"}, timeout=1.5) == (0, None)
    assert d.get("/health") == (200, {"status": "ok"})


def test_fail_at_startup_exits_nonzero_with_an_error_in_its_log(demo):
    d = demo("--fail-at-startup")
    assert d.proc.wait(10) == 1
    assert "RuntimeError: demo failure at startup" in d.log.read_text()


def test_log_option_sends_the_servers_messages_to_its_own_file_only(demo, tmp_path):
    own = tmp_path / "own.log"
    d = demo("--fail-at-startup", "--log", str(own))
    assert d.proc.wait(10) == 1
    assert "RuntimeError: demo failure at startup" in own.read_text()
    assert d.log.read_text() == ""  # stdout/stderr: nothing


def test_ignore_term_survives_sigterm_and_sigkill_leaves_orphans_holding_gpus(demo, fake_gpus):
    d = demo("--ignore-term")
    d.wait_healthy()
    os.kill(d.proc.pid, signal.SIGTERM)
    for p in d.workers:
        os.kill(p, signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        d.proc.wait(0.5)
    assert all(pid_alive(p) for p in d.workers)
    os.kill(d.proc.pid, signal.SIGKILL)
    d.proc.wait(5)
    assert all(pid_alive(p) for p in d.workers) and _held_mib(fake_gpus, 0) == 1000


def test_a_worker_dying_takes_the_launcher_down(demo):
    d = demo()
    d.wait_healthy()
    os.kill(d.workers[1], signal.SIGKILL)
    assert d.proc.wait(10) == 1
    wait_for(lambda: not pid_alive(d.workers[0]), 10, "the other worker stopped")
    assert "exited unexpectedly" in d.log.read_text()
