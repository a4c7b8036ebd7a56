# SPDX-License-Identifier: GPL-3.0-or-later
"""The gpu_server role's host facts composed from its steps' registered results (plugin_utils/_flow.py, through the
server_rotation and server_result filters). The real plays that take each path (drain, reload mid-drain, failed
put-back, two services per host) are in tests/rollout and tests/reliability."""
from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.filter.server_result import FilterModule as ResultFilters
from ansible_collections.gpufleet.serving.plugins.filter.server_rotation import FilterModule as RotationFilters
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _flow

rotation = RotationFilters().filters()["server_rotation"]
result = ResultFilters().filters()["server_result"]

NAMES = ["lb", "smg", "hook"]
SKIPPED = {"skipped": True, "changed": False, "skip_reason": "Conditional result was False"}


def start():
    return dict(out_of=[], balancers=list(NAMES), would_drain=False, drained=False, found={}, left_as_found={},
                renamed={})


def loop(*rots, failed=False, key="rotation"):
    res = {"results": [{key: r, "item": "m%d" % i} for i, r in enumerate(rots)], "changed": True}
    if failed:
        res["failed"] = True
    return res


def drain(*rots, settle=None, failed=False):
    """The drain loop's register: an out step per rotation, then the settle step."""
    res = {"results": [{"step": "plan", "drains": []}] + [{"step": "out", "rotation": r} for r in rots], "changed": True}
    if settle is not None:
        res["results"].append(dict(settle, step="settle"))
    if failed:
        res["failed"] = True
    return res


def test_a_host_whose_balancers_the_run_does_not_touch_has_none_whatever_was_registered():
    assert rotation({}, NAMES, False, drain=drain({"out_of": ["lb"]})) == {}
    assert rotation(None, NAMES, False) == {}


OUTS = ({"out_of": ["smg"], "found": {"smg": "listed"}, "left_as_found": {}, "renamed": {}},
        {"out_of": ["lb"], "found": {"lb": "UP"}, "left_as_found": {"hook": "MAINT"}, "renamed": {"old": "lb"}})


def test_the_take_out_calls_merge_in_the_entries_order_and_the_settle_drains():
    r = rotation(start(), NAMES, False, drain=drain(*OUTS))
    assert r["out_of"] == ["lb", "smg"] and r["found"] == {"smg": "listed", "lb": "UP"}
    assert r["left_as_found"] == {"hook": "MAINT"} and r["renamed"] == {"old": "lb"} and r["drained"] is False
    r = rotation(start(), NAMES, False, drain=drain(*OUTS, settle={"outcome": "drained", "inflight_left": 0.0,
                                                                   "back_in_rotation": []}))
    assert r["drained"] is True and r["inflight_left"] == 0.0 and r["out_of"] == ["lb", "smg"]


def slow(verdict):
    """The slow path's register: a round (skipped), the verdict."""
    return {"results": [{"step": "reread", "skipped": True}, {"step": "slice", "inflight": 0.0, "drained": True},
                        dict(verdict, step="verdict")], "changed": False}


def test_a_drain_deferred_to_the_slow_path_is_drained_by_its_verdict_only():
    d = drain(*OUTS, settle={"outcome": "deferred", "skipped": True})
    assert rotation(start(), NAMES, False, drain=d)["drained"] is False
    assert rotation(start(), NAMES, False, drain=d, slow=SKIPPED)["drained"] is False
    r = rotation(start(), NAMES, False, drain=d, slow=slow({"outcome": "drained", "inflight_left": 0.0, "back_in_rotation": []}))
    assert r["drained"] is True and r["inflight_left"] == 0.0 and r["out_of"] == ["lb", "smg"]
    r = rotation(start(), NAMES, False, drain=d, slow=slow({"outcome": "proceed", "inflight_left": 2.0, "back_in_rotation": []}))
    assert r["drained"] is True and r["inflight_left"] == 2.0 and r["out_of"] == ["lb", "smg"]
    # Past the timeout under on_timeout fail: not drained, still out of both (the host fails).
    r = rotation(start(), NAMES, False, drain=d, slow=slow({"outcome": "timeout", "failed": True, "inflight_left": 2.0}))
    assert r["drained"] is False and r["out_of"] == ["lb", "smg"]


def test_a_failed_take_out_keeps_what_its_other_calls_took_out():
    out = drain({"out_of": ["smg"], "found": {"smg": "listed"}}, failed=True)
    out["results"].append({"step": "out", "failed": True, "msg": "socket: permission denied", "item": "lb1"})
    out["results"].append({"step": "settle", "skipped": True, "outcome": "aborted"})
    r = rotation(start(), NAMES, False, drain=out)
    assert r["out_of"] == ["smg"] and r["drained"] is False


def test_entries_a_re_read_finds_back_in_rotation_are_no_longer_out_of():
    out = {"out_of": ["lb", "smg"], "found": {"lb": "UP", "smg": "listed"}}
    back = {"outcome": "lost", "failed": True, "back_in_rotation": [{"name": "lb", "found": "UP"}]}
    d = drain(out, settle={"outcome": "deferred", "skipped": True})
    r = rotation(start(), NAMES, False, drain=d, slow=slow(back))
    assert r["out_of"] == ["smg"] and r["drained"] is True
    lost = {"outcome": "lost", "failed": True, "back_in_rotation": [{"name": "lb", "found": "UP"}]}
    r = rotation(start(), NAMES, False, drain=drain(out, settle=lost))
    assert r["out_of"] == ["smg"] and r["drained"] is True
    # helper-41: put back by hand in one backend only, still MAINT in the other: still out there (the record keeps it).
    lost = {"outcome": "lost", "failed": True, "back_in_rotation": [{"name": "lb", "found": "web=UP api=MAINT"}]}
    assert rotation(start(), NAMES, False, drain=drain(out, settle=lost))["out_of"] == ["lb", "smg"]
    back = {"outcome": "lost", "failed": True, "back_in_rotation": [{"name": "lb", "found": "web=UP api=MAINT"}]}
    assert rotation(start(), NAMES, False, drain=d, slow=slow(back))["out_of"] == ["lb", "smg"]


