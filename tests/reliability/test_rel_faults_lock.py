# SPDX-License-Identifier: GPL-3.0-or-later
"""The controller side of a rollout going wrong, on a sandbox host: ansible-playbook interrupted between the kill
and the launch (Ctrl-C to its process group, SIGTERM to its pid), and two rollouts started against one host at once.
Runs use the real ansible-playbook CLI (signals and concurrency need the process itself)."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from gpufleet_ci import sandbox
from rel_helpers import CliRun, gpu_holders, host_py, ps, read_host_file, reset_host, sh, start_bg, wait_for

pytestmark = pytest.mark.sandbox

H = "host1"
LOCK = "/run/gpufleet/demo.lock"
LOG = "/var/log/gpufleet/demo.log"
# The demo server's workers wait for this file before they "load weights" (--startup-gate): with it away, a restart
# holds its lock between its launch and its readiness until the test opens the gate.
GATE = "/tmp/gpufleet-startup-gate"
TAKEOVER = "taking over the host lock of dead run"
# A GPU holder outside the selector that notes each SIGTERM and ignores it: the restart's stray kill (kill_gpu_strays)
# then waits out the grace, and the flag file tells the test exactly when the restart is between kill and launch.
STRAY = r"""
import signal, sys, time
import fake_gpu
flag = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *a: open(flag, "w").close())
fake_gpu.hold(1, 500)
while True:
    time.sleep(3600)
