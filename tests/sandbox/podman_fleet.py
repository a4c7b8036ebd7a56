#!/usr/bin/env python
# SPDX-License-Identifier: GPL-3.0-or-later
"""Sandbox fleet whose hosts are podman containers running systemd as PID 1 (for the systemd launcher). Test-only.

    podman_fleet.py image [--rebuild]            # make sure the image exists (see below)
    podman_fleet.py up --hosts 1 --state-dir DIR [--gpus 2] [--gpu-mib 143771] [--nvlink host1]
    podman_fleet.py down --state-dir DIR
    podman_fleet.py status --state-dir DIR

Same shape as tests/sandbox/fleet.py (whose Fleet this extends): one network namespace per host, a hub
namespace with a bridge, ssh through `ip netns exec <hub> nc`, the same DIR/inventory.yml, DIR/proxy and
DIR/fleet.json, the test-only fake NVML with the host's GPUs in /opt/gpufleet-fake (and a .pth so
/usr/bin/python3 imports it) and the demo server. But each host is a podman container that joins the
host's network namespace (`--network ns:/run/netns/<netns>`) and boots /sbin/init (`--systemd=always`),
so ansible.builtin.systemd_service really starts units; sshd runs as the image's ssh.service, with a
drop-in config (key auth, UsePAM no).

Podman 4.3 (Debian 12) runs containers on this kind of machine only with `--runtime runc
--cgroup-manager cgroupfs --ulimit nofile=20000:20000 --ulimit nproc=32768:32768`; on a hybrid cgroup
host the containers also get the host's cgroup2 hierarchy (see cgroup_opts), or `systemctl stop` waits
TimeoutStopSec every time.

The image (IMAGE) is Debian bookworm made with `debootstrap --variant=minbase --include=PACKAGES`
from the mirror apt uses (/etc/apt/sources.list*), trimmed (docs, apt lists and caches) and `podman
import`ed. The rootfs tarball is cached in .cache/podman/ (git-ignored): debootstrap runs only when both
the image and the tarball are missing (~65 s on an idle machine); an import from the tarball takes seconds.
Needs root, podman, runc, debootstrap (apt: podman runc debootstrap) besides fleet.py's commands.
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import typing as t
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _load_fleet() -> t.Any:
    name = "gpufleet_sandbox_fleet"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, str(HERE / "fleet.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


_fleet = _load_fleet()
FleetError = _fleet.FleetError
log = _fleet.log

SUITE = "bookworm"
PACKAGES = "python3,openssh-server,iproute2,netcat-openbsd,procps,systemd-sysv,dbus"
# The tag changes with the package list, so a new list builds a new image instead of reusing an old one.
_KEY = hashlib.sha1((SUITE + ":" + PACKAGES).encode()).hexdigest()[:8]
IMAGE = "localhost/gpufleet-sandbox-systemd:%s-%s" % (SUITE, _KEY)
CACHE_DIR = ROOT / ".cache" / "podman"
TARBALL = CACHE_DIR / ("gpufleet-sandbox-systemd-%s-%s.tar" % (SUITE, _KEY))
# Trimmed from the rootfs: nothing in the tests reads them, and they double the import time.
TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt", "var/lib/apt/lists")
# Global podman options that make containers run here (see the module docstring).
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
RUN_OPTS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768", "--systemd=always",
            # The hosts file and the empty resolv.conf come from the fleet (no DNS: lookups fail fast).
            "--no-hosts", "--dns", "none"]
CONTAINER_SITE = "/usr/lib/python3/dist-packages"
SSHD_DROPIN = "/etc/ssh/sshd_config.d/gpufleet.conf"
UNIFIED = "/sys/fs/cgroup/unified"


def cgroup_opts() -> t.List[str]:
    """On a hybrid cgroup host, give systemd in the container the cgroup2 hierarchy too.

    Podman masks the v1 release_agent, so systemd in the container never learns that a unit's cgroup
    became empty from v1 alone: after the main process exits, `systemctl stop` then waits the whole
    TimeoutStopSec even though every process is gone. With the host's cgroup2 hierarchy (where runc
    already placed the container) systemd watches cgroup.events and stops in the time the processes take.
    """
    try:
        with open("/proc/self/mountinfo") as f:
            hybrid = any(line.split(" - ")[0].split()[4] == UNIFIED and line.split(" - ")[1].startswith("cgroup2 ")
                         for line in f if " - " in line)
    except OSError:
        hybrid = False
    return ["--volume", "%s:%s:rw" % (UNIFIED, UNIFIED)] if hybrid else []


def podman(*args: str, input: t.Optional[t.Union[str, bytes]] = None, check: bool = True,
           timeout: float = 120) -> subprocess.CompletedProcess:
    text = not isinstance(input, bytes)
    p = subprocess.run(PODMAN + list(args), input=input, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text,
                       timeout=timeout, check=False)
    if check and p.returncode != 0:
        err = p.stderr if text else p.stderr.decode(errors="replace")
        raise FleetError("podman %s failed (rc=%d): %s" % (" ".join(args[:3]), p.returncode, err.strip()))
    return p


def missing_commands(build: bool = False) -> t.List[str]:
    """Commands this fleet needs on top of fleet.py's (debootstrap only when the image must be built)."""
    need = ["podman", "runc"] + (["debootstrap"] if build else [])
    return [c for c in need if not (shutil.which(c) or os.access("/usr/sbin/" + c, os.X_OK))]


