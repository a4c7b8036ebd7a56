# SPDX-License-Identifier: GPL-3.0-or-later
"""_balancer: HAProxy's `show stat` parsing and states, the decisions of the drain and the return to service (an
operator's MAINT/DRAIN left as found, per backend, weight 0, a renamed entry's record, a reload mid-drain), against a
real unix socket speaking HAProxy's text protocol and a real HTTP server speaking smg's worker API."""
from __future__ import annotations

import shutil
import tempfile

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _balancer as B
from balancer_fakes import FakeHAProxy, router


@pytest.fixture
def hp():
    d = tempfile.mkdtemp(prefix="hp", dir="/tmp")  # a unix socket path has at most 107 bytes
    srv = FakeHAProxy(d + "/admin.sock", {("web", "host1"): "UP", ("web", "host2"): "UP", ("api", "host1"): "UP"})
    yield srv
    srv.close()
    shutil.rmtree(d)


@pytest.fixture
def smg():
    srv = router(["http://10.0.0.1:30000", "http://10.0.0.2:30000"])
    yield srv
    srv.shutdown()
    srv.server_close()


def haproxy_entry(hp, **kw):
    return dict({"type": "haproxy", "name": "haproxy", "socket": hp.path, "delegate_to": "lb1", "backend": ""}, **kw)


def bal(entries, records=None, server="host1", worker_url="http://10.0.0.1:30000"):
    return B.Balancers(entries, server, worker_url, records, interval=0.01, sleep=lambda s: None)


STAT = ("# pxname,svname,qcur,status,weight,\nweb,FRONTEND,,OPEN,,\nweb,host1,0,UP,1,\nweb,host2,0,MAINT,1,\n"
        "api,host1,0,DRAIN,0,\nweb,BACKEND,0,UP,2,\n")


def test_parse_stat_keeps_servers_only():
    rows = B.parse_stat(STAT)
    assert [(r["pxname"], r["svname"], r["status"], r["weight"]) for r in rows] == [
        ("web", "host1", "UP", "1"), ("web", "host2", "MAINT", "1"), ("api", "host1", "DRAIN", "0")]
    assert B.server_states(rows, "host1") == {"web": "UP", "api": "DRAIN"}
    assert B.server_states(rows, "host1", "api") == {"api": "DRAIN"}
    with pytest.raises(B.BalancerError, match="not an answer to show stat"):
        B.parse_stat("Unknown command.\n")


@pytest.mark.parametrize("states, found", [
    ({}, "absent"),
    ({"web": "UP"}, "UP"),
    ({"web": "UP", "api": "UP"}, "UP"),
    ({"web": "MAINT", "api": "MAINT"}, "MAINT"),
    ({"web": "DRAIN", "api": "DRAIN"}, "DRAIN"),
    ({"web": "UP", "api": "MAINT"}, "api=MAINT web=UP"),     # an operator's MAINT in one backend: each its own
    ({"web": "DRAIN", "api": "UP"}, "api=UP web=DRAIN"),
    ({"web": "no check"}, "no"),
    ({"web": "DOWN"}, "DOWN"),
    ({"web": "MAINT (via x/y)"}, "MAINT"),
])
def test_found_of(states, found):
    assert B.found_of(states) == found


@pytest.mark.parametrize("back, backend, by", [
    ("UP", "", {"": "UP"}), ("DRAIN", "web", {"web": "DRAIN"}), ("api=MAINT web=UP", "", {"api": "MAINT", "web": "UP"})])
def test_back_by_backend(back, backend, by):
    assert B.back_by_backend(back, backend) == by


def test_input_errors_name_each_broken_rule():
    errs = B.input_errors([
        {"type": "haproxy", "name": "a"}, {"type": "sglang_router", "url": "router:30000", "name": "b"},
        {"type": "http", "name": "c", "remove": {"url": "http://x/a"}}, {"type": "none", "name": "d"},
        {"type": "http", "name": "a", "remove": {"url": "http://x"}, "add": {"url": "https://x"}}])
    assert errs == ["entry 1 (haproxy) needs delegate_to: the host whose admin socket it is",
                    "entry 2 (sglang_router) needs url, the router as http(s)://host:port",
                    "entry 3 (http) needs remove.url and add.url, both http(s) URLs",
                    "two balancers have the same name"]


def test_url_secrets_and_public_url():
    url = "https://ops:s3cret@lb.example/pool/x?token=abc#frag"
    assert B.public_url(url) == "https://lb.example/pool/x"
    assert B.url_secrets(url) == ["ops:s3cret", "token=abc"]
    assert B.url_secrets("http://lb/x") == []


