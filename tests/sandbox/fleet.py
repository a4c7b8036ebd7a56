#!/usr/bin/env python
# SPDX-License-Identifier: GPL-3.0-or-later
"""Sandbox fleet: N ssh hosts on this machine, for multi-host tests, molecule and the demo. Test-only.

    fleet.py up --hosts 3 --state-dir DIR [--gpus 2] [--gpu-mib 143771] [--nvlink host2,host3]
    fleet.py down --state-dir DIR
    fleet.py status --state-dir DIR

Needs root, iproute2, util-linux unshare, openssh-server and netcat-openbsd. Each host is:
- its own network namespace, with a veth into a bridge in a per-fleet "hub" namespace; private 10.x
  addresses exist only inside those namespaces (the machine's own namespace gets none);
- `unshare --mount --uts --pid --fork --kill-child --mount-proc` running sshd (key auth, UsePAM no) as
  PID 1 of its own pid namespace, with copy-on-write overlayfs over /etc /var /usr /opt /root /home
  /srv (upper dirs under DIR/hosts/<host>/) and tmpfs /tmp /run /var/tmp /dev/shm, its own hostname,
  an empty resolv.conf and an /etc/hosts entry (without them fact gathering stalls on DNS), and a
  distribution-default root .bashrc/.profile (not this machine's);
- the test-only fake pynvml (tests/fakes/nvml) in /opt/gpufleet-fake with that host's GPUs, reachable
  by the host interpreter through a .pth file in its site-packages dir; the demo server in
  /opt/gpufleet-fake/demo_server.py.

The controller reaches hosts through `ip netns exec <hub> nc %h %p` (see DIR/inventory.yml; `DIR/proxy %h %p`
does the same for callers that know only the state dir, e.g. molecule.yml). Names
(namespaces) carry a short hash of the state dir, so fleets of different state dirs never collide.
`down` removes namespaces, processes, mounts (they die with the hosts' mount namespaces), ssh control
sockets and the hosts' upper dirs, also after a crashed `up`; logs stay in DIR/logs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import typing as t
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FAKE_NVML_DIR = ROOT / "tests" / "fakes" / "nvml"
DEMO_SERVER = HERE / "demo_server.py"

OVERLAY_DIRS = ("etc", "var", "usr", "opt", "root", "home", "srv")
TMPFS_DIRS = ("tmp", "run", "var/tmp", "dev/shm")
SUBNET = "10.200.0"
HUB_ADDR = SUBNET + ".1"
FIRST_HOST = 11
MAX_HOSTS = 200
FAKE_DIR = "/opt/gpufleet-fake"
FAKE_STATE = "/var/lib/gpufleet-fake/state"
SSH_DIR = "/etc/ssh/gpufleet"
STATE_FILE = "fleet.json"
# sockaddr_un.sun_path is 108 bytes (107 + NUL). While it sets up a master, ssh binds DIR/cp-<host> plus
# ".<16 random chars>" and then renames it, so that longer name is the one that must fit.
MAX_CONTROL_PATH = 107
SSH_TEMP_SUFFIX = 17
# sshd settings of every sandbox host (key-only root login, no PAM/DNS delays, many parallel sessions);
# fleet.py writes them into a whole sshd_config, podman_fleet.py into a drop-in of the image's.
SSHD_OPTIONS = [
    "HostKey %s/ssh_host_ed25519_key" % SSH_DIR,
    "AuthorizedKeysFile %s/authorized_keys" % SSH_DIR,
    "PermitRootLogin prohibit-password",
    "PasswordAuthentication no",
    "KbdInteractiveAuthentication no",
    "UsePAM no",
    "UseDNS no",
    "PrintMotd no",
    "PrintLastLog no",
    "StrictModes no",
    "MaxSessions 100",
    "MaxStartups 100:30:200",
]


def host_addr(i: int) -> str:
    """Address of the fleet's i-th host (0-based)."""
    return "%s.%d" % (SUBNET, FIRST_HOST + i)


class FleetError(Exception):
    pass


