# SPDX-License-Identifier: GPL-3.0-or-later
"""The gpu_server role's decision after its check (plugin_utils/_check.py, run by the server_state action with
O(decide)); the real plays that take each branch are in tests/rollout (drain, tags) and tests/reliability (locks)."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _check

WORKERS = [dict(pid=10, holds_gpu=False), dict(pid=11, holds_gpu=True), dict(pid=12, holds_gpu=True)]


def check(**over):
    res = dict(needs_restart=False, reasons=[], running=True, workers=WORKERS, env_problems={})
    res.update(over)
    return res


def test_an_up_to_date_host_is_kept_and_its_gpu_holding_workers_count():
    d = _check.decide(check(), force=False, balancers=[], locked_run=True, check_mode=False, service="sglang")
    assert d == dict(do_restart=False, return_only=False, rotation={},
                     result=dict(service="sglang", restarted=False, reasons=[], workers=3, workers_verified=2,
                                 record_missing=""))


def test_a_worker_with_an_env_problem_is_not_verified_and_a_stopped_server_verifies_none():
    d = _check.decide(check(needs_restart=True, reasons=["workers lack the expected environment: pid 12: X"],
                            env_problems={"12": ["X"]}), False, [], True, False)
    assert d["do_restart"] is True and d["result"]["workers_verified"] == 1
    assert d["result"]["reasons"] == ["workers lack the expected environment: pid 12: X"]
    d = _check.decide(check(running=False, needs_restart=True, reasons=["server is not running"]), False, [], True, False)
    assert d["result"]["workers_verified"] == 0 and d["result"]["workers"] == 3


def test_a_forced_restart_says_forced_whatever_the_check_found():
    d = _check.decide(check(needs_restart=True, reasons=["server is not running"]), True, [], True, False)
    assert d["do_restart"] is True and d["result"]["reasons"] == ["forced"] and not d["return_only"]
    assert d["rotation"] == {}  # no balancers: the summary shows none


@pytest.mark.parametrize("check_mode", [False, True])
def test_a_restart_behind_balancers_starts_its_drain_in_rotation_whatever_the_record_says(check_mode):
    # The drain (drain.yml) reads the check's records itself: the entries the record names are not "out" of this
    # run's drain yet, they are `recorded` (an earlier run's: the summary's left out until the put-back).
    d = _check.decide(check(needs_restart=True, reasons=["r"], drain_records=RECORDS), False, ["lb-a", "lb-c"], True,
                      check_mode)
    assert d["do_restart"] is True and d["return_only"] is False and "error" not in d
    assert d["rotation"] == dict(out_of=[], balancers=["lb-a", "lb-c"], would_drain=check_mode, drained=False, found={},
                                 left_as_found={}, renamed={}, recorded=[n for n in ["lb-a", "lb-c"] if n in RECORDS])


def test_the_record_of_a_kept_server_that_cannot_be_written_is_in_the_row():
    d = _check.decide(check(record_missing="no room"), False, [], True, False)
    assert d["result"]["record_missing"] == "no room"


RECORDS = {"lb-b": dict(run="ctl:42:x", found="DRAIN"), "lb-a": dict(run="ctl:42:x"), "gone": dict(run="old")}


@pytest.mark.parametrize("check_mode, said", [(False, "put back"), (True, "would be put back")])
def test_an_up_to_date_host_left_drained_goes_back_into_the_entries_its_record_names_only(check_mode, said):
    d = _check.decide(check(drain_records=RECORDS), False, ["lb-a", "lb-b", "lb-c"], True, check_mode)
    assert d["do_restart"] is False and d["return_only"] is True
    assert d["result"]["reasons"] == ["out of rotation on lb-a, lb-b since run ctl:42:x (drain record): %s, "
                                      "no restart needed" % said]
    # The entries' order; lb-c is not named by the record, "gone" is no entry of this host now.
    assert d["rotation"] == dict(out_of=["lb-a", "lb-b"], balancers=["lb-a", "lb-b", "lb-c"], would_drain=False,
                                 drained=False, left_as_found={}, returned=["lb-a", "lb-b"], would_return=check_mode,
                                 found={"lb-a": "UP", "lb-b": "DRAIN"})


@pytest.mark.parametrize("kw", [dict(force=True), dict(locked_run=False), dict(balancers=[])])
def test_no_return_plan_for_a_restart_the_read_only_audit_or_a_host_without_balancers(kw):
    args = dict(force=False, balancers=["lb-a"], locked_run=True, check_mode=False)
    args.update(kw)
    d = _check.decide(check(drain_records=RECORDS), **args)
    assert d["return_only"] is False and "returned" not in d["rotation"] and "error" not in d
    if not kw.get("force"):
        assert d["rotation"] == {}


def test_a_record_naming_no_entry_of_the_host_plans_nothing():
    d = _check.decide(check(drain_records={"other": {}}), False, ["lb-a"], True, False)
    assert d["return_only"] is False and d["result"]["reasons"] == []


def test_an_unreadable_drain_record_fails_a_host_it_would_drain_or_put_back():
    d = _check.decide(check(drain_record_error="drain record /x: not JSON"), False, ["lb-a"], True, False)
    assert d["error"] == "drain record /x: not JSON"
    assert _check.decide(check(needs_restart=True, reasons=["r"], drain_record_error="e"),
                         False, ["lb-a"], True, False)["error"] == "e"
    # Check mode drains nothing, but predicts the real run's failure (helper-40: a forced --check said "would");
    # the audit and a host without balancers never fail on it.
    assert _check.decide(check(needs_restart=True, reasons=["r"], drain_record_error="e"),
                         True, ["lb-a"], True, True)["error"] == "e"
    assert "error" not in _check.decide(check(drain_record_error="e"), False, ["lb-a"], False, False)
    assert "error" not in _check.decide(check(drain_record_error="e"), False, [], True, False)


LAYERS = {"up_to_date": False, "sitecustomize": {"up_to_date": False}, "nccl_conf": {"up_to_date": True},
          "extra": {"error": "unreadable"}}


def test_a_restart_onto_layers_this_run_did_not_apply_is_refused_naming_them():
    stale = {k: v for k, v in LAYERS.items() if k != "extra"}
    msg = _check.refusal(check(needs_restart=True, nccl_layers=stale), False, True, "pcie_only")
    assert msg == ("the NCCL layers on this host are not what gpufleet_nccl_profile pcie_only asks for (sitecustomize "
                   "would change), and this run left the nccl_tuning role out (--tags/--skip-tags): a restart now "
                   "would launch workers without the tuning. Run with the nccl_tuning tag too.")
    assert _check.refusal(check(nccl_layers=stale), True, True, "nvlink") is not None  # forced
    # A layer the check could not decide (found by the new-user pass: another service's run was changing the layers,
    # and "would change" was untrue) says why instead.
    msg = _check.refusal(check(needs_restart=True, nccl_layers=LAYERS), False, True, "pcie_only")
    assert msg == ("the NCCL layers on this host cannot be checked against gpufleet_nccl_profile pcie_only: unreadable; "
                   "a restart now could launch workers without the tuning"), msg


@pytest.mark.parametrize("res, force, locked_run", [
    (check(nccl_layers=LAYERS), False, True),  # no restart needed: nothing to refuse
    (check(needs_restart=True, nccl_layers=LAYERS), False, False),  # the read-only audit reports the drift itself
    (check(needs_restart=True, nccl_layers=dict(LAYERS, up_to_date=True)), False, True),
    (check(needs_restart=True), True, True),  # the layers were not checked (the role applied them)
])
def test_no_refusal(res, force, locked_run):
    assert _check.refusal(res, force, locked_run, "pcie_only") is None


def test_the_unknown_profile_refusal_names_the_profile_and_the_way_out():
    msg = _check.unknown_nccl_refusal("auto")
    assert msg.startswith("gpufleet_nccl_profile is auto but this run does not know its NCCL variables")
    assert "Include the gpufleet.serving.nccl_tuning role before gpu_server" in msg


@pytest.mark.parametrize("needs_restart", [True, False])
def test_a_rollback_check_names_the_generation_in_the_hosts_row_whether_or_not_it_restarts(needs_restart):
    """The rollback playbook's summary says what each host went back to, or that it already runs it."""
    to = dict(fingerprint="a" * 64, recorded_at="T", **{"from": "b" * 64}, inventory_fingerprint="b" * 64)
    d = _check.decide(check(needs_restart=needs_restart, rollback=to), False, ["lb"], True, False)
    assert d["do_restart"] is needs_restart and d["result"]["rollback_to"] == to
    assert "rollback_to" not in _check.decide(check(), False, [], True, False)["result"]