def test_a_server_in_rotation_in_a_backend_no_entry_covers_is_refused_before_anything_is_touched(hp):
    """helper-49 (High): the host's entry named backend web only, host1 also served backend api (a frontend's), and the
    restart stopped it there in rotation: requests failed. A backend that sent it requests lately (lastsess) is refused
    by name, nothing touched; one that sent it none (a pool no frontend uses) is warned of; an entry without backend,
    or one entry per backend, covers it."""
    hp.lastsess[("api", "host1")] = "2"
    hp.lastsess[("web", "host1")] = "0"
    with pytest.raises(B.BalancerError) as e:
        bal([haproxy_entry(hp, backend="web")]).plan_out()
    assert str(e.value) == (
        "haproxy haproxy (%s on lb1): server host1 is also in rotation in backend api, which no balancer entry of this "
        "host takes it out of (its entries name backend web), and sent it requests in the last 300 s: the restart would "
        "stop it while that backend sends it more. Add an entry for api, or leave the entry's backend empty (every "
        "backend that has the server); nothing was touched" % hp.path)
    assert set(hp.commands) == {"show stat"} and hp.status("web", "host1") == "UP"
    assert [s["name"] for s in bal([haproxy_entry(hp, backend="web"),
                                    haproxy_entry(hp, name="api", backend="api")]).plan_out()] == ["haproxy", "api"]
    assert len(bal([haproxy_entry(hp)]).plan_out()) == 1
    # No session from api ever (-1): a pool no frontend uses, as far as HAProxy shows; warned of, the drain goes on.
    hp.lastsess[("api", "host1")] = "-1"
    b = bal([haproxy_entry(hp, backend="web")])
    assert len(b.plan_out()) == 1
    assert b.warnings == ["haproxy haproxy (%s on lb1): server host1 is also in rotation in backend api, which no balancer "
                          "entry of this host takes it out of (its entries name backend web) but sent it no request "
                          "lately: if a frontend uses it, its requests to this server fail while it restarts. Add an "
                          "entry for it, or leave the entry's backend empty (every backend that has the server)" % hp.path]
    # Out of rotation there already (an operator's MAINT): nothing to stop it serving.
    hp.lastsess[("api", "host1")] = "2"
    hp.servers[("api", "host1")]["status"] = "MAINT"
    assert len(bal([haproxy_entry(hp, backend="web")]).plan_out()) == 1
    # Another host's server of the same name there (another address): not this host's.
    hp.servers[("api", "host1")]["status"] = "UP"
    hp.addrs[("api", "host1")] = "10.0.0.9:30000"
    hp.addrs[("web", "host1")] = "10.0.0.1:30000"
    b = bal([haproxy_entry(hp, backend="web")])
    assert len(b.plan_out()) == 1 and b.warnings == []


def test_out_then_in_round_trip(hp):
    b = bal([haproxy_entry(hp)])
    plan = b.plan_out()
    assert plan == [{"name": "haproxy", "type": "haproxy", "found": "UP", "record": None, "back": "UP",
                     "drain": {"balancer": "haproxy", "found": "UP", "server": "host1", "keep": False}}]
    assert hp.commands == ["show stat"]  # the plan only reads
    r = b.take_out(plan)
    assert r["changed"] and r["rotation"]["out_of"] == ["haproxy"] and r["rotation"]["found"] == {"haproxy": "UP"}
    assert hp.status("web", "host1") == hp.status("api", "host1") == "MAINT" and hp.status("web", "host2") == "UP"
    assert b.back_in_rotation() == []
    r = b.put_back(r["rotation"]["found"], {}, up_timeout=1)
    assert r["changed"] and r["rotation"] == {"back_in": ["haproxy"], "left_as_found": {}, "records_kept": []}
    assert hp.status("web", "host1") == hp.status("api", "host1") == "UP"
    # Idempotent: out twice changes once.
    b.take_out(b.plan_out())
    assert b.take_out(b.plan_out())["changed"] is False


def test_an_operators_maint_is_left_as_found(hp):
    hp.servers[("web", "host1")]["status"] = hp.servers[("api", "host1")]["status"] = "MAINT"
    b = bal([haproxy_entry(hp)])
    plan = b.plan_out()
    assert plan[0]["left_as_found"] == "MAINT" and "drain" not in plan[0]
    r = b.take_out(plan)
    assert r == {"changed": False, "rotation": {"out_of": [], "found": {}, "left_as_found": {"haproxy": "MAINT"},
                                                "renamed": {}}}
    r = b.put_back({}, {"haproxy": "MAINT"}, up_timeout=1)
    assert r["changed"] is False and hp.status("web", "host1") == "MAINT"
    assert not any(c.startswith("set server") for c in hp.commands)


def test_an_operators_drain_goes_back_to_drain(hp):
    hp.servers[("web", "host1")]["status"] = hp.servers[("api", "host1")]["status"] = "DRAIN"
    b = bal([haproxy_entry(hp)])
    plan = b.plan_out()
    assert plan[0]["drain"] == {"balancer": "haproxy", "found": "DRAIN", "server": "host1", "keep": False}
    r = b.take_out(plan)
    assert hp.status("web", "host1") == "MAINT"
    r = b.put_back(r["rotation"]["found"], {}, up_timeout=1)
    assert r["rotation"]["left_as_found"] == {"haproxy": "DRAIN"}
    assert hp.status("web", "host1") == hp.status("api", "host1") == "DRAIN"