def image_exists() -> bool:
    return bool(shutil.which("podman")) and podman("image", "exists", IMAGE, check=False).returncode == 0


def apt_mirror(root: str = "/") -> str:
    """The Debian mirror apt uses for SUITE (deb822 .sources or one-line lists).

    Only the machine's own apt sources name a mirror: no registry host is written into this code. None there is
    an error that says what to add."""
    etc = os.path.join(root, "etc", "apt")
    files = sorted(glob.glob(etc + "/sources.list.d/*.sources")) + [etc + "/sources.list"] + sorted(
        glob.glob(etc + "/sources.list.d/*.list"))
    for f in files:
        try:
            text = Path(f).read_text()
        except OSError:
            continue
        if f.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict((m.group(1).lower(), m.group(2).strip()) for m in
                              re.finditer(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, re.M))
                if "deb" in fields.get("types", "").split() and SUITE in fields.get("suites", "").split():
                    for uri in fields.get("uris", "").split():
                        if "security" not in uri:
                            return uri.rstrip("/")
        else:
            for line in text.splitlines():
                m = re.match(r"^\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", line)
                if m and m.group(2) == SUITE and "security" not in m.group(1):
                    return m.group(1).rstrip("/")
    raise RuntimeError("no Debian %s mirror in %s/sources.list or %s/sources.list.d/ (deb822 .sources or one-line .list): "
                       "the systemd hosts' image is debootstrapped from the mirror apt uses; add a '%s' source"
                       % (SUITE, etc, etc, SUITE))


def ensure_image(rebuild: bool = False) -> str:
    """Make sure IMAGE exists: import the cached tarball, building it with debootstrap first when missing."""
    if not rebuild and image_exists():
        return "present"
    # Parallel test workers may all find the image missing on a fresh machine: one builds, the others wait for it.
    TARBALL.parent.mkdir(parents=True, exist_ok=True)
    with open(str(TARBALL) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not rebuild and image_exists():
            return "present"
        return _make_image(rebuild)


def _make_image(rebuild: bool) -> str:
    miss = missing_commands(build=rebuild or not TARBALL.exists())
    if miss:
        raise FleetError("missing commands for the podman sandbox fleet: %s (apt packages podman runc debootstrap)"
                         % ", ".join(miss))
    how = "imported from the cached %s" % TARBALL
    if rebuild or not TARBALL.exists():
        build_tarball()
        how = "built with debootstrap"
    if image_exists():
        # --rebuild: drop the old image (refused while a container uses it; then the tag just moves).
        podman("rmi", IMAGE, check=False)
    t0 = time.monotonic()
    with open(TARBALL, "rb") as f:
        p = subprocess.run(PODMAN + ["import", "--change", "CMD [\"/sbin/init\"]", "-", IMAGE], stdin=f,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600, check=False)
    if p.returncode != 0:
        raise FleetError("podman import of %s failed (rc=%d): %s" % (TARBALL, p.returncode, p.stderr.strip()))
    log("image %s %s (import %.1fs)" % (IMAGE, how, time.monotonic() - t0))
    return how


def build_tarball() -> None:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    mirror = apt_mirror()
    # On disk (not /tmp, which may be a small tmpfs); mknod works there as root.
    work = Path(tempfile.mkdtemp(prefix="gpufleet-debootstrap-", dir="/var/tmp"))
    rootfs = work / "rootfs"
    t0 = time.monotonic()
    try:
        log("debootstrap %s from %s into %s (once; cached in %s)" % (SUITE, mirror, rootfs, TARBALL))
        p = subprocess.run(["debootstrap", "--variant=minbase", "--include=" + PACKAGES, SUITE, str(rootfs), mirror],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200, check=False)
        if p.returncode != 0:
            raise FleetError("debootstrap %s from %s failed (rc=%d): %s"
                             % (SUITE, mirror, p.returncode, p.stdout.strip()[-2000:]))
        for d in TRIM:
            target = rootfs / d
            if target.is_dir():
                shutil.rmtree(target)
                target.mkdir()
        tmp = TARBALL.with_suffix(".tmp")
        subprocess.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tmp), "."], check=True, timeout=600)
        tmp.rename(TARBALL)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log("rootfs built in %.1fs: %s" % (time.monotonic() - t0, TARBALL))


