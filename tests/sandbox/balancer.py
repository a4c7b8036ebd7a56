#!/usr/bin/env python
# SPDX-License-Identifier: GPL-3.0-or-later
"""Sandbox load balancers in front of a sandbox fleet: real HAProxy and the real SGLang Model Gateway (`smg`). Test-only.

    balancer.py up --fleet-dir DIR --kind haproxy [--port 8080] [--server-port 30000]
    balancer.py up --fleet-dir DIR --kind smg [--port 8081]
    balancer.py status --fleet-dir DIR --kind haproxy      # JSON: each server's state (UP, DOWN, MAINT, DRAIN)
    balancer.py down --fleet-dir DIR [--kind haproxy|smg]
    balancer.py reload --fleet-dir DIR --kind haproxy [--no-save-state]   # a new HAProxy takes over (-sf)

Both run in the fleet's hub network namespace (the bridge every host is on, address 10.200.0.1), so they reach every
host's server and every host reaches them; nothing listens in this machine's own namespace. Files go to
DIR/balancers/<kind>/: the config, the pidfile, the log and, for HAProxy, the admin socket (`haproxy.sock`, level admin:
what gpufleet.serving.balancer talks to; a unix socket is a file, so the controller reaches it from any namespace).

HAProxy: backend `gpufleet` (and `gpufleet_b`, the same servers, used by no frontend: an entry without `backend` acts on
both), one server per host named like the host (`host1`, ...), `option httpchk GET /health`,
checks every 200 ms, 2 to rise, 2 to fall; `retries 2` with the default `retry-on conn-failure` and `option redispatch`:
a request whose connection could not be made goes to another server, one that reached a server never is (POST
/generate is not idempotent). Its config has `server-state-file` + `load-server-state-from-file global`: `reload` first
dumps `show servers state` to that file (what a reload must do to keep a server in MAINT, docs/runbook.md), unless
--no-save-state, then starts a new HAProxy that takes over from the old one (-sf).
smg: `smg launch --worker-urls http://<host>:30000 ... --policy round_robin` with a 1 s health check; GET /workers
lists the workers, POST /workers {"url"} adds one, DELETE /workers/<id> removes one.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import typing as t
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import fleet as _fleet  # noqa: E402

BACKEND = "gpufleet"
BACKEND2 = "gpufleet_b"
KINDS = ("haproxy", "smg")
DEFAULT_PORT = {"haproxy": 8080, "smg": 8081}

HAPROXY_CFG = """# Written by tests/sandbox/balancer.py (sandbox only).
global
    stats socket {sock} mode 600 level admin
    pidfile {pidfile}
    maxconn 2000
    # A reload keeps each server's admin state (MAINT, DRAIN) only from this file, dumped before the reload.
    server-state-file {state_file}

defaults
    mode http
    option httplog
    log stderr format raw local0 info
    timeout connect 1s
    timeout client 120s
    timeout server 120s
    timeout http-keep-alive 2s
    # Without it a health check must answer within `inter` (200 ms): on a busy machine the demo server's /health took
    # longer, HAProxy marked a serving host DOWN, and a rollout of one host at a time showed two out of service. A
    # check that reaches the server waits this long for its answer; a stopped server still fails at once (refused).
    timeout check 5s
    load-server-state-from-file global
    # Retry only what never reached a server (the default retry-on conn-failure): POST /generate is not idempotent.
    retries 2
    option redispatch 1

frontend gpufleet_in
    bind {addr}:{port}
    default_backend {backend}

backend {backend}
    balance roundrobin
    option httpchk GET /health
    http-check expect status 200
    default-server inter 200ms fastinter 100ms downinter 200ms rise 2 fall 2
{servers}

# A second pool listing the same servers (no frontend uses it): a balancer entry without `backend` acts on both.
backend {backend2}
    option httpchk GET /health
    default-server inter 1s rise 2 fall 2
{servers}
"""


class BalancerError(Exception):
    pass


def _haproxy_bin() -> str:
    for c in (shutil.which("haproxy"), "/usr/sbin/haproxy"):
        if c and os.access(c, os.X_OK):
            return c
    raise BalancerError("haproxy is not installed (apt package haproxy; ./scripts/setup installs it)")


def _smg_bin() -> str:
    for c in (str(Path(sys.executable).parent / "smg"), str(ROOT / ".venv" / "bin" / "smg"), shutil.which("smg") or ""):
        if c and os.access(c, os.X_OK):
            return c
    raise BalancerError("smg is not installed (pip package sglang-router; ./scripts/setup installs it into .venv)")


def haproxy_cmd(sock: str, cmd: str, timeout: float = 5) -> str:
    """One command on HAProxy's admin socket (test-side reads only; the role uses gpufleet.serving.balancer)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sock)
        s.sendall(cmd.encode() + b"\n")
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    finally:
        s.close()
    return out.decode()


