# SPDX-License-Identifier: GPL-3.0-or-later
"""Faults across a 3-host sandbox fleet, each provoked before or during a real gpufleet.serving.rollout
(ansible-runner, the way CI runs it): a GPU holder no kill step may touch, a server that dies at start-up,
a server that hangs after /health, and a host whose network goes away between batches."""
from __future__ import annotations

import subprocess
import threading

import pytest

from gpufleet_ci import sandbox
from rel_helpers import (FAKE_GPU, ROLLOUT_SITE, close_ssh_master, gpu_holders, host_py, host_state, ps,
                         read_host_file, reset_host, runner_play, sh, start_bg, summary, wait_for)

pytestmark = pytest.mark.sandbox

HOSTS = ["host1", "host2", "host3"]
# One module call runs kill, strays, the clean gate, launch and readiness; its result holds each step's.
RESTART_TASK = "Restart the server (kill, verify clean, launch, wait ready, verify the workers' environment, record)"
READY_TASK = RESTART_TASK
CHECK_TASK = "Check the running server against the desired state (and take the host lock)"


@pytest.fixture(scope="module")
def fleet(sandbox_fleet_module):
    return sandbox_fleet_module(hosts=3, gpus=2)


@pytest.fixture
def bare(fleet):
    """The fleet with every host reset (the fleet itself goes with the module)."""
    for h in HOSTS:
        reset_host(fleet, h)
    return fleet


def _vars(fleet, **over):
    gv = sandbox.server_vars(fleet.python, mib=1000)
    gv.pop("gpufleet_nccl_profile")  # not what these faults are about; keeps each rollout short
    # Short gates; no post-launch checks that these faults do not need (each task is an ssh round trip).
    gv.update(gpufleet_server_kill_grace=1, gpufleet_server_clean_timeout=3, gpufleet_server_verify_env=False,
              gpufleet_server_expect_gpu_processes=0)
    gv.update(over)
    return gv


def _rollout(fleet, tmp_path, gv, host_vars=None, serial=None, max_fail=None, ident="run"):
    inv = tmp_path / ("servers-%s.yml" % ident)
    inv.write_text(sandbox.servers_inventory(HOSTS, gv, host_vars))
    ev = {}
    if serial is not None:
        ev["gpufleet_rollout_serial"] = serial
    if max_fail is not None:
        ev["gpufleet_rollout_max_fail_percentage"] = max_fail
    return runner_play(tmp_path, ROLLOUT_SITE, [fleet.inventory, inv], extravars=ev, ident=ident)


def _launches(fleet, host):
    return (read_host_file(fleet, host, "/var/log/gpufleet/demo.log") or "").count("==== gpufleet launch")


@pytest.mark.reliability(
    section="fault", case="GPU held by a process no kill step may touch",
    provoked="on host2, a process named nvidia_gpu_exporter holds fake GPU memory on GPU 0 (the default exclude list "
             "protects it even with gpufleet_server_kill_gpu_strays=true); batches [2, 1], max_fail_percentage 50",
    outcome="host2 fails at the clean gate before the kill (nothing stopped; refused by the role's check, before the "
            "drain and the restart) with a message listing the holder's pid "
            "and command line and saying it is never killed; no server is launched on host2 and the holder is alive; "
            "1 of 2 failed is not above 50 %, so host3 is rolled out")
