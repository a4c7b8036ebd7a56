# SPDX-License-Identifier: GPL-3.0-or-later
"""Shared test harness.

- The collection is copied (not symlinked) into collections/ansible_collections/gpufleet/serving
  once per session, so playbooks run by FQCN exercise the current checkout.
- `fake_gpus` writes a config for the test-only fake pynvml (tests/fakes/nvml) and returns the
  environment that puts it first on a target interpreter's path.
"""
from __future__ import annotations

import functools
import os
import sys
import typing as t
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import helpers  # noqa: E402
from helpers import FakeGpus, install_collection  # noqa: E402

# Test files by their time in a full run with 4 workers (`.ci/run` prints the slowest files; these are d1241f1's fresh
# clone), longest first; the rest follow in collection order. The EE test's time includes building its base image.
LONGEST_FIRST: t.List[str] = [
    "tests/rollout/test_drain.py",
    "tests/rollout/test_drain_recovery.py",
    "tests/reliability/test_rel_systemd.py",
    "tests/reliability/test_rel_batches.py",
    "tests/reliability/test_rel_gate.py",
    "tests/ee/test_ee.py",
    "tests/rollout/test_rollout.py",
    "tests/rollout/test_tags.py",
    "tests/foundation/test_core_newest.py",
    "tests/foundation/test_integration_targets.py",
    "tests/reliability/test_rel_faults_lock.py",
    "tests/foundation/test_sanity.py",
    "tests/molecule_tests/test_molecule_scenarios.py",
    "tests/reliability/test_rel_restart_ready.py",
    "tests/reliability/test_rel_security_rollout.py",
    "tests/reliability/test_rel_faults_unreachable.py",
    "tests/rollout/test_playbooks.py",
    "tests/foundation/test_ansible_test_units.py",
    "tests/reliability/test_rel_faults_fleet.py",
    "tests/reliability/test_rel_faults_full_fs.py",
    "tests/release/test_demo.py",
    "tests/unit/plugins/modules/test_server_restart.py",
    "tests/rollout/test_systemd_unit.py",
]


def _sandbox_server_vars_without_rollback() -> None:
    """The suite's sandbox server definitions (gpufleet_ci.sandbox.server_vars, in-process) say
    gpufleet_server_rollback: false. Most tests assert what a failed restart leaves behind (the host failed, out of
    rotation, the failed server stopped), which the role's default (on since 0.3.0) would turn into a rollback wherever
    the host has a last known good. The rollback tests ask for the role's default (rollout_helpers.ROLE_DEFAULT); the
    demo, gpufleet_ci and molecule, run as processes, get the default."""
    try:
        from gpufleet_ci import sandbox
    except ImportError:  # an installed copy without tools/ (ansible-test units)
        return
    orig = sandbox.server_vars
    if getattr(orig, "gpufleet_suite", False):
        return

    @functools.wraps(orig)  # __wrapped__: the product's own, for tests that compare with what a process of it writes
    def server_vars(*args: t.Any, **kwargs: t.Any) -> t.Dict[str, t.Any]:
        return dict(orig(*args, **kwargs), gpufleet_server_rollback=False)

    server_vars.gpufleet_suite = True  # type: ignore[attr-defined]
    sandbox.server_vars = server_vars


sys.path.insert(0, str(ROOT / "tools"))
_sandbox_server_vars_without_rollback()

pytest_plugins = ["sandbox.fixtures"]  # sandbox_fleet / sandbox_fleet_module (tests/sandbox/fixtures.py)


def pytest_configure(config: pytest.Config) -> None:
    # The AnsiballZ dependency memo (tests/accel/_gpufleet_ansiballz_memo.py): every ansible-playbook the suite starts
    # skips re-parsing sources it has seen (CONTRIBUTING.md). GPUFLEET_ANSIBALLZ_MEMO= (empty) turns it off.
    if "GPUFLEET_ANSIBALLZ_MEMO" not in os.environ:
        memo = ROOT / ".cache" / "ansiballz-memo"
        memo.mkdir(parents=True, exist_ok=True)
        os.environ["GPUFLEET_ANSIBALLZ_MEMO"] = str(memo)
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        install_collection()  # the controlling pytest: once, before any xdist worker starts
    else:
        # A worker must not copy it again: that would swap it under another worker's running playbook.
        helpers.installed_at(Path(workerinput["gpufleet_collection"]))


