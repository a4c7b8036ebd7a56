# SPDX-License-Identifier: GPL-3.0-or-later
"""Zero-drop rollouts (issue 17) on the sandbox: 4 hosts behind a real HAProxy and a real SGLang Model Gateway (smg),
both fronting every server, under continuous load through each, driven by the real rollout playbook. The drain itself
and what it refuses before anything is touched; test_drain_recovery.py has the drain records, operator states, timeouts
and put-backs that fail (drain_helpers.py: the fleet).

One fleet and one pair of balancers for the whole module; the tests run in order and each leaves every host serving and
in rotation (or puts it back itself)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import typing as t
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from drain_helpers import HOSTS, RECORD, DrainFleet  # noqa: E402
from drain_helpers import pids as _pids  # noqa: E402
from drain_helpers import wait_in_rotation as _wait_in_rotation  # noqa: E402
from rollout_helpers import ROOT, Run  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "sandbox"))
import balancer as _balancer  # noqa: E402

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]


def test_check_mode_touches_neither_balancer_nor_server(df):
    before = _pids(df)
    r = df.playbook("rollout", check=True, extra_vars={"gpufleet_server_force_restart": True})
    assert r.rc == 0, r.tail()
    assert _pids(df) == before
    assert set(df.haproxy_states().values()) == {"UP"} and len(df.smg_workers()) == HOSTS
    assert all(r.summary[h]["would_drain"] and not r.summary[h]["out_of_rotation"] for h in df.hosts), r.summary


def test_rollout_under_load_drops_nothing(df):
    """serial [1, "25%"]: a canary, then one host per batch; continuous load through both balancers."""
    before = _pids(df)
    # Four batches one after another: 261 s at load 10 on 2 cores, more than 341 s at load 11 (a fixed 300 s ran out).
    # The run is bounded by its progress instead: each task of it is bounded by the role's own timeouts (drain 30 s,
    # start 30 s, balancer 30 s, kill grace 3 s, clean 10 s in server_vars), so 180 s without a line of output is a hang.
    # The load runs until stopped, at most loadgen's 900 s: the rollout must end within them for "all along" to hold.
    loads = [df.load("haproxy", "haproxy", duration=900), df.load("smg", "smg", duration=900)]
    r = df.playbook("rollout", extra_vars={"gpufleet_rollout_serial": [1, "25%"]}, timeout=None, idle_timeout=180)
    results = [x.stop() for x in loads]
    assert r.rc == 0, r.tail()
    assert r.took < 890, "the load stopped (900 s) before the rollout ended (%.0f s)" % r.took
    for res in results:
        assert res["failed"] == 0, res["failures"]
        assert res["requests"] > 40 and res["line"].endswith(", 0 failed"), res["line"]
        # Never more than one host (the batch) out: 4 - 1 in service all along.
        assert res["min_in_service"] == HOSTS - 1, res["min_in_service"]
    after = _pids(df)
    assert all(before[h] and after[h] and not (before[h] & after[h]) for h in df.hosts), (before, after)
    assert all(r.summary[h]["restarted"] and not r.summary[h]["out_of_rotation"] for h in df.hosts)
    df.all_in_rotation(timeout=5)
    # A second run: every host up to date, never drained.
    loads = [df.load("haproxy", "haproxy-again", duration=900)]
    r2 = df.playbook("rollout", extra_vars={"gpufleet_rollout_serial": [1, "25%"]}, timeout=None, idle_timeout=180)
    res = loads[0].stop()
    assert r2.rc == 0, r2.tail()
    assert res["failed"] == 0 and res["min_in_service"] == HOSTS, res
    assert _pids(df) == after


def test_unreachable_balancer_fails_the_host_before_its_kill(df):
    before = _pids(df)
    load = df.load("smg", "smg-unreachable")
    r = df.playbook("rollout", "--limit", "host2", extra_vars={"gpufleet_server_force_restart": True},
                    vars_override={"gpufleet_server_balancers": df.balancers("/nonexistent/haproxy.sock")})
    res = load.stop()
    assert r.rc != 0
    assert r.summary["host2"]["status"] == "failed" and not r.summary["host2"]["restarted"], r.summary["host2"]
    assert _pids(df)["host2"] == before["host2"]  # never killed
    assert r.summary["host2"]["out_of_rotation"] == []  # haproxy came first and failed: nothing was drained
    # One line naming the socket and the error (not "non-zero return code", not a traceback).
    assert ("cannot reach the HAProxy admin socket /nonexistent/haproxy.sock: [Errno 2] No such file or directory"
            in r.summary["host2"]["failure"]), r.summary["host2"]
    assert res["failed"] == 0, res["failures"]
    df.all_in_rotation(timeout=5)
    # The capacity guard reads the balancers itself: one it cannot read refuses the batch, before anything is touched.
    r = df.playbook("rollout", "--limit", "host2", extra_vars={"gpufleet_server_force_restart": True,
                                                               "gpufleet_rollout_min_in_service": 1},
                    vars_override={"gpufleet_server_balancers": df.balancers("/nonexistent/haproxy.sock")})
    assert r.rc != 0
    assert ("gpufleet_rollout_min_in_service: could not read HAProxy /nonexistent/haproxy.sock on localhost"
            in r.summary["host2"]["failure"]), r.summary["host2"]
    assert _pids(df)["host2"] == before["host2"]


RECORDER = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def _any(self):
        n = int(self.headers.get("Content-Length") or 0)
        rec = {"method": self.command, "path": self.path, "body": self.rfile.read(n).decode(),
               "auth": self.headers.get("Authorization")}
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.send_response(204)
        self.end_headers()
    do_POST = do_PUT = do_DELETE = _any
    def log_message(self, *a):
        pass
HTTPServer(("10.200.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_http_balancer_sends_remove_then_add_and_hides_its_headers(df):
    """The generic `http` type against a stand-in that records what it gets (a real HTTP server in the hub)."""
    calls = df.workdir / "http-calls.jsonl"
    token = "Bearer s3cr3t-token-of-the-balancer-api"
    rec = subprocess.Popen(["ip", "netns", "exec", df.fleet.hub, sys.executable, "-c", RECORDER, "8090", str(calls)])
    try:
        time.sleep(0.5)
        base = "http://10.200.0.1:8090/pool/gpufleet/members/{{ inventory_hostname }}"
        # The remove URL carries a credential of its own (a query token): never printed, never recorded.
        http = {"type": "http", "name": "lb-api", "delegate_to": "{{ inventory_hostname }}",
                "remove": {"url": base + "?token=urls3cret", "method": "DELETE", "headers": {"Authorization": token}},
                # The body can hold a token too (an API key in a JSON field): never printed (helper-36).
                "add": {"url": base, "method": "PUT", "body": '{"port": 30000, "key": "b0dys3cret"}',
                        "headers": {"Authorization": token}}}
        r = df.playbook("rollout", "-vvv", "--diff", "--limit", "host3", extra_vars={"gpufleet_server_force_restart": True},
                        vars_override=dict(df.server_vars(), gpufleet_server_balancers=[http]))
        assert r.rc == 0, r.tail()
        got = [json.loads(x) for x in calls.read_text().splitlines()]
        assert [(c["method"], c["path"].split("?")[0]) for c in got] == [("DELETE", "/pool/gpufleet/members/host3"),
                                                                         ("PUT", "/pool/gpufleet/members/host3")], got
        assert got[1]["body"] == '{"port": 30000, "key": "b0dys3cret"}' and all(c["auth"] == token for c in got)
        assert "s3cr3t-token" not in r.out and "urls3cret" not in r.out and "b0dys3cret" not in r.out
        assert r.summary["host3"]["restarted"] and r.summary["host3"]["out_of_rotation"] == []
    finally:
        rec.kill()
        rec.wait()
    df.all_in_rotation(timeout=10)


def test_capacity_guard_refuses_a_batch_before_anything_is_touched(df):
    """75% of 4 must stay in rotation: a batch of 2 (50%) is refused on every host of it, nothing locked or drained."""
    before = _pids(df)
    r = df.playbook("rollout", extra_vars={"gpufleet_rollout_serial": ["50%"], "gpufleet_server_force_restart": True,
                                           "gpufleet_rollout_min_in_service": "75%"})
    assert r.rc != 0
    for h in ("host1", "host2"):
        assert r.summary[h]["status"] == "failed", r.summary[h]
        assert ("gpufleet_rollout_min_in_service: draining host1, host2 would leave 2 of 4 server(s) in rotation, "
                "fewer than 3; nothing was touched") in r.summary[h]["failure"], r.summary[h]["failure"]
        # A batch of one would leave 3: the advice is smaller batches.
        assert r.summary[h]["failure"].endswith("use smaller batches (gpufleet_rollout_serial)"), r.summary[h]["failure"]
    assert r.summary["host3"]["status"] == "not run"
    assert _pids(df) == before
    # A percentage is rounded up (docs/playbooks.md): 70% of 4 is 3 servers, as 75% is.
    r = df.playbook("rollout", extra_vars={"gpufleet_rollout_serial": ["50%"], "gpufleet_server_force_restart": True,
                                           "gpufleet_rollout_min_in_service": "70%"})
    assert r.rc != 0 and "in rotation, fewer than 3; nothing was touched" in r.summary["host1"]["failure"], r.summary
    assert _pids(df) == before
    df.all_in_rotation(timeout=5)
    # Counted from the balancers' own state: host2 in MAINT in HAProxy, host4 at weight 0 there (a soft drain) and
    # host3's worker removed from the router, by hand, are out although the play knows nothing of it.
    _balancer.haproxy_cmd(df.haproxy.sock, "set server %s/host2 state maint" % _balancer.BACKEND)
    _balancer.haproxy_cmd(df.haproxy.sock, "set weight %s/host4 0" % _balancer.BACKEND)
    wid = [w["id"] for w in json.loads(df.fleet.hub_run(["curl", "-sf", df.smg.url + "/workers"], check=True).stdout)["workers"]
           if w["url"] == df.worker_url("host3")][0]
    df.fleet.hub_run(["curl", "-sf", "-XDELETE", "%s/workers/%s" % (df.smg.url, wid)], check=True)
    try:
        r = df.playbook("rollout", "--limit", "host1", extra_vars={"gpufleet_server_force_restart": True,
                                                                   "gpufleet_rollout_min_in_service": 2})
        assert r.rc != 0
        assert ("gpufleet_rollout_min_in_service: draining host1 would leave 0 of 4 server(s) in rotation (host2, host3, "
                "host4 already out), fewer than 2; nothing was touched") in r.summary["host1"]["failure"], r.summary["host1"]
        # No batch size can pass with one server in rotation and 2 to keep: the advice says so (helper-35).
        assert " ".join(r.summary["host1"]["failure"].split()).endswith(
            "no batch can pass, as even a batch of one host would leave fewer: lower gpufleet_rollout_min_in_service or "
            "put servers back into rotation"), r.summary["host1"]["failure"]
        assert _pids(df) == before
    finally:
        _balancer.haproxy_cmd(df.haproxy.sock, "set weight %s/host4 100%%" % _balancer.BACKEND)
        df.put_back("host2")
        df.put_back("host3")
    df.all_in_rotation(timeout=30)
    # A host of the batch out of one balancer (host1, MAINT by an operator in HAProxy) still serves the router's
    # requests: it is drained out of the router, so it is counted with the batch and named as such (helper-47: it was
    # counted out already, and its drain "changed nothing"); with 3 to keep, no batch can pass, and the advice says so,
    # not "smaller batches" (helper-36).
    _balancer.haproxy_cmd(df.haproxy.sock, "set server %s/host1 state maint" % _balancer.BACKEND)
    try:
        r = df.playbook("rollout", "--limit", "host1,host2", extra_vars={"gpufleet_server_force_restart": True,
                                                                         "gpufleet_rollout_serial": ["100%"],
                                                                         "gpufleet_rollout_min_in_service": 3})
        assert r.rc != 0
        said = " ".join(r.summary["host2"]["failure"].split())
        assert ("draining host1, host2 would leave 2 of 4 server(s) in rotation (host1 out of some of its balancers and "
                "still in others), fewer than 3; nothing was touched: no batch can pass") in said, said
        assert _pids(df) == before
        # helper-47 (High): the router's only healthy worker is host1's (the others removed from it by hand), and host1
        # is in an operator's MAINT in HAProxy. The guard let its drain through ("already out"), and every request
        # through the router failed. Now the batch is refused, nothing touched.
        listed = df.fleet.hub_run(["curl", "-sf", df.smg.url + "/workers"], check=True).stdout
        removed = [w["id"] for w in json.loads(listed)["workers"] if w["url"] != df.worker_url("host1")]
        for wid in removed:
            df.fleet.hub_run(["curl", "-sf", "-XDELETE", "%s/workers/%s" % (df.smg.url, wid)], check=True)
        r = df.playbook("rollout", "--limit", "host1", extra_vars={"gpufleet_server_force_restart": True,
                                                                   "gpufleet_rollout_min_in_service": 1})
        assert r.rc != 0
        said = " ".join(r.summary["host1"]["failure"].split())
        assert ("draining host1 would leave 0 of 4 server(s) in rotation (host2, host3, host4 already out) (host1 out of "
                "some of its balancers and still in others), fewer than 1; nothing was touched") in said, said
        assert _pids(df) == before and df.smg_workers() == {df.worker_url("host1"): True}
    finally:
        df.put_back("host1")
        for h in ("host2", "host3", "host4"):
            df.put_back(h)
    df.all_in_rotation(timeout=30)
    # The clean playbook (a stop drains first) has the same guard.
    c = df.playbook("clean", extra_vars={"gpufleet_rollout_serial": ["50%"], "gpufleet_rollout_min_in_service": "75%"})
    assert c.rc != 0
    assert ("gpufleet_rollout_min_in_service: draining host1, host2 would leave 2 of 4 server(s) in rotation, "
            "fewer than 3; nothing was touched") in c.summary["host1"]["failure"], c.summary["host1"]
    assert _pids(df) == before
    df.all_in_rotation(timeout=5)
    # A minimum on one host only (its host_vars): the fleet's minimum cannot differ between hosts (a batch without it
    # would drain below it: helper-44), so the run is refused at its first batch, before any host is touched.
    r = df.playbook("rollout", host_vars={"host2": {"gpufleet_rollout_min_in_service": "75%"}},
                    extra_vars={"gpufleet_rollout_serial": ["50%"], "gpufleet_server_force_restart": True})
    assert r.rc != 0
    assert ("gpufleet_rollout_min_in_service is the minimum of the whole fleet, so it must be the same on every host of "
            "the play (got 0 on host1, host3, host4; 75% on host2)") in r.out.replace("\n", " "), r.tail()
    assert all(r.summary[h]["restarted"] is False for h in df.hosts if h in r.summary), r.summary
    assert _pids(df) == before
    df.all_in_rotation(timeout=5)


def test_failing_host_stays_drained_and_the_run_stops(df):
    """host2's new server fails at start-up: host2 stays out of rotation, the rollout stops after its batch, the
    traffic never sees it."""
    load = df.load("haproxy", "haproxy-failing")
    r = df.playbook("rollout", extra_vars={"gpufleet_rollout_serial": [1, "25%"], "gpufleet_server_force_restart": True},
                    host_vars={"host2": {"gpufleet_server_command": df.server_vars()["gpufleet_server_command"]
                                         + ["--fail-at-startup"]}})
    res = load.stop()
    assert r.rc != 0
    assert r.summary["host1"]["status"] == "ok" and r.summary["host1"]["restarted"]
    assert r.summary["host2"]["status"] == "failed" and r.summary["host2"]["out_of_rotation"] == ["haproxy", "sglang_router"]
    assert r.summary["host3"]["status"] == "not run" and r.summary["host4"]["status"] == "not run"
    summary = json.loads((df.last_summary / "rollout-summary.json").read_text())
    assert summary["out_of_rotation"] == {"host2": ["haproxy", "sglang_router"]} and summary["halted"]
    states = df.haproxy_states()
    assert states["host2"] == "MAINT" and all(states[h] == "UP" for h in ("host1", "host3", "host4")), states
    assert df.worker_url("host2") not in df.smg_workers()
    assert res["failed"] == 0, res["failures"]
    assert res["min_in_service"] == HOSTS - 1
    # The audit reports the host left out of rotation as drift; the others are in rotation and UP.
    a = df.playbook("audit", check=True)
    assert a.rc != 0
    out = " ".join(a.out.split())
    assert "out of rotation on haproxy (MAINT in backend gpufleet)" in out and \
        "out of rotation on sglang_router (the router does not list %s)" % df.worker_url("host2") in out, a.tail()
    assert a.recap["host1"]["failed"] == 0, a.tail()  # restarted by this run's canary, back in rotation
    assert df.haproxy_states()["host2"] == "MAINT"  # the audit changed nothing
    # gpufleet's own drain, on record (root only): the audit says so, and the next run puts host2 back in both
    # balancers (the router does not list it: not a wrong worker_url, the record says gpufleet removed it).
    mode, drains = df.drain_record("host2")
    assert mode == "600" and drains["haproxy"]["found"] == "UP" and drains["sglang_router"]["found"] == "listed", drains
    assert drains["haproxy"]["server"] == "host2" and drains["sglang_router"]["server"] == df.worker_url("host2")
    assert "out of rotation on haproxy (MAINT in backend gpufleet) by gpufleet (run %s" % drains["haproxy"]["run"] in out
    assert "not by gpufleet" not in out, a.tail()
    b = df.playbook("rollout", "--limit", "host2", extra_vars={"gpufleet_server_force_restart": True})
    assert b.rc == 0, b.tail()
    assert b.summary["host2"]["out_of_rotation"] == [] and b.summary["host2"]["left_as_found"] == {}
    _wait_in_rotation(df, "host2", timeout=5)
    assert df.drain_record("host2") is None  # back in service: the record is cleared


def test_gpu_holders_no_kill_would_end_fail_the_host_before_its_drain(df):
    """issue 24: an untagged process holds host2's GPU 0, so its restart would be refused at the clean gate before the
    kill. The check refuses it, before the drain (it was drained for nothing and put back before): host2 never leaves
    either balancer, its server serves on, the host fails and the rollout halts; the traffic never fails."""
    # host2 up to date first (whatever ran before): the forced run's check then verifies its workers.
    assert df.playbook("rollout", "--limit", "host2").rc == 0
    before = _pids(df)
    holder = df.start_holder("host2", gpu=0, mib=1000)
    try:
        load = df.load("haproxy", "haproxy-holder")
        r = df.playbook("rollout", "--limit", "host2,host3",
                        extra_vars={"gpufleet_rollout_serial": [1], "gpufleet_server_force_restart": True,
                                    "gpufleet_server_clean_timeout": 3})
        res = load.stop()
    finally:
        df.kill("host2", [holder])
    assert r.rc != 0, r.tail()
    h = r.summary["host2"]
    assert h["status"] == "failed" and not h["restarted"] and h["killed"] == 0 and h["phase"] == "clean", h
    assert h["failure"].startswith("fails at the clean gate, before the kill:") and "pid %d" % holder in h["failure"], h
    assert h["out_of_rotation"] == [], h
    assert r.summary["host3"]["status"] == "not run", r.summary  # the canary failed: the rollout halted
    assert _pids(df)["host2"] == before["host2"]  # the server serves as before
    assert df.drain_record("host2") is None
    assert res["failed"] == 0, res["failures"]
    assert res["min_in_service"] == HOSTS, res  # never drained
    df.all_in_rotation(timeout=5)


def _layers(df: DrainFleet, host: str) -> t.Tuple[t.Optional[str], str]:
    """The host's system sitecustomize.py (its SHA-256) and nccl.conf, byte for byte."""
    conf = df.fleet.ssh(host, "cat /etc/nccl.conf 2>/dev/null || echo absent").stdout
    return df.snapshot()[host]["sitecustomize_sha"], conf


