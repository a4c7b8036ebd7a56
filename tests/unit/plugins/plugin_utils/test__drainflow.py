# SPDX-License-Identifier: GPL-3.0-or-later
"""The drain's steps as one loop (plugin_utils/_drainflow.py, run by the rotation_step action): which module each step
calls, with what, after what the steps before it found. The real drains (HAProxy, smg, http, a reload mid-drain,
requests in flight, an interrupted run) are in tests/rollout/test_drain.py, test_drain_recovery.py and tests/reliability."""
from __future__ import annotations

import typing as t

import pytest

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.serving.plugins.filter.rotation_steps import FilterModule
from ansible_collections.gpufleet.serving.plugins.plugin_utils._drainflow import Call, Drain, Return, Slow, before_kill, missing

rotation_steps = FilterModule().filters()["rotation_steps"]


def drain_steps(entries, host):
    return rotation_steps(entries, host)


def return_steps(entries, host):
    return rotation_steps(entries, host, flow="return")


ENTRIES = [{"type": "haproxy", "name": "lb", "delegate_to": "lb1"},
           {"type": "sglang_router", "name": "smg", "delegate_to": "localhost"},
           {"type": "http", "name": "hook", "delegate_to": "hooks", "remove": {"url": "http://h/r"}},
           {"type": "haproxy", "name": "lb2", "delegate_to": "lb1"}]
WAIT = dict(url="http://127.0.0.1:30000/metrics", metrics=["sglang:num_running_reqs"], timeout=300, slice=10,
            interval=0.5, alive_url="")


def params(**over):
    p = dict(balancers=[ENTRIES[0], ENTRIES[3]], server="gpu1", worker_url="http://10.0.0.5:30000",
             names=["lb", "smg", "hook", "lb2"], records={"old": {"server": "gpu1"}},
             record=dict(path="/var/lib/gpufleet/s.rotation.json", run="ctl:1:x"), wait=dict(WAIT))
    p.update(over)
    return p


def test_the_steps_read_every_balancer_before_any_take_out_and_re_read_only_what_has_a_read_api():
    got = [(s["step"], s["where"]) for s in drain_steps(ENTRIES, "gpu1")]
    assert got == [("plan", "lb1"), ("plan", "localhost"), ("plan", "hooks"), ("record", "gpu1"),
                   ("out", "lb1"), ("out", "localhost"), ("out", "hooks"), ("wait", "gpu1"),
                   ("recheck", "lb1"), ("recheck", "localhost"), ("settle", "gpu1")]
    assert [s["step"] for s in drain_steps([], "gpu1")] == ["record", "wait", "settle"]


def run(d, step, p, res):
    """The step's module call, then what the step makes of the module's result (.took)."""
    call = d.call(step, p)
    assert isinstance(call, Call), call
    return Ran(call, d.took(step, res))


class Ran(t.NamedTuple):
    call: Call
    res: dict


def test_a_drain_records_what_the_plan_found_then_takes_out_with_that_record_and_waits_one_slice():
    d, p = Drain(), params()
    call, out = run(d, "plan", p, {"changed": True, "drains": [{"balancer": "lb", "found": "UP"}], "invocation": {}})
    assert call.module == "gpufleet.serving.balancer" and call.check_mode is True
    assert call.args["state"] == "out" and call.args["records"] == p["records"] and call.args["names"] == p["names"]
    assert out["changed"] is False and "invocation" not in out  # a read: changed only as --check's prediction
    call = run(d, "record", p, {"changed": True, "records": {"lb": {"server": "gpu1", "found": "UP"}}}).call
    assert call.module == "gpufleet.serving.rotation_record" and call.check_mode is None
    assert call.args == dict(path=p["record"]["path"], action="add", drains=[{"balancer": "lb", "found": "UP"}],
                             run="ctl:1:x")
    call = run(d, "out", p, {"changed": True, "rotation": {"out_of": ["lb"]}}).call
    assert call.args["records"] == {"lb": {"server": "gpu1", "found": "UP"}}  # the record as written, not as read
    call, res = run(d, "wait", p, {"drained": True, "inflight": 0.0, "waited_s": 0.0})
    assert call.module == "gpufleet.serving.inflight_wait" and call.args["timeout"] == 10.0
    assert call.args["on_timeout"] == "fail" and call.args["alive_url"] is None and not res["failed"]
    call = run(d, "recheck", p, {"changed": False, "back_in_rotation": []}).call
    assert call.args["state"] == "read" and call.args["report"] == "rotation"
    assert d.call("settle", p) == dict(changed=False, inflight_left=0.0, back_in_rotation=[], outcome="drained")


