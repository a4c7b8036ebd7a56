# SPDX-License-Identifier: GPL-3.0-or-later
"""The drain tests' fleet (tests/rollout/test_drain.py, test_drain_recovery.py): 4 sandbox hosts behind a real HAProxy
and a real SGLang Model Gateway (smg), both fronting every server, load through either, and the real rollout playbook.
Each test module that asks for the `df` fixture (conftest.py) gets a fleet and a pair of balancers of its own (module
scope), so the two modules run side by side under `--dist loadfile`."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import typing as t
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout_helpers import ROOT, RolloutFleet, Run, sandbox  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "sandbox"))
import balancer as _balancer  # noqa: E402

from collection_copy import private_collections  # noqa: E402
from helpers import run_playbook  # noqa: E402

LOADGEN = ROOT / "tests" / "sandbox" / "loadgen.py"
SMG_PORT = 8081
HOSTS = 4
RECORD = "/var/lib/gpufleet/demo.rotation.json"  # gpufleet's drains of the host (rotation_record)


def skip_reason() -> t.Optional[str]:
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


def pids(df: DrainFleet) -> t.Dict[str, t.Set[t.Tuple[int, int]]]:
    s = df.snapshot()
    return {h: {(p["pid"], p["start"]) for p in s.procs(h) if "demo_server" in " ".join(p["cmdline"])} for h in df.hosts}


def wait_in_rotation(df: DrainFleet, host: str, timeout: float = 20) -> None:
    """`host` UP in HAProxy and healthy in smg (an earlier test may have left another host out on purpose)."""
    deadline = time.monotonic() + timeout
    while not (df.haproxy_states().get(host) == "UP" and df.smg_workers().get(df.worker_url(host))):
        assert time.monotonic() < deadline, (df.haproxy_states(), df.smg_workers())
        time.sleep(0.2)