# A changed NCCL variable for host2: the run writes its layers under the host lock before the check.
NEW_NCCL = {"gpufleet_nccl_env": {"NCCL_NTHREADS": "128"}}


@pytest.mark.reliability(
    section="fault", case="A restart the check refuses before the drain, with NCCL layers this run wrote",
    provoked="4 sandbox hosts behind a real HAProxy and SGLang router under load; host2 forced to restart with "
             "gpufleet_server_log_dir under a regular file (/etc/hostname/gpufleet) and a changed NCCL variable "
             "(gpufleet_nccl_env NCCL_NTHREADS), which the run writes into the layers under the host lock before its check",
    outcome="host2 fails in phase preflight with the restart's words ('cannot run this server, nothing was stopped: "
            "log_path /etc/hostname/gpufleet/demo.log lies under /etc/hostname, ...'), never leaves either balancer "
            "(fewest in service 4), same server pids, no drain record; the system sitecustomize.py and nccl.conf are "
            "byte for byte as before (put back from nccl_layers' snapshot), nccl_changed false; the rollout halts; no "
            "request fails")
def test_a_log_path_the_restart_would_refuse_fails_the_host_before_its_drain(df):
    """issue 24: host2's log directory lies under a regular file. server_restart's preflight refused it after the
    drain; the check refuses it before, with the same words (one function): host2 never leaves either balancer, its
    server serves on, the host fails and the rollout halts; the traffic never fails. The NCCL layers the run wrote
    under the lock before its check (a changed NCCL variable) are put back byte for byte: the old server runs on the
    old values."""
    assert df.playbook("rollout", "--limit", "host2").rc == 0
    before = _pids(df)
    layers = _layers(df, "host2")
    load = df.load("haproxy", "haproxy-logpath")
    r = df.playbook("rollout", "--limit", "host2,host3", extra_vars={"gpufleet_rollout_serial": [1]},
                    host_vars={"host2": dict(NEW_NCCL, gpufleet_server_force_restart=True,
                                             gpufleet_server_log_dir="/etc/hostname/gpufleet")})
    res = load.stop()
    assert r.rc != 0, r.tail()
    h = r.summary["host2"]
    assert h["status"] == "failed" and not h["restarted"] and h["killed"] == 0 and h["phase"] == "preflight", h
    assert h["failure"] == ("cannot run this server, nothing was stopped: log_path /etc/hostname/gpufleet/demo.log lies "
                            "under /etc/hostname, which is not a directory"), h
    assert h["out_of_rotation"] == [], h
    assert h["nccl_changed"] is False, h  # written, then put back
    assert r.summary["host3"]["status"] == "not run", r.summary  # the canary failed: the rollout halted
    assert _pids(df)["host2"] == before["host2"]  # the server serves as before
    assert _layers(df, "host2") == layers
    assert df.drain_record("host2") is None
    assert res["failed"] == 0, res["failures"]
    assert res["min_in_service"] == HOSTS, res  # never drained
    df.all_in_rotation(timeout=5)