def test_a_plan_that_fails_touches_nothing_after_it():
    d, p = Drain(), params()
    res = run(d, "plan", p, {"failed": True, "msg": "lb: no server gpu1 in backend web"}).res
    assert res["failed"]
    for step in ("plan", "record", "out", "wait", "recheck", "settle"):
        r = d.call(step, p)
        assert isinstance(r, dict) and r["skipped"], step


def test_nothing_to_take_out_writes_no_record_and_the_take_out_reads_the_checks_record():
    d, p = Drain(), params()
    run(d, "plan", p, {"drains": []})
    assert d.call("record", p)["skipped"]
    call = d.call("out", p)
    assert call.args["records"] == {"old": {"server": "gpu1"}}


def test_a_failed_take_out_still_runs_the_other_machines_take_out_then_stops():
    d, p = Drain(), params()
    run(d, "plan", p, {"drains": [{"balancer": "lb"}]})
    run(d, "record", p, {"records": {"lb": {}}})
    run(d, "out", p, {"failed": True, "msg": "socket refused", "rotation": {"out_of": []}})
    assert isinstance(d.call("out", p), Call)
    d.took("out", {"rotation": {"out_of": ["smg"]}})
    for step in ("wait", "recheck", "settle"):
        assert d.call(step, p)["skipped"], step


def test_requests_still_in_flight_after_the_first_slice_leave_the_rest_to_the_slow_path():
    d, p = Drain(), params()
    run(d, "plan", p, {"drains": []})
    run(d, "out", p, {"rotation": {"out_of": []}})
    res = run(d, "wait", p, {"failed": True, "msg": "2 in flight", "drained": False, "inflight": 2.0}).res
    assert res["failed"] is False and res["note"] == "2 in flight" and "msg" not in res
    assert d.call("recheck", p)["outcome"] == "deferred"
    assert d.call("settle", p)["outcome"] == "deferred"


def test_unreadable_metrics_fail_the_host_before_its_kill():
    d, p = Drain(), params()
    run(d, "plan", p, {"drains": []})
    run(d, "out", p, {"rotation": {"out_of": []}})
    res = run(d, "wait", p, {"failed": True, "msg": "metrics: connection refused"}).res
    assert res["failed"] and d.call("settle", p)["outcome"] == "aborted"


def test_no_metrics_no_wait():
    d, p = Drain(), params(wait={})
    assert d.call("wait", p)["skipped"]


def test_a_balancer_that_has_the_host_back_drops_those_records_then_fails_the_host():
    d, p = Drain(), params()
    run(d, "plan", p, {"drains": []})
    run(d, "out", p, {"rotation": {"out_of": ["lb", "lb2"]}})
    run(d, "wait", p, {"drained": True, "inflight": 0.0})
    back = [{"name": "lb", "found": "UP"}, {"name": "lb2", "found": "web=UP api=MAINT"}]
    res = run(d, "recheck", p, {"failed": True, "msg": "lb has gpu1 back in rotation", "back_in_rotation": back}).res
    assert res["failed"] is False and res["lost"] is True  # the settle step fails the host, after the clear
    assert res["note"] == "lb has gpu1 back in rotation" and "msg" not in res
    call = d.call("settle", p)
    # lb2 is still MAINT in a backend: still gpufleet's drain there, its record stays for the next run.
    assert call.module == "gpufleet.serving.rotation_record" and call.args["balancers"] == ["lb"]
    out = d.took("settle", {"changed": True})
    assert out["failed"] and out["outcome"] == "lost" and out["msg"] == "lb has gpu1 back in rotation"
    assert out["back_in_rotation"] == back


def test_check_mode_runs_the_plan_only():
    d, p = Drain(check_mode=True), params()
    call = d.call("plan", p)
    assert isinstance(call, Call) and call.check_mode is True
    assert d.took("plan", {"changed": True, "drains": [{"balancer": "lb"}]})["changed"] is True
    for step in ("record", "out", "wait", "recheck", "settle"):
        r = d.call(step, p)
        assert r["skipped"] and r["outcome"] == "check_mode", step


def test_an_unknown_flow_is_an_error():
    with pytest.raises(AnsibleFilterError, match="flow must be drain, return or slow"):
        rotation_steps(ENTRIES, "gpu1", flow="stop")


