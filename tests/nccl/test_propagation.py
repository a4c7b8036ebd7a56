# SPDX-License-Identifier: GPL-3.0-or-later
"""The issue's 'done when': after the role runs, a server started on the tuned interpreter has spawn workers
that carry every tuned variable in /proc/PID/environ, shown by process_env through a real playbook; the
launcher (which ran sitecustomize itself) and a fork-started child are explained, not failed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from helpers import FAKE_NVML_DIR, wait_for
from nccl_helpers import HERE, play

PCIE = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}


@pytest.fixture
def server(tmp_path, fake_gpus):
    started = []

    def start(python, tag, nccl_log=None):
        ready = tmp_path / ("ready-%s.json" % tag)
        env = {k: v for k, v in fake_gpus.env.items() if not k.startswith("NCCL_")}
        env["PYTHONPATH"] = str(FAKE_NVML_DIR)
        env["GPUFLEET_SERVICE"] = tag
        argv = [str(python), str(HERE / "spawn_server.py"), "--ready", str(ready), "--fork-child"]
        if nccl_log:
            argv += ["--nccl-log", str(nccl_log)]
        p = subprocess.Popen(argv, env=env, start_new_session=True)
        started.append(p)
        wait_for(lambda: ready.exists() or p.poll() is not None, 60, "server ready")
        assert p.poll() is None, "server exited"
        return json.loads(ready.read_text())

    yield start
    for p in started:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def check(title, register, tag, expected, **kw):
    return dict({"name": title, "register": register,
                 "gpufleet.serving.process_env": dict(tag="GPUFLEET_SERVICE=%s" % tag, expected=expected, **kw)},
                ignore_errors=True)


def test_spawn_workers_of_a_server_started_after_the_role_carry_every_variable(tmp_path, syspy, server, fake_gpus):
    proc, res = play(tmp_path, [{"name": "Tune", "ansible.builtin.include_role": {"name": "gpufleet.serving.nccl_tuning"},
                                 "vars": {"gpufleet_nccl_profile": "pcie_only",
                                          "gpufleet_nccl_interpreters": [str(syspy.python)]}}],
                     ["gpufleet_nccl_effective_env"], name="tune")
    assert proc.returncode == 0, proc.stdout
    assert res["gpufleet_nccl_effective_env"] == PCIE

    tag = "nccl-%s" % uuid.uuid4().hex[:8]
    log = tmp_path / "nccl.log"
    srv = server(syspy.python, tag, nccl_log=log)
    workers, launcher, forked = srv["workers"], srv["launcher"], srv["fork_child"]
    # The independent look at /proc: the exec-time rule as measured on an H200.
    for w in workers:
        env = dict(kv.split("=", 1) for kv in Path("/proc/%d/environ" % w).read_bytes().decode().split("\0") if "=" in kv)
        assert {k: env.get(k) for k in PCIE} == PCIE
    launcher_env = Path("/proc/%d/environ" % launcher).read_bytes().decode()
    assert "NCCL_PROTO=" not in launcher_env

    bad_log = tmp_path / "contradicting.log"
    bad_log.write_text("gpu-pcie-07:%d:%d [0] NCCL INFO NCCL_PROTO set by environment to Simple\n" % (workers[0], workers[0]))
    tasks = [
        check("Workers (default target)", "workers", tag, PCIE),
        check("Every selected process", "all", tag, PCIE, target="all_selected"),
        check("NCCL's log confirms the workers' values", "log", tag, PCIE, nccl_log=[str(log)], require_confirmed=True),
        check("A log that contradicts", "bad", tag, PCIE, nccl_log=[str(bad_log)]),
    ]
    proc, res = play(tmp_path, tasks, ["workers", "all", "log", "bad"], name="verify", env=fake_gpus.env)
    assert proc.returncode == 0, proc.stdout

    r = res["workers"]
    assert not r.get("failed"), r.get("msg")
    assert sorted(p["pid"] for p in r["processes"]) == sorted(workers)
    assert all(p["status"] == "ok" and p["role"] == "worker" and p["env"] == PCIE for p in r["processes"])

    r = res["all"]
    assert not r.get("failed"), r.get("msg")
    by_pid = {p["pid"]: p for p in r["processes"]}
    assert by_pid[launcher]["status"] == "explained" and by_pid[launcher]["explanation"].startswith("launcher:")
    assert sorted(by_pid[launcher]["missing"]) == sorted(PCIE)
    assert by_pid[forked]["status"] == "explained" and by_pid[forked]["explanation"].startswith("fork-started child of %d" % launcher)
    assert all(by_pid[w]["status"] == "ok" for w in workers)
    # Only expected keys are ever returned: no GPUFLEET_SERVICE, PATH, FAKE_NVML_CONFIG ...
    assert all(set(p["env"]) == set(PCIE) for p in r["processes"])

    r = res["log"]
    assert not r.get("failed"), r.get("msg")
    assert r["nccl_log"]["confirmed"] == sorted(PCIE)
    assert sorted(r["nccl_log"]["pids"]) == sorted(str(w) for w in workers)

    r = res["bad"]
    assert r["failed"] and "NCCL log contradicts NCCL_PROTO" in r["msg"] and str(workers[0]) in r["msg"]
    assert r["nccl_log"]["pids"][str(workers[0])]["NCCL_PROTO"] == {
        "status": "contradicted", "logged": "Simple", "invalid": False, "source": "%s:1" % bad_log}


def test_untuned_server_fails_listing_the_missing_variables(tmp_path, syspy, server, fake_gpus):
    tag = "nccl-%s" % uuid.uuid4().hex[:8]
    srv = server(syspy.python, tag)
    tasks = [
        check("Workers of an untuned server", "workers", tag, PCIE),
        check("Launcher of an untuned server", "all", tag, PCIE, target="all_selected"),
        check("Nothing matches", "empty", "no-such-service", PCIE),
        check("Nothing matches, allowed", "allowed", "no-such-service", PCIE, allow_empty=True),
        check("Non-GPU selection with the workers target", "nogpu", tag, PCIE, pids=[srv["launcher"]],
              include_descendants=False, include_groups=False),
    ]
    # The last selection is pids only (tag given too, so the union is the whole tree): use a dedicated one.
    tasks[-1]["gpufleet.serving.process_env"].pop("tag")
    # The nccl.conf layer: NCCL read the values from the file, so they are not in environ; only its log shows them.
    conf_log = tmp_path / "nccl-conf.log"
    conf_log.write_text("".join("gpu-pcie-07:%d:%d [0] NCCL INFO %s set by environment to %s\n" % (w, w, k, v)
                                for w in srv["workers"] for k, v in sorted({"NCCL_P2P_LEVEL": "SYS", "NCCL_BUFFSIZE": "16777216."}.items())))
    conf_vars = {"NCCL_P2P_LEVEL": "SYS", "NCCL_BUFFSIZE": "16777216"}
    tasks += [
        check("nccl.conf layer proven by NCCL's log", "conf", tag, conf_vars, nccl_log=[str(conf_log)]),
        check("Confirmation required but NCCL_PROTO never logged", "req", tag, dict(conf_vars, NCCL_PROTO="LL"),
              nccl_log=[str(conf_log)], require_confirmed=True),
    ]
    proc, res = play(tmp_path, tasks, ["workers", "all", "empty", "allowed", "nogpu", "conf", "req"], name="verify",
                     env=fake_gpus.env)
    assert proc.returncode == 0, proc.stdout

    r = res["workers"]
    assert r["failed"] and r["wrong"] == sorted(srv["workers"])
    assert "2 of 2 checked process(es) lack the expected environment" in r["msg"]
    assert "missing NCCL_ALGO, NCCL_BUFFSIZE, NCCL_MAX_NCHANNELS, NCCL_NTHREADS, NCCL_P2P_LEVEL, NCCL_PROTO" in r["msg"]

    r = res["all"]
    by_pid = {p["pid"]: p for p in r["processes"]}
    assert r["failed"] and by_pid[srv["launcher"]]["status"] == "wrong"  # no exec'd child carries them: no excuse
    assert by_pid[srv["fork_child"]]["status"] == "wrong"

    assert res["empty"]["failed"] and "No process matched" in res["empty"]["msg"]
    assert not res["allowed"].get("failed") and res["allowed"]["checked"] == 0
    assert res["nogpu"]["failed"] and "none holds a GPU" in res["nogpu"]["msg"]

    r = res["conf"]
    assert not r.get("failed"), r.get("msg")
    assert all(p["status"] == "ok" and p["env"] == {k: None for k in conf_vars} for p in r["processes"])
    assert r["nccl_log"]["confirmed"] == sorted(conf_vars)
    r = res["req"]
    assert r["failed"] and "does not confirm NCCL_PROTO" in r["msg"]
