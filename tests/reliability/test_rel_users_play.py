# SPDX-License-Identifier: GPL-3.0-or-later
"""A play of the user's that lists the roles itself (issue 24, bug C), on a one-host sandbox fleet, through the real
ansible-playbook CLI:

    - hosts: gpufleet_servers
      roles: [gpufleet.serving.nccl_tuning, gpufleet.serving.gpu_server]

The nccl_tuning role runs before gpu_server takes the host lock, so it takes the service's lock itself (gpu_server's
tasks/lock_layers.yml) before it writes the host-wide NCCL layers, and releases it after: no run rewrites them while
another run restarts the service, and under strategy free the play is refused before anything is written.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))

from rel_helpers import CliRun, wait_for  # noqa: E402
from rollout_helpers import LOCK_FILE, RolloutFleet, private_collections, run_playbook, workers  # noqa: E402

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

H = "host1"
BOTH_ROLES = """
- name: My own play
  hosts: gpufleet_servers
  gather_facts: false
  roles:
    - gpufleet.serving.nccl_tuning
    - gpufleet.serving.gpu_server
"""
SERVER_ONLY = """
- name: My own play without the tuning role
  hosts: gpufleet_servers
  gather_facts: false
  roles:
    - gpufleet.serving.gpu_server
"""
TUNING_ONLY = """
- name: My own tuning play
  hosts: gpufleet_servers
  gather_facts: false
  roles:
    - gpufleet.serving.nccl_tuning
"""
# The user's own tag on both roles (an import_role's tags, an include_role's apply), the play run with --tags mytag.
TAGGED_ROLES = """
- name: My own play, the roles under my own tag
  hosts: gpufleet_servers
  gather_facts: false
  tasks:
    - name: The NCCL tuning
      ansible.builtin.import_role:
        name: gpufleet.serving.nccl_tuning
      tags: [mytag]
    - name: The server
      ansible.builtin.include_role:
        name: gpufleet.serving.gpu_server
        apply:
          tags: [mytag]
      tags: [mytag]
