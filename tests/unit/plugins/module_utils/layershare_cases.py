# SPDX-License-Identifier: GPL-3.0-or-later
"""Two services on one host share the host-wide NCCL layers (issue 24 item 2): sitecustomize_env and nccl_conf, given
their service's launch tag, refuse a change of the block's values while another service's real process runs, before
anything is written, in check mode too; the same values, or no other service, go through.

Run by test__layershare.py in a pid namespace of its own (unshare --pid --mount-proc): the layer check reads every
process of the host, and in the root pid namespace it would see the other tests' tagged servers and the sandbox hosts'
(a host's own pid namespace hides nothing from its parent), which are other services to it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _layershare, _proc
from ansible_collections.gpufleet.serving.plugins.modules import nccl_conf, sitecustomize_env

TAG = "GPUFLEET_TEST_SERVICE_%d" % os.getpid()


@pytest.fixture
def other_service():
    """A real process of service sgb (its launch tag in its environment), in its own session."""
    started = []

    def start(value="sgb", env=None):
        env = {TAG: value} if env is None else env
        po = subprocess.Popen(["sleep", "600"], env=dict(os.environ, **env), start_new_session=True)
        started.append(po)
        # Until its exec, the child's /proc/PID/environ is still this process's (without the tag): wait for the tag,
        # as a server's would be there long before anyone restarts another service (raced on a loaded CI machine).
        deadline = time.monotonic() + 60
        while _proc.read_environ(po.pid, list(env)) != env:
            assert time.monotonic() < deadline, "the tag of %s never showed in its environ" % env
            time.sleep(0.01)
        return po

    yield start
    for po in started:
        po.kill()
        po.wait()


def _sitecustomize(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    path = site / "sitecustomize.py"
    layer = {"path": str(path), "interpreters": [sys.executable], "probe_env": {"PYTHONPATH": str(site)}, "name": "nccl",
             "service_tag": "%s=sglang" % TAG}
    return sitecustomize_env.main, layer, path


def _ncclconf(tmp_path):
    path = tmp_path / "nccl.conf"
    return nccl_conf.main, {"path": str(path), "name": "nccl", "service_tag": "%s=sglang" % TAG}, path


def _lock(locks, name, owner, expires_in=600.0):
    """`name`'s host lock in `locks` as a run holds it (expired when `expires_in` is negative)."""
    (locks / ("%s.lock" % name)).write_text(json.dumps({"owner": owner, "acquired": time.time() if expires_in > 0 else 0,
                                                        "expires": time.time() + expires_in}))


def _written_with_locks(tmp_path, layer, run_module):
    """The layer written once with NCCL_PROTO LL, the service locks in tmp_path/run: (main, args, path, locks, bytes)."""
    main, args, path = layer(tmp_path)
    locks = tmp_path / "run"
    locks.mkdir()
    args = dict(args, service_locks=str(locks))
    assert run_module(main, dict(args, env={"NCCL_PROTO": "LL"}))["changed"] is True
    return main, args, path, locks, path.read_bytes()


def _message(path, pid, names):
    return ("NCCL layers are host-wide (%s): service sgb (pid %d) runs on this host and starts workers with what the "
            "layers hold; changing %s for sglang would change sgb's next start too. Give every service on a host the same gpufleet_nccl_* (the "
            "host's group_vars), or stop sgb first (gpufleet.serving.clean); nothing was changed"
            % (os.path.realpath(str(path)), pid, names))