@pytest.hookimpl(optionalhook=True)  # an xdist hook
def pytest_configure_node(node: t.Any) -> None:
    node.workerinput["gpufleet_collection"] = str(install_collection())


def pytest_collection_modifyitems(config: pytest.Config, items: t.List[pytest.Item]) -> None:
    # Under `--dist loadfile` (scripts/test) a test file is one unit of work (its module-scoped sandbox fleet is made
    # once), handed out in collection order: files that take longest go first, so that none starts last. The sort is
    # stable: the order within a file is kept.
    if not hasattr(config, "workerinput"):
        return  # not an xdist worker: collection order (tests/reliability/gen_table.py relies on it)
    rank = {f: i for i, f in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda it: rank.get(it.nodeid.split("::")[0], len(rank)))


# Seconds per test file (setup + call + teardown of its tests, its module-scoped fleet included), summed where the
# reports arrive (the controlling pytest under xdist): printed with --durations, so that LONGEST_FIRST and
# CONTRIBUTING.md's times come from a run, not a guess.
_FILE_SECONDS: t.Dict[str, float] = {}
# CPU seconds per test file: the worker's own and its reaped children's (ansible-playbook, ansible-test, molecule; not
# what the sandbox hosts' sshd runs), measured where the test runs and carried in the report. The suite is CPU-bound on
# 2 cores: this, not the wall time each file spends sharing them, is what a file costs CI.
_FILE_CPU: t.Dict[str, float] = {}
_CPU_LAST: t.List[float] = []


def _cpu_now() -> float:
    import resource
    usage = (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    return sum(r.ru_utime + r.ru_stime for r in usage)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: t.Any) -> t.Generator[None, t.Any, None]:
    outcome = yield
    now = _cpu_now()
    if _CPU_LAST:
        outcome.get_result().user_properties.append(("cpu_s", now - _CPU_LAST[0]))
        _CPU_LAST[0] = now
    else:
        _CPU_LAST.append(now)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    f = report.nodeid.split("::")[0]
    _FILE_SECONDS[f] = _FILE_SECONDS.get(f, 0.0) + float(getattr(report, "duration", 0.0) or 0.0)
    _FILE_CPU[f] = _FILE_CPU.get(f, 0.0) + sum(float(v) for k, v in getattr(report, "user_properties", ()) if k == "cpu_s")


def pytest_terminal_summary(terminalreporter: t.Any, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not _FILE_SECONDS or config.getoption("durations", None) is None:
        return
    terminalreporter.write_sep("=", "slowest 25 test files (their tests' setup + call + teardown, summed)")
    for f, s in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:25]:
        terminalreporter.write_line("%8.1fs %s" % (s, f))
    terminalreporter.write_line("%8.1fs in all (%d files)" % (sum(_FILE_SECONDS.values()), len(_FILE_SECONDS)))
    terminalreporter.write_sep("=", "25 test files using the most CPU (the test process and its reaped children)")
    for f, s in sorted(_FILE_CPU.items(), key=lambda kv: -kv[1])[:25]:
        terminalreporter.write_line("%8.1fs %s" % (s, f))
    terminalreporter.write_line("%8.1fs in all" % sum(_FILE_CPU.values()))


@pytest.fixture(scope="session", autouse=True)
def installed_collection() -> Path:
    return install_collection()


@pytest.fixture
def fake_gpus(tmp_path):
    """Two fake PCIe-only H200s; tests may call .configure(...) to change them."""
    fg = FakeGpus(tmp_path / "nvml")
    fg.configure(gpus=2)
    yield fg
    fg.cleanup()