def test_check_mode_never_drains_and_its_skipped_steps_add_nothing():
    s = dict(start(), would_drain=True)
    d = {"results": [{"step": "plan", "drains": [{"balancer": "lb"}], "changed": True},
                     dict(SKIPPED, step="out"), dict(SKIPPED, step="settle", outcome="check_mode")]}
    r = rotation(s, NAMES, True, drain=d, back=SKIPPED)
    assert r == dict(s, drained=False, inflight_left=None)


def test_what_the_put_back_put_back_is_back_and_what_went_out_again_is_out():
    out = drain({"out_of": ["lb", "smg"], "found": {"lb": "UP", "smg": "listed"}},
                settle={"outcome": "drained", "back_in_rotation": []})
    back = loop({"back_in": ["lb"], "left_as_found": {}}, {"back_in": [], "left_as_found": {"smg": "DRAIN"}})
    r = rotation(start(), NAMES, False, drain=out, back=back)
    assert r["out_of"] == ["smg"] and r["left_as_found"] == {"smg": "DRAIN"}
    failed = loop({"back_in": ["lb"]}, failed=True)
    retake = loop({"out_of": ["lb"]}, {"out_of": []})
    r = rotation(start(), NAMES, False, drain=out, back=failed, retake=retake)
    assert r["out_of"] == ["lb", "smg"]
    # helper-41: lb was put back before smg's put-back failed, and its take-out again failed too: lb is in rotation,
    # and the rotation says so (it said "out of lb" before).
    retake = {"results": [{"failed": True, "msg": "lb: socket refused"}, {"rotation": {"out_of": ["smg"]}}]}
    r = rotation(start(), NAMES, False, drain=out, back=failed, retake=retake)
    assert r["out_of"] == ["smg"]


def test_a_return_only_host_goes_back_into_the_entries_its_record_names():
    s = dict(out_of=["smg"], balancers=NAMES, would_drain=False, drained=False, left_as_found={}, returned=["smg"],
             would_return=False, found={"smg": "listed"})
    r = rotation(s, NAMES, False, back=loop({"back_in": ["smg"], "left_as_found": {}}))
    assert r["out_of"] == [] and r["returned"] == ["smg"]


def test_a_restart_puts_back_what_an_earlier_run_left_out_and_until_then_it_is_still_out():
    """helper-45: a host the clean playbook left out (its drain record) was not said to be out when its next restart
    failed before the put-back, nor put back when the restart put it back."""
    s = dict(start(), recorded=["lb", "smg"])
    out = drain({"out_of": ["hook"], "found": {"hook": "UP"}}, settle={"outcome": "drained", "back_in_rotation": []})
    r = rotation(s, NAMES, False, drain=out)  # failed before the put-back
    assert r["out_of"] == ["hook"] and r["left_out"] == ["lb", "smg"] and r["returned"] == []
    r = rotation(s, NAMES, False, drain=out, back=loop({"back_in": ["lb", "smg", "hook"], "left_as_found": {}}))
    assert r["out_of"] == [] and r["left_out"] == [] and r["returned"] == ["lb", "smg"]
    # A put-back that failed after lb, taken out of lb again: lb and smg are still out.
    failed = loop({"back_in": ["lb"]}, failed=True)
    r = rotation(s, NAMES, False, drain=out, back=failed, retake=loop({"out_of": ["lb", "hook"]}))
    assert r["out_of"] == ["lb", "hook"] and r["left_out"] == ["lb", "smg"] and r["returned"] == []
    # --check: the run would put them back.
    r = rotation(dict(s, would_drain=True), NAMES, True)
    assert r["returned"] == ["lb", "smg"] and r["would_return"] is True and "left_out" not in r


def test_the_start_is_not_changed_in_place():
    s = start()
    rotation(s, NAMES, False, drain=drain({"out_of": ["lb"], "found": {"lb": "UP"}}))
    assert s == start()


def test_the_row_says_what_the_restart_did_or_in_check_mode_would_do():
    row = {"restarted": False, "reasons": ["forced"], "workers": 2, "workers_verified": 2}
    assert result(row, False) == row and result(row, False, restart={}) == row
    done = {"changed": True, "killed": 3, "timings": {"kill_s": 0.2}, "env": {"processes": [{"pid": 1}, {"pid": 2}]},
            "gate": {"passed": True}}
    r = result(row, False, restart=done)
    assert r == dict(row, restarted=True, would_restart=False, killed=3, timings={"kill_s": 0.2}, workers_verified=2,
                     gate={"passed": True})
    r = result(row, True, restart=done)
    assert r["restarted"] is False and r["would_restart"] is True and r["killed"] == 0 and r["timings"] == {}
    assert result(row, False, restart=SKIPPED) == row
    # A failed restart adds nothing: the role's rescue records its failure (killed, phase, timings).
    assert result(row, False, restart=dict(done, failed=True)) == row
    assert row == {"restarted": False, "reasons": ["forced"], "workers": 2, "workers_verified": 2}


def test_the_merge_is_ansibles_recursive_combine_with_append_rp():
    assert _flow._merge({"a": [1, 2], "b": {"x": 1}}, {"a": [2, 3], "b": {"y": 2}, "c": 1}) == \
        {"a": [1, 2, 3], "b": {"x": 1, "y": 2}, "c": 1}