@pytest.mark.parametrize("layer", [_sitecustomize, _ncclconf], ids=["sitecustomize_env", "nccl_conf"])
def test_a_change_of_the_values_under_another_running_service_is_refused_and_nothing_is_written(
        tmp_path, run_module, other_service, layer):
    main, args, path = layer(tmp_path)
    first = run_module(main, dict(args, env={"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}))
    assert first["changed"] is True and "failed" not in first, first  # no other service yet
    sgb = other_service()
    before = path.read_bytes()

    # The same values: nothing to change, nothing refused (idempotent with the other service running).
    same = run_module(main, dict(args, env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}))
    assert "failed" not in same and same["changed"] is False, same

    for env, state, names in (({"NCCL_PROTO": "Simple", "NCCL_ALGO": "Tree"}, "present", "NCCL_ALGO, NCCL_PROTO"),
                              ({"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_BUFFSIZE": "4194304"}, "present",
                               "NCCL_BUFFSIZE"),
                              ({}, "absent", "NCCL_ALGO, NCCL_PROTO")):
        for check_mode in (True, False):
            r = run_module(main, dict(args, env=env, state=state), check_mode=check_mode)
            assert r.get("failed") is True, r
            assert r["msg"] == _message(path, sgb.pid, names), r["msg"]
            assert "Simple" not in r["msg"] and "4194304" not in r["msg"]  # names only, never values
            assert path.read_bytes() == before
    assert sgb.poll() is None

    # Without the service's tag the module knows no service and checks nothing (as before).
    r = run_module(main, dict(args, env={"NCCL_PROTO": "Simple"}, service_tag=None))
    assert "failed" not in r and r["changed"] is True, r


@pytest.mark.parametrize("layer", [_sitecustomize, _ncclconf], ids=["sitecustomize_env", "nccl_conf"])
def test_a_process_of_the_same_service_or_none_at_all_lets_the_change_through(
        tmp_path, run_module, other_service, layer):
    main, args, path = layer(tmp_path)
    run_module(main, dict(args, env={"NCCL_PROTO": "LL"}))
    other_service("sglang")  # this service's own server: its restart follows the change
    r = run_module(main, dict(args, env={"NCCL_PROTO": "Simple"}))
    assert "failed" not in r and r["changed"] is True, r
    assert "Simple" in path.read_text()


@pytest.mark.parametrize("tag", ["sglang", "=sglang", "GPUFLEET SERVICE=x", "GPUFLEET_SERVICE="])
def test_a_malformed_service_tag_is_refused_before_anything_is_read(tmp_path, run_module, tag):
    main, args, path = _ncclconf(tmp_path)
    r = run_module(main, dict(args, env={"NCCL_PROTO": "LL"}, service_tag=tag))
    assert r["failed"] is True and r["msg"].startswith("service_tag: tag must look like NAME=VALUE"), r
    assert not path.exists()


def test_other_services_names_each_service_once_by_its_oldest_process(other_service):
    first = other_service("sgb")
    other_service("sgb")
    third = other_service("vllm")
    other_service("sglang")
    got = _layershare.other_services((TAG, "sglang"))
    assert got == {"sgb": first.pid, "vllm": third.pid}, got
    assert _proc.read_proc(first.pid) is not None


def test_a_service_with_a_tag_name_of_its_own_is_another_service(other_service):
    """issue 24: the layer check knew other services by its own tag name only, so a service launched under another
    tag name (gpufleet_server_tag_name) ran unseen and the layers changed under it. It now tells services apart as the
    kill does (_select.other_service_tag): GPUFLEET_LAUNCH_TAG, which every gpufleet launch carries, names the other
    service under any tag name; a service with a tag name of its own also knows a default-tag process as another's."""
    default_sgb = other_service(env={"GPUFLEET_SERVICE": "sgb"})  # a unit with the default tag name (no launch tag)
    other_name = "OTHER_SERVICE_%d" % os.getpid()
    vllm = other_service(env={other_name: "vllm", "GPUFLEET_LAUNCH_TAG": "%s=vllm" % other_name})
    other_service(env={"GPUFLEET_SERVICE": "sglang"})  # this service, launched before its tag name changed
    other_service(env={TAG: "sglang", "GPUFLEET_LAUNCH_TAG": "%s=sglang" % TAG})  # this service
    got = _layershare.other_services((TAG, "sglang"))
    assert got == {"sgb": default_sgb.pid, "vllm": vllm.pid}, got
    # Seen from a service with the default tag name: vllm's own tag name hides it no more.
    other_service(env={other_name: "sglang", "GPUFLEET_LAUNCH_TAG": "%s=sglang" % other_name})  # sglang, other name
    got = _layershare.other_services(("GPUFLEET_SERVICE", "sglang"))
    assert got == {"sgb": default_sgb.pid, "vllm": vllm.pid}, got


@pytest.mark.parametrize("layer", [_sitecustomize, _ncclconf], ids=["sitecustomize_env", "nccl_conf"])
def test_a_change_under_a_service_with_another_tag_name_is_refused(tmp_path, run_module, other_service, layer):
    main, args, path = layer(tmp_path)
    args = dict(args, service_tag="GPUFLEET_SERVICE=sglang")
    assert run_module(main, dict(args, env={"NCCL_PROTO": "LL"}))["changed"] is True
    before = path.read_bytes()
    vllm = other_service(env={"VLLM_SERVICE": "vllm", "GPUFLEET_LAUNCH_TAG": "VLLM_SERVICE=vllm"})
    r = run_module(main, dict(args, env={"NCCL_PROTO": "Simple"}))
    assert r.get("failed") is True and r["other_services"] == ["vllm"], r
    assert "service vllm (pid %d) runs on this host" % vllm.pid in r["msg"], r["msg"]
    assert path.read_bytes() == before


@pytest.mark.parametrize("layer", [_sitecustomize, _ncclconf], ids=["sitecustomize_env", "nccl_conf"])
def test_a_change_while_another_services_run_holds_its_lock_is_refused(tmp_path, run_module, layer):
    """Found by the new-user pass (issue 24): sgb's run had killed sgb and held sgb's host lock (no sgb process to
    see) when sglang's run rewrote the layers; sgb then launched with values it never asked for. The lock of another
    service held by a live run refuses the change; an expired one, or this service's own, does not."""
    main, args, path, locks, before = _written_with_locks(tmp_path, layer, run_module)
    owner = "ctl:4242:boot.1.uuid:%d" % int(time.time())
    _lock(locks, "sgb", owner)
    _lock(locks, "sglang", "me")
    for check_mode in (True, False):
        r = run_module(main, dict(args, env={"NCCL_PROTO": "Simple"}), check_mode=check_mode)
        assert r.get("failed") is True, r
        assert "service sgb (its host lock held by run %s since " % owner in r["msg"], r["msg"]
        assert "no process of that run works on this host now) is being restarted on this host by another run" \
            in r["msg"] and "rerun the rollout of sgb" in r["msg"], r["msg"]
        assert "changing NCCL_PROTO for sglang" in r["msg"] and "Simple" not in r["msg"], r["msg"]
        assert r["other_services"] == ["sgb"]
        assert path.read_bytes() == before
    # The same values are no change; an expired lock (a run long gone) holds nothing back.
    assert run_module(main, dict(args, env={"NCCL_PROTO": "LL"}))["changed"] is False
    _lock(locks, "sgb", owner, -1)
    r = run_module(main, dict(args, env={"NCCL_PROTO": "Simple"}))
    assert "failed" not in r and r["changed"] is True, r


@pytest.mark.parametrize("layer", [_sitecustomize, _ncclconf], ids=["sitecustomize_env", "nccl_conf"])
def test_the_values_another_services_unfinished_run_wrote_are_not_launched_onto(tmp_path, run_module, layer):
    """Found by the new-user pass (issue 24, session 20): sga's run wrote the layers (its snapshot kept) and waited at
    its clean gate; sgb's run, whose values they now were, changed nothing and launched; sga's restart was then refused
    and its snapshot put back, leaving sgb's workers with values the files no longer held. While another service's run
    holds its lock with a snapshot, even no change is refused; its lock without a snapshot (it changed nothing), or
    its snapshot without a live lock (a run long gone), holds nothing back."""
    main, args, path, locks, before = _written_with_locks(tmp_path, layer, run_module)
    owner = "ctl:4243:boot.1.uuid:%d" % int(time.time())
    _lock(locks, "sga", owner)
    assert run_module(main, dict(args, env={"NCCL_PROTO": "LL"}))["changed"] is False  # no snapshot: it changed nothing
    (locks / ("sga" + _layershare.SNAPSHOT_SUFFIX)).write_text(json.dumps({"files": []}))
    for check_mode in (True, False):
        r = run_module(main, dict(args, env={"NCCL_PROTO": "LL"}), check_mode=check_mode)
        assert r.get("failed") is True, r
        assert "service sga (its host lock held by run %s since " % owner in r["msg"], r["msg"]
        assert ("; no process of that run works on this host now) changed them and has not finished its restart"
                in r["msg"]), r["msg"]
        assert ("If it was interrupted (Ctrl-C, its controller killed), rerun the rollout of sga: from the controller "
                "that started it, it takes the lock over and finishes; from another, remove %s first, once you know that "
                "run is gone" % (locks / "sga.lock")) in r["msg"], r["msg"]
        assert "sglang would then run with values the file no longer holds" in r["msg"] and "LL" not in r["msg"], r["msg"]
        assert r["other_services"] == ["sga"]
        assert path.read_bytes() == before
    _lock(locks, "sga", owner, -1)
    assert run_module(main, dict(args, env={"NCCL_PROTO": "LL"}))["changed"] is False


@pytest.mark.parametrize("layer", [_sitecustomize, _ncclconf], ids=["sitecustomize_env", "nccl_conf"])
def test_a_tagged_process_of_another_user_holds_back_no_change_unless_its_pidfile_names_that_user(
        tmp_path, run_module, layer):
    """Found by the new-user pass (issue 24): any user could block every layer change of the host with a `sleep`
    carrying another service's launch tag, and "stop ghost first" could not be followed. A process counts as another
    service's when it runs as root, or as the user of the process that service's pidfile in the run dir names."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as nobody")
    main, args, path, locks, _before = _written_with_locks(tmp_path, layer, run_module)
    ghost = subprocess.Popen(["/bin/sleep", "600"], env={TAG: "ghost"}, user=65534, group=65534, cwd="/",
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while _proc.read_environ(ghost.pid, [TAG]) != {TAG: "ghost"} or _proc.read_proc(ghost.pid).uid != 65534:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = run_module(main, dict(args, env={"NCCL_PROTO": "Simple"}))
        assert "failed" not in r and r["changed"] is True, r
        # The same user's server, named by ghost's pidfile in the run dir: a gpufleet service run as that user.
        (locks / "ghost.pid").write_text("%d %d\n" % (ghost.pid, _proc.read_proc(ghost.pid).start_time))
        r = run_module(main, dict(args, env={"NCCL_PROTO": "LL"}))
        assert r.get("failed") is True and "service ghost (pid %d) runs on this host" % ghost.pid in r["msg"], r
    finally:
        ghost.kill()
        ghost.wait()


@pytest.mark.parametrize("layer", [_sitecustomize, _ncclconf], ids=["sitecustomize_env", "nccl_conf"])
def test_a_change_while_a_running_services_unfinished_run_changed_the_layers_says_to_finish_that_run(
        tmp_path, run_module, other_service, layer):
    """Found by the new-user pass (issue 24): sglang's controller was killed after its run wrote the layers (lock and
    snapshot left) while sglang's old server ran on; sgb's run with values of its own was told "stop sglang first",
    which stops a healthy server. It is told that sglang's run is unfinished, and to rerun it."""
    main, args, path, locks, before = _written_with_locks(tmp_path, layer, run_module)
    sgb = other_service("sgb")
    owner = "ctl:4244:boot.1.uuid:%d" % int(time.time())
    _lock(locks, "sgb", owner)
    (locks / ("sgb" + _layershare.SNAPSHOT_SUFFIX)).write_text(json.dumps({"files": []}))
    r = run_module(main, dict(args, env={"NCCL_PROTO": "Simple"}))
    assert r.get("failed") is True and r["other_services"] == ["sgb"], r
    assert "service sgb (its host lock held by run %s since " % owner in r["msg"], r["msg"]
    assert ") changed them and has not finished its restart on this host; changing NCCL_PROTO for sglang now would " \
        "change what it launches with, or puts back." in r["msg"], r["msg"]
    assert "rerun the rollout of sgb" in r["msg"] and "stop sgb first" not in r["msg"] and "Simple" not in r["msg"]
    assert path.read_bytes() == before and sgb.poll() is None
