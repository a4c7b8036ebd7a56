# SPDX-License-Identifier: GPL-3.0-or-later
"""balancer main() in-process against a real unix socket speaking HAProxy's admin protocol and a real HTTP router:
check mode plans and touches nothing, out/in/read, input errors named, secrets never in the result."""
from __future__ import annotations

import json
import shutil
import tempfile

import pytest

from ansible_collections.gpufleet.serving.plugins.modules import balancer
from balancer_fakes import FakeHAProxy, router


@pytest.fixture
def hp():
    d = tempfile.mkdtemp(prefix="hp", dir="/tmp")
    srv = FakeHAProxy(d + "/admin.sock", {("web", "host1"): "UP", ("web", "host2"): "UP"})
    yield srv
    srv.close()
    shutil.rmtree(d)


def _args(hp, **kw):
    return dict({"state": "out", "server": "host1", "interval": 0.01,
                 "balancers": [{"type": "haproxy", "name": "haproxy", "socket": hp.path, "delegate_to": "lb1"}]}, **kw)


def test_check_mode_plans_and_touches_nothing_then_real_then_again(hp, run_module):
    r = run_module(balancer.main, _args(hp), check_mode=True)
    assert r["changed"] is True and r["drains"] == [{"balancer": "haproxy", "found": "UP", "server": "host1", "keep": False}]
    assert r["rotation"]["out_of"] == ["haproxy"] and hp.status("web", "host1") == "UP"
    assert all(not c.startswith("set") for c in hp.commands)
    r2 = run_module(balancer.main, _args(hp))
    assert r2["changed"] is True and r2["rotation"] == r["rotation"] and hp.status("web", "host1") == "MAINT"
    # With gpufleet's record the MAINT is its own: planned again, nothing to change.
    recs = {"haproxy": {"found": "UP", "server": "host1"}}
    r3 = run_module(balancer.main, _args(hp, records=recs))
    assert r3["changed"] is False and r3["rotation"]["found"] == {"haproxy": "UP"}
    assert set(r3) >= {"drains", "rotation", "back_in_rotation", "drift", "out_hosts", "unread"}
    r = run_module(balancer.main, _args(hp, state="read"))
    assert r["changed"] is False and r["back_in_rotation"] == [] and "msg" not in r
    r = run_module(balancer.main, _args(hp, state="in", found={"haproxy": "UP"}, up_timeout=2), check_mode=True)
    assert r["changed"] is True and hp.status("web", "host1") == "MAINT"
    r = run_module(balancer.main, _args(hp, state="in", found={"haproxy": "UP"}, up_timeout=2))
    assert r["changed"] is True and r["rotation"]["back_in"] == ["haproxy"] and hp.status("web", "host1") == "UP"
    assert run_module(balancer.main, _args(hp, state="in", found={"haproxy": "UP"}, up_timeout=2))["changed"] is False


def test_read_names_a_server_back_in_rotation(hp, run_module):
    r = run_module(balancer.main, _args(hp, state="read"))
    assert r["back_in_rotation"] == [{"name": "haproxy", "found": "UP"}]
    assert r["msg"] == ("haproxy has the server back in rotation (UP) since gpufleet took it out (put back by hand, "
                        "or an HAProxy reload without server-state-file, which forgets MAINT: docs/runbook.md); "
                        "nothing was killed")


def test_unreachable_socket_fails_with_one_line(run_module):
    r = run_module(balancer.main, {"state": "out", "server": "h", "balancers": [
        {"type": "haproxy", "name": "haproxy", "socket": "/nonexistent/haproxy.sock", "delegate_to": "lb1"}]})
    assert r["failed"] and r["msg"] == ("haproxy haproxy: cannot reach the HAProxy admin socket /nonexistent/haproxy.sock: "
                                        "[Errno 2] No such file or directory; nothing was touched")
    assert "Traceback" not in json.dumps(r)


def test_input_errors_fail_before_anything_is_read(hp, run_module):
    r = run_module(balancer.main, {"state": "out", "balancers": [
        {"type": "sglang_router", "name": "a", "url": "router:30000"},
        {"type": "haproxy", "name": "a", "socket": hp.path, "delegate_to": "lb1"}]})
    assert r["failed"] and r["msg"] == ("gpufleet_server_balancers: entry 1 (sglang_router) needs url, the router as "
                                        "http(s)://host:port; two balancers have the same name")
    assert hp.commands == []
    r = run_module(balancer.main, {"state": "out", "balancers": [{"type": "nginx", "name": "x"}]})
    assert r["failed"] and "value of type must be one of: haproxy, sglang_router, http, none, got: nginx" in r["msg"]


def test_capacity_reads_many_hosts(hp, run_module):
    hp.servers[("web", "host2")]["status"] = "MAINT"
    r = run_module(balancer.main, {"state": "read", "report": "capacity", "balancers": [
        {"type": "haproxy", "name": "haproxy", "socket": hp.path, "host": h, "server": h} for h in ("host1", "host2")]})
    assert r["changed"] is False and r["out_hosts"] == ["host2"] and r["unread"] == []


def test_secrets_never_in_the_result(run_module):
    srv = router([])
    try:
        url = "http://ops:pw@127.0.0.1:%d/pool/host1?token=s3cr3t" % srv.server_address[1]
        r = run_module(balancer.main, {"state": "out", "balancers": [
            {"type": "http", "name": "lb", "remove": {"url": url, "headers": {"X-Key": "hdr-secret"}},
             "add": {"url": url}}]})
        assert r["changed"] and srv.calls[0][2].get("X-Key") == "hdr-secret"
        out = json.dumps(r)
        assert "hdr-secret" not in out and "s3cr3t" not in out and "ops:pw" not in out, out
        assert r["drains"][0]["server"] == "http://127.0.0.1:%d/pool/host1" % srv.server_address[1]
        srv.code = 500
        r = run_module(balancer.main, {"state": "out", "balancers": [
            {"type": "http", "name": "lb", "remove": {"url": url}, "add": {"url": url}}]})
        assert r["failed"] and "s3cr3t" not in json.dumps(r) and "answered HTTP 500" in r["msg"]
    finally:
        srv.shutdown()
        srv.server_close()
