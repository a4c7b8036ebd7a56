# SPDX-License-Identifier: GPL-3.0-or-later
"""The newest ansible-core, pinned in tests/requirements-core-newest.txt and installed in .venv-core-newest.

ansible-core 2.20+ needs Python >= 3.12 on the controller, so .venv (Python 3.11) stays on 2.19 and runs
everything else. scripts/setup makes the second venv only where Python 3.13 or 3.12 exists; without it these
tests skip with that reason. With it: `ansible-test sanity` (tests/run_sanity.py run by that venv's Python,
so that venv's ansible-test; the sanity tests whose result depends on the core, NEWEST_SANITY) and a playbook run
through the rollout_summary callback (controller code no unit test reaches). The unit tests run on the newest core
under `ansible-test units` (tests/foundation/test_ansible_test_units.py).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import typing as t

import pytest
from ansible.release import __version__ as CORE

from collection_copy import private_collections
from helpers import ROOT

NEWEST_PY = ROOT / ".venv-core-newest" / "bin" / "python"
REQUIREMENTS = ROOT / "tests" / "requirements-core-newest.txt"
PIN = re.search(r"^ansible-core==(\S+)$", REQUIREMENTS.read_text(), re.M).group(1)

needs_newest = pytest.mark.skipif(
    not NEWEST_PY.exists(),
    reason="no .venv-core-newest: scripts/setup makes it only where Python 3.13 or 3.12 exists "
           "(ansible-core %s needs Python >= 3.12 on the controller)" % PIN)


def newest_env(**extra: str) -> t.Dict[str, str]:
    """os.environ without what this pytest run set for .venv's tools; the newest venv's bin first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANSIBLE_", "PYTEST_")) and k not in ("PYTHONPATH", "FAKE_NVML_CONFIG")}
    env["PATH"] = str(NEWEST_PY.parent) + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env.update(ANSIBLE_NOCOLOR="1", NO_COLOR="1", ANSIBLE_FORCE_COLOR="0")
    env.update(extra)
    return env


def run(argv: t.Sequence[str], timeout: float, **kw: t.Any) -> subprocess.CompletedProcess:
    kw.setdefault("cwd", str(ROOT))
    kw.setdefault("env", newest_env())
    return subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                          check=False, **kw)


def test_the_docs_name_the_cores_ci_tests():
    # .venv's core, running this test (tests/release/test_versioning.py ties it to requires_ansible and pyproject).
    main_core = ".".join(CORE.split(".")[:2])
    assert tuple(int(x) for x in PIN.split(".")[:2]) > tuple(int(x) for x in main_core.split("."))
    for page, cores in (("README.md", (main_core, PIN)), ("docs/quickstart.md", (main_core, PIN)), ("docs/README.md", (PIN,))):
        text = " ".join((ROOT / page).read_text().split())  # prose wraps anywhere
        for core in cores:
            assert "ansible-core %s" % core in text, "%s does not name ansible-core %s" % (page, core)
    assert (ROOT / "tests" / "sanity" / ("ignore-%s.txt" % ".".join(PIN.split(".")[:2]))).is_file()


@needs_newest
def test_the_newest_venv_holds_the_pinned_core_on_python_3_12_or_later():
    r = run([str(NEWEST_PY), "-c", "import sys, ansible.release; print(ansible.release.__version__, *sys.version_info[:2])"],
            timeout=60)
    assert r.returncode == 0, r.stdout
    version, major, minor = r.stdout.split()
    assert version == PIN, "scripts/setup installs tests/requirements-core-newest.txt; re-run it"
    assert (int(major), int(minor)) >= (3, 12)


PLAYBOOK = """
- name: Pretend rollout
  hosts: all
  gather_facts: false
  tasks:
    - name: Record a result like the gpu_server role
      ansible.builtin.set_fact:
        gpufleet_server_result: {restarted: true, reasons: [forced], workers_verified: 2, timings: {kill_s: 1.5}}

    - name: Fail one host like the role's rescue
      ansible.builtin.fail:
        msg: demo failure
      when: inventory_hostname == 'hostb'
"""


