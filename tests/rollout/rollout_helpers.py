# SPDX-License-Identifier: GPL-3.0-or-later
"""Helpers of the rollout tests: a sandbox fleet running the demo server, driven by the real playbooks.

    rf = RolloutFleet(fleet, workdir)        # fleet = sandbox_fleet_module(hosts=3, gpus=2)
    rf.reset()                               # no demo process, no gpufleet state, original sitecustomize
    rf.start_stale()                         # an untagged, untuned demo server on every host (by hand)
    run = rf.playbook("rollout", host_vars={"host2": {...}}, extra_vars={...})
    run.rc, run.recap["host1"]["changed"], run.summary["host1"]["restarted"]
    snap = rf.snapshot()                     # per host: processes (NCCL_/GPUFLEET_ env only), GPU holders, files

Everything on a host is read with one ssh call running PROBE in the host's python; processes are only
ever killed by pid, inside the sandbox hosts' own pid namespaces.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import typing as t
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from collection_copy import private_collections  # noqa: E402
from gpufleet_ci import sandbox  # noqa: E402
from helpers import HTTP_OK_SCRIPT, run_playbook  # noqa: E402

PCIE_ONLY = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
             "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}
TAG = ("GPUFLEET_SERVICE", "demo")
STATE_FILE = "/var/lib/gpufleet/demo.json"
PIDFILE = "/run/gpufleet/demo.pid"
LOCK_FILE = "/run/gpufleet/demo.lock"

# Runs on a host (stdin of its python3): processes other than sshd and this probe, with ONLY their NCCL_* and
# GPUFLEET_* variables; GPU holders through the host's NVML; the gpufleet files; the system sitecustomize.
PROBE = r'''
import hashlib, json, os, sys
me = os.getpid()
skip = {1, me}
p = me
while p > 1:
    try:
        p = int(open("/proc/%d/stat" % p).read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        break
    skip.add(p)
procs = []
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) in skip:
        continue
    pid = int(d)
    try:
        cmd = [c.decode("utf-8", "replace") for c in open("/proc/%d/cmdline" % pid, "rb").read().split(b"\0") if c]
        raw = open("/proc/%d/environ" % pid, "rb").read().split(b"\0")
        stat = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    except OSError:
        continue
    if not cmd or stat[0] == "Z" or cmd[0].startswith("sshd"):
        continue
    env = {}
    for kv in raw:
        k, _, v = kv.decode("utf-8", "replace").partition("=")
        if k.startswith(("NCCL_", "GPUFLEET_")):
            env[k] = v
    procs.append({"pid": pid, "ppid": int(stat[1]), "sid": int(stat[4]), "start": int(stat[19]), "cmdline": cmd,
                  "env": env})
gpus = {}
try:
    import pynvml
    pynvml.nvmlInit()
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        # v2: "used" without the driver's reserved memory, as gpu_wait reads it.
        gpus[str(i)] = {"used_mib": pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used // (1024 * 1024),
                        "holders": sorted(x.pid for x in pynvml.nvmlDeviceGetComputeRunningProcesses(h))}
    pynvml.nvmlShutdown()
except Exception as e:
    gpus = {"error": repr(e)}
def read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None
import sysconfig
site = None
for cand in (os.path.join(sysconfig.get_paths()["stdlib"], "sitecustomize.py"), "/etc/python3.%d/sitecustomize.py" % sys.version_info[1]):
    if os.path.exists(cand):
        site = os.path.realpath(cand)
        break
files = {k: read(v) for k, v in json.loads(sys.argv[1]).items()}
sc = read(site) if site else None
print(json.dumps({"procs": procs, "gpus": gpus, "files": files, "sitecustomize_path": site,
                  "sitecustomize_sha": hashlib.sha256(sc.encode()).hexdigest() if sc is not None else None,
                  "sitecustomize_has_nccl": bool(sc and "NCCL_PROTO" in sc)}))
'''

FILES = {"state": STATE_FILE, "pidfile": PIDFILE, "lock": LOCK_FILE}

# Kill every process of the host except sshd and this shell, by pid, SIGKILL; remove gpufleet's files.
RESET = r'''
me=$$
for d in /proc/[0-9]*; do
  pid=${d#/proc/}
  [ "$pid" = 1 ] && continue
  [ "$pid" = "$me" ] && continue
  [ "$pid" = "$PPID" ] && continue
  cmd=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null) || continue
  case "$cmd" in ""|sshd*) continue;; esac
  kill -9 "$pid" 2>/dev/null
done
rm -rf /var/lib/gpufleet /run/gpufleet /var/log/gpufleet /var/lib/demo /var/lib/demo-stale /var/log/demo-stale.log
'''

# A vars_override value that drops the variable from the inventory: the role's default applies (e.g. for
# gpufleet_server_rollback, which tests/conftest.py turns off in the suite's sandbox server definitions).
ROLE_DEFAULT = object()


class Snapshot(dict):
    """host -> probe result, with helpers."""

    def procs(self, host: str) -> t.List[t.Dict[str, t.Any]]:
        return self[host]["procs"]

    def pids(self, host: str) -> t.Set[int]:
        return {p["pid"] for p in self.procs(host)}

    def tagged(self, host: str) -> t.List[t.Dict[str, t.Any]]:
        return [p for p in self.procs(host) if p["env"].get(TAG[0]) == TAG[1]]

    def holders(self, host: str) -> t.Set[int]:
        g = self[host]["gpus"]
        assert "error" not in g, "NVML on %s: %s" % (host, g)
        return {pid for v in g.values() for pid in v["holders"]}

    def holders_per_gpu(self, host: str) -> t.Dict[str, t.List[int]]:
        return {k: v["holders"] for k, v in self[host]["gpus"].items()}

    def launcher(self, host: str) -> t.Optional[int]:
        pf = self[host]["files"]["pidfile"]
        return int(pf.split()[0]) if pf else None

    def state(self, host: str) -> t.Optional[t.Dict[str, t.Any]]:
        s = self[host]["files"]["state"]
        return json.loads(s) if s else None

    def identities(self, host: str) -> t.Set[t.Tuple[int, int]]:
        """(pid, start time) of every process: a process restarted under a reused pid still differs."""
        return {(p["pid"], p["start"]) for p in self.procs(host)}


class Run:
    def __init__(self, cp: subprocess.CompletedProcess, summary_dir: Path, took: float) -> None:
        self.rc = cp.returncode
        self.out = cp.stdout
        self.took = took
        self.recap = parse_recap(cp.stdout)
        p = summary_dir / "rollout-summary.json"
        self.summary = {h["host"]: h for h in json.loads(p.read_text())["hosts"]} if p.exists() else {}

    def __repr__(self) -> str:
        return "Run(rc=%s, %.1fs)" % (self.rc, self.took)

    def tail(self, n: int = 6000) -> str:
        return self.out[-n:]


def tasks_run(out: str, host: str) -> t.List[str]:
    """Names of the tasks (TASK [...] headers of the default callback) that ran on `host` (ok, changed or failed)."""
    names, task = [], None
    for line in out.splitlines():
        m = re.match(r"^TASK \[(.*)\] \**$", line)
        if m:
            task = m.group(1)
            continue
        m = re.match(r"^(ok|changed|fatal): \[([^\]]+)\]", line)
        if m and task is not None and m.group(2).split(" ")[0] == host and (not names or names[-1] != task):
            names.append(task)
    return names


def parse_recap(out: str) -> t.Dict[str, t.Dict[str, int]]:
    """PLAY RECAP lines -> {host: {ok, changed, unreachable, failed, skipped, rescued, ignored}}."""
    recap: t.Dict[str, t.Dict[str, int]] = {}
    part = out.rsplit("PLAY RECAP", 1)
    if len(part) != 2:
        return recap
    for line in part[1].splitlines():
        m = re.match(r"^(\S+)\s+:\s+(.*)$", line.strip())
        if not m:
            continue
        counts = dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2)))
        if "ok" in counts:
            recap[m.group(1)] = counts
    return recap


class RolloutFleet:
    def __init__(self, fleet: t.Any, workdir: Path) -> None:
        self.fleet = fleet
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.hosts = list(fleet.hosts)
        self.python = fleet.python
        self.runs = 0
        # What the last test left on the hosts (see conftest's rolled_out).
        self.state = "unknown"
        self._orig_site: t.Dict[str, t.Tuple[str, t.Optional[str]]] = {}
        for h in self.hosts:
            s = self.probe(h)
            path = s["sitecustomize_path"]
            content = self.fleet.ssh(h, "cat %s" % path, check=True).stdout if path else None
            self._orig_site[h] = (path, content)

    # -- host state --------------------------------------------------------------------------------
    def probe(self, host: str) -> t.Dict[str, t.Any]:
        cmd = "%s - %s" % (self.python, _shq(json.dumps(FILES)))
        p = self.fleet.ssh(host, cmd, input=PROBE, timeout=60)
        assert p.returncode == 0, "probe on %s failed: %s%s" % (host, p.stdout, p.stderr)
        return json.loads(p.stdout)

    def snapshot(self) -> Snapshot:
        with ThreadPoolExecutor(len(self.hosts)) as ex:
            return Snapshot(zip(self.hosts, ex.map(self.probe, self.hosts)))

    def reset(self) -> None:
        """No demo/holder process, no gpufleet state, the sitecustomize the host booted with."""
        def one(h: str) -> None:
            path, content = self._orig_site[h]
            if path and content is not None:
                self.fleet.ssh(h, RESET + "cat > %s\n" % _shq(path), input=content, check=True)
            else:
                self.fleet.ssh(h, RESET, check=True)

        with ThreadPoolExecutor(len(self.hosts)) as ex:
            list(ex.map(one, self.hosts))
        self.wait(lambda s: all(not s.procs(h) and not s.holders(h) for h in self.hosts), 15, "hosts reset")

    def original_sitecustomize(self, host: str) -> t.Tuple[str, t.Optional[str]]:
        """(path, content) of the system sitecustomize.py the host booted with (no NCCL block)."""
        return self._orig_site[host]

    def wait(self, cond: t.Callable[[Snapshot], bool], timeout: float, what: str) -> Snapshot:
        deadline = time.monotonic() + timeout
        while True:
            s = self.snapshot()
            if cond(s):
                return s
            if time.monotonic() > deadline:
                raise AssertionError("timed out after %ss waiting for %s; last: %s" % (timeout, what, json.dumps(s)[:3000]))
            time.sleep(0.3)

    def start_stale(self, hosts: t.Optional[t.Sequence[str]] = None) -> Snapshot:
        """An untagged, untuned demo server started by hand on each host, its spawn workers holding both GPUs."""
        hosts = list(hosts or self.hosts)
        with ThreadPoolExecutor(len(hosts)) as ex:
            list(ex.map(lambda h: self.fleet.ssh(h, sandbox.stale_server_cmd(self.python), check=True), hosts))
        return self.wait(lambda s: all(len(s[h]["gpus"]) == 2 and all(v["holders"] for v in s[h]["gpus"].values())
                                       for h in hosts), 30, "stale servers holding the GPUs")

    def start_holder(self, host: str, gpu: int = 0, mib: int = 1000) -> int:
        """An untagged process holding fake GPU memory (nothing of the service)."""
        self.fleet.ssh(host, "cd /; nohup setsid %s /opt/gpufleet-fake/fake_gpu.py hold --gpu %d --mib %d "
                             "--ready-file /tmp/holder.ready > /dev/null 2>&1 < /dev/null &"
                       % (self.python, gpu, mib), check=True)
        s = self.wait(lambda s: any("fake_gpu.py" in " ".join(p["cmdline"]) for p in s.procs(host))
                      and self.fleet.ssh(host, "test -e /tmp/holder.ready").returncode == 0, 15, "holder on " + host)
        return next(p["pid"] for p in s.procs(host) if "fake_gpu.py" in " ".join(p["cmdline"]))

    def kill(self, host: str, pids: t.Iterable[int], sig: str = "KILL") -> None:
        pids = [str(int(p)) for p in pids]
        if pids:
            self.fleet.ssh(host, "kill -%s %s" % (sig, " ".join(pids)))

    # -- playbooks ---------------------------------------------------------------------------------
    def inventory(self, vars_override: t.Optional[t.Mapping[str, t.Any]] = None,
                  host_vars: t.Optional[t.Mapping[str, t.Mapping[str, t.Any]]] = None) -> Path:
        """A directory inventory: the fleet's hosts + the gpufleet_servers group with the demo server."""
        self.runs += 1
        d = self.workdir / ("inv-%d" % self.runs)
        d.mkdir()
        shutil.copy(self.fleet.inventory, d / "fleet.yml")
        gv = dict(self.server_vars(), **dict(vars_override or {}))
        gv = {k: v for k, v in gv.items() if v is not ROLE_DEFAULT}
        (d / "servers.yml").write_text(sandbox.servers_inventory(self.hosts, gv, host_vars))
        return d

    def server_vars(self) -> t.Dict[str, t.Any]:
        v = sandbox.server_vars(self.python)
        # Quick on 2 cores: short grace/timeouts, a fast poll.
        v.update({"gpufleet_server_kill_grace": 2, "gpufleet_server_clean_timeout": 4,
                  "gpufleet_server_start_timeout": 30, "gpufleet_server_ready_interval": 0.1})
        return v

    def playbook(self, name: str, *args: str, vars_override: t.Optional[t.Mapping[str, t.Any]] = None,
                 host_vars: t.Optional[t.Mapping[str, t.Mapping[str, t.Any]]] = None,
                 extra_vars: t.Optional[t.Mapping[str, t.Any]] = None, check: bool = False,
                 timeout: float = 240, env: t.Optional[t.Mapping[str, str]] = None) -> Run:
        inv = self.inventory(vars_override, host_vars)
        # The run's reports, where the test's env says (GPUFLEET_SUMMARY_DIR) or a fresh directory.
        summary = Path((env or {}).get("GPUFLEET_SUMMARY_DIR") or self.workdir / ("summary-%d" % self.runs))
        # One batch unless a test asks for more: every batch costs a full pass of the play.
        extra_vars = dict({"gpufleet_rollout_serial": ["100%"]}, **dict(extra_vars or {}))
        # A private copy of the collection: other pytest sessions re-copy collections/ under our feet.
        env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(private_collections()),
                   **dict({"GPUFLEET_SUMMARY_DIR": str(summary)}, **dict(env or {})))
        t0 = time.monotonic()
        cp = run_playbook("gpufleet.serving." + name, *args, inventory=str(inv), env=env,
                          extra_vars=dict(extra_vars or {}), check=check, timeout=timeout)
        run = Run(cp, summary, time.monotonic() - t0)
        # Shown with -s or on failure: where the time of a test goes.
        print("ansible-playbook %s %s: rc=%s in %.1fs" % (name, " ".join(args), run.rc, run.took))
        return run

    def rolled_out(self) -> Snapshot:
        """Reset, start stale servers, roll out once: every host runs a tagged, tuned server."""
        if self.state != "stale":  # a test that only looked at the stale fleet left it as it was
            self.reset()
            self.start_stale()
        r = self.playbook("rollout")
        assert r.rc == 0, r.tail()
        self.state = "clean"
        return self.snapshot()