def log(msg: str) -> None:
    print("fleet: " + msg, file=sys.stderr, flush=True)


def run(argv: t.Sequence[str], input: t.Optional[str] = None, check: bool = True,
        timeout: float = 30) -> subprocess.CompletedProcess:
    p = subprocess.run(check=False, args=list(argv), input=input, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    if check and p.returncode != 0:
        raise FleetError("%s failed (rc=%d): %s" % (" ".join(argv[:4]), p.returncode, p.stderr.strip()))
    return p


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def prefix_for(state_dir: Path) -> str:
    return "gf" + hashlib.sha1(str(state_dir).encode()).hexdigest()[:8]


def host_python() -> str:
    """The interpreter hosts use: Debian's system python when present (realistic for sitecustomize work)."""
    for cand in ("/usr/bin/python3", shutil.which("python3") or ""):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise FleetError("no python3 interpreter found for the sandbox hosts")


def site_dir(python: str) -> str:
    out = run([python, "-c", "import site; print(site.getsitepackages()[0])"]).stdout.strip()
    if not any(out == "/" + d or out.startswith("/" + d + "/") for d in OVERLAY_DIRS):
        raise FleetError("site-packages dir %s of %s is not under an overlaid dir %s" % (out, python, OVERLAY_DIRS))
    return out


def preflight() -> None:
    if os.geteuid() != 0:
        raise FleetError("the sandbox fleet needs root (network namespaces, mounts)")
    missing = [c for c in ("ip", "unshare", "nc", "ssh", "ssh-keygen") if not shutil.which(c)]
    if not os.access("/usr/sbin/sshd", os.X_OK):
        missing.append("/usr/sbin/sshd")
    if missing:
        raise FleetError("missing commands for the sandbox fleet: %s (apt packages iproute2, util-linux, "
                         "openssh-server, netcat-openbsd)" % ", ".join(missing))


class Fleet:
    def __init__(self, state_dir: t.Union[str, Path]) -> None:
        self.dir = Path(os.path.realpath(str(state_dir)))
        self.prefix = prefix_for(self.dir)
        self.hub = self.prefix + "-hub"
        self.state_path = self.dir / STATE_FILE
        self.inventory = self.dir / "inventory.yml"
        self.key = self.dir / "id_ed25519"
        self.logs = self.dir / "logs"

    # -- names -------------------------------------------------------------------------------------
    def netns(self, host: str) -> str:
        return "%s-%s" % (self.prefix, host)

    def host_dir(self, host: str) -> Path:
        return self.dir / "hosts" / host

    def control_path(self) -> str:
        # %h (the host's address: one fleet, one user, one port) rather than %C (40 hex chars), so a state
        # dir under a long checkout path still fits sun_path.
        return str(self.dir / "cp-%h")

    def load(self) -> t.Optional[t.Dict[str, t.Any]]:
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return None

    # -- checks ------------------------------------------------------------------------------------
    def check_state_dir(self) -> None:
        s = str(self.dir)
        for d in OVERLAY_DIRS:
            if s == "/" + d or s.startswith("/" + d + "/"):
                raise FleetError("state dir %s must not be under /%s: the hosts overlay that dir, and overlayfs "
                                 "refuses an upper dir inside its lower dir" % (s, d))
        longest = len(self.control_path()) - 2 + len(host_addr(MAX_HOSTS - 1)) + SSH_TEMP_SUFFIX
        if longest > MAX_CONTROL_PATH:
            raise FleetError("state dir %s is too long for ssh control sockets: DIR/cp-<address>.<16 chars> takes "
                             "%d bytes, sun_path holds %d; use a state dir at most %d bytes long"
                             % (s, longest, MAX_CONTROL_PATH, len(s) - (longest - MAX_CONTROL_PATH)))

    def our_netns(self) -> t.List[str]:
        try:
            names = os.listdir("/run/netns")
        except OSError:
            return []
        return sorted(n for n in names if n.startswith(self.prefix + "-"))

    def host_alive(self, h: t.Dict[str, t.Any]) -> bool:
        pid = h.get("pid")
        if not pid or not _alive(pid, h.get("start")):
            return False
        return os.path.exists("/run/netns/" + self.netns(h["name"]))

    # -- up ----------------------------------------------------------------------------------------
    def up(self, hosts: int, gpus: int, gpu_mib: int, nvlink: t.Sequence[str], python: t.Optional[str],
           timeout: float = 20) -> t.Dict[str, t.Any]:
        preflight()
        self.check_state_dir()
        if not 1 <= hosts <= MAX_HOSTS:
            raise FleetError("--hosts must be between 1 and %d, got %d" % (MAX_HOSTS, hosts))
        names = ["host%d" % (i + 1) for i in range(hosts)]
        bad = [n for n in nvlink if n not in names]
        if bad:
            raise FleetError("--nvlink names unknown hosts %s (hosts are %s)" % (", ".join(bad), ", ".join(names)))
        python = python or host_python()
        wanted = {"hosts": names, "gpus": gpus, "gpu_mib": gpu_mib, "nvlink": sorted(nvlink), "python": python}

        old = self.load()
        if old is not None or self.our_netns():
            if old and {k: old.get(k) for k in wanted} == wanted and all(self.host_alive(h) for h in old["host_info"]):
                log("fleet in %s is already up with this config; reusing it" % self.dir)
                self.write_inventory(old)
                self._write_proxy()
                return old
            if old and all(self.host_alive(h) for h in old["host_info"]):
                raise FleetError("a fleet with another config is already up in %s; run `down --state-dir %s` first"
                                 % (self.dir, self.dir))
            log("cleaning up a stale or partial fleet in %s" % self.dir)
            self.down()

        t0 = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        sp = site_dir(python)
        # Also the `python3` on PATH (pyenv here), so ad-hoc `python3 -c 'import pynvml'` works on hosts too.
        sites = [sp]
        other = shutil.which("python3")
        if other and os.path.realpath(other) != os.path.realpath(python):
            try:
                sites.append(site_dir(other))
            except FleetError:
                pass
        sites = list(dict.fromkeys(sites))
        state: t.Dict[str, t.Any] = dict(wanted, prefix=self.prefix, hub=self.hub, hub_addr=HUB_ADDR,
                                         state_dir=str(self.dir), site_dirs=sites, host_info=[],
                                         key=str(self.key), inventory=str(self.inventory))
        # Written first so that `down` after a crash below finds everything.
        self._save(state)
        try:
            self._keys()
            self._network(names)
            for i, name in enumerate(names):
                addr = host_addr(i)
                self._prepare_host(name, addr, names, gpus, gpu_mib, name in nvlink, sites)
                state["host_info"].append({"name": name, "addr": addr, "netns": self.netns(name),
                                           "gpus": gpus, "nvlink": name in nvlink})
            # Host logs are appended to across boots: readiness is read from this boot's part only (an old
            # "Server listening" line of a crashed host's earlier boot must not pass for the new sshd).
            self._log_from = {h["name"]: _size(self.logs / ("%s.log" % h["name"])) for h in state["host_info"]}
            for h in state["host_info"]:
                pid = self._boot(h["name"])
                h["pid"], h["start"] = pid, _start_time(pid)
            self._save(state)
            self._wait_ready(state, timeout)
        except BaseException:
            log("up failed; tearing down what was created (logs in %s)" % self.logs)
            self.down()
            raise
        self.write_inventory(state)
        self._write_proxy()
        log("up: %d hosts in %.2fs; inventory %s" % (hosts, time.monotonic() - t0, self.inventory))
        return state

    def _save(self, state: t.Dict[str, t.Any]) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.rename(self.state_path)

    def _keys(self) -> None:
        if not self.key.exists():
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpufleet-sandbox", "-f", str(self.key)])

    def _network(self, names: t.Sequence[str]) -> None:
        batch = ["netns add " + self.hub] + ["netns add " + self.netns(n) for n in names]
        run(["ip", "-batch", "-"], input="\n".join(batch) + "\n")
        hub = ["link set lo up", "link add br0 type bridge", "addr add %s/24 dev br0" % HUB_ADDR, "link set br0 up"]
        for i, n in enumerate(names):
            hub += ["link add vh%d type veth peer name eth0 netns %s" % (i + 1, self.netns(n)),
                    "link set vh%d master br0 up" % (i + 1)]
        run(["ip", "-n", self.hub, "-batch", "-"], input="\n".join(hub) + "\n")
        for i, n in enumerate(names):
            cmds = ["link set lo up", "addr add %s/24 dev eth0" % host_addr(i), "link set eth0 up"]
            run(["ip", "-n", self.netns(n), "-batch", "-"], input="\n".join(cmds) + "\n")

    def _prepare_host(self, name: str, addr: str, names: t.Sequence[str], gpus: int, gpu_mib: int, nvlink: bool,
                      sites: t.Sequence[str]) -> None:
        hd = self.host_dir(name)
        if hd.exists():
            shutil.rmtree(hd)
        for d in OVERLAY_DIRS:
            up, wk = hd / "upper" / d, hd / "work" / d
            up.mkdir(parents=True)
            wk.mkdir(parents=True)
            _copy_mode("/" + d, up)
        upper = hd / "upper"

        def put(path: str, content: t.Union[str, bytes], mode: int = 0o644) -> None:
            dst = upper / path.lstrip("/")
            _mkdirs_like(upper, dst.parent)
            if isinstance(content, str):
                content = content.encode()
            dst.write_bytes(content)
            os.chmod(dst, mode)

        hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        hosts += "".join("%s\t%s\n" % (host_addr(i), n) for i, n in enumerate(names))
        hosts += "%s\tcontroller\n" % HUB_ADDR
        put("/etc/hosts", hosts)
        put("/etc/hostname", name + "\n")
        put("/etc/resolv.conf", "")  # no DNS inside: lookups fail fast instead of timing out
        # A fresh host's root shell files, not this machine's: sshd runs every command through root's bash, which
        # reads ~/.bashrc, and a developer's (pyenv init and the like) would add ~0.1 s to each round trip.
        for rc in (".bashrc", ".profile"):
            for src in ("/usr/share/base-files/dot" + rc, "/etc/skel/" + rc):
                if os.path.exists(src):
                    put("/root/" + rc, Path(src).read_bytes())
                    break
            else:
                put("/root/" + rc, "")
        hk = self.dir / ("hostkey-" + name)
        for p in (hk, Path(str(hk) + ".pub")):
            if p.exists():
                p.unlink()
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(hk)])
        put(SSH_DIR + "/ssh_host_ed25519_key", hk.read_bytes(), 0o600)
        put(SSH_DIR + "/ssh_host_ed25519_key.pub", Path(str(hk) + ".pub").read_bytes())
        hk.unlink()
        Path(str(hk) + ".pub").unlink()
        put(SSH_DIR + "/authorized_keys", Path(str(self.key) + ".pub").read_bytes(), 0o600)
        put(SSH_DIR + "/sshd_config", "\n".join(
            ["Port 22", "ListenAddress 0.0.0.0"] + SSHD_OPTIONS
            + ["PidFile /run/sshd.pid", "Subsystem sftp /usr/lib/openssh/sftp-server", ""]))
        # The test-only fake NVML, with this host's GPUs, reachable by the host interpreter without PYTHONPATH.
        for f in ("pynvml.py", "fake_gpu.py"):
            put(FAKE_DIR + "/" + f, (FAKE_NVML_DIR / f).read_bytes())
        if DEMO_SERVER.exists():
            put(FAKE_DIR + "/demo_server.py", DEMO_SERVER.read_bytes(), 0o755)
        cfg = {
            "gpus": [{"name": "NVIDIA H200", "memory_mib": gpu_mib, "reserved_mib": 615,
                      "nvlink_links": 18 if nvlink else 0,
                      "uuid": "GPU-%s-%04d-0000-0000-%012d" % (hashlib.sha1(name.encode()).hexdigest()[:8], i, i)}
                     for i in range(gpus)],
            "release_delay_s": 0.15,
            "state_dir": FAKE_STATE,
        }
        put(FAKE_DIR + "/fake_nvml.json", json.dumps(cfg, indent=1))
        _mkdirs_like(upper, upper / FAKE_STATE.lstrip("/"))
        os.chmod(upper / FAKE_STATE.lstrip("/"), 0o1777)
        # insert(0): the fake wins over a real nvidia-ml-py that might be installed in the system python.
        for sd in sites:
            put(sd + "/gpufleet-sandbox-fake-nvml.pth", "import sys; sys.path.insert(0, %r)\n" % FAKE_DIR)
        boot = ["set -e", "hostname %s" % shlex.quote(name)]
        for d in OVERLAY_DIRS:
            boot.append("mount -t overlay overlay -o lowerdir=/%s,upperdir=%s,workdir=%s /%s"
                        % (d, shlex.quote(str(upper / d)), shlex.quote(str(hd / "work" / d)), d))
        for d in TMPFS_DIRS:
            mode = "0755" if d == "run" else "1777"
            boot.append("mount -t tmpfs -o mode=%s,size=1g tmpfs /%s" % (mode, d))
        boot += ["mkdir -p /run/sshd", "chmod 0755 /run/sshd",
                 "exec /usr/sbin/sshd -D -e -f %s/sshd_config" % SSH_DIR]
        (hd / "boot.sh").write_text("\n".join(boot) + "\n")

    def _boot(self, name: str) -> int:
        logf = open(self.logs / ("%s.log" % name), "ab")
        try:
            p = subprocess.Popen(["ip", "netns", "exec", self.netns(name), "unshare", "--mount", "--uts", "--pid",
                                  "--fork", "--kill-child", "--mount-proc", "/bin/sh", str(self.host_dir(name) / "boot.sh")],
                                 stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                 start_new_session=True, close_fds=True)
        finally:
            logf.close()
        # Not waited for here: the host outlives this script. Reap it if it dies while we still run.
        self._children = getattr(self, "_children", []) + [p]
        return p.pid

    def _wait_ready(self, state: t.Dict[str, t.Any], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = {h["name"] for h in state["host_info"]}
        while pending:
            for h in state["host_info"]:
                if h["name"] not in pending:
                    continue
                with open(self.logs / ("%s.log" % h["name"]), "rb") as f:
                    f.seek(getattr(self, "_log_from", {}).get(h["name"], 0))
                    text = f.read().decode(errors="replace")
                if "Server listening on" in text:
                    pending.discard(h["name"])
                elif not _alive(h["pid"], h["start"]) or any(p.poll() is not None for p in self._children
                                                             if p.pid == h["pid"]):
                    raise FleetError("host %s died while booting: %s" % (h["name"], text.strip()[-400:]))
            if pending and time.monotonic() > deadline:
                raise FleetError("hosts %s did not start sshd within %ss" % (", ".join(sorted(pending)), timeout))
            if pending:
                time.sleep(0.01)

    # -- inventory ---------------------------------------------------------------------------------
    def ssh_common_args(self) -> str:
        return ('-o ProxyCommand="ip netns exec %s nc %%h %%p" -o StrictHostKeyChecking=no '
                "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=10 -o ControlPath=%s"
                % (self.hub, self.control_path()))

    def write_inventory(self, state: t.Dict[str, t.Any]) -> None:
        q = json.dumps  # JSON strings are valid YAML double-quoted scalars
        lines = ["# Written by tests/sandbox/fleet.py for the sandbox fleet in %s. Test-only." % self.dir,
                 "all:", "  hosts:"]
        for h in state["host_info"]:
            lines += [
                "    %s:" % h["name"],
                "      ansible_host: %s" % q(h["addr"]),
                "      ansible_user: root",
                "      ansible_ssh_private_key_file: %s" % q(str(self.key)),
                "      ansible_ssh_common_args: %s" % q(self.ssh_common_args()),
                "      ansible_python_interpreter: %s" % q(state["python"]),
                "      gpufleet_sandbox_gpus: %d" % h["gpus"],
                "      gpufleet_sandbox_nvlink: %s" % ("true" if h["nvlink"] else "false"),
            ]
        tmp = self.inventory.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(self.inventory)

    def _write_proxy(self) -> None:
        """DIR/proxy HOST PORT: the ProxyCommand for callers that know the state dir but not the hub's name."""
        p = self.dir / "proxy"
        p.write_text("#!/bin/sh\n# ssh ProxyCommand into the sandbox fleet of %s\nexec ip netns exec %s nc \"$@\"\n"
                     % (self.dir, self.hub))
        p.chmod(0o755)

    def ssh_argv(self, host: str, command: str) -> t.List[str]:
        """argv of a plain ssh call to `host` running `command` (same options as the inventory)."""
        state = self.load()
        if not state:
            raise FleetError("no fleet in %s" % self.dir)
        addr = {h["name"]: h["addr"] for h in state["host_info"]}.get(host)
        if addr is None:
            raise FleetError("no host %s in the fleet in %s" % (host, self.dir))
        return (["ssh", "-i", str(self.key), "-o", "BatchMode=yes", "-o", "ControlMaster=auto",
                 "-o", "ControlPersist=30s"] + shlex.split(self.ssh_common_args()) + ["root@" + addr, command])

    # -- down --------------------------------------------------------------------------------------
    def down(self) -> None:
        preflight()
        state = self.load() or {}
        # 1. ssh control masters (they run in this namespace and hold proxies in the hub).
        socks = sorted(self.dir.glob("cp-*")) if self.dir.is_dir() else []
        procs = [subprocess.Popen(["ssh", "-o", "ControlPath=" + str(s), "-O", "exit", "sandbox"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for s in socks]
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        # 2. every process in any of our namespaces; `unshare --fork` ignores SIGTERM, so SIGKILL:
        # --kill-child then ends each host's pid namespace, whose mount namespace (overlays) goes with it.
        names = set(self.our_netns())
        names.update(h.get("netns", "") for h in state.get("host_info", []))
        names.discard("")
        if state.get("hub"):
            names.add(state["hub"])
        pids = set()
        for h in state.get("host_info", []):
            if h.get("pid") and _alive(h["pid"], h.get("start")):
                pids.add(h["pid"])
        for n in sorted(names):
            if os.path.exists("/run/netns/" + n):
                out = run(["ip", "netns", "pids", n], check=False).stdout
                pids.update(int(x) for x in out.split() if x.isdigit())
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids):
            if time.monotonic() > deadline:
                raise FleetError("processes %s survived SIGKILL for 10s" % sorted(p for p in pids if _alive(p)))
            time.sleep(0.01)
        # Reap our own children (when down runs inside the process that ran up).
        for p in getattr(self, "_children", []):
            p.poll()
        # 3. the namespaces themselves.
        existing = [n for n in sorted(names) if os.path.exists("/run/netns/" + n)]
        if existing:
            run(["ip", "-force", "-batch", "-"], input="".join("netns del %s\n" % n for n in existing), check=False)
        left = [n for n in existing if os.path.exists("/run/netns/" + n)]
        if left:
            raise FleetError("could not delete network namespaces %s" % ", ".join(left))
        # 4. files: sockets, keys, upper dirs, inventory, state (logs stay).
        if self.dir.is_dir():
            for s in self.dir.glob("cp-*"):
                s.unlink()
            for p in (self.dir / "hosts",):
                if p.exists():
                    shutil.rmtree(p)
            for p in list(self.dir.glob("hostkey-*")) + [self.key, Path(str(self.key) + ".pub"), self.inventory,
                                                         self.state_path, self.dir / "proxy"]:
                if p.exists():
                    p.unlink()

    # -- status ------------------------------------------------------------------------------------
    def status(self) -> t.Dict[str, t.Any]:
        state = self.load()
        if not state:
            return {"state_dir": str(self.dir), "up": False, "hosts": [], "netns": self.our_netns()}
        hosts = [{"name": h["name"], "addr": h["addr"], "pid": h.get("pid"), "alive": self.host_alive(h),
                  "gpus": h["gpus"], "nvlink": h["nvlink"]} for h in state["host_info"]]
        return {"state_dir": str(self.dir), "up": bool(hosts) and all(h["alive"] for h in hosts),
                "inventory": str(self.inventory), "hub": state["hub"], "python": state["python"],
                "hosts": hosts, "netns": self.our_netns()}


def _start_time(pid: int) -> t.Optional[int]:
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(")") + 2:].split()[19])