def test_a_kept_host_whose_layers_the_run_did_not_apply_names_them_and_a_restart_is_refused_instead():
    stale = {"up_to_date": False, "sitecustomize": {"up_to_date": False}, "nccl_conf": {"up_to_date": True}}
    d = _check.decide(check(nccl_layers=stale), False, [], True, False)
    assert d["do_restart"] is False and d["result"]["nccl_stale"] == ["sitecustomize"], d
    assert "nccl_stale" not in _check.decide(check(nccl_layers={"up_to_date": True}), False, [], True, False)["result"]
    assert "nccl_stale" not in _check.decide(check(), False, [], True, False)["result"]
    # A restart onto them is refused (refusal), not reported as stale.
    d = _check.decide(check(nccl_layers=stale, needs_restart=True, reasons=["r"]), False, [], True, False)
    assert "nccl_stale" not in d["result"]


# The rollout's fast path (the rollout_check action) after its read-only check.
def test_the_fast_path_ends_only_a_host_the_check_calls_up_to_date_and_no_drain_record_names():
    up = check(up_to_date=True)
    assert _check.fast_verdict(up, ["lb"], "demo") == {
        "up_to_date": True, "gpufleet_nccl_changed": False,
        "gpufleet_server_result": dict(service="demo", restarted=False, reasons=[], workers=3, workers_verified=2)}
    # An earlier run died after its drain: the roles put the host back, however right its server.
    assert _check.fast_verdict(dict(up, drain_records={"lb": {}}), ["lb"], "demo") == {"up_to_date": False}
    # A record of a balancer the host no longer has is not this host's business here.
    assert _check.fast_verdict(dict(up, drain_records={"old": {}}), ["lb"], "demo")["up_to_date"] is True
    # Not up to date, or a check that failed: the roles take the host and report it.
    assert _check.fast_verdict(check(up_to_date=False), [], "demo") == {"up_to_date": False}
    assert _check.fast_verdict(dict(up, failed=True, msg="no"), [], "demo") == {"up_to_date": False}