"""
LOCK_TASK = "TASK [gpufleet.serving.gpu_server : Take the host lock before the NCCL layers are written]"


@pytest.fixture(scope="module")
def rf1(sandbox_fleet_module, tmp_path_factory) -> RolloutFleet:
    fleet = sandbox_fleet_module(hosts=1, gpus=2)
    r = RolloutFleet(fleet, tmp_path_factory.mktemp("users-play"))
    yield r
    r.reset()


@pytest.fixture
def rolled(rf1: RolloutFleet, monkeypatch) -> RolloutFleet:
    """host1 runs a tagged, tuned server (rolled out once; the cases leave it running and tuned), and no lock."""
    rf1.fleet.ssh(H, "rm -f %s" % LOCK_FILE)
    if rf1.state != "clean":
        rf1.rolled_out()
    monkeypatch.setenv("ANSIBLE_COLLECTIONS_PATH", str(private_collections()))
    yield rf1
    rf1.fleet.ssh(H, "rm -f %s" % LOCK_FILE)


def _play(rf: RolloutFleet, name: str, text: str) -> Path:
    pb = rf.workdir / ("%s-%d.yml" % (name, rf.runs))
    pb.write_text(text)
    return pb


def _sha(rf: RolloutFleet) -> str:
    return rf.probe(H)["sitecustomize_sha"]


@pytest.mark.reliability(
    section="fault", case="A play of the user's with nccl_tuning before gpu_server while another run holds the host lock",
    provoked="a live later run of another controller holds the service's host lock; the user's own play (roles "
             "[nccl_tuning, gpu_server], a changed NCCL variable) starts; the lock is released 4 s after the play "
             "reached its lock",
    outcome="the nccl_tuning role waits for the lock (gpu_server's, wait-die) before its first write: the "
            "sitecustomize.py is byte for byte the same while the other run holds the lock; once it is released the "
            "play writes the layers under its own lock, restarts the server onto them and leaves no lock")
def test_a_users_play_writes_the_layers_only_under_the_host_lock(rolled):
    rf = rolled
    sha0 = _sha(rf)
    # A later run of another controller (its id ends with its start): this earlier run waits for it (wait-die).
    owner = "other-controller:4242:0000.1.x:%.6f" % (time.time() + 3600)
    lock = {"owner": owner, "acquired": time.time(), "expires": time.time() + 3600}
    rf.fleet.ssh(H, "mkdir -p /run/gpufleet && cat > %s" % LOCK_FILE, input=json.dumps(lock), check=True)
    inv = rf.inventory({"gpufleet_nccl_env": {"NCCL_NTHREADS": "128"}, "gpufleet_server_lock_wait": 120})
    run = CliRun(rf.workdir, "both-roles-%d" % rf.runs, str(_play(rf, "both", BOTH_ROLES)), [inv])
    try:
        wait_for(lambda: LOCK_TASK in run.text() or run.proc.poll() is not None, 180, "the play to reach its lock")
        assert run.proc.poll() is None, run.text()[-4000:]
        for _second in range(4):
            assert _sha(rf) == sha0, "the layers changed while another run held the lock:\n" + run.text()[-3000:]
            assert "Manage the NCCL block" not in run.text()
            time.sleep(1)
        assert json.loads(rf.fleet.ssh(H, "cat %s" % LOCK_FILE, check=True).stdout)["owner"] == owner
        rf.fleet.ssh(H, "rm -f %s" % LOCK_FILE, check=True)
        rc = run.wait(240)
    finally:
        if run.proc.poll() is None:  # a failed assertion above: end the play (its own session) without masking it
            os.killpg(run.pid, signal.SIGKILL)
            run.proc.wait()
    out = " ".join(run.text().split())
    assert rc == 0, out[-4000:]
    assert "for the host lock of a later gpufleet run" in out, out[-3000:]
    after = rf.snapshot()
    assert after[H]["sitecustomize_sha"] != sha0
    assert after[H]["files"]["lock"] is None
    ws = workers(after, H)
    assert ws and all(w["env"].get("NCCL_NTHREADS") == "128" for w in ws), ws


@pytest.mark.reliability(
    section="input", case="A play of the user's with nccl_tuning and gpu_server under strategy free",
    provoked="ANSIBLE_STRATEGY=free; the user's own play lists roles [nccl_tuning, gpu_server]; a changed NCCL "
             "variable (the layers and the server would change)",
    outcome="refused at the nccl_tuning role's lock, before its first write: 'gpufleet's roles cannot keep their batch "
            "semantics under the play's strategy free ... nothing was changed on this host'; exit code 2; "
            "sitecustomize.py byte for byte the same, same server processes, no lock left")
def test_a_users_play_under_strategy_free_is_refused_before_the_layers_are_written(rolled, monkeypatch):
    rf = rolled
    before = rf.snapshot()
    inv = rf.inventory({"gpufleet_nccl_env": {"NCCL_NTHREADS": "64"}})
    monkeypatch.setenv("ANSIBLE_STRATEGY", "free")

    cp = run_playbook(_play(rf, "both-free", BOTH_ROLES), inventory=str(inv), timeout=240)

    out = " ".join(cp.stdout.split())
    assert cp.returncode == 2, out[-4000:]
    assert "gpufleet's roles cannot keep their batch semantics under the play's strategy free" in out, out[-3000:]
    assert "nothing was changed on this host" in out
    assert "Manage the NCCL block" not in out
    after = rf.snapshot()
    assert after[H]["sitecustomize_sha"] == before[H]["sitecustomize_sha"]
    assert after.identities(H) == before.identities(H)
    assert after[H]["files"] == before[H]["files"]  # state, pidfile, and no lock


@pytest.mark.reliability(
    section="input", case="A play of the user's with gpu_server and a profile but without nccl_tuning",
    provoked="gpufleet_nccl_profile pcie_only in the inventory; the user's own play lists only the gpu_server role",
    outcome="refused before the lock and the kill: 'this run does not know its NCCL variables: the nccl_tuning role "
            "did not run on this host before this check (this play does not include it, ...) ... Include the "
            "gpufleet.serving.nccl_tuning role before gpu_server'; exit code 2; nothing changed")
def test_a_users_play_without_the_tuning_role_is_told_what_happened(rolled):
    rf = rolled
    before = rf.snapshot()
    inv = rf.inventory()

    cp = run_playbook(_play(rf, "server-only", SERVER_ONLY), inventory=str(inv), timeout=240)

    out = " ".join(cp.stdout.split())
    assert cp.returncode == 2, out[-4000:]
    assert "the nccl_tuning role did not run on this host before this check (this play does not include it" in out, out[-3000:]
    assert "Include the gpufleet.serving.nccl_tuning role before gpu_server" in out
    assert "--tags/--skip-tags left it out)" in out
    after = rf.snapshot()
    assert after.identities(H) == before.identities(H)
    assert after[H]["files"] == before[H]["files"]


@pytest.mark.reliability(
    section="fault", case="The nccl_tuning role on its own for a service fails writing a layer",
    provoked="the user's own play lists only nccl_tuning (gpufleet_server_name set); its sitecustomize.py path is "
             "under a regular file, so the layer write fails after the lock was taken",
    outcome="the host fails naming the write; the service's host lock it took is released (its always): no lock file "
            "is left, and the next run is not blocked")
def test_the_tuning_roles_lock_is_released_when_a_write_fails(rolled):
    rf = rolled
    inv = rf.inventory({"gpufleet_nccl_env": {"NCCL_NTHREADS": "32"},
                        "gpufleet_nccl_sitecustomize_path": "/etc/hostname/sitecustomize.py"})

    cp = run_playbook(_play(rf, "tuning-only", TUNING_ONLY), inventory=str(inv), timeout=240)

    out = cp.stdout
    assert cp.returncode == 2, out[-4000:]
    assert LOCK_TASK in out and "Release the host lock" in out, out[-3000:]
    assert rf.probe(H)["files"]["lock"] is None


@pytest.mark.reliability(
    section="fault", case="A play of the user's with its own tag on both roles, run with --tags of that tag",
    provoked="the user's own play imports nccl_tuning and includes gpu_server (apply), both tagged mytag; a changed "
             "NCCL variable (NCCL_NTHREADS 96); ansible-playbook --tags mytag",
    outcome="the tag selects every step of both roles, as it selects any task under it: the layers are written, the "
            "server is checked and restarted onto them (every spawn worker has NCCL_NTHREADS=96), rc 0; never 'NCCL "
            "layers only, servers not checked' (helper-42: the check's call, tagged always, read the tags of its block "
            "only, and skipped the check)")
def test_a_users_own_tag_on_the_roles_selects_every_step_of_them(rolled):
    rf = rolled
    before = rf.snapshot()
    inv = rf.inventory({"gpufleet_nccl_env": {"NCCL_NTHREADS": "96"}})

    cp = run_playbook(_play(rf, "tagged", TAGGED_ROLES), "--tags", "mytag", inventory=str(inv), timeout=300)

    rf.state = "nthreads-96"  # the next case rolls the default definition out again
    out = " ".join(cp.stdout.split())
    assert cp.returncode == 0, out[-4000:]
    assert "NCCL layers only" not in out, out[-3000:]
    after = rf.snapshot()
    assert after.identities(H) != before.identities(H), "the server was not restarted onto the new layers"
    ws = workers(after, H)
    assert ws and all(w["env"].get("NCCL_NTHREADS") == "96" for w in ws), [w["env"].get("NCCL_NTHREADS") for w in ws]
    assert rf.probe(H)["files"]["lock"] is None


# The user's own play with both roles under ignore_errors (two services on a host go on past a failed one).
IGNORED_ROLES = """
- name: My own play, the roles under ignore_errors
  hosts: gpufleet_servers
  gather_facts: false
  tasks:
    - name: The service, whatever happens to it
      ignore_errors: true
      block:
        - name: The NCCL tuning
          ansible.builtin.import_role:
            name: gpufleet.serving.nccl_tuning
        - name: The server
          ansible.builtin.include_role:
            name: gpufleet.serving.gpu_server
    - name: After the role
      ansible.builtin.debug:
        msg: the play went on