def _alive(pid: int, start: t.Optional[int] = None) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except OSError:
        return False
    rest = data[data.rindex(")") + 2:].split()
    if rest[0] in ("Z", "X"):
        return False
    return start is None or int(rest[19]) == start


def _copy_mode(src: str, dst: Path) -> None:
    st = os.stat(src)
    os.chown(dst, st.st_uid, st.st_gid)
    os.chmod(dst, stat.S_IMODE(st.st_mode))


def _mkdirs_like(upper: Path, path: Path) -> None:
    """mkdir -p `path` inside an upper dir, giving each new dir the owner and mode of the real dir it shadows."""
    rel = path.relative_to(upper)
    cur = upper
    for part in rel.parts:
        cur = cur / part
        if cur.is_dir():
            continue
        cur.mkdir()
        real = "/" + str(cur.relative_to(upper))
        if os.path.isdir(real):
            _copy_mode(real, cur)


def cli_parser(description: str, hosts: int, timeout: float, python_option: bool = True) -> t.Tuple[t.Any, t.Any]:
    """The up/down/status command line shared by fleet.py and podman_fleet.py: (parser, its subparsers)."""
    ap = argparse.ArgumentParser(description=description)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="start N hosts (reuses a running fleet with the same config)")
    u.add_argument("--hosts", type=int, default=hosts)
    u.add_argument("--state-dir", required=True)
    u.add_argument("--gpus", type=int, default=2, help="fake GPUs per host")
    u.add_argument("--gpu-mib", type=int, default=143771, help="memory per fake GPU in MiB")
    u.add_argument("--nvlink", default="", help="comma-separated hosts whose fake GPUs have NVLink")
    if python_option:
        u.add_argument("--python", help="interpreter for the hosts (default /usr/bin/python3 if present)")
    u.add_argument("--timeout", type=float, default=timeout)
    d = sub.add_parser("down", help="remove everything of the fleet (also after a crashed up)")
    d.add_argument("--state-dir", required=True)
    s = sub.add_parser("status", help="print the fleet's state as JSON; rc 0 only if all hosts are up")
    s.add_argument("--state-dir", required=True)
    return ap, sub