"""


@pytest.fixture(scope="module")
def fleet(sandbox_fleet_module):
    return sandbox_fleet_module(hosts=1, gpus=2)


@pytest.fixture
def bare(fleet):
    """The fleet with host1 reset (the fleet itself goes with the module)."""
    reset_host(fleet, H)
    return fleet


def _inventory(fleet, tmp_path, name="servers", **over):
    gv = sandbox.server_vars(fleet.python, mib=1000)
    gv.pop("gpufleet_nccl_profile")
    gv.update(gpufleet_server_verify_env=False, gpufleet_server_expect_gpu_processes=0, gpufleet_server_clean_timeout=15)
    gv.update(over)
    inv = tmp_path / ("%s.yml" % name)
    inv.write_text(sandbox.servers_inventory([H], gv))
    return [fleet.inventory, inv], gv


def _launches(fleet):
    return (read_host_file(fleet, H, LOG) or "").count("==== gpufleet launch")


def _interrupt_between_kill_and_launch(fleet, tmp_path, invs, name, flag, send):
    fleet.host_run(H, ["rm", "-f", GATE])  # the interrupted run's new server is held before its readiness
    start_bg(fleet, H, [fleet.python, "-c", STRAY, flag])
    wait_for(lambda: gpu_holders(fleet, H)[1], 60, "stray holding GPU 1")
    run = CliRun(tmp_path, name, "gpufleet.serving.rollout", invs)
    wait_for(lambda: fleet.host_run(H, ["test", "-e", flag]).returncode == 0 or run.proc.poll() is not None, 240,
             "the stray kill step to send SIGTERM")
    assert run.proc.poll() is None, "the rollout ended before its kill step:\n" + run.text()[-3000:]
    send(run.pid)
    rc = run.wait(60)
    return run, rc


def _next_run_waits_for_the_dead_runs_restart(fleet, tmp_path, invs, name):
    """Start the next rollout while the interrupted run's restart is held on the host (its new server waits for the
    gate); open the gate only once that rollout has found the dead run's lock and its takeover is running on the host
    (the server_state module's AnsiballZ payload directory,
    /tmp/ansible_gpufleet.serving.server_state_payload_*, exists). The held restart still needs its server's
    --startup-delay after that, far more than the module needs to read the lock: the rollout then waits for it,
    however long the machine took to get it there (a 15 s grace once ran out before it arrived)."""
    run = CliRun(tmp_path, name, "gpufleet.serving.rollout", invs)

    def taking_over():
        if run.proc.poll() is not None:
            return True
        return TAKEOVER in run.text() and fleet.host_run(
            H, ["sh", "-c", "ls -d /tmp/ansible_*.server_state_payload_*"]).returncode == 0
    wait_for(taking_over, 300, "the next rollout to take over the dead run's lock")
    fleet.host_run(H, ["touch", GATE])
    return run


@pytest.mark.reliability(
    section="fault", case="Controller interrupted in the middle of a restart",
    provoked="a rollout's restart kills the tagged server, then waits out the kill grace of a TERM-ignoring stray GPU "
             "holder (kill_gpu_strays, grace 15 s); at that moment Ctrl-C (SIGINT to ansible-playbook's process group), "
             "and a second rollout starts at once; then the same with SIGTERM to ansible-playbook's pid alone",
    outcome="an interrupted run's restart (one server_restart call on the host) runs to its end there: the stray is "
            "killed after the grace, the server launched and the lock released, never leaving the host without a "
            "server; the next run from this controller sees the lock of a dead run and waits for that host process "
            "('waited ... for the restart of dead run') instead of breaking the lock under it, then finds the server up "
            "to date and changes nothing; exactly one launch per interrupted restart; no manual step")
def test_interrupted_rollout_completes_its_restart_and_the_next_run_waits_for_it(bare, tmp_path):
    fleet = bare
    gv_cmd = sandbox.server_vars(fleet.python, mib=1000)["gpufleet_server_command"] + [
        "--startup-gate", GATE, "--startup-delay", "5"]
    invs, gv = _inventory(fleet, tmp_path, gpufleet_server_kill_gpu_strays=True, gpufleet_server_kill_grace=15,
                          gpufleet_server_kill_final_wait=2, gpufleet_server_command=gv_cmd,
                          # The held restart waits at the gate until the next rollout has come (bounded by 300 s there).
                          gpufleet_server_start_timeout=360)
    fleet.host_run(H, ["touch", GATE])
    start_bg(fleet, H, gv["gpufleet_server_command"], env={"GPUFLEET_SERVICE": "demo"})
    wait_for(lambda: gpu_holders(fleet, H)[0], 90, "the old server holding GPU 0")
    old = {p["pid"] for p in ps(fleet, H).values() if p["tag"] == "demo"}
    me = socket.gethostname()

    r1, rc1 = _interrupt_between_kill_and_launch(fleet, tmp_path, invs, "ctrl-c", "/tmp/stray-term-1",
                                                 lambda pid: os.killpg(pid, signal.SIGINT))
    assert rc1 != 0
    assert not old & set(ps(fleet, H)), "the kill step did not run before the interrupt"
    # The controller is gone; its restart still waits out the stray's grace on the host, under r1's lock.
    lock = json.loads(read_host_file(fleet, H, LOCK) or "{}")
    assert lock.get("owner", "").startswith("%s:%d:" % (me, r1.pid)), lock
    worker = lock["worker"][0]
    assert worker in ps(fleet, H), "no host process works under the dead run's lock"
    assert _launches(fleet) == 0

    # Started at once, while r1's restart still runs on the host: r2 waits for it, then finds the server up to date.
    r2 = _next_run_waits_for_the_dead_runs_restart(fleet, tmp_path, invs, "after-ctrl-c")
    assert r2.wait() == 0, r2.text()[-4000:]
    out2 = " ".join(r2.text().split())  # warnings may be wrapped
    assert "%s: taking over the host lock of dead run %s:%d:" % (H, me, r1.pid) in out2, out2[-3000:]
    assert "for the restart of dead run %s:%d:" % (me, r1.pid) in out2, out2[-3000:]
    assert "still running on this host as pid %d" % worker in out2, out2[-3000:]
    assert "changed=0" in out2 and "failed=0" in out2, out2[-3000:]
    assert _launches(fleet) == 1, "r1's restart did not launch exactly once"

    # The same with SIGTERM to ansible-playbook's pid alone.
    r3, rc3 = _interrupt_between_kill_and_launch(fleet, tmp_path, invs, "sigterm", "/tmp/stray-term-2",
                                                 lambda pid: os.kill(pid, signal.SIGTERM))
    assert rc3 == -signal.SIGTERM, r3.text()[-2000:]
    worker3 = json.loads(read_host_file(fleet, H, LOCK) or "{}").get("worker", [None])[0]
    assert worker3 in ps(fleet, H), "no host process works under the dead run's lock"
    r4 = _next_run_waits_for_the_dead_runs_restart(fleet, tmp_path, invs, "after-sigterm")
    assert r4.wait() == 0, r4.text()[-4000:]
    out = " ".join(r4.text().split())
    assert "for the restart of dead run %s:%d:" % (me, r3.pid) in out, out[-3000:]
    assert "changed=0" in out and "failed=0" in out, out[-3000:]
    assert _launches(fleet) == 2, "the interrupted runs' restarts did not each launch exactly once"
    assert read_host_file(fleet, H, LOCK) is None, "the lock was not released"
    procs = ps(fleet, H)
    for gpu, pids in gpu_holders(fleet, H).items():
        assert pids and all(procs[p]["tag"] == "demo" for p in pids), (gpu, pids)
    assert not any("fake_gpu" in p["cmd"] or "stray" in p["cmd"] for p in procs.values())


# The NCCL layers a run writes host-wide: the system sitecustomize (both places Debian links) and nccl.conf.
LAYERS_CODE = r"""
import json, os, sys, sysconfig
out = {}
for p in (os.path.join(sysconfig.get_paths()["stdlib"], "sitecustomize.py"),
          "/etc/python3.%d/sitecustomize.py" % sys.version_info[1], "/etc/nccl.conf"):
    try:
        out[p] = open(p).read()
    except OSError:
        out[p] = None