def _shq(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def workers(snap: Snapshot, host: str) -> t.List[t.Dict[str, t.Any]]:
    """Spawn workers of the tagged server: tagged processes started by multiprocessing's spawn."""
    return [p for p in snap.tagged(host) if "--multiprocessing-fork" in p["cmdline"]]


def nccl(env: t.Mapping[str, str]) -> t.Dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("NCCL_")}


# Another process on a server's port, answering 200 to every GET and POST: `python3 -c FOREIGN_LISTENER PORT [ADDRESS]`
# (default all addresses). Run by the system python, as another user can run it (nobody cannot reach the venv).
FOREIGN_LISTENER = HTTP_OK_SCRIPT + r"""
http.server.ThreadingHTTPServer((sys.argv[2] if len(sys.argv) > 2 else "0.0.0.0", int(sys.argv[1])), H).serve_forever()
"""


class BalancerRecorder:
    """An HTTP balancer API on the controller (127.0.0.1), for an `http` balancer entry without delegate_to: records
    each call (method, path); answers `add_status` to PUT, 204 to DELETE."""

    def __init__(self, add_status: int) -> None:
        calls = self.calls = []  # type: t.List[t.Tuple[str, str]]

        class H(BaseHTTPRequestHandler):
            def _any(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                calls.append((self.command, self.path))
                self.send_response(add_status if self.command == "PUT" else 204)
                self.send_header("Content-Length", "0")
                self.end_headers()
            do_PUT = do_DELETE = _any

            def log_message(self, *a: t.Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d/members/{{ inventory_hostname }}" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