def test_each_backend_goes_back_to_its_own_state(hp):
    hp.servers[("api", "host1")]["status"] = "MAINT"  # an operator's MAINT in one backend only
    b = bal([haproxy_entry(hp)])
    plan = b.plan_out()
    assert plan[0]["back"] == "api=MAINT web=UP"
    r = b.take_out(plan)
    r = b.put_back(r["rotation"]["found"], {}, up_timeout=1)
    assert r["rotation"]["left_as_found"] == {"haproxy": "MAINT in backend api"}
    assert hp.status("web", "host1") == "UP" and hp.status("api", "host1") == "MAINT"


def test_an_earlier_runs_drain_goes_back_to_what_it_found(hp):
    hp.servers[("web", "host1")]["status"] = hp.servers[("api", "host1")]["status"] = "MAINT"
    b = bal([haproxy_entry(hp)], records={"haproxy": {"found": "DRAIN", "server": "host1", "run": "r1"}})
    plan = b.plan_out()
    assert plan[0]["back"] == "DRAIN" and plan[0]["drain"]["keep"] is True
    assert b.take_out(plan)["rotation"]["found"] == {"haproxy": "DRAIN"}


def test_a_record_that_names_a_renamed_entry(hp):
    # The entry was called "lb-old" when an earlier run drained the host; its record still says what was found.
    hp.servers[("web", "host1")]["status"] = hp.servers[("api", "host1")]["status"] = "MAINT"
    recs = {"lb-old": {"found": "UP", "server": "host1", "run": "r1", "at": "then"}}
    b = bal([haproxy_entry(hp, name="lb-new")], records=recs)
    plan = b.plan_out()
    assert plan[0]["record"] == "lb-old" and plan[0]["back"] == "UP" and "left_as_found" not in plan[0]
    assert plan[0]["drain"] == {"balancer": "lb-new", "found": "UP", "server": "host1", "keep": True}
    assert b.take_out(plan)["rotation"]["renamed"] == {"lb-old": "lb-new"}
    assert "by gpufleet (run r1 at then" in b.drift()[0]
    # A record under a name that is still an entry's is that entry's, never another's.
    b2 = B.Balancers([haproxy_entry(hp, name="lb-new")], "host1", "", recs, names=["lb-old", "lb-new"])
    assert B.record_for(b2.entries[0], recs, b2.names, "host1") == (None, None)


def test_a_reload_mid_drain_puts_the_server_back(hp):
    b = bal([haproxy_entry(hp)])
    b.take_out(b.plan_out())
    # An HAProxy reload without its server-state-file forgets MAINT: the server is UP while requests are in flight.
    hp.servers[("web", "host1")]["status"] = hp.servers[("api", "host1")]["status"] = "UP"
    assert b.back_in_rotation() == [("haproxy", "UP")]


def test_a_reload_right_after_maint_fails_the_drain(hp):
    # The server comes back UP right after gpufleet set it MAINT (a reload): the wait for MAINT names what it saw.
    n = {"stat": 0}

    def hook(line):
        if line == "show stat":
            n["stat"] += 1
            if n["stat"] == 3:
                hp.servers[("web", "host1")]["status"] = "UP"
    hp.hook = hook
    b = B.Balancers([haproxy_entry(hp, backend="web")], "host1", interval=0.01, out_timeout=0.2)
    with pytest.raises(B.BalancerError, match=r"haproxy: HAProxy .* server host1 is UP in web, not MAINT") as e:
        b.take_out(b.plan_out())
    assert e.value.result["rotation"]["out_of"] == []  # not noted as out: the recheck and the summary say so


def test_wrong_server_or_unreachable_socket_is_one_line(hp):
    with pytest.raises(B.BalancerError) as e:
        bal([haproxy_entry(hp, server="nosuch")]).plan_out()
    assert str(e.value) == ("haproxy haproxy (%s on lb1) has no server nosuch in any backend: a wrong server or backend "
                            "name; nothing was touched" % hp.path)
    # The entry that cannot be read is named (a host may have several), and nothing was touched: all are read first.
    with pytest.raises(B.BalancerError) as e:
        bal([haproxy_entry(hp, socket="/nonexistent/haproxy.sock")]).plan_out()
    assert str(e.value) == ("haproxy haproxy: cannot reach the HAProxy admin socket /nonexistent/haproxy.sock: [Errno 2] "
                            "No such file or directory; nothing was touched")
    # Every one of them.
    with pytest.raises(B.BalancerError) as e:
        bal([haproxy_entry(hp, name="a", socket="/nonexistent/a.sock"), haproxy_entry(hp, name="ok"),
             haproxy_entry(hp, name="b", socket="/nonexistent/b.sock")]).plan_out()
    assert str(e.value) == ("haproxy a: cannot reach the HAProxy admin socket /nonexistent/a.sock: [Errno 2] No such file "
                            "or directory; haproxy b: cannot reach the HAProxy admin socket /nonexistent/b.sock: [Errno 2] "
                            "No such file or directory; nothing was touched")
    assert not any(c.startswith("set ") for c in hp.commands), hp.commands


