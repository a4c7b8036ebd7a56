# SPDX-License-Identifier: GPL-3.0-or-later
"""A pidfile alone never selects a process (issue 13): two sandbox hosts, each with a server rolled out, then stopped
by hand, its pidfile rewritten to hold only the pid of an older, unrelated process: another user's on host1, root's on
host2. One more real rollout (gpufleet.serving.rollout through ansible-runner) must leave both processes alone.
Then the same again with the pidfile in gpufleet's own form, C(PID START_TIME), holding the unrelated process's pid and
its real start time: a matching start time alone confirms nothing (only the launch tag or the adopt regex does).
"""
from __future__ import annotations

import pytest

from gpufleet_ci import sandbox
from rel_helpers import ROLLOUT_SITE, ps, read_host_file, runner_play, sh, start_bg, summary, wait_for

pytestmark = pytest.mark.sandbox

HOSTS = ["host1", "host2"]
PIDFILE = "/run/gpufleet/demo.pid"
RESTART_TASK = "Restart the server (kill, verify clean, launch, wait ready, verify the workers' environment, record)"
CHECK_TASK = "Check the running server against the desired state (and take the host lock)"
# The unrelated process's owner on each host: another user (useradd on the host), and root.
OWNERS = {"host1": "pidtest", "host2": "root"}
# What the rewritten pidfile holds: the pid only, then the pid and the process's real start time ('PID START_TIME').
FORMS = ["pid", "pid_start_time"]


def _rollout(fleet, work, ident):
    gv = sandbox.server_vars(fleet.python, mib=1000)
    gv.pop("gpufleet_nccl_profile")  # NCCL tuning is not what this fault is about
    gv.update(gpufleet_server_kill_grace=1, gpufleet_server_clean_timeout=5, gpufleet_server_verify_env=False,
              gpufleet_server_expect_gpu_processes=0)
    inv = work / ("servers-%s.yml" % ident)
    inv.write_text(sandbox.servers_inventory(HOSTS, gv))
    return runner_play(work, ROLLOUT_SITE, [fleet.inventory, inv], ident=ident)


def _tagged(fleet, host):
    return [p["pid"] for p in ps(fleet, host).values() if p["tag"] == "demo"]


@pytest.fixture(scope="module")
def scenario(sandbox_fleet_module, tmp_path_factory):
    fleet = sandbox_fleet_module(hosts=len(HOSTS), gpus=2)
    work = tmp_path_factory.mktemp("rel-pidfile")
    victims = {}
    for h, user in OWNERS.items():
        if user != "root":
            sh(fleet, h, "id %s >/dev/null 2>&1 || useradd -M -s /bin/sh %s" % (user, user))
        # Older than the pidfile written below: the pidfile's age alone cannot tell it from the server.
        start_bg(fleet, h, ["sleep", "3603"], user=None if user == "root" else user)
        victims[h] = wait_for(lambda h=h: [p for p in ps(fleet, h).values() if p["cmd"] == "sleep 3603"], 60,
                              "the unrelated sleep on %s" % h)[0]

    first = _rollout(fleet, work, "first")
    assert first.rc == 0, first.stdout[-3000:]
    runs, after, pidfiles = {}, {}, {}
    for form in FORMS:
        for h in HOSTS:
            # Stopped by hand (kill of every server process), then the pidfile rewritten: a pid only, or the
            # unrelated process's pid and its real start time (the form gpufleet writes).
            server = _tagged(fleet, h)
            assert server, "no server on %s before the %s rollout" % (h, form)
            # The launcher stops its workers on TERM: one may be gone before its own signal.
            sh(fleet, h, "kill -TERM %s 2>/dev/null; true" % " ".join(str(p) for p in server))
            wait_for(lambda h=h: not _tagged(fleet, h), 60, "server stopped on %s" % h)
            text = "%d" % victims[h]["pid"] if form == "pid" else "%d %d" % (victims[h]["pid"], victims[h]["start"])
            sh(fleet, h, "echo %s > %s" % (text, PIDFILE))
        runs[form] = _rollout(fleet, work, form)
        after[form] = {h: ps(fleet, h) for h in HOSTS}
        pidfiles[form] = {h: read_host_file(fleet, h, PIDFILE) for h in HOSTS}
    return dict(fleet=fleet, runs=runs, victims=victims, after=after, pidfiles=pidfiles)


def _unconfirmed_pidfile_process_survives(scenario, form):
    run = scenario["runs"][form]
    assert run.rc == 0, run.stdout[-3000:]
    for host in HOSTS:
        victim = scenario["victims"][host]
        assert (victim["uid"] != 0) is (OWNERS[host] != "root"), (host, victim)
        kill = run.res(host, RESTART_TASK)["kill"]
        assert victim["pid"] not in {p["pid"] for p in kill["processes"]}, (host, kill["processes"])
        pf = kill["pidfile"]
        assert pf["pid"] == victim["pid"] and pf["status"] == "unconfirmed", (host, pf)
        assert pf["confirmed_by"] is None, (host, pf)
        assert any("unconfirmed" in n and str(victim["pid"]) in n for n in kill["notes"]), (host, kill["notes"])
        check = run.res(host, CHECK_TASK)
        assert check["running"] is False and check["pidfile"]["status"] == "unconfirmed", (host, check.get("pidfile"))
        after = scenario["after"][form][host]
        assert after.get(victim["pid"], {}).get("start") == victim["start"], "the sleep on %s was killed" % host
        assert summary(run)[host]["restarted"] is True, host
        new = scenario["pidfiles"][form][host].split()
        assert len(new) == 2 and int(new[0]) != victim["pid"], (host, new)
        assert after[int(new[0])]["tag"] == "demo", (host, after.get(int(new[0])))


@pytest.mark.reliability(
    section="fault", case="Pidfile holding only the pid of an older, unrelated process (another user's, root's)",
    provoked="a server rolled out, then stopped by hand, its pidfile (/run/gpufleet/demo.pid) rewritten to hold only "
             "the pid of a `sleep` started before it: one of user `pidtest` (useradd on the host) on host1, one of "
             "root on host2; one more rollout",
    outcome="the `sleep` has no launch tag and does not match the adopt regex, so neither the check nor the kill "
            "trusts the pidfile: it is reported unconfirmed (kill step's `pidfile.status` and notes, the check's "
            "`pidfile.status`, `running` false); the `sleep` survives with the same pid and start time, and the server "
            "is launched and the pidfile rewritten")
def test_unconfirmed_pidfile_process_survives(scenario):
    _unconfirmed_pidfile_process_survives(scenario, "pid")


@pytest.mark.reliability(
    section="fault", case="Pidfile naming an unrelated process by its pid and real start time (another user's, root's)",
    provoked="as above, then the server stopped by hand again and its pidfile rewritten in gpufleet's own form, "
             "`PID START_TIME`, with the `sleep`'s pid and its real start time (field 22 of /proc/PID/stat); one more "
             "rollout",
    outcome="the start time matches, but a start time only tells a stale pidfile and never confirms: without the "
            "launch tag or an adopt-regex match the pidfile is reported unconfirmed (`confirmed_by` null) by the kill "
            "step and the check (`running` false); the `sleep` survives with the same pid and start time, and the "
            "server is launched and the pidfile rewritten")
def test_pidfile_with_an_unrelated_process_real_start_time_is_unconfirmed(scenario):
    _unconfirmed_pidfile_process_survives(scenario, "pid_start_time")