class PodmanFleet(_fleet.Fleet):
    """fleet.Fleet with podman+systemd hosts instead of unshare+sshd ones (network, keys, inventory, down reused)."""

    def container(self, host: str) -> str:
        return "%s-%s" % (self.prefix, host)

    def up(self, hosts: int, gpus: int, gpu_mib: int, nvlink: t.Sequence[str], python: t.Optional[str] = None,
           timeout: float = 60) -> t.Dict[str, t.Any]:
        _fleet.preflight()
        miss = missing_commands()
        if miss:
            raise FleetError("missing commands for the podman sandbox fleet: %s (apt packages podman runc)"
                             % ", ".join(miss))
        ensure_image()
        # The image's interpreter; the fake NVML's .pth goes into its dist-packages (see _prepare_host).
        return super().up(hosts, gpus, gpu_mib, nvlink, "/usr/bin/python3", timeout)

    def _prepare_host(self, name: str, addr: str, names: t.Sequence[str], gpus: int, gpu_mib: int, nvlink: bool,
                      sites: t.Sequence[str]) -> None:
        # fleet.py lays out every file of the host (hosts, ssh keys, fake NVML, demo server) under
        # hosts/<name>/upper/ as a root tree; _boot copies that tree into the container.
        super()._prepare_host(name, addr, names, gpus, gpu_mib, nvlink, [CONTAINER_SITE])
        upper = self.host_dir(name) / "upper"
        conf = upper / SSHD_DROPIN.lstrip("/")
        conf.parent.mkdir(parents=True, exist_ok=True)
        # Debian's sshd_config includes sshd_config.d/*.conf first, and the first value of an option wins.
        conf.write_text("\n".join(_fleet.SSHD_OPTIONS + [""]))
        os.chmod(conf, 0o644)
        (self.host_dir(name) / "boot.sh").unlink()

    def _boot(self, name: str) -> int:
        ctr = self.container(name)
        podman("rm", "-f", "-t", "0", ctr, check=False)
        podman("create", "--name", ctr, "--hostname", name, "--network", "ns:/run/netns/" + self.netns(name),
               *RUN_OPTS, *cgroup_opts(), IMAGE, "/sbin/init")
        tar = subprocess.run(["tar", "--numeric-owner", "-C", str(self.host_dir(name) / "upper"), "-cf", "-", "."],
                             stdout=subprocess.PIPE, check=True, timeout=60).stdout
        podman("cp", "-", ctr + ":/", input=tar)
        podman("start", ctr)
        pid = int(podman("inspect", "--format", "{{.State.Pid}}", ctr).stdout.strip())
        if pid <= 0:
            raise FleetError("container %s did not start: %s" % (ctr, podman("logs", ctr, check=False).stdout[-400:]))
        return pid

    def _wait_ready(self, state: t.Dict[str, t.Any], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for h in state["host_info"]:
            ctr = self.container(h["name"])
            # Until systemd finished booting (running, or degraded when some unit failed).
            while True:
                left = max(1.0, deadline - time.monotonic())
                p = podman("exec", ctr, "systemctl", "is-system-running", "--wait", check=False, timeout=left)
                # Right after `podman start`, systemd may not have opened its bus yet, or not yet created
                # /run/systemd/system (then systemctl's sd_booted() is false and it prints "offline" at once,
                # without waiting): ask again until the deadline.
                starting = "Failed to connect to bus" in p.stderr or p.stdout.strip() == "offline"
                if not starting or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if p.stdout.strip() not in ("running", "degraded"):
                raise FleetError("systemd in %s did not boot: %s %s" % (ctr, p.stdout.strip(), p.stderr.strip()))
            while True:
                nc = subprocess.run(["ip", "netns", "exec", self.hub, "nc", "-z", "-w", "1", h["addr"], "22"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
                if nc.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise FleetError("sshd of %s does not answer on %s:22 after %ss: %s" % (
                        ctr, h["addr"], timeout, podman("exec", ctr, "systemctl", "status", "ssh", "--no-pager",
                                                        check=False).stdout[-600:]))
                time.sleep(0.1)

    def our_containers(self) -> t.List[str]:
        if not shutil.which("podman"):
            return []
        p = podman("ps", "-a", "--filter", "name=^%s-" % self.prefix, "--format", "{{.Names}}", check=False)
        return sorted(n for n in p.stdout.split() if n.startswith(self.prefix + "-"))

    def down(self) -> None:
        ctrs = self.our_containers()
        if ctrs:
            podman("rm", "-f", "-t", "0", *ctrs, timeout=120)
        super().down()


def main(argv: t.Optional[t.Sequence[str]] = None) -> int:
    ap, sub = _fleet.cli_parser(__doc__.split("\n", maxsplit=1)[0], hosts=1, timeout=60, python_option=False)
    i = sub.add_parser("image", help="make sure the image exists (import the cached rootfs or debootstrap it)")
    i.add_argument("--rebuild", action="store_true", help="debootstrap again even if the image or tarball exist")
    a = ap.parse_args(argv)
    if a.cmd == "image":
        try:
            print(json.dumps({"image": IMAGE, "tarball": str(TARBALL), "result": ensure_image(a.rebuild)}))
        except FleetError as e:
            log("error: %s" % e)
            return 1
        return 0
    return _fleet.run_cli(PodmanFleet(a.state_dir), a, status_extra=lambda f: {"containers": f.our_containers()})


if __name__ == "__main__":
    sys.exit(main())