def test_an_unknown_step_is_an_error_and_a_step_without_state_fails_closed():
    with pytest.raises(ValueError):
        Drain().call("nap", params())
    r = missing("out")
    assert r["failed"] and "nothing was touched" in r["msg"] and r["msg"].startswith("drain step out ran without")
    assert missing("clear")["msg"].startswith("return to service step clear ran without")


def rparams(**over):
    p = dict(balancers=[ENTRIES[0]], server="gpu1", worker_url="http://10.0.0.5:30000", names=["lb", "smg"],
             records={"lb": {"server": "gpu1"}}, record={"path": "/var/lib/gpufleet/s.rotation.json"}, up_timeout=30.0,
             rotation={"found": {"lb": "UP"}, "left_as_found": {"smg": "MAINT"}, "renamed": {"old-lb": "lb"}})
    p.update(over)
    return p


def test_the_return_puts_back_on_each_machine_then_clears_the_record_but_what_a_put_back_kept():
    assert [(s["step"], s["where"]) for s in return_steps(ENTRIES, "gpu1")] == [
        ("back", "lb1"), ("back", "localhost"), ("back", "hooks"), ("clear", "gpu1")]
    r, p = Return(), rparams()
    call = r.call("back", p)
    assert call.module == "gpufleet.serving.balancer" and call.args["state"] == "in" and call.check_mode is None
    assert call.args["found"] == {"lb": "UP"} and call.args["left_as_found"] == {"smg": "MAINT"}
    assert call.args["records"] == {"lb": {"server": "gpu1"}} and call.args["up_timeout"] == 30.0
    r.took("back", {"changed": True, "rotation": {"back_in": ["lb"], "records_kept": ["smg"]}})
    call = r.call("clear", p)
    assert call.args == dict(path=p["record"]["path"], action="clear", balancers=["lb", "old-lb"])


def test_a_put_back_that_fails_leaves_the_record_and_check_mode_touches_nothing():
    r, p = Return(), rparams()
    r.took("back", {"failed": True, "msg": "lb: not UP after 30s"})
    r.took("back", {"changed": True, "rotation": {"back_in": ["smg"]}})
    assert r.call("clear", p)["skipped"]
    assert Return(check_mode=True).call("back", p)["skipped"] and Return(check_mode=True).call("clear", p)["skipped"]


def test_a_failed_drain_step_says_nothing_was_killed_once():
    # Every drain step comes before the kill: a failure's own words ("answered HTTP 500") say so too, once.
    d, p = Drain(), params()
    run(d, "plan", p, {"changed": True, "drains": [{"balancer": "lb"}]})
    run(d, "record", p, {"changed": True, "records": {"lb": {}}})
    out = run(d, "out", p, {"failed": True, "msg": "lb-api: the remove request DELETE /members/gpu1 answered HTTP 500"}).res
    assert out["msg"] == "lb-api: the remove request DELETE /members/gpu1 answered HTTP 500; nothing was killed"
    said = before_kill({"failed": True, "msg": "x refused: the metrics URL is wrong; nothing was killed"})
    assert said["msg"].count("nothing was killed") == 1
    assert before_kill({"changed": True, "msg": "ok"})["msg"] == "ok"
    plan = Drain().took("plan", {"failed": True, "msg": "lb: socket /x: No such file or directory"})
    assert plan["msg"].endswith("; nothing was touched")
    waited = Drain().took("wait", {"failed": True, "msg": "http://h/metrics answered HTTP 404; the metrics could not be read"})
    assert waited["msg"].endswith("could not be read; nothing was killed")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def slow(clock, first=None, **wait):
    w = dict(dict(WAIT, on_timeout="fail"), **wait)
    return Slow({"first": first if first is not None else {"waited_s": 10.0, "inflight": 3.0,
                                                           "gauges": {"sglang:num_running_reqs": 3.0}}},
                clock=clock), params(wait=w)


def test_the_slow_path_rounds_fit_the_timeout_and_end_with_the_read_before_the_kill():
    got = [(s["step"], s["where"]) for s in rotation_steps(ENTRIES, "gpu1", flow="slow", timeout=30, slice=10)]
    one = [("reread", "lb1"), ("reread", "localhost"), ("slice", "gpu1")]
    assert got == one * 2 + [("final", "lb1"), ("final", "localhost"), ("verdict", "gpu1")]
    assert len(rotation_steps(ENTRIES, "gpu1", flow="slow", timeout=5, slice=10)) == 3 + 3  # at least one round


