# SPDX-License-Identifier: GPL-3.0-or-later
"""Selection + kill (module_utils, in-process) against real process trees.

Each scenario is one an SRE meets when restarting SGLang/vLLM: spawn workers, TERM-ignoring
workers, workers orphaned to PID 1 after the launcher died, a stale pidfile whose pid now belongs to
another process, and an unrelated process that must survive every kill (see conftest `bystander`).
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from helpers import pid_alive, service_tag, wait_for

from ansible_collections.gpufleet.serving.plugins.module_utils import _gpuwait, _kill, _nvml, _proc, _select


def select(**kw):
    procs = _proc.snapshot()
    res = _select.select(_select.Selector(**kw), procs)
    return res, procs


def select_and_kill(grace=2.0, final_wait=3.0, **kw):
    res, procs = select(**kw)
    report = _kill.kill([procs[p] for p in sorted(res["selected"])], grace=grace, final_wait=final_wait)
    return res, {r["pid"]: r for r in report}


def gpus_clean(timeout=5.0):
    with _nvml.open_backend("nvml") as b:
        return _gpuwait.wait(b, [0, 1], timeout=timeout)


@pytest.fixture(autouse=True)
def _fake_nvml_in_process(fake_gpus, monkeypatch):
    """The in-process _nvml binds the real nvidia-ml-py here; point it at the fake for this test."""
    import sys

    from helpers import FAKE_NVML_DIR

    monkeypatch.setenv("FAKE_NVML_CONFIG", str(fake_gpus.config))
    monkeypatch.syspath_prepend(str(FAKE_NVML_DIR))
    sys.modules.pop("pynvml", None)
    import pynvml  # the fake

    monkeypatch.setattr(_nvml, "pynvml", pynvml)
    yield


def test_spawn_workers_killed_by_tag_and_gpus_freed(launch):
    tree = launch(workers=3, mib=5000)
    assert not gpus_clean(timeout=0.1)["ok"]
    res, rep = select_and_kill(tag=service_tag("x"))
    assert set(tree.workers) | {tree.launcher} <= set(res["selected"])
    assert all(res["selected"][w][0] == "tag" for w in tree.workers)
    assert all(not r["survived"] for r in rep.values())
    assert tree.alive() == []
    r = gpus_clean()
    assert r["ok"] and r["holders"] == []


def test_launcher_pid_with_descendants_and_session(launch):
    tree = launch(workers=2, tag=None)
    res = select(pids=[tree.launcher])[0]
    assert set(res["selected"]) == set(tree.members)
    assert {res["selected"][w][0] for w in tree.workers} <= {"group_member", "descendant"}
    res = select(pids=[tree.launcher], include_descendants=False, include_groups=False)[0]
    assert set(res["selected"]) == {tree.launcher}


def test_term_ignoring_workers_escalate_to_kill(launch):
    tree = launch(workers=2, worker_ignore_term=True, ignore_term=True)
    t0 = time.monotonic()
    res, rep = select_and_kill(tag=service_tag("x"), grace=0.5, final_wait=3)
    took = time.monotonic() - t0
    for w in tree.workers + [tree.launcher]:
        assert rep[w]["signals_sent"] == ["SIGTERM", "SIGKILL"], rep[w]
        assert rep[w]["survived"] is False and rep[w]["exited_after_s"] >= 0.5
    assert took < 3
    assert tree.alive() == []


def test_orphaned_workers_found_by_tag(launch):
    """setsid launcher SIGKILLed: its spawn workers are reparented, found only by the launch tag."""
    tree = launch(workers=2, tag=service_tag("orphan-test"), mib=7000)
    os.kill(tree.launcher, signal.SIGKILL)
    tree.popen.wait()
    wait_for(lambda: all(_proc.read_proc(w).ppid != tree.launcher for w in tree.workers), 5, "reparenting")
    for w in tree.workers:
        assert pid_alive(w)
        assert _proc.read_proc(w).ppid != tree.launcher
    # Not a descendant of anything we know any more: only the tag finds them.
    res = select(pids=[tree.launcher])[0]
    assert res["selected"] == {}
    res, rep = select_and_kill(tag=service_tag("orphan-test"))
    assert set(tree.workers) <= set(res["selected"])
    assert all(not rep[w]["survived"] for w in tree.workers)
    assert tree.alive() == []
    assert gpus_clean()["ok"]


def test_other_tag_value_untouched(launch):
    mine = launch(workers=1, tag=service_tag("a"))
    other = launch(workers=1, tag=service_tag("a") + "b")
    res = select_and_kill(tag=service_tag("a"))[0]
    assert mine.alive() == []
    assert other.alive() == sorted(other.members)
    assert not set(res["selected"]) & set(other.members)


def test_our_pidfile_selects_the_server(launch):
    """gpufleet's own 'PID START_TIME' pidfile: confirmed by the launch tag its server carries, never by the start
    time alone."""
    tree = launch(workers=2, pidfile=True, tag=service_tag("pf"))
    res = select(pidfile=str(tree.pidfile))[0]
    assert res["selected"] == {} and res["pidfile"]["status"] == "unconfirmed", res  # no tag given
    res, rep = select_and_kill(pidfile=str(tree.pidfile), tag=service_tag("pf"))
    assert res["selected"][tree.launcher][0] == "pidfile" and res["pidfile"]["confirmed_by"] == "tag", res
    assert set(res["selected"]) == set(tree.members)
    assert tree.alive() == []


def test_stale_pidfile_with_wrong_start_time_kills_nothing(sleeper, tmp_path):
    """The pid in the pidfile is alive but is another process (different start time): never touched."""
    innocent = sleeper()
    st = _proc.read_proc(innocent.pid).start_time
    pf = tmp_path / "server.pid"
    pf.write_text("%d %d\n" % (innocent.pid, st - 100))
    res, rep = select_and_kill(pidfile=str(pf))
    assert res["selected"] == {} and rep == {}
    assert "stale" in res["notes"][0] and "pid %d now belongs to another process" % innocent.pid in res["notes"][0]
    time.sleep(0.05)
    assert innocent.poll() is None


def test_foreign_pidfile_older_than_its_pid_kills_nothing(sleeper, tmp_path):
    """A foreign pidfile ('PID' only) written before that pid's process started is stale."""
    innocent = sleeper()
    pf = tmp_path / "foreign.pid"
    pf.write_text("%d\n" % innocent.pid)
    old = time.time() - 3600
    os.utime(pf, (old, old))
    res, rep = select_and_kill(pidfile=str(pf))
    assert res["selected"] == {} and rep == {}
    assert "started after the pidfile was written" in res["notes"][0]
    assert innocent.poll() is None
    # Written after the process started, it is still not trusted on its own (issue 13): nothing confirms it.
    os.utime(pf, None)
    res = select(pidfile=str(pf))[0]
    assert res["selected"] == {} and res["pidfile"]["status"] == "unconfirmed"
    # A command line regex confirms it.
    res = select(pidfile=str(pf), pidfile_cmdline_regex=r"time\.sleep")[0]
    assert list(res["selected"]) == [innocent.pid] and res["pidfile"]["confirmed_by"] == "pidfile_cmdline_regex"


