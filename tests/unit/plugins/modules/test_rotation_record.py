# SPDX-License-Identifier: GPL-3.0-or-later
"""rotation_record main() in-process, on real files: the host's record of gpufleet's own drains."""
from __future__ import annotations

import json
import os
import stat

import pytest

from ansible_collections.gpufleet.serving.plugins.modules import rotation_record


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_add_keep_replace_clear_and_read(tmp_path, run_module):
    path = str(tmp_path / "state" / "demo.rotation.json")
    r = run_module(rotation_record.main, {"path": path})
    assert r["changed"] is False and r["records"] == {} and not os.path.exists(path)
    r = run_module(rotation_record.main, {"path": path, "action": "add", "balancer": "haproxy", "found": "DRAIN",
                                          "server": "host1", "run": "run-1"})
    assert r["changed"] is True and r["records"]["haproxy"]["found"] == "DRAIN" and r["records"]["haproxy"]["at"]
    assert _mode(path) == 0o600  # root only, as the server's state file, whatever the umask
    # An earlier run's entry is kept (keep, the default): what the host goes back to.
    r = run_module(rotation_record.main, {"path": path, "action": "add", "balancer": "haproxy", "found": "MAINT",
                                          "run": "run-2"})
    assert r["changed"] is False and r["records"]["haproxy"]["found"] == "DRAIN" and r["records"]["haproxy"]["run"] == "run-1"
    # Found in rotation (keep false): a stale entry is replaced.
    r = run_module(rotation_record.main, {"path": path, "action": "add", "balancer": "haproxy", "found": "UP",
                                          "run": "run-3", "keep": False})
    assert r["changed"] is True and r["records"]["haproxy"]["run"] == "run-3"
    run_module(rotation_record.main, {"path": path, "action": "add", "balancer": "smg", "found": "listed"})
    assert sorted(json.loads(open(path).read())["drains"]) == ["haproxy", "smg"]
    r = run_module(rotation_record.main, {"path": path, "action": "clear", "balancers": ["haproxy"]})
    assert r["changed"] is True and list(r["records"]) == ["smg"]
    r = run_module(rotation_record.main, {"path": path, "action": "clear", "balancers": ["haproxy", "smg"]})
    assert r["changed"] is True and r["records"] == {} and not os.path.exists(path)
    assert run_module(rotation_record.main, {"path": path, "action": "clear", "balancers": ["smg"]})["changed"] is False


def test_check_mode_writes_nothing(tmp_path, run_module):
    path = str(tmp_path / "demo.rotation.json")
    r = run_module(rotation_record.main, {"path": path, "action": "add", "balancer": "haproxy", "found": "UP"},
                   check_mode=True)
    assert r["changed"] is True and not os.path.exists(path)


def test_diff_shows_the_record_before_and_after(tmp_path, run_module):
    path = str(tmp_path / "demo.rotation.json")
    args = {"path": path, "action": "add", "balancer": "haproxy", "found": "UP", "server": "host1", "_ansible_diff": True}
    r = run_module(rotation_record.main, args, check_mode=True)
    assert r["diff"]["before"] == "" and json.loads(r["diff"]["after"])["drains"]["haproxy"]["server"] == "host1"
    assert not os.path.exists(path)
    run_module(rotation_record.main, args)
    assert "diff" not in run_module(rotation_record.main, args)  # kept: nothing changed, nothing to show
    r = run_module(rotation_record.main, {"path": path, "action": "clear", "balancers": ["haproxy"], "_ansible_diff": True})
    assert json.loads(r["diff"]["before"])["drains"]["haproxy"]["found"] == "UP" and r["diff"]["after"] == ""


@pytest.mark.parametrize("text", ["not json", "[]", "42", "null", '{"drains": []}', '{"x": 1}',
                                  '{"drains": {"haproxy": "x"}}'])
def test_a_file_that_is_not_a_record_fails_and_is_left_alone(tmp_path, run_module, text):
    path = tmp_path / "demo.rotation.json"
    path.write_text(text)
    r = run_module(rotation_record.main, {"path": str(path), "action": "add", "balancer": "haproxy", "found": "UP"})
    assert r["failed"] is True and "is not a gpufleet drain record" in r["msg"]
    assert path.read_text() == text


def test_add_needs_balancer_and_found(tmp_path, run_module):
    r = run_module(rotation_record.main, {"path": str(tmp_path / "x.json"), "action": "add"})
    assert r["failed"] is True and "balancer" in r["msg"] and "drains" in r["msg"], r
    r = run_module(rotation_record.main, {"path": str(tmp_path / "x.json"), "action": "add", "balancer": "haproxy"})
    assert r["failed"] is True and "balancer" in r["msg"] and "found" in r["msg"], r


def test_add_several_drains_in_one_call(tmp_path, run_module):
    path = str(tmp_path / "x.json")
    run_module(rotation_record.main, {"path": path, "action": "add", "balancer": "haproxy", "found": "DRAIN", "run": "r1"})
    r = run_module(rotation_record.main, {"path": path, "action": "add", "run": "r2", "drains": [
        {"balancer": "haproxy", "found": "MAINT", "server": "host1", "keep": True},
        {"balancer": "smg", "found": "listed", "server": "http://h:1", "keep": False}]})
    assert r["changed"] is True and r["records"]["haproxy"]["found"] == "DRAIN" and r["records"]["haproxy"]["run"] == "r1"
    assert r["records"]["smg"]["found"] == "listed" and r["records"]["smg"]["run"] == "r2"
    assert json.loads(open(path).read())["drains"] == r["records"]


def test_a_directory_is_named(tmp_path, run_module):
    r = run_module(rotation_record.main, {"path": str(tmp_path), "action": "read"})
    assert r["failed"] is True and "%s is a directory, not a gpufleet drain record" % tmp_path in r["msg"], r


def test_read_with_known_names_the_drains_of_entries_the_host_no_longer_has(tmp_path, run_module):
    path = str(tmp_path / "demo.rotation.json")
    for name in ("haproxy", "old-lb"):
        run_module(rotation_record.main, {"path": path, "action": "add", "balancer": name, "found": "UP", "run": "r-1"})
    r = run_module(rotation_record.main, {"path": path, "known": ["haproxy", "sglang_router"]})
    assert r["changed"] is False and sorted(r["records"]) == ["haproxy", "old-lb"]
    assert len(r["stale"]) == 1 and r["stale"][0].startswith(
        "drain record: gpufleet took server ? out of balancer entry old-lb (run r-1 at "), r["stale"]
    # No entry at all (every balancer removed from the inventory): every drain is stale.
    assert len(run_module(rotation_record.main, {"path": path, "known": []})["stale"]) == 2
    # Without known: no opinion.
    assert "stale" not in run_module(rotation_record.main, {"path": path})


@pytest.mark.parametrize("drains", [{"haproxy": {"server": "host2", "found": 7}}, {"haproxy": {}},
                                    {"haproxy": {"server": 5, "found": "UP"}}])
def test_a_record_whose_fields_are_not_what_gpufleet_writes_is_refused(tmp_path, run_module, drains):
    """helper-38: such a record passed the audit, and the rollout's put-back failed on it after taking the host out."""
    path = tmp_path / "demo.rotation.json"
    path.write_text(json.dumps({"drains": drains}))
    r = run_module(rotation_record.main, {"path": str(path), "known": ["haproxy"]})
    assert r.get("failed"), r
    assert "is not a gpufleet drain record (its entry haproxy has no state found, or fields that are not text" in r["msg"]
