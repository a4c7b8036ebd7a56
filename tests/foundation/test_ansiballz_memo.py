# SPDX-License-Identifier: GPL-3.0-or-later
"""The suite's AnsiballZ dependency memo (tests/accel/_gpufleet_ansiballz_memo.py) changes how fast the suite's
ansible-playbook builds a module's payload, never what it builds: every gpufleet module's zip holds the same files,
byte for byte, with the memo cold, warm and off; a warm memo compiles only the modules themselves; an edited
module_util is parsed again (its new import reaches the payload)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import helpers

pytestmark = pytest.mark.fast

HERE = Path(__file__).resolve().parent
VENV_PY = Path(sys.executable)


def _payloads(collections: Path, memo) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_ANSIBALLZ_MEMO"}
    if memo is not None:
        env["GPUFLEET_ANSIBALLZ_MEMO"] = str(memo)
    out = subprocess.run([str(VENV_PY), str(HERE / "ansiballz_payloads.py"), str(collections)], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def collections(tmp_path_factory):
    """A copy of the installed collection (the last test edits a module_util in it)."""
    root = tmp_path_factory.mktemp("memo") / "collections"
    shutil.copytree(helpers.install_collection(), root / "ansible_collections/gpufleet/serving",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_every_payload_is_the_same_with_the_memo_cold_warm_and_off(collections, tmp_path):
    memo = tmp_path / "memo"
    memo.mkdir()
    off, cold, warm = _payloads(collections, None), _payloads(collections, memo), _payloads(collections, memo)
    assert not off["memo_patched"] and cold["memo_patched"] and warm["memo_patched"]
    assert len(off["modules"]) >= 10
    assert cold["modules"] == off["modules"] and warm["modules"] == off["modules"]
    # Off, every module_util is compiled once per module that pulls it in; warm, only each module itself (its metadata).
    assert off["compiled"] > 10 * len(off["modules"])
    assert warm["compiled"] == len(off["modules"])


def test_an_edited_module_util_is_parsed_again(collections, tmp_path):
    memo = tmp_path / "memo"
    memo.mkdir()
    mu = collections / "ansible_collections/gpufleet/serving/plugins/module_utils"
    before = _payloads(collections, memo)["modules"]["balancer"]
    assert not any(n.endswith("module_utils/_runid.py") for n in before), sorted(before)
    src = mu / "_balancer.py"
    text = src.read_text()
    marker = "from __future__ import annotations\n"
    assert marker in text
    src.write_text(text.replace(marker, marker + "from ansible_collections.gpufleet.serving.plugins.module_utils "
                                "import _runid  # noqa: F401\n", 1))
    after = _payloads(collections, memo)
    assert any(n.endswith("module_utils/_runid.py") for n in after["modules"]["balancer"]), sorted(after["modules"]["balancer"])
    assert after["modules"]["balancer"] == _payloads(collections, None)["modules"]["balancer"]


def test_setup_attaches_the_memo_to_the_venv_only_when_asked():
    probe = "import sys; print('_gpufleet_ansiballz_memo' in sys.modules, len(sys.meta_path))"
    base = {k: v for k, v in os.environ.items() if k != "GPUFLEET_ANSIBALLZ_MEMO"}
    # Empty, as `GPUFLEET_ANSIBALLZ_MEMO= ./scripts/test` sets it (CONTRIBUTING.md): off.
    off = subprocess.run([str(VENV_PY), "-c", probe], env=dict(base, GPUFLEET_ANSIBALLZ_MEMO=""), capture_output=True,
                         text=True, check=True).stdout.split()
    on = subprocess.run([str(VENV_PY), "-c", probe], env=dict(base, GPUFLEET_ANSIBALLZ_MEMO=str(HERE)),
                        capture_output=True, text=True, check=True).stdout.split()
    assert off[0] == "True" and on[0] == "True"  # the .pth that scripts/setup writes
    assert int(on[1]) == int(off[1]) + 1  # its import hook only where the variable names a directory