print(json.dumps(out))
"""


def _layers(fleet):
    return host_py(fleet, H, LAYERS_CODE)


def _restore_layers(fleet, layers):
    for path, content in layers.items():
        if content is None:
            sh(fleet, H, "rm -f %s" % path)
        else:
            fleet.host_run(H, ["/bin/sh", "-c", "cat > %s" % path], input=content)


@pytest.mark.reliability(
    section="fault", case="Two rollouts against the same host at once, with different NCCL tuning (wait-die)",
    provoked="rollout A (NCCL profile pcie_only) restarts host1 (server start-up takes 60 s); while A holds the host "
             "lock and its server starts, rollout B, started later, asks for another NCCL tuning (NCCL_BUFFSIZE) with "
             "the default gpufleet_server_lock_wait (900 s)",
    outcome="B stops at once on host1 with 'host is locked by an earlier gpufleet run <A's id> (started HH:MM:SS); "
            "this later run stops here, the earlier one goes on; run again after it' (no wait) and writes nothing there: "
            "the system sitecustomize and nccl.conf byte for byte as A left them, no kill, no launch, B's recap "
            "changed=0; A finishes: exactly one launch in the server log, the running server is A's, the layers hold "
            "A's values, no lock left")
def test_concurrent_rollouts_never_interleave(bare, tmp_path):
    fleet = bare
    original = _layers(fleet)
    # A's server takes 60 s to start: B (its own ansible-playbook start-up, its validation and fast check) reaches host1
    # well inside A's hold, even on a loaded machine.
    gv_cmd = sandbox.server_vars(fleet.python, mib=1000)["gpufleet_server_command"] + ["--startup-delay", "60"]
    common = dict(gpufleet_server_command=gv_cmd, gpufleet_nccl_profile="pcie_only", gpufleet_server_start_timeout=180)
    invs_a = _inventory(fleet, tmp_path, "a", **common)[0]
    invs_b = _inventory(fleet, tmp_path, "b", gpufleet_nccl_env={"NCCL_BUFFSIZE": "4194304"}, **common)[0]
    me = socket.gethostname()
    try:
        a = CliRun(tmp_path, "a", "gpufleet.serving.rollout", invs_a)
        # A holds the lock, its layers are written and its server is starting (the launch line is in the log).
        wait_for(lambda: (read_host_file(fleet, H, LOCK) and _launches(fleet) == 1) or a.proc.poll() is not None, 240,
                 "A to launch under its lock")
        assert a.proc.poll() is None, a.text()[-3000:]
        lock = read_host_file(fleet, H, LOCK)
        assert '"%s:%d:' % (me, a.pid) in lock, lock
        a_layers = _layers(fleet)
        assert any(c and "NCCL_PROTO" in c for c in a_layers.values()), a_layers

        b = CliRun(tmp_path, "b", "gpufleet.serving.rollout", invs_b)
        rc_b = b.wait()
        assert a.proc.poll() is None, "A ended before B: B did not meet A's lock:\n" + a.text()[-3000:]
        out_b = " ".join(b.text().split())
        assert rc_b == 2, out_b[-3000:]
        assert ("host is locked by an earlier gpufleet run %s:%d:" % (me, a.pid)) in out_b, out_b[-3000:]
        assert "this later run stops here, the earlier one goes on; run again after it" in out_b, out_b[-3000:]
        assert "waited" not in out_b, out_b[-3000:]  # a later run never waits for an earlier one
        assert "Restart the server (kill" not in b.text()
        assert re.search(r"host1\s*: ok=\d+\s+changed=0 ", b.text()), b.text()[-2000:]
        assert _layers(fleet) == a_layers, "B wrote the NCCL layers under A's lock"

        assert a.wait() == 0, a.text()[-4000:]
        assert _launches(fleet) == 1
        assert _layers(fleet) == a_layers and "4194304" not in json.dumps(a_layers)
        pid = int(read_host_file(fleet, H, "/run/gpufleet/demo.pid").split()[0])
        assert pid in ps(fleet, H)
        assert read_host_file(fleet, H, LOCK) is None
    finally:
        _restore_layers(fleet, original)


@pytest.mark.reliability(
    section="fault", case="A rollout meets the host lock of a later run (wait-die)",
    provoked="host1's lock file names a live run of another controller that started after this rollout; once the "
             "rollout's check has started, the lock is removed (that run finished), 5 s later",
    outcome="the earlier run waits (bounded by gpufleet_server_lock_wait, 900 s by default) and says so with how long: "
            "'waited N s for the host lock of a later gpufleet run <id> (started HH:MM:SS), which held this host; "
            "this earlier run goes on now'; then it restarts host1 and exits 0; one launch")
def test_an_earlier_run_waits_for_a_later_runs_lock_and_says_how_long(bare, tmp_path):
    fleet = bare
    invs = _inventory(fleet, tmp_path)[0]
    run = CliRun(tmp_path, "earlier", "gpufleet.serving.rollout", invs)
    later = "other-controller:4242:%s.1.later:%.6f" % ("0" * 8, time.time() + 600)
    now = time.time()
    sh(fleet, H, "mkdir -p /run/gpufleet && printf '%%s' '%s' > %s" % (
        json.dumps({"owner": later, "acquired": now, "expires": now + 3600}), LOCK))
    wait_for(lambda: "Check the running server against the desired state" in run.text() or run.proc.poll() is not None,
             240, "the rollout's check (which takes the lock)")
    time.sleep(5)  # the task's banner comes before its module reaches the host
    sh(fleet, H, "rm -f %s" % LOCK)
    assert run.wait() == 0, run.text()[-4000:]
    out = " ".join(run.text().split())
    m = re.search(r"waited ([0-9.]+) s for the host lock of a later gpufleet run %s \(started [0-9:]{8}\), which held "
                  r"this host; this earlier run goes on now" % re.escape(later), out)
    assert m and float(m.group(1)) > 0, out[-3000:]
    assert _launches(fleet) == 1
    assert read_host_file(fleet, H, LOCK) is None


def _dead_run_id():
    """A run id of this controller (the gpufleet.serving.run lookup's form) whose ansible-playbook process is gone."""
    from ansible_collections.gpufleet.serving.plugins.plugin_utils import _run  # the collection on the test's path
    gone = subprocess.Popen(["sleep", "60"])
    try:
        run_id = _run.new_id(socket.gethostname(), gone.pid)
    finally:
        gone.kill()
        gone.wait()
    assert _run.owner_alive(run_id, socket.gethostname()) is False
    return run_id


@pytest.mark.reliability(
    section="fault", case="The rerun after a run interrupted under the host lock, with a new NCCL tuning",
    provoked="a rollout with NCCL profile pcie_only; then host1's lock file names a run of this controller whose "
             "ansible-playbook process is gone (killed after it took the lock, before its restart), and the next rollout "
             "asks for another NCCL_BUFFSIZE (gpufleet_nccl_env)",
    outcome="the rollout takes the dead run's lock over at its first lock, before the NCCL layers are written "
            "('taking over the host lock of dead run ...', 'broke the lock of dead run'), writes the new value into the "
            "layers under it and restarts host1 onto them; rc 0, one more launch, no lock left, and no claim that "
            "--tags left the nccl_tuning role out")
def test_the_rerun_after_an_interrupted_run_tunes_under_the_taken_over_lock(bare, tmp_path):
    """Found by the new-user pass (issue 24): the rerun skipped the tuning (the lock task met the dead run's lock), took
    the lock over only at its check and then refused the restart as if --tags had left the nccl_tuning role out."""
    fleet = bare
    original = _layers(fleet)
    try:
        invs = _inventory(fleet, tmp_path, "first", gpufleet_nccl_profile="pcie_only")[0]
        first = CliRun(tmp_path, "first", "gpufleet.serving.rollout", invs)
        assert first.wait() == 0, first.text()[-4000:]
        launches = _launches(fleet)
        dead = _dead_run_id()
        now = time.time()
        sh(fleet, H, "mkdir -p /run/gpufleet && printf '%%s' '%s' > %s" % (
            json.dumps({"owner": dead, "acquired": now, "expires": now + 3600}), LOCK))
        invs = _inventory(fleet, tmp_path, "rerun", gpufleet_nccl_profile="pcie_only",
                          gpufleet_nccl_env={"NCCL_BUFFSIZE": "4194304"})[0]
        rerun = CliRun(tmp_path, "rerun", "gpufleet.serving.rollout", invs)
        rc = rerun.wait()
        out = " ".join(rerun.text().split())
        assert rc == 0, out[-4000:]
        assert "%s: taking over the host lock of dead run %s" % (H, dead) in out, out[-3000:]
        assert "broke the lock of dead run %s" % dead in out, out[-3000:]
        assert "left the nccl_tuning role out" not in out, out[-3000:]
        assert any(c and "4194304" in c for c in _layers(fleet).values()), _layers(fleet)
        assert _launches(fleet) == launches + 1
        assert read_host_file(fleet, H, LOCK) is None
    finally:
        _restore_layers(fleet, original)
