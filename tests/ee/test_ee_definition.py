# SPDX-License-Identifier: GPL-3.0-or-later
"""execution-environment.yml reads what scripts/build-ee writes, and ansible-builder run alone on a checkout (before
scripts/build-ee made .cache/ee/build/) fails with a message that says to run scripts/build-ee.

ansible-builder checks the `galaxy` dependency file before anything else and reports a missing one only as "Dependency
file PATH does not exist.", so PATH carries the hint. No podman, no root: `ansible-builder create` only writes a build
context. ansible-builder is the one scripts/build-ee uses (its venv .cache/ee/venv, made on first use from the package
index).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MESSAGE = "Dependency file .cache/ee/build/run-scripts-build-ee-first/requirements.yml does not exist."


def _build_ee():
    loader = importlib.machinery.SourceFileLoader("gpufleet_build_ee", str(ROOT / "scripts" / "build-ee"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


BUILD_EE = _build_ee()


def _definition() -> dict:
    return yaml.safe_load((ROOT / "execution-environment.yml").read_text())


def test_the_definition_reads_the_files_build_ee_writes():
    ee = _definition()
    assert ROOT / ee["dependencies"]["galaxy"] == BUILD_EE.REQUIREMENTS
    for entry in ee["additional_build_files"]:
        assert (ROOT / entry["src"]).parent == BUILD_EE.BUILD, entry


def _create(cwd: Path) -> subprocess.CompletedProcess:
    exe = BUILD_EE.builder()
    return subprocess.run([str(exe), "create", "-f", "execution-environment.yml", "-c", "context"], cwd=str(cwd),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, check=False)


def test_ansible_builder_alone_says_to_run_build_ee(tmp_path):
    # A checkout where scripts/build-ee never ran: the definition and nothing under .cache/.
    shutil.copy(ROOT / "execution-environment.yml", tmp_path)
    p = _create(tmp_path)
    assert p.returncode != 0, p.stdout[-3000:]
    assert MESSAGE in p.stdout, p.stdout[-3000:]
    assert "build-ee" in MESSAGE

    # Once the files scripts/build-ee writes are there, the same command makes the build context from them.
    build = tmp_path / BUILD_EE.BUILD.relative_to(ROOT)
    reqs = tmp_path / BUILD_EE.REQUIREMENTS.relative_to(ROOT)
    reqs.parent.mkdir(parents=True)
    reqs.write_text(yaml.safe_dump({"collections": [{"name": "/build/collections/gpufleet-serving.tar.gz",
                                                     "type": "file"}]}))
    (build / "collections").mkdir()
    (build / "wheels").mkdir()
    (build / "pip.conf").write_text("[global]\nno-index = true\nfind-links = /wheels\n")
    p = _create(tmp_path)
    assert p.returncode == 0, p.stdout[-3000:]
    assert yaml.safe_load((tmp_path / "context" / "_build" / "requirements.yml").read_text()) == yaml.safe_load(
        reqs.read_text())
    assert "COPY _build/configs/pip.conf /etc/pip.conf" in (tmp_path / "context" / "Containerfile").read_text()