def test_the_fast_path_fails_a_host_whose_server_cannot_be_launched():
    v = _check.fast_verdict(check(launch_problems=["no such user"], msg="cannot launch: no such user", failed=True),
                            [], "demo")
    assert v == {"failed": True, "msg": "demo: cannot launch: no such user", "launch_problems": ["no such user"]}


def test_a_host_with_no_balancer_left_is_warned_of_every_drain_its_record_keeps_and_of_an_unreadable_record():
    """Found in session 24's review: with every balancer entry removed from the inventory, the rollout read no record
    and said nothing of the drains it keeps (the audit did). Each is now a warning, as for one renamed entry."""
    rec = {"old-lb": {"found": "UP", "server": "h1", "run": "r-1", "at": "t"}}
    lines = _check.stale_records({"drain_records": rec}, [])
    assert len(lines) == 1 and lines[0].startswith("drain record: gpufleet took server h1 out of balancer entry old-lb")
    # A record of another host's server (an entry copied when it was made) names that server, not "the host", as the
    # one to put back (helper-40: an operator following "the host" would undo an operator's MAINT on this one).
    other = _check.stale_records({"drain_records": {"lb": {"found": "UP", "server": "host2", "run": "x", "at": "y"}}}, [])
    assert other[0].startswith("drain record: gpufleet took server host2 out of balancer entry lb (run x at y)"), other
    assert "put that server back into that balancer by hand" in other[0], other
    assert _check.stale_records({"drain_records": rec}, ["old-lb"]) == []
    bad = _check.stale_records({"drain_record_error": "drain record /x: not JSON"}, [])
    assert len(bad) == 1 and bad[0].startswith("drain record /x: not JSON; the host has no balancer"), bad
    # With balancers, an unreadable record fails the host (decide), not a warning.
    assert _check.stale_records({"drain_record_error": "drain record /x: not JSON"}, ["lb"]) == []