def test_the_slow_path_waits_in_slices_until_drained_then_reads_once_more_and_is_drained():
    clock = Clock()
    s, p = slow(clock)
    call = s.call("reread", p)
    assert call.module == "gpufleet.serving.balancer" and call.args["state"] == "read"
    s.took("reread", {"changed": False, "back_in_rotation": []})
    call = s.call("slice", p)
    # The deadline counts from the first slice's start: 300 s less the 10 it waited; a slice is at most 10 s.
    assert call.module == "gpufleet.serving.inflight_wait" and call.args["timeout"] == 10
    r = s.took("slice", {"failed": True, "msg": "1 request(s) still in flight after 10s", "inflight": 1.0, "drained": False})
    assert r["failed"] is False and r["note"].startswith("1 request")
    clock.now += 10
    s.took("reread", {"changed": False})
    s.took("slice", {"changed": False, "inflight": 0.0, "drained": True})
    assert s.call("reread", p)["skipped"] and s.call("slice", p)["skipped"]
    assert isinstance(s.call("final", p), Call)
    s.took("final", {"changed": False, "back_in_rotation": []})
    v = s.call("verdict", p)
    assert v == dict(changed=False, inflight_left=0.0, back_in_rotation=[], outcome="drained")


def test_the_slow_path_past_its_deadline_fails_the_host_or_goes_on_as_asked():
    for on_timeout in ("fail", "proceed"):
        clock = Clock()
        s, p = slow(clock, on_timeout=on_timeout)
        assert isinstance(s.call("reread", p), Call)  # the loop's first item: the deadline is set from here
        clock.now += 285  # 5 s of the 300 left (10 went to the first slice)
        assert s.call("slice", p).args["timeout"] == 5
        s.took("slice", {"failed": True, "msg": "2 request(s) still in flight", "inflight": 2.0, "drained": False,
                         "gauges": {"sglang:num_running_reqs": 2.0}})
        clock.now += 5
        assert s.call("reread", p)["skip_reason"] == "the drain timeout has passed" and s.call("slice", p)["skipped"]
        v = s.call("verdict", p)
        said = "2 request(s) still in flight after 300s (sglang:num_running_reqs=2)"
        if on_timeout == "fail":
            assert s.call("final", p)["skipped"]
            assert v["failed"] and v["outcome"] == "timeout" and v["msg"] == said + "; nothing was killed"
        else:
            assert isinstance(s.call("final", p), Call)
            assert v["outcome"] == "proceed" and not v.get("failed") and v["inflight_left"] == 2.0
            assert v["warnings"] == [said + "; going on (gpufleet_server_drain_on_timeout: proceed)"]


def test_a_balancer_back_in_rotation_between_slices_ends_the_rounds_and_the_verdict_drops_its_record():
    clock = Clock()
    s, p = slow(clock)
    r = s.took("reread", {"failed": True, "msg": "lb: host gpu1 is back in rotation (UP)",
                          "back_in_rotation": [{"name": "lb", "found": "UP"}, {"name": "lb2", "found": "web=UP api=MAINT"}]})
    assert r["failed"] is False and r["lost"] is True
    for step in ("reread", "slice", "final"):
        assert s.call(step, p)["skipped"], step
    call = s.call("verdict", p)
    # Only the entry back in every backend loses its record; one still MAINT in a backend is still gpufleet's drain.
    assert call.module == "gpufleet.serving.rotation_record" and call.args["balancers"] == ["lb"]
    v = s.took("verdict", {"changed": True})
    assert v["failed"] and v["outcome"] == "lost" and v["msg"] == "lb: host gpu1 is back in rotation (UP); nothing was killed"
    assert [b["name"] for b in v["back_in_rotation"]] == ["lb", "lb2"]


def test_unreadable_metrics_end_the_slow_path_at_that_slice_and_check_mode_runs_none_of_it():
    clock = Clock()
    s, p = slow(clock)
    r = s.took("slice", {"failed": True, "msg": "http://127.0.0.1:30000/metrics answered HTTP 500; the metrics could not be read"})
    assert r["failed"] and r["msg"].endswith("; nothing was killed")
    assert s.call("final", p)["skipped"] and s.call("verdict", p)["outcome"] == "aborted"
    c = Slow(check_mode=True)
    assert all(c.call(step, params())["skipped"] for step in ("reread", "slice", "final", "verdict"))
    with pytest.raises(ValueError):
        Slow().call("nap", params())
