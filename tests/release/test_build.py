# SPDX-License-Identifier: GPL-3.0-or-later
"""What users install works: `ansible-galaxy collection build` leaves development material out, and the
tarball, installed into a fresh collections path, runs a playbook by FQCN (gpufleet.serving.clean against
localhost with fake GPUs: it kills a real tagged GPU holder and verifies the GPU clean)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from helpers import FAKE_NVML_DIR, FakeGpus, PY, pid_alive, wait_for
from release_helpers import BIN, ROOT, clean_env, run

# Everything a user needs; anything else at the top of the tarball is a build_ignore gap.
ALLOWED_TOP = {"MANIFEST.json", "FILES.json", "README.md", "CHANGELOG.md", "changelogs", "docs", "meta", "plugins",
               "roles", "playbooks", "inventories"}
FORBIDDEN_PARTS = {"tests", "molecule", "tools", "scripts", "bench", "collections", ".venv", ".git", ".ansible",
                   "__pycache__", ".pytest_cache", ".cache", ".ci"}


@pytest.fixture(scope="module")
def tarball(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    r = run([str(BIN / "ansible-galaxy"), "collection", "build", str(ROOT), "--output-path", str(out)], cwd=out)
    assert r.returncode == 0, r.stdout
    version = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
    path = out / ("gpufleet-serving-%s.tar.gz" % version)
    assert path.is_file(), r.stdout
    return path


def test_tarball_leaves_out_tests_venvs_caches_and_tools(tarball):
    with tarfile.open(tarball) as tf:
        names = tf.getnames()
    top = {n.split("/")[0] for n in names}
    assert top <= ALLOWED_TOP, "unexpected in the tarball: %s" % sorted(top - ALLOWED_TOP)
    for n in names:
        parts = set(n.split("/"))
        assert not parts & FORBIDDEN_PARTS, n
        assert not n.endswith((".pyc", ".tar.gz", ".egg-info")) and ".egg-info/" not in n, n
    # ... and holds what users run.
    for must in ("plugins/modules/gpu_wait.py", "plugins/module_utils/_nvml.py", "plugins/callback/rollout_summary.py",
                 "roles/gpu_server/meta/argument_specs.yml", "playbooks/rollout.yml", "meta/runtime.yml",
                 "changelogs/changelog.yaml", "CHANGELOG.md", "docs/concepts.md"):
        assert must in names, must
    # The test-only fake NVML never ships.
    assert not [n for n in names if "fake" in n.lower()], [n for n in names if "fake" in n.lower()]


def test_manifest_matches_galaxy_yml(tarball):
    with tarfile.open(tarball) as tf:
        manifest = json.load(tf.extractfile("MANIFEST.json"))["collection_info"]
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert (manifest["namespace"], manifest["name"], manifest["version"]) == (galaxy["namespace"], galaxy["name"], galaxy["version"])


def test_installed_tarball_runs_a_playbook_by_fqcn(tarball, tmp_path):
    colls = tmp_path / "colls"
    r = run([str(BIN / "ansible-galaxy"), "collection", "install", str(tarball), "-p", str(colls)], cwd=tmp_path)
    assert r.returncode == 0, r.stdout
    installed = colls / "ansible_collections" / "gpufleet" / "serving"
    assert (installed / "MANIFEST.json").is_file() and not (installed / "tests").exists()

    # Fake GPUs for the playbook's modules (the fake pynvml comes from the test tree, never from the tarball).
    fg = FakeGpus(tmp_path / "nvml")
    fg.configure(gpus=2)
    name = "reltest%d" % os.getpid()
    ready = tmp_path / "holder-ready"
    holder = subprocess.Popen([PY, str(FAKE_NVML_DIR / "fake_gpu.py"), "hold", "--gpu", "0", "--mib", "20000",
                               "--ready-file", str(ready)], env=dict(fg.env, GPUFLEET_SERVICE=name))
    try:
        wait_for(ready.exists, 60, "tagged holder ready")
        # A user's directory: no ansible.cfg, only the fresh collections path.
        work = tmp_path / "work"
        work.mkdir()
        env = clean_env(ANSIBLE_COLLECTIONS_PATH=str(colls), FAKE_NVML_CONFIG=fg.env["FAKE_NVML_CONFIG"],
                        PYTHONPATH=str(FAKE_NVML_DIR), HOME=str(tmp_path / "home"))
        t0 = time.monotonic()
        r = run([str(BIN / "ansible-playbook"), "gpufleet.serving.clean", "-i", "localhost,", "-c", "local",
                 "-e", json.dumps({"ansible_python_interpreter": PY, "gpufleet_target": "localhost",
                                   "gpufleet_server_name": name, "gpufleet_server_run_dir": str(tmp_path / "run"),
                                   "gpufleet_server_kill_grace": 2, "gpufleet_server_clean_timeout": 10}), "-v"],
                cwd=work, env=env, timeout=120)
        assert r.returncode == 0, r.stdout[-4000:]
        assert time.monotonic() - t0 < 60
        holder.wait(timeout=10)
        assert not pid_alive(holder.pid)
        assert "Stop the service and verify its GPUs clean" in r.stdout, r.stdout[-3000:]
        assert '"signalled": 1' in r.stdout and '"matched_by": ["tag"]' in r.stdout, r.stdout[-3000:]
        assert '"killed": 1' in r.stdout and '"clean_s"' in r.stdout, r.stdout[-3000:]
        # The lock taken, the stop, the lock released: each changed the host.
        assert "changed=3 " in r.stdout and "failed=0 " in r.stdout, r.stdout[-2000:]
        r = run([str(BIN / "ansible-doc"), "-t", "role", "gpufleet.serving.gpu_server"], cwd=work, env=env)
        assert r.returncode == 0 and "ENTRY POINT: *audit*" in r.stdout and "ENTRY POINT: *main*" in r.stdout, r.stdout[-2000:]
        r = run([str(BIN / "ansible-doc"), "-F", "-t", "module", "gpufleet.serving"], cwd=work, env=env)
        assert r.returncode == 0 and str(installed / "plugins" / "modules" / "gpu_wait.py") in r.stdout, r.stdout
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_the_documented_install_reinstalls_the_same_version(tarball, tmp_path):
    """README.md's and the quickstart's `ansible-galaxy collection install` carry --force: without it, installing the
    version already there says "Nothing to do" and leaves the installed copy as it is (an edited or older build of
    the same version stays)."""
    said = {page: re.findall(r"^ansible-galaxy collection install .*$", (ROOT / page).read_text(), re.M)
            for page in ("README.md", "docs/quickstart.md")}
    for page, lines in said.items():
        assert lines, "%s documents no install" % page
        for line in lines:
            assert "--force" in line.split("#")[0].split(), "%s: %s" % (page, line)
    colls = tmp_path / "colls"
    installed = colls / "ansible_collections" / "gpufleet" / "serving" / "plugins" / "modules" / "gpu_wait.py"
    install = [str(BIN / "ansible-galaxy"), "collection", "install", str(tarball), "-p", str(colls)]
    assert run(install, cwd=tmp_path).returncode == 0
    good = installed.read_text()
    installed.write_text("# a stale copy\n")
    r = run(install, cwd=tmp_path)
    assert r.returncode == 0 and "Nothing to do" in r.stdout and installed.read_text() == "# a stale copy\n", r.stdout
    r = run(install + ["--force"], cwd=tmp_path)
    assert r.returncode == 0 and installed.read_text() == good, r.stdout
