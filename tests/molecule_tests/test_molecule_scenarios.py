# SPDX-License-Identifier: GPL-3.0-or-later
"""`molecule test -s <scenario>` for each molecule scenario, one test each, through the real molecule CLI.

- default: the rollout on 3 sandbox hosts that run a stale server: converge, idempotence (changed=0),
  check, verify (GPU holders = tagged workers of the new server with the pcie_only env, stale pids gone).
- check_mode: `--check` rollout on hosts with a stale server; verify that nothing changed.
- systemd: the rollout with the systemd launcher on podman hosts with systemd as PID 1
  (tests/sandbox/podman_fleet.py); verify the unit, its Environment=, the workers' env, and that
  `systemctl stop` ends every process of the unit's cgroup.

Every test also checks that molecule's destroy left no namespaces (and no containers) behind. The verify
playbooks hold the assertions; molecule exits non-zero when any of them fails.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import typing as t
from pathlib import Path

import pytest

from sandbox.fixtures import podman_fleet, skip_reason

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
STEP = re.compile(r"^(?:\S+\s+)?(\w+) (?:>|➜) (\w+): Executed: (\w+)", re.M)
# What debootstrap says when the Debian mirror cannot be reached (then the systemd scenario is skipped).
UNREACHABLE = re.compile(r"Failed getting release file|Couldn't download|Temporary failure resolving|"
                         r"Could not resolve|Connection refused|Network is unreachable|Connection timed out")


def _prefix(scenario: str) -> str:
    """Name prefix of the namespaces (and containers) of the scenario's fleet; see molecule.yml's state dir."""
    state_dir = os.path.realpath("/tmp/gpufleet-molecule%s/%s" % (ROOT, scenario))
    return podman_fleet()._fleet.prefix_for(Path(state_dir)) + "-"


def _leftovers(scenario: str) -> t.List[str]:
    """Network namespaces and podman containers of the scenario's fleet (other tests' fleets come and go)."""
    try:
        names = os.listdir("/run/netns")
    except OSError:
        names = []
    if shutil.which("podman"):
        p = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, timeout=60, check=False)
        names += ["container " + n for n in p.stdout.split()]
    prefix = _prefix(scenario)
    return sorted(n for n in names if n.startswith(prefix) or n.startswith("container " + prefix))


def _skip_unless_sandbox() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    if not (VENV_BIN / "molecule").exists():
        pytest.skip("molecule is not installed in this venv (./scripts/setup installs it)")


def molecule_test(scenario: str, timeout: float) -> t.Dict[str, str]:
    """Run `molecule test -s scenario`; return {step: result}; fail with the output's tail unless rc == 0."""
    env = dict(os.environ, PATH="%s%s%s" % (VENV_BIN, os.pathsep, os.environ.get("PATH", "")),
               NO_COLOR="1", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", PY_COLORS="0")
    env.pop("ANSIBLE_CONFIG", None)
    t0 = time.monotonic()
    try:
        p = subprocess.run([str(VENV_BIN / "molecule"), "test", "-s", scenario], cwd=str(ROOT), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        # molecule was killed before its destroy step: tear the fleet down here.
        subprocess.run([str(VENV_BIN / "molecule"), "destroy", "-s", scenario], cwd=str(ROOT), env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180, check=False)
        out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else (e.output or "")
        pytest.fail("molecule test -s %s took more than %ss: %s" % (scenario, timeout, out[-6000:]))
    took = time.monotonic() - t0
    # Shown with -s or on failure: where the suite's time goes.
    print("molecule test -s %s: rc=%d in %.1fs" % (scenario, p.returncode, took))
    assert p.returncode == 0, p.stdout[-8000:]
    steps = {m.group(2): m.group(3) for m in STEP.finditer(p.stdout) if m.group(1) == scenario}
    return steps


def test_default_scenario_rolls_out_idempotently_and_leaves_no_fleet():
    _skip_unless_sandbox()
    steps = molecule_test("default", timeout=420)
    for step in ("create", "prepare", "converge", "idempotence", "check", "verify", "destroy"):
        assert steps.get(step) == "Successful", (step, steps)
    assert not _leftovers("default"), "molecule's destroy left %s" % _leftovers("default")


def test_check_mode_scenario_changes_nothing_and_leaves_no_fleet():
    _skip_unless_sandbox()
    steps = molecule_test("check_mode", timeout=300)
    for step in ("create", "prepare", "check", "verify", "destroy"):
        assert steps.get(step) == "Successful", (step, steps)
    assert "converge" not in steps, "check_mode must only run the rollout with --check: %s" % steps
    assert not _leftovers("check_mode"), "molecule's destroy left %s" % _leftovers("check_mode")


def test_systemd_scenario_runs_the_unit_and_stop_ends_its_cgroup():
    _skip_unless_sandbox()
    pf = podman_fleet()
    missing = pf.missing_commands(build=not pf.TARBALL.exists() and not pf.image_exists())
    if missing:
        pytest.skip("the systemd scenario needs %s (apt-get install podman runc debootstrap; ./scripts/setup does)"
                    % ", ".join(missing))
    # The image first (debootstrap once, ~65 s idle, then cached in .cache/podman): its own timeout and error.
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "sandbox" / "podman_fleet.py"), "image"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900, check=False)
    if p.returncode != 0 and UNREACHABLE.search(p.stdout):
        pytest.skip("the Debian mirror for debootstrap is unreachable: %s" % p.stdout.strip()[-600:])
    assert p.returncode == 0, p.stdout[-4000:]
    print(p.stdout.strip().splitlines()[-1])
    steps = molecule_test("systemd", timeout=600)
    for step in ("create", "prepare", "converge", "idempotence", "verify", "destroy"):
        assert steps.get(step) == "Successful", (step, steps)
    assert not _leftovers("systemd"), "molecule's destroy left %s" % _leftovers("systemd")
