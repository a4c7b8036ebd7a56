# SPDX-License-Identifier: GPL-3.0-or-later
"""Zero-drop rollouts (issue 17) on the sandbox: 4 hosts behind a real HAProxy and a real SGLang Model Gateway (smg),
both fronting every server, under continuous load through each, driven by the real rollout playbook.

One fleet and one pair of balancers for the whole module; the tests run in order and each leaves every host serving and
in rotation (or puts it back itself)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import typing as t
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout_helpers import ROLE_DEFAULT, ROOT, BalancerRecorder, RolloutFleet, Run, sandbox  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "sandbox"))
import balancer as _balancer  # noqa: E402

from collection_copy import private_collections  # noqa: E402
from helpers import run_playbook  # noqa: E402

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

LOADGEN = ROOT / "tests" / "sandbox" / "loadgen.py"
SMG_PORT = 8081
HOSTS = 4
RECORD = "/var/lib/gpufleet/demo.rotation.json"  # gpufleet's drains of the host (rotation_record)


def _skip() -> t.Optional[str]:
    if not (shutil.which("haproxy") or os.access("/usr/sbin/haproxy", os.X_OK)):
        return "haproxy is not installed (./scripts/setup installs it)"
    if not (Path(sys.executable).parent / "smg").exists():
        return "smg is not installed (./scripts/setup: pip sglang-router)"
    return None


class DrainFleet(RolloutFleet):
    """The rollout helpers, with the checkout's collections/ after the private copy."""

    def __init__(self, fleet: t.Any, workdir: Path) -> None:
        super().__init__(fleet, workdir)
        self.haproxy = _balancer.Balancer(fleet.state_dir, "haproxy")
        self.smg = _balancer.Balancer(fleet.state_dir, "smg", SMG_PORT)

    def balancers(self, haproxy_socket: t.Optional[str] = None) -> t.List[t.Dict[str, t.Any]]:
        return [
            {"type": "haproxy", "delegate_to": "localhost", "socket": haproxy_socket or self.haproxy.sock,
             "backend": _balancer.BACKEND},
            # smg listens in the fleet's hub namespace: reached from the hosts, not from the controller.
            {"type": "sglang_router", "url": self.smg.url, "delegate_to": "{{ inventory_hostname }}"},
        ]

    def start_stale(self, hosts: t.Optional[t.Sequence[str]] = None) -> t.Any:
        # Each /generate takes 0.5 s on the server itself (smg drops unknown fields of a request, so a request's own
        # delay would not reach the server through it): requests are in flight whenever a drain starts.
        orig = sandbox.stale_server_cmd
        sandbox.stale_server_cmd = lambda *a, **k: orig(*a, **k).replace(" > /var/log/", " --generate-delay 0.5 > /var/log/")
        try:
            return super().start_stale(hosts)
        finally:
            sandbox.stale_server_cmd = orig

    def server_vars(self) -> t.Dict[str, t.Any]:
        v = super().server_vars()
        v["gpufleet_server_command"] = list(v["gpufleet_server_command"]) + ["--generate-delay", "0.5"]
        v.update({"gpufleet_server_balancers": self.balancers(), "gpufleet_server_drain_timeout": 30,
                  "gpufleet_server_drain_interval": 0.1, "gpufleet_server_balancer_up_timeout": 30})
        return v

    def playbook(self, name: str, *args: str, vars_override: t.Optional[t.Mapping[str, t.Any]] = None,
                 host_vars: t.Optional[t.Mapping[str, t.Mapping[str, t.Any]]] = None,
                 extra_vars: t.Optional[t.Mapping[str, t.Any]] = None, check: bool = False,
                 timeout: t.Optional[float] = 300, idle_timeout: t.Optional[float] = None) -> Run:
        inv = self.inventory(vars_override, host_vars)
        summary = self.workdir / ("summary-%d" % self.runs)
        extra_vars = dict({"gpufleet_rollout_serial": ["100%"]}, **dict(extra_vars or {}))
        env = dict(os.environ, GPUFLEET_SUMMARY_DIR=str(summary),
                   ANSIBLE_COLLECTIONS_PATH="%s:%s" % (private_collections(), ROOT / "collections"))
        t0 = time.monotonic()
        cp = run_playbook("gpufleet.serving." + name, *args, inventory=str(inv), env=env, extra_vars=extra_vars,
                          check=check, timeout=timeout, idle_timeout=idle_timeout)
        run = Run(cp, summary, time.monotonic() - t0)
        print("ansible-playbook %s %s: rc=%s in %.1fs" % (name, " ".join(args), run.rc, run.took))
        self.last_summary = summary
        return run

    # -- balancers -------------------------------------------------------------------------------
    def haproxy_states(self) -> t.Dict[str, str]:
        return {k: v["status"] for k, v in self.haproxy.status().items()}

    def smg_workers(self) -> t.Dict[str, bool]:
        return {u: w["healthy"] for u, w in self.smg.status().items()}

    def worker_url(self, host: str) -> str:
        return "http://%s:30000" % self.fleet.addr(host)

    def all_in_rotation(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            hp, sm = self.haproxy_states(), self.smg_workers()
            if all(hp.get(h) == "UP" for h in self.hosts) and all(sm.get(self.worker_url(h)) for h in self.hosts):
                return
            if time.monotonic() > deadline:
                raise AssertionError("not every host in rotation: haproxy %s, smg %s" % (hp, sm))
            time.sleep(0.2)

    def put_back(self, host: str) -> None:
        """What an operator does once a host left out of rotation is fixed (docs/runbook.md)."""
        _balancer.haproxy_cmd(self.haproxy.sock, "set server %s/%s state ready" % (_balancer.BACKEND, host))
        if self.worker_url(host) not in self.smg_workers():
            self.fleet.hub_run(["curl", "-sf", "-XPOST", self.smg.url + "/workers", "-H", "Content-Type: application/json",
                                "-d", json.dumps({"url": self.worker_url(host)})], check=True)

    def drain_record(self, host: str) -> t.Optional[t.Tuple[str, t.Dict[str, t.Any]]]:
        """(mode, drains) of the host's drain record (rotation_record), None when there is none."""
        p = self.fleet.ssh(host, "stat -c %%a %s && cat %s" % (RECORD, RECORD))
        if p.returncode != 0:
            return None
        mode, body = p.stdout.split("\n", 1)
        return mode.strip(), json.loads(body)["drains"]

    # -- load ------------------------------------------------------------------------------------
    def load(self, via: str, name: str, clients: int = 4, duration: float = 400) -> "Load":
        return Load(self, via, name, clients, duration)


class Load:
    """tests/sandbox/loadgen.py in the hub namespace, through one balancer, until stopped."""

    def __init__(self, df: DrainFleet, via: str, name: str, clients: int, duration: float) -> None:
        self.out = df.workdir / ("load-%s-%d.json" % (name, df.runs))
        self.stop_file = df.workdir / ("stop-%s-%d" % (name, df.runs))
        url = (df.haproxy.url if via == "haproxy" else df.smg.url) + "/generate"
        sample = ["--haproxy-socket", df.haproxy.sock] if via == "haproxy" else ["--smg-url", df.smg.url]
        self.p = subprocess.Popen(["ip", "netns", "exec", df.fleet.hub, sys.executable, str(LOADGEN), "--url", url,
                                   "--clients", str(clients), "--duration", str(duration), "--max-requests", "100000",
                                   "--tp", "2", "--timeout", "60", "--stop-file", str(self.stop_file),
                                   "--json", str(self.out)] + sample,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(1.5)  # requests in flight everywhere before the rollout starts

    def stop(self) -> t.Dict[str, t.Any]:
        self.stop_file.write_text("")
        out = self.p.communicate(timeout=90)[0]
        assert self.p.returncode == 0, out
        res = json.loads(self.out.read_text())
        res["line"] = out.strip().splitlines()[-1]
        print("load:", out.strip())
        return res


@pytest.fixture(scope="module")
def df(sandbox_fleet_module, tmp_path_factory) -> t.Iterator[DrainFleet]:
    why = _skip()
    if why:
        pytest.skip(why)
    fleet = sandbox_fleet_module(hosts=HOSTS, gpus=2)
    d = DrainFleet(fleet, tmp_path_factory.mktemp("drain"))
    d.reset()
    d.start_stale()
    try:
        d.haproxy.up()
        d.smg.up()
        d.all_in_rotation()
        yield d
    finally:
        d.haproxy.down()
        d.smg.down()
        d.reset()


def _pids(df: DrainFleet) -> t.Dict[str, t.Set[t.Tuple[int, int]]]:
    s = df.snapshot()
    return {h: {(p["pid"], p["start"]) for p in s.procs(h) if "demo_server" in " ".join(p["cmdline"])} for h in df.hosts}


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
    # A host of the batch already out (host1, MAINT by an operator) counts as out and is named; with 3 to keep of the 3
    # in rotation, no batch can pass, and the advice says so, not "smaller batches" (helper-36).
    _balancer.haproxy_cmd(df.haproxy.sock, "set server %s/host1 state maint" % _balancer.BACKEND)
    try:
        r = df.playbook("rollout", "--limit", "host1,host2", extra_vars={"gpufleet_server_force_restart": True,
                                                                         "gpufleet_rollout_serial": ["100%"],
                                                                         "gpufleet_rollout_min_in_service": 3})
        assert r.rc != 0
        said = " ".join(r.summary["host2"]["failure"].split())
        assert ("draining host2 would leave 2 of 4 server(s) in rotation (host1 already out), fewer than 3; nothing was "
                "touched: no batch can pass") in said, said
        assert _pids(df) == before
    finally:
        df.put_back("host1")
    df.all_in_rotation(timeout=30)
    # The clean playbook (a stop drains first) has the same guard.
    c = df.playbook("clean", extra_vars={"gpufleet_rollout_serial": ["50%"], "gpufleet_rollout_min_in_service": "75%"})
    assert c.rc != 0
    assert ("gpufleet_rollout_min_in_service: draining host1, host2 would leave 2 of 4 server(s) in rotation, "
            "fewer than 3; nothing was touched") in c.summary["host1"]["failure"], c.summary["host1"]
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


def test_the_audit_reports_a_drain_record_of_an_entry_the_host_no_longer_has(df):
    """An entry renamed or removed from gpufleet_server_balancers after a run took the host out of it: no rollout puts
    the host back there, and the record outlives it. The audit says so, with balancers or none (helper-36, low)."""
    rec = {"drains": {"old-lb": {"found": "UP", "server": "host4", "run": "ctl:9:old", "at": "2026-11-30T22:00:00+0000"}}}
    df.fleet.ssh("host4", "umask 077 && mkdir -p %s && cat > %s" % (os.path.dirname(RECORD), RECORD),
                 input=json.dumps(rec), check=True)
    try:
        line = ("drain record: gpufleet took server host4 out of balancer entry old-lb (run ctl:9:old at "
                "2026-11-30T22:00:00+0000), and the host no longer has that entry in gpufleet_server_balancers")
        for balancers in (df.balancers(), []):
            a = df.playbook("audit", "--limit", "host4", check=True,
                            vars_override=dict(df.server_vars(), gpufleet_server_balancers=balancers))
            assert a.rc != 0, a.tail()
            assert line in " ".join(a.out.split()), a.tail()
        assert df.drain_record("host4")[1] == rec["drains"]  # read-only
        # The rollout says it too (a warning), on its fast path and on a forced restart, and leaves the record; also
        # with no balancer left in the inventory (it read no record then, and said nothing).
        for extra, balancers in (({}, df.balancers()), ({"gpufleet_server_force_restart": True}, df.balancers()),
                                 ({}, []), ({"gpufleet_server_force_restart": True}, [])):
            r = df.playbook("rollout", "--limit", "host4", extra_vars=extra,
                            vars_override=dict(df.server_vars(), gpufleet_server_balancers=balancers))
            assert r.rc == 0, r.tail()
            assert line in " ".join(r.out.split()), (extra, balancers, r.tail())
        assert df.drain_record("host4")[1] == rec["drains"]
        # A record the rollout would refuse to read (it halts on it) is drift too (helper-37, M2).
        for bad in ("{not json", json.dumps({"drains": {"gone": "junk"}})):
            df.fleet.ssh("host4", "cat > %s" % RECORD, input=bad, check=True)
            for balancers in (df.balancers(), []):
                a = df.playbook("audit", "--limit", "host4", check=True,
                                vars_override=dict(df.server_vars(), gpufleet_server_balancers=balancers))
                assert a.rc != 0, a.tail()
                said = "halts on it" if balancers else "warns of it (no balancer of the host reads it)"
                assert "drain record unreadable, the next rollout %s" % said in " ".join(a.out.split()), a.tail()
            # Without balancers the rollout does warn of it, and goes on.
            r = df.playbook("rollout", "--limit", "host4",
                            vars_override=dict(df.server_vars(), gpufleet_server_balancers=[]))
            assert r.rc == 0, r.tail()
            assert "the host has no balancer in gpufleet_server_balancers, so no rollout reads it" in " ".join(
                r.out.split()), r.tail()
    finally:
        df.fleet.ssh("host4", "rm -f %s" % RECORD, check=True)
    a = df.playbook("audit", "--limit", "host4", check=True)
    assert a.rc == 0, a.tail()


def test_a_drain_record_of_another_server_is_not_this_hosts_drain(df):
    """helper-38: host4's record names host3 under host4's entry (made from an entry copied from host3's variables), and
    host4 is in an operator's MAINT. It was taken for host4's drain: the rollout put host4 back, undoing the MAINT, and
    the audit said 'by gpufleet'. Now the audit names the record, and the rollout refuses with nothing touched."""
    rec = {"drains": {"haproxy": {"found": "UP", "server": "host3", "run": "ctl:9:copied", "at": "2026-12-05T19:00:00+0000"}}}
    first = df.playbook("rollout", "--limit", "host4")  # up to date: the next rollout's only work is the put-back
    assert first.rc == 0, first.tail()
    _balancer.haproxy_cmd(df.haproxy.sock, "set server %s/host4 state maint" % _balancer.BACKEND)
    df.fleet.ssh("host4", "umask 077 && mkdir -p %s && cat > %s" % (os.path.dirname(RECORD), RECORD),
                 input=json.dumps(rec), check=True)
    try:
        a = df.playbook("audit", "--limit", "host4", check=True)
        out = " ".join(a.out.split())
        assert a.rc != 0 and "the drain record of entry haproxy names server host3, not this host's host4" in out, a.tail()
        assert "not by gpufleet (no drain record of it)" in out, a.tail()
        # --check says what the run does (helper-39: it predicted a put-back the run refused).
        for check in (True, False):
            r = df.playbook("rollout", "--limit", "host4", check=check)
            assert r.rc != 0, r.tail()
            out = " ".join(r.out.split())
            assert "names server host3, not this host's host4" in out and "nothing was touched" in out, r.tail()
            assert "taken out again" not in out and r.summary["host4"]["out_of_rotation"] == [], r.tail()
        assert df.haproxy_states()["host4"] == "MAINT" and df.haproxy_states()["host3"] == "UP"
        assert df.drain_record("host4")[1] == rec["drains"]
        # A forced restart leaves the operator's MAINT as found, and keeps the record (the review of 8cb3ef1: its clear
        # removed it, the only trace that gpufleet took host3 out).
        r = df.playbook("rollout", "--limit", "host4", extra_vars={"gpufleet_server_force_restart": True})
        assert r.rc == 0, r.tail()
        assert r.summary["host4"]["restarted"], r.summary["host4"]
        assert df.haproxy_states()["host4"] == "MAINT" and df.drain_record("host4")[1] == rec["drains"]
        # In rotation, the same record: a forced restart's drain would overwrite it with host4's and then clear it
        # (helper-39, gone without a word). It refuses with nothing touched, as the put-back does.
        _balancer.haproxy_cmd(df.haproxy.sock, "set server %s/host4 state ready" % _balancer.BACKEND)
        before = _pids(df)
        r = df.playbook("rollout", "--limit", "host4", extra_vars={"gpufleet_server_force_restart": True})
        assert r.rc != 0, r.tail()
        assert "names server host3, not this host's host4" in " ".join(r.out.split()), r.tail()
        assert r.summary["host4"]["out_of_rotation"] == [], r.summary["host4"]
        assert df.haproxy_states()["host4"] == "UP" and df.drain_record("host4")[1] == rec["drains"]
        assert _pids(df)["host4"] == before["host4"]
    finally:
        df.fleet.ssh("host4", "rm -f %s" % RECORD, check=True)
        _balancer.haproxy_cmd(df.haproxy.sock, "set server %s/host4 state ready" % _balancer.BACKEND)
    df.all_in_rotation(timeout=30)


def test_clean_drains_the_host_stops_it_and_the_next_rollout_puts_it_back(df):
    """The clean playbook behind balancers: out of both (its drain record kept), the server stopped, GPUs clean; the next
    rollout relaunches it and puts it back into both. It used to fail after taking the host out of HAProxy, its server
    still running ('gpufleet_server_rotation' is undefined: helper-36)."""
    r = df.playbook("clean", "--limit", "host1")
    assert r.rc == 0, r.tail()
    h = r.summary["host1"]
    assert h["status"] == "ok" and h["out_of_rotation"] == ["haproxy", "sglang_router"], h
    # On purpose, not a failure (helper-39: it read "once the cause is fixed").
    assert "left out of rotation, as this playbook does: host1 (haproxy, sglang_router); the next rollout puts it back" \
        in " ".join(r.out.split()), r.tail()
    assert df.haproxy_states()["host1"] == "MAINT" and df.worker_url("host1") not in df.smg_workers()
    assert not _pids(df)["host1"]  # stopped
    rec = df.drain_record("host1")
    assert rec is not None and sorted(rec[1]) == ["haproxy", "sglang_router"], rec
    r = df.playbook("rollout", "--limit", "host1")
    assert r.rc == 0, r.tail()
    assert r.summary["host1"]["restarted"], r.summary["host1"]
    df.all_in_rotation(timeout=30)
    assert df.drain_record("host1") is None


def test_a_host_an_interrupted_run_left_drained_is_put_back_without_a_restart(df):
    """What a rollout SIGKILLed after its drain leaves once the restart finished on the host: the server up to date, the
    host in MAINT and out of the router, gpufleet's drain record. The next rollout (fast path included) puts it back
    into both balancers without restarting it and says so; the record is cleared."""
    before = _pids(df)
    _balancer.haproxy_cmd(df.haproxy.sock, "set server %s/host3 state maint" % _balancer.BACKEND)
    wid = [w["id"] for w in json.loads(df.fleet.hub_run(["curl", "-sf", df.smg.url + "/workers"], check=True).stdout)["workers"]
           if w["url"] == df.worker_url("host3")][0]
    df.fleet.hub_run(["curl", "-sf", "-XDELETE", "%s/workers/%s" % (df.smg.url, wid)], check=True)
    rec = {"drains": {"haproxy": {"found": "UP", "server": "host3", "run": "ctl:1:killed", "at": "2026-11-30T22:00:00+0000"},
                      "sglang_router": {"found": "listed", "server": df.worker_url("host3"), "run": "ctl:1:killed",
                                        "at": "2026-11-30T22:00:00+0000"}}}
    df.fleet.ssh("host3", "umask 077 && mkdir -p %s && cat > %s" % (os.path.dirname(RECORD), RECORD),
                 input=json.dumps(rec), check=True)
    a = df.playbook("audit", "--limit", "host3", check=True)
    assert "by gpufleet (run ctl:1:killed at 2026-11-30T22:00:00+0000 did not put it back: a failed or interrupted run, " \
        "or the clean playbook; the next rollout puts it back)" in " ".join(a.out.split()), a.tail()
    # With every server asked to stay in rotation (3 of 4 are now): putting host3 back only raises the capacity, so
    # the guard lets it through.
    r = df.playbook("rollout", "--limit", "host3", extra_vars={"gpufleet_rollout_min_in_service": 4})
    assert r.rc == 0, r.tail()
    h = r.summary["host3"]
    assert h["status"] == "ok" and not h["restarted"] and h["out_of_rotation"] == [], h
    assert h["returned_to_service"] == ["haproxy", "sglang_router"], h
    assert "put back into rotation, left out by an earlier run (drain record): host3 (haproxy, sglang_router)" in r.out
    assert _pids(df)["host3"] == before["host3"]  # no restart
    _wait_in_rotation(df, "host3", timeout=5)
    assert df.drain_record("host3") is None
    # A record the role cannot read is reported; the host never passes as up to date over it.
    df.fleet.ssh("host3", "cat > %s" % RECORD, input="[]", check=True)
    try:
        r = df.playbook("rollout", "--limit", "host3")
        assert r.rc != 0 and "is not a gpufleet drain record" in r.summary["host3"]["failure"], r.tail()
        assert _pids(df)["host3"] == before["host3"]
    finally:
        df.fleet.ssh("host3", "rm -f %s" % RECORD, check=True)


def test_servers_taken_out_by_hand_are_left_as_found(df):
    """host3 in MAINT and host4 in DRAIN, set by hand in HAProxy: both restarted (and back in the router), host3 stays
    MAINT, host4 goes back to DRAIN, and the summary and the audit say it was not gpufleet."""
    def cmd(c):
        return _balancer.haproxy_cmd(df.haproxy.sock, c)
    cmd("set server %s/host3 state maint" % _balancer.BACKEND)
    cmd("set server %s/host4 state drain" % _balancer.BACKEND)
    try:
        r = df.playbook("rollout", "--limit", "host3,host4", extra_vars={"gpufleet_server_force_restart": True})
        assert r.rc == 0, r.tail()
        assert r.summary["host3"]["restarted"] and r.summary["host4"]["restarted"]
        assert r.summary["host3"]["left_as_found"] == {"haproxy": "MAINT"}, r.summary["host3"]
        assert r.summary["host4"]["left_as_found"] == {"haproxy": "DRAIN"}, r.summary["host4"]
        assert r.summary["host3"]["out_of_rotation"] == [] and r.summary["host4"]["out_of_rotation"] == []
        summary = json.loads((df.last_summary / "rollout-summary.json").read_text())
        assert summary["left_as_found"] == {"host3": {"haproxy": "MAINT"}, "host4": {"haproxy": "DRAIN"}}, summary
        assert "left as found, taken out by someone else, not by gpufleet: host3 (haproxy MAINT); host4 (haproxy DRAIN)" \
            in r.out, r.tail()
        states = df.haproxy_states()
        assert states["host3"] == "MAINT" and states["host4"].startswith("DRAIN"), states
        assert df.smg_workers().get(df.worker_url("host3")) is not None
        assert df.drain_record("host3") is None and df.drain_record("host4") is None
        a = df.playbook("audit", "--limit", "host3", check=True)
        assert a.rc != 0
        assert "out of rotation on haproxy (MAINT in backend gpufleet), not by gpufleet" in " ".join(a.out.split()), a.tail()
    finally:
        df.put_back("host3")
        df.put_back("host4")
    _wait_in_rotation(df, "host3")
    _wait_in_rotation(df, "host4")


def test_an_entry_without_backend_restores_each_backend_as_found(df):
    """One HAProxy, two backends listing host1, an operator's MAINT in the second, an entry without `backend`: host1 is
    drained from both and goes back to UP in the first only; the second stays MAINT, as found, and the summary says so."""
    def cmd(c):
        return _balancer.haproxy_cmd(df.haproxy.sock, c)
    cmd("set server %s/host1 state maint" % _balancer.BACKEND2)
    try:
        hp = {"type": "haproxy", "delegate_to": "localhost", "socket": df.haproxy.sock}
        r = df.playbook("rollout", "--limit", "host1", extra_vars={"gpufleet_server_force_restart": True},
                        vars_override=dict(df.server_vars(), gpufleet_server_balancers=[hp]))
        assert r.rc == 0, r.tail()
        h = r.summary["host1"]
        assert h["restarted"] and h["out_of_rotation"] == [], h
        assert h["left_as_found"] == {"haproxy": "MAINT in backend %s" % _balancer.BACKEND2}, h
        assert _balancer.haproxy_servers(df.haproxy.sock, _balancer.BACKEND2)["host1"]["status"] == "MAINT"
        assert df.haproxy_states()["host1"] == "UP"
        assert df.drain_record("host1") is None
        # helper-39 (High): the same MAINT with gpufleet's own drain record (a run killed after its drain, the host put
        # back into the first backend by hand, as the runbook says). It is gpufleet's: the restart puts the host back
        # into both, clears the record and blames nobody (it was left MAINT, "not by gpufleet", the record cleared).
        rec = {"drains": {"haproxy": {"found": "UP", "server": "host1", "run": "ctl:1:killed",
                                      "at": "2026-12-05T22:00:00+0000"}}}
        df.fleet.ssh("host1", "umask 077 && mkdir -p %s && cat > %s" % (os.path.dirname(RECORD), RECORD),
                     input=json.dumps(rec), check=True)
        r = df.playbook("rollout", "--limit", "host1", extra_vars={"gpufleet_server_force_restart": True},
                        vars_override=dict(df.server_vars(), gpufleet_server_balancers=[hp]))
        assert r.rc == 0, r.tail()
        h = r.summary["host1"]
        assert h["restarted"] and h["out_of_rotation"] == [] and h["left_as_found"] == {}, h
        assert _balancer.haproxy_servers(df.haproxy.sock, _balancer.BACKEND2)["host1"]["status"].split()[0] == "UP"
        assert df.drain_record("host1") is None
    finally:
        df.fleet.ssh("host1", "rm -f %s" % RECORD, check=True)
        cmd("set server %s/host1 state ready" % _balancer.BACKEND2)
    _wait_in_rotation(df, "host1")


def test_haproxy_reload_keeps_maint_only_with_its_server_state_file(df):
    """The runbook's remedy, on the real HAProxy: dump `show servers state` to its server-state-file before the reload
    and MAINT survives it; without the dump the new process starts the server from its config."""
    _balancer.haproxy_cmd(df.haproxy.sock, "set server %s/host4 state maint" % _balancer.BACKEND)
    try:
        pid = df.haproxy.pid()
        df.haproxy.reload(save_state=True)
        assert df.haproxy.pid() != pid
        assert df.haproxy_states()["host4"] == "MAINT"
        df.haproxy.reload(save_state=False)
        assert df.haproxy_states()["host4"] != "MAINT"
    finally:
        df.put_back("host4")
    _wait_in_rotation(df, "host4")


def test_a_server_back_in_rotation_before_its_kill_fails_the_host(df):
    """HAProxy is reloaded without its state file while host4 drains (a request in flight there that runs until the test
    releases it, a drain timeout of 120 s): HAProxy forgot MAINT and routes to host4 again. The re-check between two
    slices of the in-flight wait fails the host while that request is still in flight; nothing is killed."""
    before = _pids(df)
    # The request ends only when released (after the run): the in-flight wait alone would have failed the host at the
    # drain timeout ("still in flight after 120s"), and the re-check before the kill never comes while it runs. So a
    # "back in rotation" failure with the request still running is the slices' doing, whatever the machine's load
    # (a request of a fixed 70 s ran out on a busy machine before the run reached its drain).
    release = "/tmp/gpufleet-release-slow-request"
    df.fleet.ssh("host4", "rm -f %s" % release, check=True)
    slow = subprocess.Popen(["ip", "netns", "exec", df.fleet.hub, "curl", "-s", "-m", "400", "-XPOST",
                             "http://%s:30000/generate" % df.fleet.addr("host4"), "-d",
                             json.dumps({"text": "slow", "until": release, "delay": 390})],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import threading
    run_over = threading.Event()
    reloaded = []  # type: t.List[bool]

    def reload_once_drained() -> None:
        # Once gpufleet has put host4 in MAINT, however long the run takes to get there; not at all if it never does.
        while df.haproxy_states().get("host4") != "MAINT":
            if run_over.is_set():
                return
            time.sleep(0.1)
        df.haproxy.reload(save_state=False)
        reloaded.append(True)

    th = threading.Thread(target=reload_once_drained)
    try:
        time.sleep(0.5)
        th.start()
        r = df.playbook("rollout", "--limit", "host4", extra_vars={"gpufleet_server_force_restart": True},
                        vars_override=dict(df.server_vars(), gpufleet_server_drain_timeout=120))
        in_flight_at_the_end = slow.poll() is None
        run_over.set()
        th.join(timeout=60)
        assert reloaded, "host4 never went to MAINT: %s" % r.tail()
        assert r.rc != 0
        h = r.summary["host4"]
        assert h["status"] == "failed" and "haproxy has the server back in rotation (UP) since gpufleet took it out" \
            in " ".join(h["failure"].split()) and "nothing was killed" in h["failure"], h
        assert "still in flight after" not in h["failure"], h  # not the drain timeout
        # Seen between two slices of the wait: the request was still in flight when the run ended.
        assert in_flight_at_the_end, (r.took, h)
        assert h["out_of_rotation"] == ["sglang_router"], h  # HAProxy routes to it again: not out there
        assert _pids(df)["host4"] == before["host4"]
        # HAProxy's entry is no longer gpufleet's drain: its record went, the router's (still out) stays.
        rec = df.drain_record("host4")
        assert rec is not None and sorted(rec[1]) == ["sglang_router"], rec
    finally:
        run_over.set()
        df.fleet.ssh("host4", "touch %s" % release)
        slow.wait(timeout=90)  # ends in host4's server before the next test drains it
    assert slow.returncode == 0
    df.fleet.ssh("host4", "rm -f %s" % release)
    # An operator then takes host4 out of HAProxy by hand: the next run leaves it there (it used to take the record of
    # the failed drain for its own and put host4 back, helper-35), and puts it back into the router only.
    _balancer.haproxy_cmd(df.haproxy.sock, "set server %s/host4 state maint" % _balancer.BACKEND)
    r = df.playbook("rollout", "--limit", "host4")
    assert r.rc == 0, r.tail()
    assert df.haproxy_states()["host4"] == "MAINT"
    assert df.smg_workers().get(df.worker_url("host4")), df.smg_workers()
    assert df.drain_record("host4") is None
    df.put_back("host4")
    _wait_in_rotation(df, "host4")


def test_a_failed_server_kept_for_debugging_holds_the_next_drain_until_proceed(df):
    """docs/runbook.md's advice for `killed, failed new server kept` behind balancers with drain metrics: the kept
    server's own readiness requests never finish, so the next rollout's drain times out and fails the host with
    nothing killed; the same rollout with gpufleet_server_drain_on_timeout=proceed kills it and serves again."""
    v = df.server_vars()
    hang = dict(v, gpufleet_server_command=list(v["gpufleet_server_command"]) + ["--hang-after-health"],
                gpufleet_server_keep_failed=True, gpufleet_server_rollback=False, gpufleet_server_start_timeout=15,
                gpufleet_server_health_request=dict(v["gpufleet_server_health_request"], timeout=1))
    r = df.playbook("rollout", "--limit", "host3", extra_vars={"gpufleet_server_force_restart": True},
                    vars_override=hang)
    assert r.rc != 0
    h = r.summary["host3"]
    assert h["status"] == "failed" and h["restart"] == "killed, failed new server kept", h
    assert "The failed new server was kept for debugging (keep_failed)" in h["failure"], h["failure"]
    assert h["out_of_rotation"] == ["haproxy", "sglang_router"], h
    kept = _pids(df)["host3"]
    assert kept, "the failed new server was not kept"
    assert df.haproxy_states()["host3"] == "MAINT" and df.worker_url("host3") not in df.smg_workers()

    # The runbook's next step without its advice: the drain waits for the kept server's hung requests.
    r = df.playbook("rollout", "--limit", "host3", vars_override=dict(v, gpufleet_server_drain_timeout=2))
    assert r.rc != 0
    h = r.summary["host3"]
    assert h["status"] == "failed" and "still in flight after 2s" in h["failure"], h
    assert _pids(df)["host3"] == kept  # nothing killed

    # With it: the drain says so and goes on, the kill ends the kept server, the host serves again.
    r = df.playbook("rollout", "--limit", "host3", extra_vars={"gpufleet_server_drain_on_timeout": "proceed"},
                    vars_override=dict(v, gpufleet_server_drain_timeout=2))
    assert r.rc == 0, r.tail()
    assert "going on (gpufleet_server_drain_on_timeout: proceed)" in " ".join(r.out.split())
    h = r.summary["host3"]
    assert h["status"] == "ok" and h["restarted"] and h["out_of_rotation"] == [], h
    assert _pids(df)["host3"] and not _pids(df)["host3"] & kept
    _wait_in_rotation(df, "host3", timeout=30)


def test_never_draining_server_times_out_and_stays_out(df):
    """A request that never ends on host1 (sent to it directly): the drain times out, the host fails before its kill
    and stays out of rotation (gpufleet_server_drain_on_timeout: fail, the default). Last: the server goes on counting
    that request after its client is gone."""
    before = _pids(df)
    stuck = subprocess.Popen(["ip", "netns", "exec", df.fleet.hub, "curl", "-s", "-m", "120", "-XPOST",
                              "http://%s:30000/generate" % df.fleet.addr("host1"), "-d",
                              json.dumps({"text": "stuck", "delay": 110})],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        r = df.playbook("rollout", "--limit", "host1", extra_vars={"gpufleet_server_force_restart": True},
                        vars_override=dict(df.server_vars(), gpufleet_server_drain_timeout=2))
        assert r.rc != 0
        h = r.summary["host1"]
        assert h["status"] == "failed" and "still in flight after 2s" in h["failure"], h
        assert h["out_of_rotation"] == ["haproxy", "sglang_router"], h
        assert "left out of rotation: host1 (haproxy, sglang_router)" in r.out
        assert _pids(df)["host1"] == before["host1"]  # nothing killed
        assert df.haproxy_states()["host1"] == "MAINT"
        assert df.worker_url("host1") not in df.smg_workers()
    finally:
        stuck.kill()
        stuck.wait()
    df.put_back("host1")
    deadline = time.monotonic() + 30
    while df.haproxy_states()["host1"] != "UP" or not df.smg_workers().get(df.worker_url("host1")):
        assert time.monotonic() < deadline, (df.haproxy_states(), df.smg_workers())
        time.sleep(0.2)


def test_drain_on_timeout_proceed_says_so_and_restarts_the_host(df):
    """The same never-ending request with gpufleet_server_drain_on_timeout: proceed: the drain times out, the run says
    so and goes on (the request is cut by the kill), the host is restarted, verified and back in every balancer."""
    before = _pids(df)
    stuck = subprocess.Popen(["ip", "netns", "exec", df.fleet.hub, "curl", "-s", "-m", "120", "-XPOST",
                              "http://%s:30000/generate" % df.fleet.addr("host1"), "-d",
                              json.dumps({"text": "stuck", "delay": 110})],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        r = df.playbook("rollout", "--limit", "host1", extra_vars={"gpufleet_server_force_restart": True},
                        vars_override=dict(df.server_vars(), gpufleet_server_drain_timeout=2,
                                           gpufleet_server_drain_on_timeout="proceed"))
        assert r.rc == 0, r.tail()
        out = " ".join(r.out.split())
        assert "request(s) still in flight after 2s" in out and "going on (gpufleet_server_drain_on_timeout: proceed)" in out
        h = r.summary["host1"]
        assert h["status"] == "ok" and h["restarted"] and h["out_of_rotation"] == [], h
        assert _pids(df)["host1"] != before["host1"]
    finally:
        stuck.kill()
        stuck.wait()
    _wait_in_rotation(df, "host1", timeout=30)


def test_a_host_its_balancer_will_not_take_back_is_taken_out_again_and_reported_restarted(df):
    """The balancer refuses the add (HTTP 500) after a verified restart of host3: the host fails, is taken out again
    (never left in rotation unconfirmed), and the summary says its server was restarted. The entry has no delegate_to
    (default localhost), and gpufleet_rollout_min_in_service 3 with --limit host3 counts the other hosts of the group
    as serving."""
    rec = BalancerRecorder(add_status=500)
    try:
        http = {"type": "http", "name": "lb-api", "remove": {"url": rec.url, "method": "DELETE"},
                "add": {"url": rec.url, "method": "PUT", "body": "{}"}}
        r = df.playbook("rollout", "--limit", "host3",
                        extra_vars={"gpufleet_server_force_restart": True, "gpufleet_rollout_min_in_service": 3},
                        vars_override=dict(df.server_vars(), gpufleet_server_balancers=[http]))
    finally:
        rec.close()
    assert r.rc != 0
    h = r.summary["host3"]
    assert h["status"] == "failed" and "could not be put back into rotation after its verified restart" in h["failure"], h
    # The balancer call's own words, not the loop's "One or more items failed".
    assert ("lb-api: the add request PUT %s answered HTTP 500" % rec.url.replace("{{ inventory_hostname }}", "host3")
            in " ".join(h["failure"].split())), h
    assert h["restarted"] is True and h["killed"] > 0 and h["kill_s"] is not None, h
    assert h["out_of_rotation"] == ["lb-api"], h
    assert rec.calls == [("DELETE", "/members/host3"), ("PUT", "/members/host3"), ("DELETE", "/members/host3")]
    _wait_in_rotation(df, "host3")  # haproxy and smg were not in this run's list


class _BreakingRouter(BaseHTTPRequestHandler):
    """A router stand-in on the controller (the SGLang Model Gateway's worker API). With `breaks`, it refuses the add
    (HTTP 500) and from then on answers nothing but HTTP 500: a router that broke during the restart."""

    def log_message(self, *a):
        pass

    def _send(self, code: int, body: t.Any = None) -> None:
        data = json.dumps(body if body is not None else {}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.server.broken:
            return self._send(500)
        return self._send(200, {"workers": list(self.server.workers.values())})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.server.breaks:
            self.server.broken = True
            return self._send(500)
        self.server.workers["w9"] = {"id": "w9", "url": body.get("url"), "is_healthy": True}
        return self._send(202, {"id": "w9"})

    def do_DELETE(self):
        if self.server.broken:
            return self._send(500)
        self.server.workers.pop(self.path.rsplit("/", 1)[-1], None)
        return self._send(200)


def _router(worker: str, breaks: bool) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _BreakingRouter)
    srv.daemon_threads = True
    srv.workers, srv.breaks, srv.broken = {"w1": {"id": "w1", "url": worker, "is_healthy": True}}, breaks, False
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_a_put_back_that_fails_on_one_balancer_takes_the_host_out_of_the_others_again(df):
    """helper-41: HAProxy took host3 back, then the router refused the add and stopped answering. The take-out again
    was one call for both entries (one delegate_to, localhost), refused whole at the router's read: HAProxy kept host3
    UP while the summary said it was out. Each entry is now taken out again on its own; the next run puts host3 back.
    (The stand-in lists host3 only: no capacity guard, gpufleet_rollout_min_in_service 0.)"""
    bad = _router(df.worker_url("host3"), breaks=True)
    entries = [df.balancers()[0],
               {"type": "sglang_router", "name": "router", "delegate_to": "localhost",
                "url": "http://127.0.0.1:%d" % bad.server_address[1]}]
    try:
        r = df.playbook("rollout", "--limit", "host3",
                        extra_vars={"gpufleet_server_force_restart": True, "gpufleet_rollout_min_in_service": 0},
                        vars_override=dict(df.server_vars(), gpufleet_server_balancers=entries))
    finally:
        bad.shutdown()
        bad.server_close()
    assert r.rc != 0
    h = r.summary["host3"]
    assert h["status"] == "failed" and "could not be put back into rotation after its verified restart" in h["failure"], h
    assert "(taken out again)" in " ".join(h["failure"].split()), h
    assert df.haproxy_states()["host3"] == "MAINT", df.haproxy_states()
    assert h["out_of_rotation"] == ["haproxy", "router"], h
    # (An earlier test of this module may have left a record of its own entry: only these two are this test's.)
    assert {"haproxy", "router"} <= set(df.drain_record("host3")[1])
    # The router works again (it never listed host3's worker since): the next run puts host3 back into both.
    good = _router(df.worker_url("host3"), breaks=False)
    good.workers = {}
    entries[1]["url"] = "http://127.0.0.1:%d" % good.server_address[1]
    try:
        b = df.playbook("rollout", "--limit", "host3", extra_vars={"gpufleet_rollout_min_in_service": 0},
                        vars_override=dict(df.server_vars(), gpufleet_server_balancers=entries))
    finally:
        good.shutdown()
        good.server_close()
    assert b.rc == 0 and b.summary["host3"]["out_of_rotation"] == [], b.tail()
    assert [w["url"] for w in good.workers.values()] == [df.worker_url("host3")]
    _wait_in_rotation(df, "host3")
    left = df.drain_record("host3")
    assert left is None or not {"haproxy", "router"} & set(left[1]), left


def test_a_wrong_metrics_url_fails_the_host_before_its_kill(df):
    """The metrics URL refuses the connection while the server answers on its health URL: not a stopped server with
    nothing in flight, a wrong URL. The host fails before its kill (same processes) and stays out."""
    before = _pids(df)
    r = df.playbook("rollout", "--limit", "host4", extra_vars={"gpufleet_server_force_restart": True},
                    vars_override=dict(df.server_vars(), gpufleet_server_drain_metrics_url="http://127.0.0.1:30999/metrics"))
    assert r.rc != 0
    h = r.summary["host4"]
    assert h["status"] == "failed" and "the metrics URL is wrong" in h["failure"], h
    assert _pids(df)["host4"] == before["host4"]
    assert h["out_of_rotation"] == ["haproxy", "sglang_router"], h
    df.put_back("host4")
    _wait_in_rotation(df, "host4")


def _wait_in_rotation(df: DrainFleet, host: str, timeout: float = 20) -> None:
    """`host` UP in HAProxy and healthy in smg (an earlier test may have left another host out on purpose)."""
    deadline = time.monotonic() + timeout
    while not (df.haproxy_states().get(host) == "UP" and df.smg_workers().get(df.worker_url(host))):
        assert time.monotonic() < deadline, (df.haproxy_states(), df.smg_workers())
        time.sleep(0.2)


def test_a_canary_that_never_gets_ready_is_rolled_back_and_serves_again_under_load(df):
    """issue 26: with gpufleet_server_rollback as the role has it by default, host1's new definition dies at start-up; the restart goes back to
    host1's last known good (its forced restart just before), which goes back into both balancers; host1 fails, the
    rollout halts before the later batches, and the traffic through HAProxy never fails."""
    r = df.playbook("rollout", "--limit", "host1", extra_vars={"gpufleet_server_force_restart": True})
    assert r.rc == 0, r.tail()
    before = _pids(df)
    load = df.load("haproxy", "haproxy-rollback")
    bad = df.server_vars()["gpufleet_server_command"] + ["--fail-at-startup"]
    r = df.playbook("rollout", extra_vars={"gpufleet_rollout_serial": [1, "25%"]},
                    vars_override={"gpufleet_server_rollback": ROLE_DEFAULT}, host_vars={"host1": {"gpufleet_server_command": bad}})
    _wait_in_rotation(df, "host1")
    res = load.stop()
    assert r.rc != 0
    h = r.summary["host1"]
    assert h["status"] == "failed" and h["failure"].startswith("rolled back to the last known good "), h
    assert h["restart"].startswith("killed, rolled back to ") and h["workers_verified"] == 2, h
    assert h["out_of_rotation"] == [], h
    assert df.haproxy_states()["host1"] == "UP" and df.smg_workers().get(df.worker_url("host1")), df.haproxy_states()
    assert all(r.summary[x]["status"] == "not run" for x in ("host2", "host3", "host4")), r.summary
    after = _pids(df)
    assert after["host1"] != before["host1"] and all(after[x] == before[x] for x in ("host2", "host3", "host4"))
    assert df.drain_record("host1") is None
    assert res["failed"] == 0, res["failures"]
