# SPDX-License-Identifier: GPL-3.0-or-later
"""Fixtures for foundation tests: real server-like process trees and an unrelated bystander.

Every process a test starts is recorded by (pid, start time) and, if still alive at teardown,
SIGKILLed by that exact identity; nothing is ever killed by name.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import typing as t
from pathlib import Path

import pytest

from helpers import PY, ROOT, service_tag, wait_for

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tests" / "unit"))  # smi_stub, collection_copy
from collection_copy import use_private_collections  # noqa: E402

# Imports and ansible-playbook runs (ANSIBLE_COLLECTIONS_PATH) use a copy no concurrent run rewrites.
use_private_collections()


def _proc():
    from ansible_collections.gpufleet.serving.plugins.module_utils import _proc as p

    return p


class Tree(t.NamedTuple):
    popen: subprocess.Popen
    launcher: int
    workers: t.List[int]
    members: t.Dict[int, int]  # pid -> start time, launcher + every descendant at start
    pidfile: t.Optional[Path]

    def alive(self) -> t.List[int]:
        p = _proc()
        return sorted(pid for pid, st in self.members.items() if p.is_alive((pid, st)))


class Spawned:
    def __init__(self) -> None:
        self.identities: t.Dict[int, int] = {}
        self.popens: t.List[subprocess.Popen] = []

    def track(self, pid: int) -> None:
        info = _proc().read_proc(pid)
        if info is not None:
            self.identities[pid] = info.start_time

    def cleanup(self) -> None:
        p = _proc()
        for pid, st in self.identities.items():
            if p.is_alive((pid, st)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for po in self.popens:
            if po.poll() is None:
                po.kill()
            po.wait()


@pytest.fixture
def spawned():
    s = Spawned()
    yield s
    s.cleanup()


@pytest.fixture
def launch(fake_gpus, tmp_path, spawned):
    """Start the stand-in server (tests/foundation/launcher.py); return its Tree once workers hold memory."""
    count = [0]

    def start(workers: int = 2, mib: int = 1000, tag: t.Optional[str] = service_tag("x"), setsid: bool = True,
              worker_ignore_term: bool = False, ignore_term: bool = False, pidfile: bool = False,
              marker: str = "", env: t.Optional[t.Dict[str, str]] = None) -> Tree:
        count[0] += 1
        e = dict(fake_gpus.env)
        e.pop("GPUFLEET_SERVICE", None)
        if tag:
            k, v = tag.split("=", 1)
            e[k] = v
        e.update(env or {})
        ready = tmp_path / ("ready-%d.json" % count[0])
        pf = tmp_path / ("server-%d.pid" % count[0]) if pidfile else None
        argv = [PY, str(HERE / "launcher.py"), "--ready", str(ready), "--workers", str(workers), "--mib", str(mib)]
        if worker_ignore_term:
            argv.append("--worker-ignore-term")
        if ignore_term:
            argv.append("--ignore-term")
        if pf:
            argv += ["--pidfile", str(pf)]
        if marker:
            argv += ["--marker", marker]
        po = subprocess.Popen(argv, env=e, start_new_session=setsid)
        spawned.popens.append(po)
        spawned.track(po.pid)
        wait_for(lambda: ready.exists() or po.poll() is not None, 60, "launcher ready")
        assert po.poll() is None, "launcher exited with %s" % po.returncode
        data = json.loads(ready.read_text())
        snap = _proc().snapshot()
        members = {po.pid: snap[po.pid].start_time}
        for pid in _proc().descendants([po.pid], snap):
            members[pid] = snap[pid].start_time
        for pid in members:
            spawned.track(pid)
        assert set(data["workers"]) <= set(members)
        return Tree(po, data["launcher"], data["workers"], members, pf)

    return start


@pytest.fixture
def sleeper(spawned):
    """Start a plain sleeping python process (own session unless told otherwise); returns its Popen."""

    def start(*args: str, ignore_term: bool = False, **popen: t.Any) -> subprocess.Popen:
        code = ("import signal, sys, time\n"
                "if %r: signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('ready', flush=True)\ntime.sleep(600)\n") % ignore_term
        popen.setdefault("start_new_session", True)
        po = subprocess.Popen([PY, "-c", code] + list(args), stdout=subprocess.PIPE, text=True, **popen)
        assert po.stdout.readline().strip() == "ready"
        spawned.popens.append(po)
        spawned.track(po.pid)
        return po

    return start


@pytest.fixture(scope="module")
def bystander():
    """An unrelated process that matches no selector; every test of the module asserts it survived."""
    po = subprocess.Popen([PY, "-c", "import time; time.sleep(3600)", "innocent-bystander"], start_new_session=True)
    yield po
    po.kill()
    po.wait()


@pytest.fixture(autouse=True)
def bystander_survives(request, bystander):
    yield
    assert bystander.poll() is None, "an unrelated process was killed by %s" % request.node.name
