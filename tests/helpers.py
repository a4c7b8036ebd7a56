# SPDX-License-Identifier: GPL-3.0-or-later
"""Helpers for tests: collection install, fake GPUs, real processes, ansible-playbook runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import typing as t
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
FAKE_NVML_DIR = ROOT / "tests" / "fakes" / "nvml"
PY = sys.executable

_installed: t.Optional[Path] = None


def service_tag(name: str) -> str:
    """A launch tag (NAME=VALUE) that only this test process uses: tests that kill by tag on this machine's root pid
    namespace must never match another test's processes (parallel workers, another checkout's run, the sandbox
    hosts' servers, whose processes this namespace also sees)."""
    return "GPUFLEET_SERVICE=%s-%d" % (name, os.getpid())


def installed_at(path: Path) -> None:
    """The copy is already installed at `path` (an xdist worker: the controlling pytest installed it)."""
    global _installed
    _installed = path


def install_collection() -> Path:
    global _installed
    if _installed is None and ROOT.parts[-3:] == ("ansible_collections", "gpufleet", "serving"):
        # This tree already is an installed copy (`ansible-test units` runs one), without scripts/.
        _installed = ROOT
    if _installed is None:
        out = subprocess.run([PY, str(ROOT / "scripts" / "install-collection"), str(ROOT / "collections")],
                             check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
        _installed = Path(out)
    return _installed


class FakeGpus:
    """Config + state dir of the fake pynvml; `env` puts the fake first on PYTHONPATH."""

    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self.base.mkdir(parents=True, exist_ok=True)
        self.config = self.base / "fake_nvml.json"
        self.state = self.base / "state"
        self.holders: t.List[subprocess.Popen] = []

    def configure(self, gpus: int = 2, memory_mib: int = 143771, reserved_mib: int = 615, nvlink_links: int = 0,
                  memory_v2: bool = True, release_delay_s: float = 0.15, init_error: t.Optional[str] = None) -> None:
        cfg = {
            "gpus": [{"name": "NVIDIA H200", "memory_mib": memory_mib, "reserved_mib": reserved_mib,
                      "nvlink_links": nvlink_links} for _gpu in range(gpus)],
            "memory_v2": memory_v2,
            "release_delay_s": release_delay_s,
            "state_dir": str(self.state),
            "init_error": init_error,
        }
        self.config.write_text(json.dumps(cfg))

    @property
    def env(self) -> t.Dict[str, str]:
        e = dict(os.environ)
        e["FAKE_NVML_CONFIG"] = str(self.config)
        e["PYTHONPATH"] = str(FAKE_NVML_DIR) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
        return e

    def hold(self, gpu: int = 0, mib: int = 20000, ignore_term: bool = False, extra_env: t.Optional[t.Mapping[str, str]] = None,
             **popen: t.Any) -> subprocess.Popen:
        """Start a real process that holds `mib` of fake GPU memory until it dies (`extra_env`: added to its environment,
        a launch tag for instance)."""
        fd, ready = tempfile.mkstemp(dir=str(self.base), prefix="ready-")
        os.close(fd)
        os.unlink(ready)  # the holder creates it when it holds the memory
        argv = [PY, str(FAKE_NVML_DIR / "fake_gpu.py"), "hold", "--gpu", str(gpu), "--mib", str(mib), "--ready-file", ready]
        if ignore_term:
            argv.append("--ignore-term")
        p = subprocess.Popen(argv, env=dict(self.env, **(extra_env or {})), **popen)
        # A start-up wait, not an assertion on speed: a Python start took over 10 s on the 2-core CI machine at load 11.
        wait_for(lambda: os.path.exists(ready), 60, "fake GPU holder ready")
        self.holders.append(p)
        return p

    def cleanup(self) -> None:
        for p in self.holders:
            if p.poll() is None:
                p.kill()
                p.wait()


def wait_for(cond: t.Callable[[], t.Any], timeout: float, what: str, interval: float = 0.01) -> t.Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rindex(")") + 2:].split()[0] not in ("Z", "X")


def run_playbook(playbook: t.Union[str, Path], *args: str, env: t.Optional[t.Dict[str, str]] = None,
                 extra_vars: t.Optional[t.Dict[str, t.Any]] = None, check: bool = False, diff: bool = False,
                 inventory: t.Optional[str] = None, timeout: t.Optional[float] = 300,
                 idle_timeout: t.Optional[float] = None) -> subprocess.CompletedProcess:
    """Run ansible-playbook (the real CLI) from the repo root; localhost uses this venv's python. With `idle_timeout`,
    a run that prints nothing for that long is hung (see run_while_progressing)."""
    e = dict(env or os.environ)
    e.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
    e["ANSIBLE_NOCOLOR"] = "1"
    e["ANSIBLE_FORCE_COLOR"] = "0"
    argv = [str(VENV_BIN / "ansible-playbook"), str(playbook)]
    if inventory is None:
        argv += ["-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=%s" % PY]
    else:
        argv += ["-i", inventory]
    if extra_vars:
        argv += ["-e", json.dumps(extra_vars)]
    if check:
        argv.append("--check")
    if diff:
        argv.append("--diff")
    argv += list(args)
    if idle_timeout is not None:
        e["PYTHONUNBUFFERED"] = "1"
        return run_while_progressing(argv, idle_timeout, timeout, cwd=str(ROOT), env=e)
    return subprocess.run(argv, cwd=str(ROOT), env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, check=False)


def run_while_progressing(argv: t.Sequence[str], idle_timeout: float, timeout: t.Optional[float] = None,
                          **kw: t.Any) -> subprocess.CompletedProcess:
    """Run argv (stdout and stderr captured together) for as long as it makes progress: one that prints nothing for
    `idle_timeout` s (or runs past `timeout`, when given) is killed and raises TimeoutExpired with its output so far.
    For a run whose length is the machine's speed times its work (a whole rollout on a busy machine): a hang shows as
    silence, whatever the load, while a fixed bound on the whole run only measures the machine."""
    import threading

    p = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    lines: t.List[str] = []
    last = [time.monotonic()]

    def pump() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line)
            last[0] = time.monotonic()

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    t0 = time.monotonic()
    while p.poll() is None:
        now = time.monotonic()
        if now - last[0] > idle_timeout or (timeout is not None and now - t0 > timeout):
            p.kill()
            p.wait()
            th.join(5)
            raise subprocess.TimeoutExpired(list(argv), now - t0, output="".join(lines))
        time.sleep(0.2)
    th.join()
    return subprocess.CompletedProcess(list(argv), p.returncode, "".join(lines))


# The start of a script that answers 200 "ok" to every GET and POST (class H), for another interpreter to run
# (`python3 -c`, as another user: nobody cannot reach the venv): the foreign listeners of the port tests.
HTTP_OK_SCRIPT = r"""
import http.server, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    do_POST = do_GET
"""
