# SPDX-License-Identifier: GPL-3.0-or-later
"""_envcheck, the verify core of process_env and server_restart: statuses of real processes read from /proc
(a launcher whose exec'd child carries the values, a fork-started copy, a process that lacks them), the role
classification and the expected-variables check, without a module."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from helpers import wait_for

from ansible_collections.gpufleet.serving.plugins.module_utils import _envcheck, _nccllog, _proc

PY = sys.executable
EXPECTED = {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring"}


def proc(pid, ppid, cmdline=("python3",)):
    return _proc.Proc(pid=pid, ppid=ppid, pgid=pid, sid=pid, uid=0, state="S", start_time=1, flags=0, comm="python3",
                      cmdline=list(cmdline))


@pytest.mark.parametrize("target,holders,want", [
    # 10 launches 11 (a GPU worker) which starts 12; 20 is unrelated.
    ("workers", {11}, {11: "worker", 12: "worker_descendant"}),
    ("all_selected", {11}, {10: "other", 11: "worker", 12: "worker_descendant", 20: "other"}),
    ("workers", set(), {}),
    ("workers", {10}, {10: "worker", 11: "worker_descendant", 12: "worker_descendant"}),
])
def test_classify(target, holders, want):
    procs = {p.pid: p for p in (proc(10, 1), proc(11, 10), proc(12, 11), proc(20, 1))}
    selected = {pid: ["tag"] for pid in procs}
    assert _envcheck.classify(selected, procs, holders, target) == want


@pytest.mark.parametrize("value,want", [
    ({"NCCL_PROTO": "Simple"}, {"NCCL_PROTO": "Simple"}),
    ({"NCCL_BUFFSIZE": 16777216}, {"NCCL_BUFFSIZE": "16777216"}),
])
def test_normalize_expected(value, want):
    assert _envcheck.normalize_expected(value) == want


@pytest.mark.parametrize("value,msg", [
    ({}, "expected must name at least one variable"),
    ({"A B": "x"}, "variable name"),
    ({"NCCL_PROTO": None}, "NCCL_PROTO"),
])
def test_normalize_expected_refuses(value, msg):
    with pytest.raises(_envcheck.EnvCheckError, match=msg):
        _envcheck.normalize_expected(value)


@pytest.fixture
def tree(tmp_path):
    """A real launcher (without the values in its exec-time environ) that sets them in-process, then starts an
    exec'd child (carries them) and a fork-started copy of itself (the launcher's environ block, no exec)."""
    ready = tmp_path / "ready"
    code = textwrap.dedent("""
        import multiprocessing as mp, os, subprocess, sys, time
        def idle():
            time.sleep(120)
        if __name__ == "__main__":
            os.environ.update(NCCL_PROTO="Simple", NCCL_ALGO="Ring")  # what sitecustomize does after exec
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            fork = mp.get_context("fork").Process(target=idle)
            fork.start()
            with open(sys.argv[1], "w") as f:
                f.write("%d %d" % (child.pid, fork.pid))
            time.sleep(120)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    launcher = subprocess.Popen([PY, "-c", code, str(ready)], env=env, start_new_session=True)
    wait_for(lambda: ready.exists() and ready.read_text(), 20, "launcher tree up")
    child, fork = (int(x) for x in ready.read_text().split())
    yield launcher.pid, child, fork
    os.killpg(launcher.pid, 9)
    launcher.wait()


def test_launcher_and_fork_are_explained_by_the_exec_child(tree):
    launcher, child, fork = tree
    procs = _proc.snapshot()
    selected = {pid: ["tag"] for pid in (launcher, child, fork)}
    res = _envcheck.check(EXPECTED, selected, procs, holders={child}, target="all_selected")
    by = {r["pid"]: r for r in res["processes"]}
    assert by[child]["status"] == "ok" and by[child]["env"] == EXPECTED and by[child]["role"] == "worker"
    assert by[launcher]["status"] == "explained" and by[launcher]["explanation"].startswith("launcher: ")
    assert str(child) in by[launcher]["explanation"]
    assert sorted(by[launcher]["missing"]) == ["NCCL_ALGO", "NCCL_PROTO"]
    assert by[fork]["status"] == "explained" and by[fork]["explanation"].startswith("fork-started child of %d" % launcher)
    assert (res["checked"], res["ok"], res["explained"], res["wrong"], res["gone"]) == (3, 1, 2, [], [])
    # Only the expected keys are read from an environ (it holds tokens).
    assert all(set(r["env"]) == set(EXPECTED) for r in res["processes"])


def test_a_process_without_the_values_and_no_carrier_is_wrong(tree):
    launcher, child, _fork = tree
    procs = _proc.snapshot()
    want = dict(EXPECTED, NCCL_PROTO="LL")  # the child carries Simple: different, and nothing vouches for the launcher
    res = _envcheck.check(want, {launcher: ["tag"], child: ["tag"]}, procs, holders=set(), target="all_selected")
    by = {r["pid"]: r for r in res["processes"]}
    assert by[child]["status"] == "wrong" and by[child]["mismatched"] == ["NCCL_PROTO"] and by[child]["missing"] == []
    assert by[launcher]["status"] == "wrong" and by[launcher]["missing"] == ["NCCL_ALGO", "NCCL_PROTO"]
    assert res["wrong"] == sorted([launcher, child])


def test_nccl_log_confirms_and_contradicts_per_pid(tree):
    launcher, child, _fork = tree
    procs = _proc.snapshot()
    entries = [_nccllog.Entry(pid=child, name="NCCL_PROTO", value="LL", invalid=False, line=1, path="log")]
    res = _envcheck.check(EXPECTED, {child: ["tag"]}, procs, holders={child}, target="workers", log_entries=entries)
    [row] = res["processes"]
    assert row["status"] == "wrong" and row["nccl_log_contradicted"] == ["NCCL_PROTO"]
    assert res["nccl_log"] is not None


def test_a_gone_process_is_listed_as_gone():
    p = subprocess.Popen([PY, "-c", "pass"])
    p.wait()
    procs = {p.pid: proc(p.pid, os.getpid())}
    res = _envcheck.check(EXPECTED, {p.pid: ["pids"]}, procs, holders=set(), target="all_selected")
    assert res["gone"] == [p.pid] and res["checked"] == 0 and res["processes"] == []


def test_nvml_holders_lists_the_fake_gpus_processes(nvml):
    holder = nvml.hold(gpu=1, mib=1024)
    pids, notes = _envcheck.nvml_holders("nvml")
    assert holder.pid in pids and notes == []


def test_nvml_holders_without_a_backend_is_a_note(nvml, tmp_path, monkeypatch):
    nvml.configure(gpus=2, init_error="LIBRARY_NOT_FOUND")
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi either
    pids, notes = _envcheck.nvml_holders("auto")
    assert pids == set() and len(notes) == 1 and "/dev/nvidia* only" in notes[0]