def run_cli(fleet: "Fleet", a: t.Any, status_extra: t.Optional[t.Callable[[t.Any], t.Dict[str, t.Any]]] = None) -> int:
    """Run the parsed up/down/status command on `fleet`; errors become one line and rc 1."""
    try:
        t0 = time.monotonic()
        if a.cmd == "up":
            nv = [x.strip() for x in a.nvlink.split(",") if x.strip()]
            fleet.up(a.hosts, a.gpus, a.gpu_mib, nv, getattr(a, "python", None), a.timeout)
            log("up in %.1fs" % (time.monotonic() - t0))
            print(fleet.inventory)
        elif a.cmd == "down":
            fleet.down()
            log("down in %.2fs" % (time.monotonic() - t0))
        else:
            st = fleet.status()
            st.update(status_extra(fleet) if status_extra else {})
            print(json.dumps(st, indent=1))
            return 0 if st["up"] else 1
    except FleetError as e:
        log("error: %s" % e)
        return 1
    return 0


def main(argv: t.Optional[t.Sequence[str]] = None) -> int:
    ap, _sub = cli_parser(__doc__.split("\n", maxsplit=1)[0], hosts=3, timeout=20)
    a = ap.parse_args(argv)
    return run_cli(Fleet(a.state_dir), a)


if __name__ == "__main__":
    sys.exit(main())