@pytest.mark.parametrize("addr, url, why", [
    ("10.0.0.1:30000", "http://10.0.0.1:30000", None),
    ("127.0.0.1:30000", "http://localhost:30000", None),  # resolved where HAProxy runs
    ("[::1]:30000", "http://[::1]:30000", None),
    ("10.0.0.1:30000", "http://10.0.0.1", "port 30000, not the worker URL's 80"),
    ("10.0.0.2:30000", "http://10.0.0.1:30000", "address 10.0.0.2, not the worker URL's 10.0.0.1"),
    ("10.0.0.2:30000", "http://localhost:30000", "address 10.0.0.2, and the worker URL's host localhost is "),
    ("10.0.0.1:30000", "http://no-such-host.invalid:30000",
     "the worker URL's host no-such-host.invalid cannot be resolved here"),
    ("", "http://10.0.0.1:30000", None),  # an HAProxy older than 1.7 shows no address: nothing to compare
    ("unix", "http://10.0.0.1:30000", None),
])
def test_address_mismatch(addr, url, why):
    got = B.address_mismatch(addr, url)
    assert (got is None) if why is None else got.startswith(why), got


def test_a_server_name_of_another_host_is_refused_with_nothing_touched(hp):
    # host2's inventory copied host1's entry (server: host1): HAProxy's host1 is at 10.0.0.1, host2's server at 10.0.0.2.
    hp.addrs = {("web", "host1"): "10.0.0.1:30000", ("api", "host1"): "10.0.0.1:30000", ("web", "host2"): "10.0.0.2:30000"}
    b = bal([haproxy_entry(hp, server="host1")], server="host2", worker_url="http://10.0.0.2:30000")
    with pytest.raises(B.BalancerError) as e:
        b.plan_out()
    assert str(e.value) == (
        "haproxy haproxy (%s on lb1): server host1 is not this host's server (http://10.0.0.2:30000): in backend api it "
        "has address 10.0.0.1, not the worker URL's 10.0.0.2; in backend web it has address 10.0.0.1, not the worker "
        "URL's 10.0.0.2; a server name of another host, or HAProxy reaches this host's server at another address (set "
        "the entry's worker_url to http://ADDRESS:PORT as HAProxy has it); nothing was touched" % hp.path)
    assert hp.commands == ["show stat"] and hp.status("web", "host1") == "UP"
    # The right name passes; so does the address HAProxy has, given as the entry's worker_url (a second network).
    assert bal([haproxy_entry(hp, server="host2")], server="host2", worker_url="http://10.0.0.2:30000").plan_out()
    assert bal([haproxy_entry(hp, worker_url="http://10.0.0.1:30000")], worker_url="http://192.0.2.9:30000").plan_out()


def test_the_put_back_refuses_a_server_name_of_another_host_with_nothing_touched(hp):
    # host2 was left out by gpufleet; its entry now names host1 (changed since the drain), and an operator has host1 in
    # MAINT: the return would undo the operator's MAINT on host1 and leave host2 out (helper-36). Refused, untouched.
    hp.addrs = {("web", "host1"): "10.0.0.1:30000", ("api", "host1"): "10.0.0.1:30000", ("web", "host2"): "10.0.0.2:30000"}
    hp.servers[("web", "host1")]["status"] = "MAINT"
    hp.servers[("web", "host2")]["status"] = "MAINT"
    b = bal([haproxy_entry(hp, server="host1")], server="host2", worker_url="http://10.0.0.2:30000")
    with pytest.raises(B.BalancerError) as e:
        b.put_back({"haproxy": "UP"}, {}, up_timeout=1)
    assert "server host1 is not this host's server (http://10.0.0.2:30000)" in str(e.value), str(e.value)
    assert str(e.value).endswith("nothing was touched")
    assert hp.status("web", "host1") == "MAINT" and hp.status("web", "host2") == "MAINT"
    assert not any(c.startswith("set ") for c in hp.commands), hp.commands
    # The right name goes back.
    assert bal([haproxy_entry(hp, server="host2")], server="host2",
               worker_url="http://10.0.0.2:30000").put_back({"haproxy": "UP"}, {}, up_timeout=1)["changed"]
    assert hp.status("web", "host2") == "UP"


