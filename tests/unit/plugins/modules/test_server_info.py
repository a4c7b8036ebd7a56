# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""server_info: the read-only check (issue 25's split of server_state by job). It says what server_state's check says
of the same host, by the same code, and writes nothing: no lock file, no record, whatever it finds."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_server_state as _st  # noqa: E402
from test_server_state import NAME, check_args, running  # noqa: E402

from ansible_collections.gpufleet.serving.plugins.module_utils import _hostlock  # noqa: E402
from ansible_collections.gpufleet.serving.plugins.modules import server_info, server_state  # noqa: E402


# server_state's fixtures, used here by name: a tagged server holding fake GPUs, and the state, pid and lock paths.
servers = _st.servers
paths = _st.paths


def info_args(paths, **kw):
    a = check_args(paths, **kw)
    del a["action"]
    return a


def listing(tmp_path):
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


def test_it_says_what_server_states_check_says_and_writes_nothing(servers, paths, run_module, tmp_path):
    s = running(servers, paths, run_module)
    before = listing(tmp_path)
    state_before = Path(paths["state_file"]).read_bytes()
    for kw in ({}, {"fingerprint": "a" * 64, "expected_env": {"NCCL_PROTO": "Simple"}}):
        info = run_module(server_info.main, info_args(paths, lock_file=paths["lock_file"], **kw))
        state = run_module(server_state.main, check_args(paths, **kw))
        assert info["changed"] is False and "locked" not in info
        for k in ("needs_restart", "reasons", "running", "workers", "strays", "env_problems", "fingerprint_recorded",
                  "up_to_date", "gpu_holders"):
            assert info[k] == state[k], k
        assert info["needs_restart"] is bool(kw)
    # In check mode too: the same answer.
    cm = run_module(server_info.main, info_args(paths), check_mode=True)
    assert cm["changed"] is False and cm["up_to_date"] is True and [w["pid"] for w in cm["workers"]] == [s.pid]
    assert listing(tmp_path) == before and Path(paths["state_file"]).read_bytes() == state_before
    assert not os.path.exists(paths["lock_file"])


def test_another_runs_lock_is_not_up_to_date_and_is_left_alone(servers, paths, run_module):
    running(servers, paths, run_module)
    taken = run_module(server_state.main, {"action": "lock", "name": NAME, "state_file": paths["state_file"],
                                           "lock_file": paths["lock_file"], "owner": "ctl:7:other"})
    assert taken["locked"] is True
    lock = Path(paths["lock_file"]).read_bytes()
    r = run_module(server_info.main, info_args(paths, lock_file=paths["lock_file"]))
    assert r["changed"] is False and r["needs_restart"] is False and r["up_to_date"] is False
    assert r["lock_holder"] == "ctl:7:other"
    assert Path(paths["lock_file"]).read_bytes() == lock and _hostlock.lock_holder(paths["lock_file"]) == "ctl:7:other"


@pytest.mark.parametrize("option", [{"owner": "ctl:1:a"}, {"keep_lock": True}, {"action": "check"}, {"timings": {}}])
def test_the_writes_options_are_not_its_own(paths, run_module, option):
    """Taking a lock, keeping it or recording is server_state's job: server_info refuses those options."""
    args = info_args(paths)
    args.update(option)
    r = run_module(server_info.main, args)
    assert r["failed"] and "Unsupported parameters" in r["msg"] and list(option)[0] in r["msg"], r
    assert not os.path.exists(os.path.dirname(paths["lock_file"]))


def test_server_states_check_without_an_owner_is_deprecated_for_it(nvml, paths, run_module, monkeypatch):
    from ansible.module_utils import _internal
    from ansible.module_utils.common import warnings

    # A unit test of an action plugin in this process makes ansible-core take it for a controller, whose deprecations go
    # to Display instead of the module's result: this test is a module's run on a target.
    monkeypatch.setattr(_internal, "is_controller", False, raising=False)

    def msgs(res):  # 2.19 puts the text under event (a DeprecationSummary); older cores had it at the top
        return [d.get("msg") or d["event"]["msg"] for d in res.get("deprecations") or []]

    # ansible-core keeps a process's deprecations across module runs (a dict, so one text once): start from none.
    getattr(warnings, "_global_deprecations").clear()
    # With an owner (the role's check under the lock) it is not deprecated.
    locked = run_module(server_state.main, check_args(paths, lock_file=paths["lock_file"], owner="ctl:1:a"))
    assert msgs(locked) == []
    r = run_module(server_state.main, check_args(paths))
    assert msgs(r) == [
        "server_state's action=check without owner is the read-only check of gpufleet.serving.server_info, with the "
        "same options (less action); use that module"], json.dumps(r.get("deprecations"))
