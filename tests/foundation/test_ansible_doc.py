# SPDX-License-Identifier: GPL-3.0-or-later
"""`ansible-doc` renders every module of the collection (the ones in plugins/modules/ right now)."""
from __future__ import annotations

import ast
import json
import os
import subprocess

import pytest
import yaml

from helpers import ROOT, VENV_BIN

MODULES = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py") if not p.name.startswith("_"))


def _doc(name: str) -> dict:
    tree = ast.parse((ROOT / "plugins" / "modules" / (name + ".py")).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "DOCUMENTATION":
            return yaml.safe_load(node.value.value)
    raise AssertionError("%s has no DOCUMENTATION" % name)


def test_the_foundation_modules_exist():
    assert {"gpu_info", "gpu_wait", "process_kill"} <= set(MODULES)


def _ansible_doc(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), COLUMNS="2000")
    return subprocess.run([str(VENV_BIN / "ansible-doc")] + list(args), cwd=str(ROOT), env=env, check=False,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)


@pytest.fixture(scope="module")
def docs_json() -> dict:
    """What ansible-doc resolved for every module (fragments merged), in one call."""
    r = _ansible_doc("-j", *["gpufleet.serving.%s" % m for m in MODULES])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("module", MODULES)
def test_ansible_doc_renders(module, docs_json):
    src = _doc(module)
    assert src["module"] == module
    r = _ansible_doc("gpufleet.serving.%s" % module)
    assert r.returncode == 0, r.stderr
    assert "[WARNING]" not in r.stderr and "ERROR" not in r.stderr, r.stderr
    assert r.stdout.startswith("> MODULE gpufleet.serving.%s " % module)
    assert "OPTIONS" in r.stdout and "EXAMPLES" in r.stdout and "RETURN VALUES" in r.stdout
    first = src["description"][0] if isinstance(src["description"], list) else src["description"]
    plain = []
    for w in first.split():  # the leading words before any O()/C()/M() markup, which ansible-doc renders
        if "(" in w or ")" in w:
            break
        plain.append(w)
    if plain:
        assert " ".join(plain[:6]) in " ".join(r.stdout.split())
    doc = docs_json["gpufleet.serving.%s" % module]["doc"]
    assert doc["short_description"] == src["short_description"]
    assert doc["description"] == src["description"]
    assert {"check_mode", "diff_mode", "idempotent"} <= set(doc.get("attributes", {})), "attributes fragment missing"