def test_worker_in_our_session_does_not_pull_us_in(sleeper):
    """A worker sharing pytest's session/group is not a leader: selecting it selects only it."""
    w = sleeper(start_new_session=False)
    info = _proc.read_proc(w.pid)
    me = _proc.read_proc(os.getpid())
    assert (info.sid, info.pgid) == (me.sid, me.pgid) and info.pgid != w.pid
    res, rep = select_and_kill(pids=[w.pid])
    assert list(res["selected"]) == [w.pid]
    assert w.wait(timeout=5) == -signal.SIGTERM
    assert pid_alive(os.getpid()) and pid_alive(os.getppid())


def test_group_leader_in_our_session_expands_to_its_group_only(sleeper):
    leader = sleeper(start_new_session=False, process_group=0)
    follower = sleeper(start_new_session=False)  # same session, pytest's group
    res = select(pids=[leader.pid])[0]
    assert set(res["selected"]) == {leader.pid}
    assert follower.pid not in res["selected"] and os.getpid() not in res["selected"]


def test_protected_pids_never_signalled(sleeper):
    chain = [os.getpid()] + _proc.ancestors(os.getpid(), _proc.snapshot())
    kthreads = [p.pid for p in _proc.snapshot().values() if p.is_kernel_thread][:3]
    res, rep = select_and_kill(pids=[1] + chain + kthreads)
    assert res["selected"] == {} and rep == {}
    assert set(res["excluded"]) == {1} | set(chain) | set(kthreads)
    # A regex that matches our own command line selects nothing of our chain either.
    res = select(cmdline_regex="pytest")[0]
    assert not set(res["selected"]) & ({1} | set(chain))


def test_pid_reuse_identity_never_signalled(sleeper):
    """kill() given an identity whose start time no longer matches treats it as gone and signals nothing."""
    p = sleeper()
    info = _proc.read_proc(p.pid)
    [r] = _kill.kill([info._replace(start_time=info.start_time + 7)], grace=0.2, final_wait=0.2)
    assert r["already_gone"] and r["signals_sent"] == [] and not r["survived"]
    time.sleep(0.05)
    assert p.poll() is None


def test_exclude_regex_spares_matching_member(launch, sleeper):
    tree = launch(workers=1, marker="server-marker-1")
    agent = sleeper("nvidia-persistenced-lookalike", env=dict(os.environ, GPUFLEET_SERVICE=service_tag("x").split("=", 1)[1]))
    res = select(tag=service_tag("x"), exclude_regex=[r"persistenced"])[0]
    assert agent.pid in res["excluded"] and agent.pid not in res["selected"]
    assert tree.launcher in res["selected"]
