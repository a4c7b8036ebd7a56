# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 16 items 3 and 4 on a sandbox host: the server run as an unprivileged `serve` user.

(a) root's shell on the host has `umask 077` (first line of /root/.bashrc, which sshd's bash reads for every
    command, the modules' included): the server and its spawn workers still run with umask 0022, and gpufleet's
    directories and files have their documented modes.
(b) the system sitecustomize.py made 0600 (root reads it, `serve` does not): the audit fails naming it; a plain
    rollout (its fast check included) makes it 0644; a forced restart then launches workers that carry the NCCL
    variables as `serve`.
"""
from __future__ import annotations

import pytest

from rollout_helpers import PCIE_ONLY, RolloutFleet, nccl, workers

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

H = "host1"
SERVE_STATE = "/srv/demo"  # the demo server's own state directory, which it writes as `serve`


@pytest.fixture(scope="module")
def rf(sandbox_fleet_module, tmp_path_factory):
    fleet = sandbox_fleet_module(hosts=1, gpus=2)
    r = RolloutFleet(fleet, tmp_path_factory.mktemp("serve-user"))
    r.reset()
    fleet.ssh(H, "id serve >/dev/null 2>&1 || useradd -M -s /bin/sh serve; install -d -o serve -m 0755 %s"
              % SERVE_STATE, check=True)
    # The operator's umask: before the .bashrc's early return for non-interactive shells.
    fleet.ssh(H, "cp /root/.bashrc /root/.bashrc.orig; sed -i '1i umask 077' /root/.bashrc", check=True)
    yield r
    fleet.ssh(H, "mv /root/.bashrc.orig /root/.bashrc")
    r.reset()


def serve_vars(rf: RolloutFleet):
    v = rf.server_vars()
    cmd = list(v["gpufleet_server_command"])
    cmd[cmd.index("--state-dir") + 1] = SERVE_STATE
    v.update(gpufleet_server_user="serve", gpufleet_server_command=cmd)
    return v


def status(rf, pids):
    """pid -> (Umask, real uid name) from /proc/PID/status."""
    out = rf.fleet.ssh(H, "for p in %s; do echo $p $(awk '/^Umask:/{print $2}' /proc/$p/status) "
                          "$(stat -c %%U /proc/$p); done" % " ".join(str(p) for p in pids), check=True).stdout
    return {int(p): (u, user) for p, u, user in (ln.split() for ln in out.splitlines())}


def modes(rf, paths):
    out = rf.fleet.ssh(H, "stat -c '%%n %%a %%U' %s" % " ".join(paths), check=True).stdout
    return {n: (m, u) for n, m, u in (ln.split() for ln in out.splitlines())}


def sitecustomize(rf):
    return rf.probe(H)["sitecustomize_path"]


def test_a_rollout_from_a_umask_077_shell_gives_the_server_umask_0022_and_gpufleets_files_their_modes(rf):
    # What every module of the rollout inherits on the host.
    assert rf.fleet.ssh(H, "umask", check=True).stdout.strip() == "0077"

    run = rf.playbook("rollout", vars_override=serve_vars(rf))

    assert run.rc == 0, run.tail()
    assert run.summary[H]["restarted"] is True and run.summary[H]["workers_verified"] == 2, run.summary[H]
    snap = rf.snapshot()
    tagged = [p["pid"] for p in snap.tagged(H)]
    # The launcher, its 2 spawn workers and multiprocessing's resource tracker.
    assert snap.launcher(H) in tagged and len(workers(snap, H)) == 2 and len(tagged) >= 3, snap.procs(H)
    assert status(rf, tagged) == {pid: ("0022", "serve") for pid in tagged}
    for w in workers(snap, H):
        assert nccl(w["env"]).items() >= PCIE_ONLY.items(), w
    assert modes(rf, ["/run/gpufleet", "/var/lib/gpufleet", "/var/log/gpufleet", "/var/log/gpufleet/demo.log",
                      "/var/lib/gpufleet/demo.json", "/run/gpufleet/demo.pid"]) == {
        "/run/gpufleet": ("755", "root"), "/var/lib/gpufleet": ("755", "root"), "/var/log/gpufleet": ("755", "root"),
        "/var/log/gpufleet/demo.log": ("644", "serve"), "/var/lib/gpufleet/demo.json": ("600", "root"),
        "/run/gpufleet/demo.pid": ("644", "root")}
    # The server's own files (launcher and workers write them as `serve`) follow the server's umask.
    own = modes(rf, [SERVE_STATE + "/launcher.json", SERVE_STATE + "/worker-0.json", SERVE_STATE + "/worker-1.json"])
    assert set(own.values()) == {("644", "serve")}, own


def test_a_sitecustomize_the_server_user_cannot_read_is_drift_and_a_rollout_makes_it_readable(rf):
    site = sitecustomize(rf)
    before = rf.snapshot()
    assert len(workers(before, H)) == 2, "the first test's server must be running"
    rf.fleet.ssh(H, "chmod 0600 %s" % site, check=True)
    why = "%s is not readable by every user (mode 0600)" % site

    audit = rf.playbook("audit", vars_override=serve_vars(rf))

    assert audit.rc != 0, audit.tail()
    assert "%s drifted: NCCL layers differ from the profile; %s" % (H, why) in audit.out, audit.tail()
    assert modes(rf, [site])[site][0] == "600"  # the audit changes nothing

    run = rf.playbook("rollout", vars_override=serve_vars(rf))

    assert run.rc == 0, run.tail()
    assert run.recap[H]["changed"] > 0, run.recap
    assert modes(rf, [site])[site] == ("644", "root")
    # Nothing else was wrong: the running workers already carried the variables, so the server was left running.
    after = rf.snapshot()
    assert run.summary[H]["restarted"] is False and after.identities(H) == before.identities(H), run.summary[H]

    # The case of issue 16 item 4: the same chmod, then a forced restart. The tuning runs first and makes the file
    # readable, so the new workers, which run as `serve`, load it.
    rf.fleet.ssh(H, "chmod 0600 %s" % site, check=True)
    run = rf.playbook("rollout", vars_override=serve_vars(rf), extra_vars={"gpufleet_server_force_restart": True})

    assert run.rc == 0, run.tail()
    assert run.summary[H]["restarted"] is True and run.summary[H]["workers_verified"] == 2, run.summary[H]
    assert modes(rf, [site])[site] == ("644", "root")
    snap = rf.snapshot()
    ws = workers(snap, H)
    assert len(ws) == 2 and not before.identities(H) & snap.identities(H)
    assert status(rf, [w["pid"] for w in ws]) == {w["pid"]: ("0022", "serve") for w in ws}
    for w in ws:
        assert nccl(w["env"]).items() >= PCIE_ONLY.items(), w