def test_wait_up_times_out_naming_the_state(hp):
    hp.hook = lambda line: hp.servers[("web", "host1")].update(status="DOWN") if line.startswith("show") else None
    b = bal([haproxy_entry(hp, backend="web")])
    with pytest.raises(B.BalancerError, match=r"haproxy: HAProxy .*: server host1 is DOWN in web, not UP, after 0.05s"):
        b.put_back({"haproxy": "UP"}, {}, up_timeout=0.05)


def test_capacity_counts_weight_0_maint_and_unhealthy_as_out(hp, smg):
    hp.servers[("web", "host2")]["weight"] = "0"  # `set weight web/host2 0`: a soft drain
    hp.servers[("web", "host3")] = {"status": "MAINT", "weight": "1"}
    hp.servers[("web", "host4")] = {"status": "no check", "weight": "1"}
    smg.workers["w1"]["is_healthy"] = False
    entries = [dict(haproxy_entry(hp), host=h, server=h) for h in ("host1", "host2", "host3", "host4")] + [
        {"type": "sglang_router", "name": "smg", "url": smg.url, "host": "host1", "worker_url": "http://10.0.0.1:30000"},
        {"type": "sglang_router", "name": "smg", "url": smg.url, "host": "host5", "worker_url": "http://10.0.0.2:30000"},
        dict(haproxy_entry(hp, socket="/nonexistent/s"), host="host6", server="host6"),
        {"type": "sglang_router", "name": "smg2", "url": "http://127.0.0.1:1", "host": "host7", "delegate_to": "r"}]
    r = bal(entries).capacity()
    # host2 at weight 0, host3 MAINT, host5's worker unhealthy; "no check" is in rotation; unread ones are not counted.
    assert r["out_hosts"] == ["host2", "host3", "host5"], r
    assert r["unread"] == [
        "HAProxy /nonexistent/s on lb1 (cannot reach the HAProxy admin socket /nonexistent/s: [Errno 2] No such file or "
        "directory)", "the router http://127.0.0.1:1 from r (GET http://127.0.0.1:1/workers: [Errno 111] Connection "
        "refused)"]
    assert hp.commands.count("show stat") == 1  # one read per socket
    # Each pool a request is routed to, with its hosts and those in rotation there (helper-47: a host out of one
    # backend still serves another, and the guard must not drain a backend's last server).
    pools = r["pools"]
    web = next(v for k, v in pools.items() if k.startswith("HAProxy ") and k.endswith(" backend web"))
    assert web == {"members": ["host1", "host2", "host3", "host4"], "in": ["host1", "host4"]}, pools
    router = pools["router " + smg.url.rstrip("/")]
    assert router == {"members": ["host1", "host5"], "in": ["host1"]}, router


def test_capacity_router_unhealthy_worker_is_out(smg):
    smg.workers["w1"]["is_healthy"] = False
    entries = [{"type": "sglang_router", "name": "smg", "url": smg.url, "host": h, "worker_url": "http://10.0.0.%d:30000" % i}
               for i, h in ((1, "host1"), (2, "host2"), (3, "host3"))]
    r = bal(entries).capacity()
    assert (r["out_hosts"], r["unread"]) == (["host2", "host3"], [])
    assert r["pools"] == {"router " + smg.url.rstrip("/"): {"members": ["host1", "host2", "host3"], "in": ["host1"]}}


def test_router_out_and_in(smg):
    e = {"type": "sglang_router", "name": "smg", "url": smg.url + "/", "headers": {"Authorization": "Bearer k"}}
    b = bal([e])
    r = b.take_out(b.plan_out())
    assert r["rotation"]["found"] == {"smg": "listed"} and "http://10.0.0.1:30000" not in [
        w["url"] for w in smg.workers.values()]
    assert all(c[2].get("Authorization") == "Bearer k" for c in smg.calls)
    # Absent, with gpufleet's record: its own drain, already out.
    b = bal([e], records={"smg": {"found": "listed", "server": "http://10.0.0.1:30000"}})
    assert b.plan_out()[0]["back"] == "listed" and "drain" not in b.plan_out()[0]
    r = b.put_back({"smg": "listed"}, {}, up_timeout=1)
    assert r["changed"] and [w for w in smg.workers.values() if w["url"] == "http://10.0.0.1:30000"]
    assert b.put_back({"smg": "listed"}, {}, up_timeout=1)["changed"] is False


def test_router_wrong_worker_url_is_refused_with_nothing_touched(smg):
    b = bal([{"type": "sglang_router", "name": "smg", "url": smg.url}], worker_url="http://10.9.9.9:30000")
    with pytest.raises(B.BalancerError) as e:
        b.plan_out()
    assert str(e.value) == (
        "sglang_router smg (%s) does not list the worker http://10.9.9.9:30000 and gpufleet has no record of taking it "
        "out: a wrong worker_url, or a worker removed by hand (the router lists http://10.0.0.1:30000, "
        "http://10.0.0.2:30000); nothing was touched" % smg.url)
    assert [c[0] for c in smg.calls] == ["GET"]