def test_unkillable_gpu_holder_fails_the_clean_gate_and_nothing_is_launched(bare, tmp_path):
    fleet = bare
    sh(fleet, "host2", "ln -sf %s /usr/local/bin/nvidia_gpu_exporter" % FAKE_GPU)
    start_bg(fleet, "host2", [fleet.python, "/usr/local/bin/nvidia_gpu_exporter", "hold", "--gpu", "0", "--mib", "700"])
    holder = wait_for(lambda: gpu_holders(fleet, "host2")[0], 60, "exporter holding GPU 0")[0]

    run = _rollout(fleet, tmp_path, _vars(fleet, gpufleet_server_kill_gpu_strays=True), serial=[2, 1], max_fail=50)

    assert run.rc != 0
    s = summary(run)
    assert s["host2"]["status"] == "failed" and s["host2"]["restarted"] is False, s["host2"]
    # The role's check refuses it, before the drain and the restart, with the restart's own words and result shape.
    clean = run.task("host2", CHECK_TASK)
    assert clean["event"] == "runner_on_failed", clean
    assert run.task("host2", RESTART_TASK) is None
    failed = clean["res"]
    assert failed["msg"].startswith("fails at the clean gate, before the kill: GPUs not clean"), failed["msg"]
    assert "pid %d" % holder in failed["msg"], failed["msg"]
    assert "nvidia_gpu_exporter hold --gpu 0" in failed["msg"], failed["msg"]
    assert "adopt" not in failed["msg"], failed["msg"]  # strays were on: the holder was excluded, not overlooked
    assert "pid %d: never killed (excluded by " % holder in failed["msg"], failed["msg"]
    assert failed["msg"].endswith(", stop it by hand"), failed["msg"]
    # Refused before either kill step: nothing was signalled.
    assert "strays" not in failed and "kill" not in failed and failed.get("killed", 0) == 0, failed
    assert failed["phase"] == "clean" and failed.get("pid") is None and not failed.get("changed"), failed
    assert [h["pid"] for h in failed["clean"]["holders"]] == [holder] and failed["clean"]["before_kill"], failed["clean"]
    assert _launches(fleet, "host2") == 0
    assert gpu_holders(fleet, "host2")[0] == [holder] and holder in ps(fleet, "host2")
    assert not [p for p in ps(fleet, "host2").values() if p["tag"]]
    for h in ("host1", "host3"):
        assert s[h]["status"] == "ok" and s[h]["restarted"] is True, s[h]
        assert _launches(fleet, h) == 1


@pytest.mark.reliability(
    section="fault", case="Server exits during start-up",
    provoked="host1's command gets --fail-at-startup (logs a RuntimeError, exits 1) with gpufleet_server_start_timeout 120",
    outcome="the readiness gate fails within seconds, not after 120 s (task < 20 s, < 60 s from the rollout's start), "
            "phase startup, and the failure message carries the log tail with the RuntimeError")
def test_server_dying_at_startup_fails_fast_with_the_log_tail(hang_run):
    run = hang_run
    ready = run.task("host1", READY_TASK)
    assert ready["event"] == "runner_on_failed"
    assert ready["res"]["phase"] == "startup"
    assert ready["duration"] < 20, ready["duration"]
    # From the start of the rollout to host1's failure (other hosts of the batch go on meanwhile).
    assert run.seconds_until("host1", READY_TASK) < 60, run.seconds_until("host1", READY_TASK)
    assert "exited during start-up" in ready["res"]["msg"]
    assert "RuntimeError: demo failure at startup" in ready["res"]["msg"], ready["res"]["msg"]
    assert "RuntimeError: demo failure at startup" in summary(run)["host1"]["failure"]


@pytest.mark.reliability(
    section="fault", case="/health says 200 but a real request never returns",
    provoked="host2 and host3 run the demo server with --hang-after-health; host2 has gpufleet_server_health_request "
             "(POST /generate, 2 s per try), host3 has none; start timeout 15 s",
    outcome="host2 fails the readiness gate with 'health answered 200 but the real request did not succeed'; host3, "
            "checked by /health alone, passes although its /generate hangs (which is why the request matters)")
def test_health_200_but_hung_server_fails_only_with_the_real_request(fleet, hang_run):
    run = hang_run
    ready2 = run.task("host2", READY_TASK)
    assert ready2["event"] == "runner_on_failed" and ready2["res"]["phase"] == "ready", ready2["res"]
    assert ready2["res"]["health_ok"] is True
    assert "/health answered 200 but the real request did not succeed" in ready2["res"]["msg"], ready2["res"]["msg"]
    assert summary(run)["host2"]["status"] == "failed"
    assert run.task("host3", READY_TASK)["event"] == "runner_on_ok"
    assert summary(run)["host3"]["status"] == "ok" and summary(run)["host3"]["restarted"] is True
    # host3 passed on /health alone, yet it cannot serve.
    probe = host_py(fleet, "host3", PROBE)
    assert probe == {"health": 200, "generate": "timeout"}, probe