@needs_newest
def test_rollout_summary_callback_on_the_newest_core(tmp_path):
    (tmp_path / "pb.yml").write_text(PLAYBOOK)
    env = newest_env(ANSIBLE_COLLECTIONS_PATH=str(private_collections()), HOME=str(tmp_path),
                     ANSIBLE_CALLBACKS_ENABLED="gpufleet.serving.rollout_summary", GPUFLEET_SUMMARY_DIR=str(tmp_path / "out"))
    r = run([str(NEWEST_PY.parent / "ansible-playbook"), "-i", "hosta,hostb,", "-c", "local", "-e",
             "ansible_python_interpreter=%s" % NEWEST_PY, str(tmp_path / "pb.yml")], timeout=180, cwd=str(tmp_path), env=env)
    assert r.returncode == 2, r.stdout  # hostb failed
    # A callback that raises is only a warning ("Failure using method ..."): the run itself goes on.
    assert "Failure using method" not in r.stdout and "[DEPRECATION WARNING]" not in r.stdout, r.stdout
    rows = {c[0]: c for c in ([x.strip() for x in ln.split("|")[1:-1]] for ln in
                              r.stdout[r.stdout.index("GPUFLEET ROLLOUT SUMMARY"):].splitlines() if ln.startswith("|"))}
    assert rows["hosta"][1] == "ok" and rows["hostb"][1] == "failed" and "demo failure" in rows["hostb"], rows
    hosts = {h["host"]: h for h in json.loads((tmp_path / "out" / "rollout-summary.json").read_text())["hosts"]}
    assert hosts["hosta"]["workers_verified"] == 2 and hosts["hostb"]["failure"] == "demo failure", hosts


def test_callback_reads_the_public_task_result_api():
    # _result/_host/_task are slated for deprecation (core 2.23); .result/.host/.task exist from 2.19 on.
    src = (ROOT / "plugins" / "callback" / "rollout_summary.py").read_text()
    assert not re.findall(r"result\._(?:result|host|task)\b", src)


# What the newest core's `ansible-test sanity` adds to .venv's full run (test_sanity.py) on the same files: the tests
# whose result depends on the core (its doc and argspec schemas, its plugin loader, its deprecations) or on Python 3.12+.
# - validate-modules, ansible-doc, runtime-metadata, action-plugin-docs: the core's schemas and loader.
# - import: the plugins imported under the newest core on Python 3.12+; compile: every file compiles on that Python.
# - pylint on plugins/: its ansible checkers (deprecated calls against the core's version, unwanted functions) read the
#   core; the generic rules on tests/ are the same files .venv's run lints (170 s of the 2.19 run is pylint).
# - ignores: the ignore file of this core is well formed.
# Left to .venv's run: pep8, yamllint, shellcheck, changelog and the code-smell scripts (no-*, shebang, symlinks,
# line-endings, empty-init, use-*, replace-urlopen): the same scripts (ansible-test 2.19 and 2.21 differ there only in
# runtime-metadata's, kept above) or pinned style tools on the same files; pep8 alone took 114 s.
NEWEST_SANITY = [
    ["--test", "pylint", "plugins/"],
    ["--test", "validate-modules", "--test", "ansible-doc", "--test", "runtime-metadata", "--test", "action-plugin-docs",
     "--test", "import", "--test", "compile", "--test", "ignores"],
]


@needs_newest
@pytest.mark.slow
def test_ansible_test_sanity_passes_on_the_newest_core():
    out = ""
    for args in NEWEST_SANITY:
        r = run([str(NEWEST_PY), str(ROOT / "tests" / "run_sanity.py")] + args, timeout=1500)
        errors = [ln for ln in r.stdout.splitlines() if ln.startswith(("ERROR:", "FATAL:"))]
        assert r.returncode == 0, "\n".join(errors) or r.stdout[-6000:]
        out += r.stdout
    ran = set(re.findall(r'^Running sanity test "([^"]+)"', out, re.M))
    assert ran == {a for args in NEWEST_SANITY for a in args[1::2] if not a.endswith("/")}, ran
    assert re.search(r'Running sanity test "import" on Python 3\.1[2-9]', out), out[-3000:]
    assert re.search(r'Running sanity test "compile" on Python 3\.1[2-9]', out), out[-3000:]