def test_audit_drift_lines(hp, smg):
    hp.servers[("web", "host1")]["status"] = "MAINT"
    hp.servers[("api", "host1")]["status"] = "DOWN"
    smg.workers.pop("w0")
    entries = [haproxy_entry(hp), {"type": "sglang_router", "name": "smg", "url": smg.url},
               {"type": "http", "name": "api", "remove": {"url": "http://x"}, "add": {"url": "http://x"}}]
    assert bal(entries).drift() == [
        "in rotation on haproxy but DOWN (backend api)",
        "out of rotation on haproxy (MAINT in backend web), not by gpufleet (no drain record of it)",
        "out of rotation on smg (the router does not list http://10.0.0.1:30000), not by gpufleet (no drain record of it)"]
    assert bal(entries[:1], records={}).drift("bad json")[1].endswith("(drain record unreadable: bad json)")
    assert bal([haproxy_entry(hp, socket="/nonexistent/s")]).drift() == [
        "balancer haproxy could not be read: cannot reach the HAProxy admin socket /nonexistent/s: [Errno 2] No such "
        "file or directory"]
    # An entry naming another host's server reports that, not the other host's state as this host's (helper-36).
    hp.addrs = {("web", "host1"): "10.0.0.9:30000", ("api", "host1"): "10.0.0.1:30000"}
    lines = bal(entries[:1]).drift()
    head = "haproxy haproxy (%s on lb1): server host1 is not this host's server" % hp.path
    assert len(lines) == 1 and lines[0].startswith(head) and "in backend web it has address 10.0.0.9" in lines[0], lines
    hp.addrs = {}
    # Weight 0 is out of rotation (no request goes there), as the capacity guard counts it; the audit says so.
    hp.servers[("web", "host1")] = {"status": "UP", "weight": "0"}
    assert bal(entries[:1]).drift() == [
        "in rotation on haproxy but DOWN (backend api)",
        "out of rotation on haproxy (weight 0 in backend web), not by gpufleet (no drain record of it)"]


def test_http_remove_add_hide_credentials(smg):
    url = "http://ops:pw@127.0.0.1:%d/pool/host1?token=abc" % smg.server_address[1]
    e = {"type": "http", "name": "lb", "remove": {"url": url, "method": "DELETE", "headers": {"X-Key": "k"}},
         "add": {"url": url, "method": "PUT", "body": {"port": 30000}}}
    b = bal([e])
    plan = b.plan_out()
    assert plan[0]["drain"] == {"balancer": "lb", "found": "unknown", "server": "http://127.0.0.1:%d/pool/host1"
                                % smg.server_address[1], "keep": True}
    assert b.take_out(plan)["changed"]
    assert b.put_back({"lb": "unknown"}, {}, 1)["changed"]
    assert [(c[0], c[1]) for c in smg.calls] == [("DELETE", "/pool/host1?token=abc"), ("PUT", "/pool/host1?token=abc")]
    assert smg.bodies == [{"port": 30000}]
    smg.code = 500
    with pytest.raises(B.BalancerError) as ex:
        b.put_back({}, {}, 1)
    assert str(ex.value) == "lb: the add request PUT http://127.0.0.1:%d/pool/host1 answered HTTP 500" % smg.server_address[1]


def test_an_unreachable_http_entry_fails_at_its_take_out_and_the_entries_before_it_stay_out(hp):
    # docs/concepts.md: haproxy and sglang_router entries are read before the host leaves any; an http entry has no read
    # API, so one that cannot be reached fails only when the host is taken out of it, after the entries before it.
    http = {"type": "http", "name": "hook", "remove": {"url": "http://127.0.0.1:9/remove"},
            "add": {"url": "http://127.0.0.1:9/add"}}
    b = bal([haproxy_entry(hp), http])
    plan = b.plan_out()  # nothing to read for the hook: the plan passes
    assert [s["found"] for s in plan] == ["UP", "unknown"]
    with pytest.raises(B.BalancerError) as e:
        b.take_out(plan)
    assert str(e.value).startswith("hook: "), str(e.value)
    assert e.value.result["rotation"]["out_of"] == ["haproxy"] and hp.status("web", "host1") == "MAINT"
    # The other way round, an haproxy entry that cannot be read fails the plan: the host leaves none.
    b = bal([http, haproxy_entry(hp, socket="/nonexistent/s")])
    with pytest.raises(B.BalancerError):
        b.plan_out()


