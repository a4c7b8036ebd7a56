# SPDX-License-Identifier: GPL-3.0-or-later
"""pytest plugin: `sandbox_fleet` / `sandbox_fleet_module` factories of real sshd hosts (tests/sandbox/fleet.py).

    def test_x(sandbox_fleet):
        fleet = sandbox_fleet(hosts=3, gpus=2, nvlink=["host2"])
        fleet.inventory            # Path of the ansible inventory (ssh through the fleet's hub namespace)
        fleet.hosts                # ["host1", "host2", "host3"]
        fleet.ssh("host1", "hostname")        # CompletedProcess (text, stdout+stderr split)
        fleet.hub_run(["curl", "-s", "http://%s:30000/health" % fleet.addr("host1")])
        fleet.down()               # also done automatically at teardown

Tests using it are skipped (with the reason) when not root or when ip/unshare/sshd/nc/ssh are missing.
Enable with `pytest_plugins = ["sandbox.fixtures"]` in tests/conftest.py (tests/ is on sys.path there).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import typing as t
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FLEET_PY = HERE / "fleet.py"
VENV_BIN = Path(sys.executable).parent


def load_script(name: str, path: Path) -> t.Any:
    """Import a script (fleet.py, podman_fleet.py) once per process, under `name`, as they import each other."""
    if name not in sys.modules:
        import importlib.util
        spec = importlib.util.spec_from_file_location(name, str(path))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def podman_fleet() -> t.Any:
    """tests/sandbox/podman_fleet.py as a module."""
    return load_script("gpufleet_sandbox_podman_fleet", HERE / "podman_fleet.py")


_fleet = load_script("gpufleet_sandbox_fleet", FLEET_PY)


def skip_reason() -> t.Optional[str]:
    """Why the sandbox fleet cannot run here, or None."""
    if os.geteuid() != 0:
        return "the sandbox fleet needs root (network namespaces, overlay mounts)"
    missing = [c for c in ("ip", "unshare", "nc", "ssh", "ssh-keygen") if not shutil.which(c)]
    if not os.access("/usr/sbin/sshd", os.X_OK):
        missing.append("sshd")
    if missing:
        return "the sandbox fleet needs %s (apt: iproute2 util-linux netcat-openbsd openssh-server)" % ", ".join(missing)
    return None


class SandboxFleet:
    """A running fleet; thin wrapper over `fleet.py` and its state file."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self._fleet = _fleet.Fleet(state_dir)
        self.inventory = self._fleet.inventory
        self.hub = self._fleet.hub
        self._state: t.Dict[str, t.Any] = {}
        self.is_up = False

    # -- lifecycle ---------------------------------------------------------------------------------
    def up(self, hosts: int = 3, gpus: int = 2, nvlink: t.Sequence[str] = (), gpu_mib: t.Optional[int] = None,
           python: t.Optional[str] = None) -> "SandboxFleet":
        argv = [sys.executable, str(FLEET_PY), "up", "--hosts", str(hosts), "--gpus", str(gpus),
                "--state-dir", str(self.state_dir)]
        if nvlink:
            argv += ["--nvlink", ",".join(nvlink)]
        if gpu_mib:
            argv += ["--gpu-mib", str(gpu_mib)]
        if python:
            argv += ["--python", python]
        p = subprocess.run(check=False, args=argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        self.is_up = True  # even on failure: down() must still clean a partial fleet
        if p.returncode != 0:
            raise AssertionError("fleet up failed (rc=%d): %s" % (p.returncode, p.stderr.strip()))
        self._state = json.loads(self._fleet.state_path.read_text())
        return self

    def down(self) -> None:
        if not self.is_up:
            return
        p = subprocess.run(check=False, args=[sys.executable, str(FLEET_PY), "down", "--state-dir", str(self.state_dir)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        self.is_up = False
        if p.returncode != 0:
            raise AssertionError("fleet down failed (rc=%d): %s" % (p.returncode, p.stderr.strip()))

    # -- facts -------------------------------------------------------------------------------------
    @property
    def hosts(self) -> t.List[str]:
        return [h["name"] for h in self._state.get("host_info", [])]

    @property
    def python(self) -> str:
        return self._state["python"]

    def addr(self, host: str) -> str:
        return self._host(host)["addr"]

    def netns(self, host: str) -> str:
        return self._host(host)["netns"]

    def launcher_pid(self, host: str) -> int:
        """PID (in this namespace) of the host's `unshare` process; its child is the host's PID 1 (sshd)."""
        return self._host(host)["pid"]

    def pid1(self, host: str) -> int:
        """PID (in this namespace) of the host's PID 1, sshd."""
        with open("/proc/%d/task/%d/children" % (self.launcher_pid(host), self.launcher_pid(host))) as f:
            return int(f.read().split()[0])

    def _host(self, host: str) -> t.Dict[str, t.Any]:
        for h in self._state.get("host_info", []):
            if h["name"] == host:
                return h
        raise KeyError("no host %r in the sandbox fleet (hosts: %s)" % (host, self.hosts))

    # -- running things ----------------------------------------------------------------------------
    def ssh(self, host: str, command: str, check: bool = False, timeout: float = 60,
            input: t.Optional[str] = None) -> subprocess.CompletedProcess:
        """Run a shell command on `host` over ssh as root (plain ssh, same options as the inventory)."""
        p = subprocess.run(check=False, args=self._fleet.ssh_argv(host, command), input=input, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError("ssh %s %r failed (rc=%d): %s%s" % (host, command, p.returncode, p.stdout, p.stderr))
        return p

    def hub_run(self, argv: t.Sequence[str], timeout: float = 60, **kw: t.Any) -> subprocess.CompletedProcess:
        """Run argv inside the fleet's hub network namespace (it reaches every host's address)."""
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        return subprocess.run(check=kw.pop("check", False), args=["ip", "netns", "exec", self.hub] + list(argv), timeout=timeout, **kw)

    def host_run(self, host: str, argv: t.Sequence[str], timeout: float = 60, **kw: t.Any) -> subprocess.CompletedProcess:
        """Run argv inside all of `host`'s namespaces (nsenter into its PID 1), without ssh."""
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        return subprocess.run(check=False, args=["nsenter", "-t", str(self.pid1(host)), "-m", "-u", "-p", "-n", "--"] + list(argv),
                              timeout=timeout, **kw)

    def ansible(self, pattern: str, module: str, args: str = "", *extra: str,
                timeout: float = 120) -> subprocess.CompletedProcess:
        """Run an ad-hoc `ansible` (the real CLI of this venv) against the fleet's inventory."""
        argv = [str(VENV_BIN / "ansible"), pattern, "-i", str(self.inventory), "-m", module]
        if args:
            argv += ["-a", args]
        return subprocess.run(check=False, args=argv + list(extra), cwd=str(ROOT), env=self.ansible_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)

    def ansible_env(self, base: t.Optional[t.Dict[str, str]] = None) -> t.Dict[str, str]:
        e = dict(base or os.environ)
        e.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
        e["ANSIBLE_NOCOLOR"] = "1"
        e["ANSIBLE_FORCE_COLOR"] = "0"
        return e


def _factory(tmp_factory: pytest.TempPathFactory) -> t.Tuple[t.Callable[..., SandboxFleet], t.List[SandboxFleet]]:
    made: t.List[SandboxFleet] = []

    def make(hosts: int = 3, gpus: int = 2, nvlink: t.Sequence[str] = (), gpu_mib: t.Optional[int] = None,
             python: t.Optional[str] = None, state_dir: t.Optional[Path] = None) -> SandboxFleet:
        reason = skip_reason()
        if reason:
            pytest.skip(reason)
        # Short base: ssh control sockets live in the state dir (108-byte unix socket paths).
        f = SandboxFleet(state_dir or tmp_factory.mktemp("fleet", numbered=True))
        made.append(f)
        return f.up(hosts=hosts, gpus=gpus, nvlink=nvlink, gpu_mib=gpu_mib, python=python)

    return make, made


def _teardown(made: t.List[SandboxFleet]) -> None:
    errors = []
    for f in made:
        try:
            f.down()
        except AssertionError as e:
            errors.append(str(e))
    if errors:
        raise AssertionError("; ".join(errors))


@pytest.fixture
def sandbox_fleet(tmp_path_factory):
    """Factory of sandbox fleets torn down after the test: `sandbox_fleet(hosts=3, gpus=2, nvlink=["host2"])`."""
    make, made = _factory(tmp_path_factory)
    yield make
    _teardown(made)


@pytest.fixture(scope="module")
def sandbox_fleet_module(tmp_path_factory):
    """Like `sandbox_fleet`, torn down after the module (share one fleet between a module's tests)."""
    make, made = _factory(tmp_path_factory)
    yield make
    _teardown(made)


@pytest.fixture(scope="session")
def sandbox_fleet_session(tmp_path_factory):
    """Like `sandbox_fleet`, torn down at the end of the pytest session."""
    make, made = _factory(tmp_path_factory)
    yield make
    _teardown(made)


class PodmanHosts(SandboxFleet):
    """SandboxFleet over tests/sandbox/podman_fleet.py: each host a podman container booting systemd."""

    def up(self, hosts: int = 1, gpus: int = 2, nvlink: t.Sequence[str] = (), gpu_mib: t.Optional[int] = None,
           python: t.Optional[str] = None) -> "PodmanHosts":
        self._fleet = podman_fleet().PodmanFleet(self.state_dir)
        argv = [sys.executable, str(HERE / "podman_fleet.py"), "up", "--hosts", str(hosts),
                "--gpus", str(gpus), "--state-dir", str(self.state_dir)]
        self.is_up = True
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300, check=False)
        if p.returncode != 0:
            raise AssertionError("podman fleet up failed (rc=%d): %s" % (p.returncode, p.stderr.strip()[-2000:]))
        self._state = json.loads(self._fleet.state_path.read_text())
        return self

    def down(self) -> None:
        if self.is_up:
            self.is_up = False
            subprocess.run([sys.executable, str(HERE / "podman_fleet.py"), "down", "--state-dir", str(self.state_dir)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300, check=True)


def podman_skip_reason() -> t.Optional[str]:
    """Why podman hosts booting systemd cannot run here (after building their image once), or None."""
    reason = skip_reason()
    if reason:
        return reason
    pf = podman_fleet()
    missing = pf.missing_commands(build=not pf.TARBALL.exists() and not pf.image_exists())
    if missing:
        return "podman hosts need %s (apt-get install podman runc debootstrap)" % ", ".join(missing)
    p = subprocess.run([sys.executable, str(HERE / "podman_fleet.py"), "image"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stdout[-4000:]
    return None


@pytest.fixture(scope="module")
def systemd_host(tmp_path_factory):
    """One podman host booting systemd (the molecule `systemd` scenario's hosts), for the module's tests."""
    reason = podman_skip_reason()
    if reason:
        pytest.skip(reason)
    f = PodmanHosts(tmp_path_factory.mktemp("pfleet", numbered=True))
    try:
        yield f.up(hosts=1, gpus=2)
    finally:
        f.down()