def haproxy_servers(sock: str, backend: str = BACKEND) -> t.Dict[str, t.Dict[str, t.Any]]:
    """{server: {status, scur}} of the backend, from `show stat` (status UP, DOWN, MAINT, DRAIN, 'UP 1/2', ...)."""
    lines = haproxy_cmd(sock, "show stat").splitlines()
    head = lines[0].lstrip("# ").split(",")
    out = {}
    for line in lines[1:]:
        row = dict(zip(head, line.split(",")))
        if row.get("pxname") == backend and row.get("svname") not in ("FRONTEND", "BACKEND", None):
            out[row["svname"]] = {"status": row["status"], "scur": int(row["scur"] or 0)}
    return out


class Balancer:
    def __init__(self, fleet_dir: t.Union[str, Path], kind: str, port: t.Optional[int] = None) -> None:
        if kind not in KINDS:
            raise BalancerError("kind must be one of %s, got %r" % (", ".join(KINDS), kind))
        self.fleet = _fleet.Fleet(fleet_dir)
        self.kind = kind
        self.port = port or DEFAULT_PORT[kind]
        self.dir = self.fleet.dir / "balancers" / kind
        self.pidfile = self.dir / "pid"
        self.sock = str(self.dir / "haproxy.sock")
        self.log = self.dir / "log"
        self.state_file = self.dir / "servers.state"

    @property
    def addr(self) -> str:
        return _fleet.HUB_ADDR

    @property
    def url(self) -> str:
        return "http://%s:%d" % (self.addr, self.port)

    def _state(self) -> t.Dict[str, t.Any]:
        st = self.fleet.load()
        if not st:
            raise BalancerError("no sandbox fleet in %s (fleet.py up first)" % self.fleet.dir)
        return st

    def up(self, server_port: int = 30000, timeout: float = 20) -> "Balancer":
        st = self._state()
        self.down()
        self.dir.mkdir(parents=True, exist_ok=True)
        hosts = [(h["name"], h["addr"]) for h in st["host_info"]]
        if self.kind == "haproxy":
            cfg = self.dir / "haproxy.cfg"
            cfg.write_text(HAPROXY_CFG.format(
                sock=self.sock, pidfile=self.pidfile, state_file=self.state_file, addr=self.addr, port=self.port, backend=BACKEND,
                backend2=BACKEND2,
                servers="\n".join("    server %s %s:%d check" % (n, a, server_port) for n, a in hosts)))
            if self.state_file.exists():
                self.state_file.unlink()  # an earlier fleet's servers' states
            argv = [_haproxy_bin(), "-db", "-f", str(cfg)]
        else:
            argv = [_smg_bin(), "launch", "--host", self.addr, "--port", str(self.port), "--policy", "round_robin",
                    "--health-check-interval-secs", "1", "--health-failure-threshold", "2",
                    "--health-success-threshold", "1", "--log-level", "warn",
                    "--worker-urls"] + ["http://%s:%d" % (a, server_port) for _name, a in hosts]
        with open(self.log, "ab") as logf:
            p = subprocess.Popen(["ip", "netns", "exec", st["hub"]] + argv, stdin=subprocess.DEVNULL, stdout=logf,
                                 stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        self.pidfile.write_text("%d\n" % p.pid)
        deadline = time.monotonic() + timeout
        while not self._listening():
            if p.poll() is not None:
                raise BalancerError("%s exited with %s: %s" % (self.kind, p.returncode, self.log.read_text()[-1500:]))
            if time.monotonic() > deadline:
                self.down()
                raise BalancerError("%s did not listen on %s within %ss" % (self.kind, self.url, timeout))
            time.sleep(0.05)
        return self

    def reload(self, save_state: bool = True, timeout: float = 20) -> None:
        """HAProxy's reload: a new process on the same config takes over from the old one (-sf), as `systemctl reload
        haproxy` does. With save_state, `show servers state` goes to the server-state-file first; without, the new
        process starts every server from its config (MAINT forgotten)."""
        if self.kind != "haproxy":
            raise BalancerError("reload is for haproxy")
        st = self._state()
        old = self.pid()
        if save_state:
            self.state_file.write_text(haproxy_cmd(self.sock, "show servers state"))
        elif self.state_file.exists():
            self.state_file.unlink()
        argv = [_haproxy_bin(), "-db", "-f", str(self.dir / "haproxy.cfg")] + (["-sf", str(old)] if old else [])
        with open(self.log, "ab") as logf:
            p = subprocess.Popen(["ip", "netns", "exec", st["hub"]] + argv, stdin=subprocess.DEVNULL, stdout=logf,
                                 stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        self.pidfile.write_text("%d\n" % p.pid)
        deadline = time.monotonic() + timeout
        while True:  # the socket answers from the new process
            try:
                if "Pid: %d\n" % p.pid in haproxy_cmd(self.sock, "show info"):
                    break
            except OSError:
                pass
            if p.poll() is not None:
                raise BalancerError("haproxy reload exited with %s: %s" % (p.returncode, self.log.read_text()[-1500:]))
            if time.monotonic() > deadline:
                raise BalancerError("the reloaded haproxy did not answer on %s within %ss" % (self.sock, timeout))
            time.sleep(0.05)
        if old:  # the old process finishes its connections and exits: reap it (it is our child when we started it)
            deadline = time.monotonic() + 10
            while _alive(old) and time.monotonic() < deadline:
                try:
                    os.waitpid(old, os.WNOHANG)
                except ChildProcessError:
                    pass
                time.sleep(0.05)

    def _listening(self) -> bool:
        st = self._state()
        r = subprocess.run(["ip", "netns", "exec", st["hub"], "nc", "-z", "-w", "1", self.addr, str(self.port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        if r.returncode != 0:
            return False
        return self.kind != "haproxy" or os.path.exists(self.sock)

    def pid(self) -> t.Optional[int]:
        try:
            return int(self.pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def down(self) -> None:
        pid = self.pid()
        if pid:
            # `ip netns exec` execs the balancer: the pid is the balancer's own, and it leads its own session.
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(pid, sig)
                except ProcessLookupError:
                    break
                deadline = time.monotonic() + 5
                while _alive(pid) and time.monotonic() < deadline:
                    try:
                        os.waitpid(pid, os.WNOHANG)
                    except ChildProcessError:
                        pass
                    time.sleep(0.02)
                if not _alive(pid):
                    break
        for p in (self.pidfile, Path(self.sock)):
            if p.exists():
                p.unlink()

    def status(self) -> t.Dict[str, t.Any]:
        """HAProxy: {server: {status, scur}}; smg: {url: {healthy}} (read in the hub namespace)."""
        if self.kind == "haproxy":
            return haproxy_servers(self.sock)
        st = self._state()
        code = ("import json, urllib.request; w = json.load(urllib.request.urlopen(%r, timeout=5))['workers'];"
                "print(json.dumps({x['url']: {'healthy': x['is_healthy']} for x in w}))" % (self.url + "/workers"))
        r = subprocess.run(["ip", "netns", "exec", st["hub"], sys.executable, "-c", code], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, check=False, timeout=15)
        if r.returncode != 0:
            raise BalancerError("smg /workers: %s" % r.stderr.strip()[-500:])
        return json.loads(r.stdout)


def _alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def main(argv: t.Optional[t.Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("action", choices=["up", "down", "status", "reload"])
    ap.add_argument("--fleet-dir", required=True, help="the sandbox fleet's --state-dir")
    ap.add_argument("--kind", choices=KINDS)
    ap.add_argument("--port", type=int)
    ap.add_argument("--server-port", type=int, default=30000)
    ap.add_argument("--no-save-state", action="store_true", help="reload without dumping the servers' states")
    a = ap.parse_args(argv)
    try:
        kinds = [a.kind] if a.kind else (list(KINDS) if a.action == "down" else [])
        if not kinds:
            ap.error("--kind is required for %s" % a.action)
        for k in kinds:
            b = Balancer(a.fleet_dir, k, a.port)
            if a.action == "up":
                b.up(a.server_port)
                print(json.dumps({"kind": k, "url": b.url, "socket": b.sock if k == "haproxy" else None}))
            elif a.action == "down":
                b.down()
            elif a.action == "reload":
                b.reload(save_state=not a.no_save_state)
            else:
                print(json.dumps(b.status(), indent=1))
    except BalancerError as e:
        print("balancer: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