def test_a_record_of_another_server_under_the_entrys_name_is_not_this_hosts_drain(hp):
    """helper-38: a record made from an entry copied from another host (server host2 under host1's entry name) was
    taken for host1's drain: the put-back undid an operator's MAINT on host1. It is not gpufleet's drain now: the
    plan leaves the MAINT as found, the audit names the record, the put-back refuses with nothing touched."""
    hp.servers[("web", "host1")]["status"] = "MAINT"
    rec = {"haproxy": {"found": "UP", "server": "host2", "run": "r-1", "at": "t"}}
    plan = {s["name"]: s for s in bal([haproxy_entry(hp, backend="web")], records=rec).plan_out()}
    assert plan["haproxy"]["left_as_found"] == "MAINT" and plan["haproxy"]["record"] is None, plan
    lines = bal([haproxy_entry(hp, backend="web")], records=rec).drift()
    assert lines[0].startswith("the drain record of entry haproxy names server host2, not this host's host1"), lines
    assert "not by gpufleet (no drain record of it)" in lines[1], lines
    with pytest.raises(B.BalancerError, match="names server host2, not this host's host1.*nothing was touched"):
        bal([haproxy_entry(hp, backend="web")], records=rec).put_back({"haproxy": "UP"}, {}, 1)
    assert hp.servers[("web", "host1")]["status"] == "MAINT"  # untouched
    # The MAINT left as found (a forced restart's put-back): nothing refused or touched, and the record is one to keep
    # (the role's clear leaves it: it may be the only trace that gpufleet took host2 out).
    r = bal([haproxy_entry(hp, backend="web")], records=rec).put_back({}, {"haproxy": "MAINT"}, 1)
    assert r["changed"] is False and r["rotation"]["records_kept"] == ["haproxy"], r
    assert hp.servers[("web", "host1")]["status"] == "MAINT"
    # Its own record (server host1) is gpufleet's drain, as before.
    own = {"haproxy": {"found": "UP", "server": "host1", "run": "r-1", "at": "t"}}
    assert bal([haproxy_entry(hp, backend="web")], records=own).put_back({"haproxy": "UP"}, {}, 1)["changed"]


def test_gpufleets_own_drain_put_back_by_hand_in_one_backend_goes_back_whole(hp):
    """helper-39 (High): host1 drained by gpufleet from both backends (its record found UP), the run killed, an operator
    put it back into one backend by hand (the runbook's step). The next restart took the other backend's MAINT for an
    operator's, left it, and cleared the record: the host stayed out of it, blamed on someone else. The backends still
    MAINT are gpufleet's: they go back to what the record found."""
    hp.servers[("api", "host1")]["status"] = "MAINT"  # web=UP (put back by hand), api=MAINT (gpufleet's)
    rec = {"haproxy": {"found": "UP", "server": "host1", "run": "r-1", "at": "t"}}
    b = bal([haproxy_entry(hp)], records=rec)
    plan = b.plan_out()
    assert plan[0]["back"] == "UP" and "left_as_found" not in plan[0], plan
    assert plan[0]["drain"] == {"balancer": "haproxy", "found": "UP", "server": "host1", "keep": False}
    r = b.take_out(plan)
    assert r["rotation"]["found"] == {"haproxy": "UP"} and r["rotation"]["left_as_found"] == {}, r
    assert b.put_back(r["rotation"]["found"], {}, 1)["rotation"]["left_as_found"] == {}
    assert hp.status("web", "host1") == hp.status("api", "host1") == "UP"
    # An operator's DRAIN in the backend put back by hand stays DRAIN; the gpufleet MAINT goes back to UP.
    hp.servers[("web", "host1")]["status"], hp.servers[("api", "host1")]["status"] = "DRAIN", "MAINT"
    assert bal([haproxy_entry(hp)], records=rec).plan_out()[0]["back"] == "api=UP web=DRAIN"
    # Without a record, the same states are an operator's, per backend, as before.
    assert bal([haproxy_entry(hp)]).plan_out()[0]["back"] == "api=MAINT web=DRAIN"
    assert B.resume_back("a=MAINT b=UP", "a=DRAIN b=UP") == "a=DRAIN b=UP"


@pytest.mark.parametrize("state", ["UP", "DRAIN"])
def test_a_drain_over_a_record_of_another_server_is_refused_with_nothing_touched(hp, state):
    """helper-39 (Medium): with the host in rotation (or an operator's DRAIN), a restart's drain overwrote a record of
    another server under the entry's name with its own, then cleared it: the only trace that gpufleet took that server
    out, gone without a word. The drain refuses it now, as the put-back does."""
    hp.servers[("web", "host1")]["status"] = hp.servers[("api", "host1")]["status"] = state
    rec = {"haproxy": {"found": "UP", "server": "host2", "run": "r-1", "at": "t"}}
    with pytest.raises(B.BalancerError, match="names server host2, not this host's host1.*nothing was touched"):
        bal([haproxy_entry(hp)], records=rec).plan_out()
    assert not any(c.startswith("set server") for c in hp.commands)