"""


@pytest.mark.reliability(
    section="fault", case="A play of the user's that includes the roles under ignore_errors, whose new server fails",
    provoked="the user's own play lists nccl_tuning and gpu_server in a block with ignore_errors: true; a forced "
             "restart onto a server that exits at startup (gpufleet_server_rollback false)",
    outcome="the role's rescue still runs (the failure is recorded, the host lock released: no lock file is left) and "
            "only its last task, which fails the host, is ignored: the play goes on, the summary says the host failed "
            "with its server killed (helper-44: every task of the role was ignored, the rescue never ran, and the "
            "summary said ok)")
def test_a_users_play_under_ignore_errors_still_runs_the_roles_rescue(rolled):
    rf = rolled
    cmd = list(rf.server_vars()["gpufleet_server_command"]) + ["--fail-at-startup"]
    inv = rf.inventory({"gpufleet_server_command": cmd, "gpufleet_server_force_restart": True})

    cp = run_playbook(_play(rf, "ignored", IGNORED_ROLES), inventory=str(inv), timeout=300)

    rf.state = "failed"  # killed, not serving: the next case rolls out again
    out = cp.stdout
    assert cp.returncode == 0, out[-4000:]
    assert "TASK [gpufleet.serving.gpu_server : Record the failure for the rollout summary]" in out, out[-4000:]
    last = out.index("TASK [gpufleet.serving.gpu_server : Release the host lock, and fail the host where its flow failed]")
    assert "...ignoring" in out[last:] and "the play went on" in out[last:], out[last:][-3000:]
    row = next(ln for ln in out.splitlines() if ln.startswith("| %s |" % H))
    assert "| failed |" in row, row
    assert rf.probe(H)["files"]["lock"] is None