def test_a_return_to_service_over_a_record_of_another_server_fails_the_host_in_check_mode_too():
    """helper-39 (Medium): --check predicted a put-back ("would put back ... (lb)") that the real run refused after
    its check (the put-back's own refusal). The decision refuses it now, in both, naming the record."""
    check = {"needs_restart": False, "drain_records": {"lb": {"found": "UP", "server": "host1", "run": "r"}}}
    for check_mode in (False, True):
        out = _check.decide(check, False, ["lb"], True, check_mode, {"lb": "host2"})
        assert out["error"].startswith("the drain record of entry lb names server host1, not this host's host2"), out
        assert out["error"].endswith("nothing was touched") and not out["return_only"], out
    # Its own record: the put-back, as before.
    assert _check.decide(check, False, ["lb"], True, False, {"lb": "host1"})["return_only"] is True


def _real_task(own, inherited):
    """A task of a real play (ansible-core's own objects): `own` tags under a block tagged `inherited`."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.playbook.play import Play
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    task = {"debug": {"msg": "x"}}
    if own:
        task["tags"] = list(own)
    block = {"block": [task]}
    if inherited:
        block["tags"] = list(inherited)
    play = Play.load({"name": "p", "hosts": "all", "gather_facts": False, "tasks": [block]},
                     variable_manager=VariableManager(loader=loader), loader=loader)
    return play.get_tasks()[0][0]


TAGSETS = [[], ["nccl_tuning", "configure"], ["gpufleet_server"], ["always"], ["never"], ["never", "nccl_tuning"]]
SELECTIONS = [["all"], ["nccl_tuning"], ["gpufleet_server"], ["configure", "gpufleet_server"], ["tagged"], ["untagged"],
              ["mine"], ["always"], ["never"]]
SKIPS = [[], ["nccl_tuning"], ["gpufleet_server"], ["all"], ["always"], ["tagged"], ["untagged"], ["mine"], ["all", "always"]]


@pytest.mark.parametrize("inherited", [[], ["mine"]])
@pytest.mark.parametrize("own", TAGSETS)
def test_tags_select_is_what_ansible_core_does_with_a_task_of_these_tags(own, inherited):
    # The check's call runs each of its steps only where a task of that step's own tags would have run: the very
    # rules of ansible-core (Taggable.evaluate_tags on a real task of a real play), for every selection here.
    task = _real_task(own, inherited)
    for only in SELECTIONS:
        for skip in SKIPS:
            assert _check.tags_select(list(inherited) + list(own), only, skip) is task.evaluate_tags(only, skip, {}), \
                (own, inherited, only, skip)


def test_a_restart_starts_from_the_entries_the_hosts_own_drain_record_names():
    """helper-45: the decision says which entries an earlier run left the host out of, its own drains only."""
    records = {"lb-a": {"server": "h1", "found": "UP"}, "lb-b": {"server": "other", "found": "UP"}, "gone": {}}
    d = _check.decide(check(needs_restart=True, reasons=["r"], drain_records=records), False, ["lb-a", "lb-b", "lb-c"],
                      True, False, {"lb-a": "h1", "lb-b": "h1"})
    assert d["rotation"]["recorded"] == ["lb-a"] and d["rotation"]["out_of"] == []
    assert _check.recorded_drains({"drain_records": records}, ["lb-b", "lb-a"]) == ["lb-b", "lb-a"]
    assert _check.recorded_drains({"drain_record_error": "x"}, ["lb-a"]) == []