def test_an_operators_drain_set_after_gpufleets_drain_stays_and_is_not_gpufleets(hp):
    """helper-40 (Medium): gpufleet drained host1 from both backends (its record found UP), the run was killed, then an
    operator set DRAIN in one backend. The put-back set it UP (the operator's DRAIN gone), and the audit said the DRAIN
    was gpufleet's. gpufleet takes a server out with MAINT only: a DRAIN found is someone else's, and stays."""
    hp.servers[("web", "host1")]["status"], hp.servers[("api", "host1")]["status"] = "DRAIN", "MAINT"
    rec = {"haproxy": {"found": "UP", "server": "host1", "run": "r-1", "at": "t"}}
    lines = bal([haproxy_entry(hp)], records=rec).drift()
    assert any("(DRAIN in backend web), not by gpufleet" in ln for ln in lines), lines
    assert any("(MAINT in backend api) by gpufleet" in ln for ln in lines), lines
    r = bal([haproxy_entry(hp)], records=rec).put_back({"haproxy": "UP"}, {}, 1)  # the return without a restart
    assert hp.status("web", "host1") == "DRAIN" and hp.status("api", "host1") == "UP", hp.servers
    assert r["rotation"]["left_as_found"] == {"haproxy": "DRAIN in backend web"} and r["changed"], r


def _leaves_maint_pending(hp, then):
    """As HAProxy does: a server that leaves MAINT reads "UP 1/2" (UP, going down) until its next check, which marks
    it `then` (UP when the check passes, DOWN when HAProxy cannot reach it)."""
    def on_ready(line):
        if line.startswith("set server ") and line.endswith(" state ready"):
            b, s = line.split()[2].split("/", 1)
            checks[(b, s)] = 0
    checks = {}
    hp.hook = on_ready
    real = hp.answer

    def answer(line):
        out = real(line)
        for k in list(checks):
            if line.startswith("set server "):
                hp.servers[k]["status"] = "UP 1/2"
            elif line == "show stat":
                checks[k] += 1
                if checks[k] >= 3:  # the next check, a few reads later
                    hp.servers[k]["status"] = then
                    del checks[k]
        return out
    hp.answer = answer


def test_the_put_back_waits_for_a_check_to_pass_not_the_up_a_server_leaves_maint_with(hp):
    """helper-41: a server HAProxy can no longer reach read UP right after `state ready`, and the host counted as
    back. The wait now needs a settled UP: it fails the host when the next check marks the server DOWN, and passes
    when the check passes."""
    b = bal([haproxy_entry(hp, backend="web")])
    r = b.take_out(b.plan_out())
    _leaves_maint_pending(hp, "DOWN")
    with pytest.raises(B.BalancerError, match="server host1 is DOWN in web, not UP"):
        b.put_back(r["rotation"]["found"], {}, up_timeout=0.3)
    b = bal([haproxy_entry(hp, backend="web")])
    r = b.take_out(b.plan_out())
    _leaves_maint_pending(hp, "UP")
    r = b.put_back(r["rotation"]["found"], {}, up_timeout=5)
    assert r["rotation"]["back_in"] == ["haproxy"] and hp.status("web", "host1") == "UP"


def test_the_plan_warns_when_the_server_is_the_last_in_rotation_and_still_drains(hp, smg):
    """helper-45: with no capacity minimum, the canary drained while its peers were in an operator's MAINT/DRAIN, and
    4847 of 5000 requests failed with no word. The drain goes on (the minimum is the guard); the plan says it."""
    b = bal([haproxy_entry(hp)])
    assert "drain" in b.plan_out()[0]
    # host1 is alone in backend api (web has host2 UP).
    assert b.warnings == ["haproxy haproxy: host1 is the only server in rotation in backend api: while it is out (drain, "
                          "restart, put-back) no server there takes requests; gpufleet_rollout_min_in_service refuses "
                          "such a batch"]
    hp.servers[("web", "host2")]["status"] = "MAINT"
    hp.servers[("api", "host9")] = {"status": "UP", "weight": "0"}  # weight 0 takes no request either
    b = bal([haproxy_entry(hp)])
    b.plan_out()
    assert len(b.warnings) == 1 and "in backend api, web:" in b.warnings[0], b.warnings
    hp.servers[("api", "host9")]["weight"] = "1"
    hp.servers[("web", "host2")]["status"] = "no check"
    b = bal([haproxy_entry(hp)])
    b.plan_out()
    assert b.warnings == []
    # The router: the other worker unhealthy leaves host1's the only one.
    e = {"type": "sglang_router", "name": "smg", "url": smg.url}
    b = bal([e])
    b.plan_out()
    assert b.warnings == []
    smg.workers["w1"]["is_healthy"] = False
    b = bal([e])
    b.plan_out()
    assert b.warnings == ["sglang_router smg: http://10.0.0.1:30000 is the only healthy worker the router lists: while "
                          "it is out (drain, restart, put-back) the router has no worker to send requests to; "
                          "gpufleet_rollout_min_in_service refuses such a batch"]