@pytest.mark.parametrize("new_nccl", [False, pytest.param(True, marks=pytest.mark.reliability(
    section="fault", case="A restart refused by its own preflight after the drain, with NCCL layers this run wrote",
    provoked="as above, host2's log directory (absent at the check) made a regular file while the drain waits for a "
             "request in flight sent to host2 directly; a changed NCCL variable written under the host lock",
    outcome="server_restart refuses before its kill (phase preflight, killed 0); the run puts host2 back into both "
            "balancers (UP in each), clears its drain record and puts the NCCL layers back byte for byte (sitecustomize.py "
            "and nccl.conf as before, nccl_changed false); same server pids; the rollout halts; no request fails"))],
    ids=["same-nccl", "new-nccl"])
def test_a_restart_refused_before_its_kill_puts_the_drained_host_back(df, new_nccl):
    """A refusal that only the restart's own preflight makes, after the drain: host2's log directory is made a regular
    file while the drain waits for a request in flight (the check, before the drain, found nothing wrong). Its server
    was never stopped: the run puts host2 back into both balancers (UP in each) and clears its drain record, fails the
    host and halts the rollout; the traffic through HAProxy never fails. With a changed NCCL variable, the NCCL layers
    the run wrote under the lock are put back byte for byte."""
    late = "/var/log/gpufleet/late"
    first = df.playbook("rollout", "--limit", "host2")
    assert first.rc == 0, first.tail()
    before = _pids(df)
    layers = _layers(df, "host2")
    load = df.load("haproxy", "haproxy-refused")
    # In flight on host2 for 8 s, sent to it directly: the drain waits for it once host2 is out of the balancers.
    inflight = subprocess.Popen(["ip", "netns", "exec", df.fleet.hub, "curl", "-s", "-m", "60", "-XPOST",
                                 "http://%s:30000/generate" % df.fleet.addr("host2"), "-d",
                                 json.dumps({"text": "slow", "delay": 8})],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs: t.List[Run] = []
    rollout = threading.Thread(target=lambda: runs.append(df.playbook(
        "rollout", "--limit", "host2,host3", extra_vars={"gpufleet_rollout_serial": [1]},
        host_vars={"host2": dict(NEW_NCCL if new_nccl else {}, gpufleet_server_force_restart=True,
                                 gpufleet_server_log_dir=late)})))
    try:
        rollout.start()
        deadline = time.monotonic() + 120
        while df.haproxy_states().get("host2") != "MAINT":  # drained: the check is behind
            assert time.monotonic() < deadline and rollout.is_alive(), "host2 was never drained"
            time.sleep(0.1)
        df.fleet.ssh("host2", "rm -rf %s && touch %s" % (late, late), check=True)
        rollout.join(300)
    finally:
        inflight.wait(timeout=60)
        df.fleet.ssh("host2", "rm -f %s" % late)
    res = load.stop()
    r = runs[0]
    assert r.rc != 0, r.tail()
    h = r.summary["host2"]
    assert h["status"] == "failed" and not h["restarted"] and h["killed"] == 0 and h["phase"] == "preflight", h
    assert h["failure"].startswith("cannot run this server, nothing was stopped: log_path %s/demo.log lies under %s, "
                                   % (late, late)), h
    assert h["out_of_rotation"] == [], h  # back in both balancers
    # The old server's workers, checked by this run, serve on (not 0); with the new NCCL variable they lack it, and the
    # check verified none against this run's definition.
    assert h["workers_verified"] == (0 if new_nccl else 2), h
    assert r.summary["host3"]["status"] == "not run", r.summary  # the canary failed: the rollout halted
    summary = json.loads((df.last_summary / "rollout-summary.json").read_text())
    assert summary["out_of_rotation"] == {} and summary["halted"], summary
    assert _pids(df)["host2"] == before["host2"]  # the server serves as before
    assert _layers(df, "host2") == layers and h["nccl_changed"] is False, h
    _wait_in_rotation(df, "host2", timeout=5)
    assert df.drain_record("host2") is None
    assert res["failed"] == 0, res["failures"]
    assert res["min_in_service"] == HOSTS - 1, res  # host2 was drained for the restart before it was put back
    df.all_in_rotation(timeout=5)


def test_sglang_router_wrong_worker_url_fails_the_host_before_its_kill(df):
    """A worker_url the router does not list, with no record of gpufleet removing it: a misconfiguration, not a host
    already out. The host fails before anything is touched, naming the router and the URL: every entry is checked
    before the host leaves any, so the HAProxy listed before the router still has it UP."""
    before = _pids(df)
    bad = "http://10.200.0.250:30000"
    smg = {"type": "sglang_router", "url": df.smg.url, "delegate_to": "{{ inventory_hostname }}", "worker_url": bad}
    # The host's own check of a worker_url set by hand (not one of its addresses) is off, as behind NAT: the router's
    # own refusal is what this test is about.
    r = df.playbook("rollout", "--limit", "host2", extra_vars={"gpufleet_server_force_restart": True},
                    vars_override=dict(df.server_vars(), gpufleet_server_balancers=[df.balancers()[0], smg],
                                       gpufleet_server_worker_url_check=False))
    assert df.haproxy_states()["host2"] == "UP"
    assert r.rc != 0
    h = r.summary["host2"]
    assert h["status"] == "failed" and not h["restarted"] and h["out_of_rotation"] == [], h
    assert ("sglang_router sglang_router (%s) does not list the worker %s and gpufleet has no record of taking it out"
            % (df.smg.url, bad)) in " ".join(h["failure"].split()), h["failure"]
    assert _pids(df)["host2"] == before["host2"]
    assert df.drain_record("host2") is None
    df.all_in_rotation(timeout=5)


@pytest.mark.reliability(
    section="fault", case="A HAProxy entry naming another host's server",
    provoked="4 sandbox hosts behind a real HAProxy; host2 forced to restart with its entry's server host3 (a "
             "copy-paste slip): HAProxy's host3 has host3's address, not host2's",
    outcome="host2 fails before anything is touched: 'server host3 is not this host's server (...): in backend ... it has "
            "address <host3's>, not the worker URL's <host2's>; ... nothing was touched'; host2 and host3 "
            "both stay UP in HAProxy, same server pids, no drain record")
def test_a_haproxy_server_name_of_another_host_fails_the_host_before_anything_is_touched(df):
    """A copy-paste slip in host2's entry (server: host3): HAProxy's host3 is at host3's address, not host2's. Taking it
    out would drain host3 and kill host2 while HAProxy still sends it requests; the host fails before anything is
    touched instead, naming both addresses, and host3 stays in rotation (found by a new user, helper-35)."""
    before = _pids(df)
    wrong = dict(df.balancers()[0], server="host3")
    # --check predicts it: the read of every balancer before the drain is read-only and runs in check mode too.
    c = df.playbook("rollout", "--limit", "host2", check=True, extra_vars={"gpufleet_server_force_restart": True},
                    vars_override=dict(df.server_vars(), gpufleet_server_balancers=[wrong]))
    assert c.rc != 0 and c.summary["host2"]["status"] == "failed", c.tail()
    assert "server host3 is not this host's server" in " ".join(c.summary["host2"]["failure"].split()), c.summary
    r = df.playbook("rollout", "--limit", "host2", extra_vars={"gpufleet_server_force_restart": True},
                    vars_override=dict(df.server_vars(), gpufleet_server_balancers=[wrong]))
    assert r.rc != 0
    assert df.haproxy_states()["host3"] == "UP" and df.haproxy_states()["host2"] == "UP"
    h = r.summary["host2"]
    assert h["status"] == "failed" and not h["restarted"] and h["out_of_rotation"] == [], h
    said = " ".join(h["failure"].split())
    assert ("server host3 is not this host's server (%s): in backend %s it has address %s, not the worker URL's %s"
            % (df.worker_url("host2"), _balancer.BACKEND, df.fleet.addr("host3"), df.fleet.addr("host2"))) in said, said
    assert said.endswith("nothing was touched"), said
    assert _pids(df) == before
    assert df.drain_record("host2") is None
    df.all_in_rotation(timeout=5)


@pytest.mark.reliability(
    section="fault", case="A balancer entry copied from another host, its server and worker_url both",
    provoked="4 sandbox hosts behind a real HAProxy; host2 forced to restart with its entry's server host3 and "
             "worker_url host3's (HAProxy's address for host3 matches it)",
    outcome="host2 fails before anything is touched: 'balancer entry haproxy: its worker_url's host <host3's> is no "
            "address of this host ...'; host2 and host3 both stay UP in HAProxy, same server pids, no drain record")
def test_an_entry_copied_from_another_host_with_its_worker_url_fails_the_host_before_anything_is_touched(df):
    """The copy-paste slip the address check cannot see: host2's entry names host3's server and host3's worker URL, and
    HAProxy's address for host3 is that URL's, so the balancer would drain host3 while host2 is killed under its
    requests. Only host2 can tell that the URL is not its own: its check refuses before the drain (helper-36's B6)."""
    before = _pids(df)
    copied = dict(df.balancers()[0], server="host3", worker_url=df.worker_url("host3"))
    c = df.playbook("rollout", "--limit", "host2", check=True, extra_vars={"gpufleet_server_force_restart": True},
                    vars_override=dict(df.server_vars(), gpufleet_server_balancers=[copied]))
    assert c.rc != 0 and "is no address of this host" in " ".join(c.out.split()), c.tail()
    r = df.playbook("rollout", "--limit", "host2", extra_vars={"gpufleet_server_force_restart": True},
                    vars_override=dict(df.server_vars(), gpufleet_server_balancers=[copied]))
    assert r.rc != 0
    assert df.haproxy_states()["host3"] == "UP" and df.haproxy_states()["host2"] == "UP"
    h = r.summary["host2"]
    assert h["status"] == "failed" and not h["restarted"] and h["out_of_rotation"] == [], h
    said = " ".join(r.out.split())
    assert ("balancer entry %s: its worker_url's host %s is no address of this host"
            % (copied.get("name", "haproxy"), df.fleet.addr("host3"))) in said, said
    assert _pids(df) == before
    assert df.drain_record("host2") is None
    # An earlier run left host2 drained (MAINT, its record); host3 is in MAINT by an operator. The put-back without a
    # restart is refused the same way: host3 is not put back over the operator's MAINT (helper-37, H2).
    for h in ("host2", "host3"):
        _balancer.haproxy_cmd(df.haproxy.sock, "set server %s/%s state maint" % (_balancer.BACKEND, h))
    rec = {"drains": {"haproxy": {"found": "UP", "server": "host2", "run": "ctl:1:killed", "at": "2026-12-05T18:00:00+0000"}}}
    df.fleet.ssh("host2", "umask 077 && mkdir -p %s && cat > %s" % (os.path.dirname(RECORD), RECORD),
                 input=json.dumps(rec), check=True)
    r = df.playbook("rollout", "--limit", "host2", vars_override=dict(df.server_vars(), gpufleet_server_balancers=[copied]))
    assert r.rc != 0, r.tail()
    assert "is no address of this host" in " ".join(r.out.split()), r.tail()
    assert df.haproxy_states()["host3"] == "MAINT" and df.haproxy_states()["host2"] == "MAINT"
    assert df.drain_record("host2")[1] == rec["drains"]
    assert _pids(df) == before
    _balancer.haproxy_cmd(df.haproxy.sock, "set server %s/host3 state ready" % _balancer.BACKEND)
    # The same entry with host2's own worker URL given by hand passes the check, and the restart goes through (host2
    # back in rotation, its record cleared).
    own = dict(df.balancers()[0], worker_url=df.worker_url("host2"))
    r = df.playbook("rollout", "--limit", "host2", extra_vars={"gpufleet_server_force_restart": True},
                    vars_override=dict(df.server_vars(), gpufleet_server_balancers=[own]))
    assert r.rc == 0, r.tail()
    assert r.summary["host2"]["restarted"], r.summary["host2"]
    df.all_in_rotation(timeout=30)
    assert df.drain_record("host2") is None
    # The clean playbook's drain is refused the same way, before its lock: host2 keeps serving, host3 stays in
    # rotation (helper-38, H1: host3 was taken out and host2 stopped in rotation, rc 0).
    now = _pids(df)
    c = df.playbook("clean", "--limit", "host2", vars_override=dict(df.server_vars(), gpufleet_server_balancers=[copied]))
    assert c.rc != 0, c.tail()
    assert "is no address of this host" in " ".join(c.out.split()), c.tail()
    assert df.haproxy_states()["host3"] == "UP" and df.haproxy_states()["host2"] == "UP"
    assert _pids(df) == now and df.drain_record("host2") is None