PROBE = r"""
import json, socket, urllib.request
out = {"health": urllib.request.urlopen("http://127.0.0.1:30000/health", timeout=5).status}
req = urllib.request.Request("http://127.0.0.1:30000/generate", data=b'{"text": "x"}', method="POST")
try:
    urllib.request.urlopen(req, timeout=2)
    out["generate"] = "answered"
except (socket.timeout, TimeoutError):
    out["generate"] = "timeout"
except Exception as e:
    out["generate"] = repr(e)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def hang_run(fleet, tmp_path_factory):
    """One rollout, all hosts in one batch: host1 dies at start-up, host2 and host3 hang after /health."""
    for h in HOSTS:
        reset_host(fleet, h)
    tmp_path = tmp_path_factory.mktemp("rel-hang")
    gv = _vars(fleet, gpufleet_server_start_timeout=15)
    cmd = gv["gpufleet_server_command"]
    req = dict(gv["gpufleet_server_health_request"], timeout=2)
    host_vars = {
        "host1": {"gpufleet_server_command": cmd + ["--fail-at-startup"], "gpufleet_server_start_timeout": 120},
        "host2": {"gpufleet_server_command": cmd + ["--hang-after-health"], "gpufleet_server_health_request": req},
        "host3": {"gpufleet_server_command": cmd + ["--hang-after-health"], "gpufleet_server_health_request": {}},
    }
    return _rollout(fleet, tmp_path, gv, host_vars, serial=["100%"], max_fail=100)


@pytest.mark.reliability(
    section="fault", case="Host unreachable mid-rollout",
    provoked="batches [1, 1, 1], max_fail_percentage 0; as soon as host1 (batch 1) launches its server, host2's "
             "network link goes down (sshd no longer reachable)",
    outcome="host1 completes; host2 is reported unreachable and its batch fails; the rollout halts and host3 is "
            "untouched (no task ran there, same processes and files)")
def test_host_unreachable_between_batches_halts_the_rollout(bare, tmp_path):
    fleet = bare
    # host3 runs a tagged server started by hand, so a rollout reaching it would kill and replace it.
    gv = _vars(fleet)
    start_bg(fleet, "host3", gv["gpufleet_server_command"], env={"GPUFLEET_SERVICE": "demo"})
    wait_for(lambda: all(gpu_holders(fleet, "host3").values()), 90, "host3 server holding its GPUs")
    host3_before = host_state(fleet, "host3")
    # No ssh connection to host2 may survive the cut (ansible shares persistent control masters).
    close_ssh_master(fleet, "host2")
    cut = threading.Event()
    stop = threading.Event()

    def cut_host2_after_host1_launches():
        while not stop.is_set():
            if read_host_file(fleet, "host1", "/run/gpufleet/demo.pid"):
                subprocess.run(["ip", "-n", fleet.netns("host2"), "link", "set", "eth0", "down"], check=True)
                cut.set()
                return
            stop.wait(0.1)

    th = threading.Thread(target=cut_host2_after_host1_launches, daemon=True)
    th.start()
    try:
        run = _rollout(fleet, tmp_path, gv, serial=[1, 1, 1], max_fail=0)
    finally:
        stop.set()
        th.join(10)
        subprocess.run(["ip", "-n", fleet.netns("host2"), "link", "set", "eth0", "up"], check=True)
    assert cut.is_set(), "host1 never launched:\n" + run.stdout[-3000:]
    assert run.rc == 4, run.rc  # ansible-playbook's exit code for an unreachable host (docs/runbook.md)
    s = summary(run)
    assert s["host1"]["status"] == "ok" and s["host1"]["restarted"] is True, s["host1"]
    assert run.unreachable("host2"), run.tasks_seen("host2")
    assert s["host2"]["status"] == "unreachable", s["host2"]
    assert run.host_events("host3") == [], run.tasks_seen("host3")
    assert s["host3"]["status"] == "not run", s["host3"]
    assert host_state(fleet, "host3") == host3_before
    wait_for(lambda: fleet.ssh("host2", "true").returncode == 0, 90, "host2 reachable again")
