# SPDX-License-Identifier: GPL-3.0-or-later
"""The suite's AnsiballZ memo (tests/accel/_gpufleet_ansiballz_memo.py) changes how fast the suite's ansible-playbook
builds a payload and how fast its modules start, never what they run: every gpufleet module's zip holds the same
sources, byte for byte, with the memo cold, warm and off, and with it a checked .pyc beside each; a warm memo compiles
only the modules themselves; an edited module_util is parsed again (its new import reaches the payload); the target's
interpreter loads the bytecode, and the source where the .pyc does not match it; the collection loader gets the code
compile() gives for the file; a built payload is reused by later runs until what it is made of changes."""
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
    assert warm["modules"] == cold["modules"]
    for name, files in off["modules"].items():
        assert not any(n.endswith(".pyc") for n in files), name
        sources = {n: h for n, h in cold["modules"][name].items() if not n.endswith(".pyc")}
        assert sources == files, name
        assert set(cold["modules"][name]) - set(files) == {n + "c" for n in files if n.endswith(".py")}, name
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
    off = _payloads(collections, None)["modules"]["balancer"]
    assert {n: h for n, h in after["modules"]["balancer"].items() if not n.endswith(".pyc")} == off


_IMPORT_PROBE = r"""
import importlib, importlib.util, json, sys
sys.path.insert(0, sys.argv[1])
m = importlib.import_module(sys.argv[2])
print(json.dumps({"origin": m.__spec__.origin, "edited": hasattr(m, "GPUFLEET_EDITED"),
                  "magic": importlib.util.MAGIC_NUMBER.hex()}))
"""


def _import_from(python: str, zip_path: Path, name: str) -> dict:
    out = subprocess.run([python, "-c", _IMPORT_PROBE, str(zip_path), name], capture_output=True, text=True, timeout=60,
                         check=True, env={"PATH": os.environ.get("PATH", "")})
    return json.loads(out.stdout)


def test_the_target_interpreter_loads_the_bytecode_and_the_source_where_they_differ(collections, tmp_path):
    """What a module run on a sandbox host does: zipimport from the payload with the hosts' interpreter."""
    import zipfile
    from sandbox.fleet import host_python
    memo, zips = tmp_path / "memo", tmp_path / "zips"
    memo.mkdir()
    zips.mkdir()
    subprocess.run([str(VENV_PY), str(HERE / "ansiballz_payloads.py"), str(collections), str(zips)], check=True,
                   env=dict(os.environ, GPUFLEET_ANSIBALLZ_MEMO=str(memo)), capture_output=True, timeout=300)
    python, name = host_python(), "ansible_collections.gpufleet.serving.plugins.module_utils._balancer"
    got = _import_from(python, zips / "balancer.zip", name)
    same_magic = got["magic"] == _import_from(str(VENV_PY), zips / "balancer.zip", "json")["magic"]
    # Another Python minor version on the target (another magic number) compiles the source, as without the memo.
    assert got["origin"].endswith("_balancer.pyc" if same_magic else "_balancer.py"), got
    assert not got["edited"]
    # The source changed under its .pyc (hash-based and checked): the target compiles the new source.
    arc = "ansible_collections/gpufleet/serving/plugins/module_utils/_balancer.py"
    stale = tmp_path / "stale.zip"
    with zipfile.ZipFile(zips / "balancer.zip") as zi, zipfile.ZipFile(stale, "w") as zo:
        for info in zi.infolist():
            data = zi.read(info)
            zo.writestr(info, data + b"\nGPUFLEET_EDITED = 1\n" if info.filename == arc else data)
    got = _import_from(python, stale, name)
    assert got["origin"].endswith("_balancer.py") and got["edited"], got


_LOADER_PROBE = r"""
import json, sys
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
_AnsibleCollectionFinder(paths=[sys.argv[1]])._install()
import importlib
name = "ansible_collections.gpufleet.serving.plugins.module_utils._envblock"
m = importlib.import_module(name)
code = m.__loader__.get_code(name)
fresh = compile(m.__loader__.get_source(name), m.__loader__.get_filename(name), "exec", flags=0, dont_inherit=True)
print(json.dumps({"same": code == fresh and code.co_filename == fresh.co_filename, "file": code.co_filename}))
"""


def test_the_collection_loader_gets_the_code_compile_gives(collections, tmp_path):
    memo = tmp_path / "memo"
    memo.mkdir()
    env = dict(os.environ, GPUFLEET_ANSIBALLZ_MEMO=str(memo))
    runs = []
    for _run in range(2):  # cold: compiled and stored; warm: read from the memo
        out = subprocess.run([str(VENV_PY), "-c", _LOADER_PROBE, str(collections)], env=env, capture_output=True,
                             text=True, timeout=120, check=True)
        runs.append((json.loads(out.stdout), sorted((p.name, p.stat().st_mtime_ns) for p in memo.glob("*.code"))))
    (cold, cold_files), (warm, warm_files) = runs
    assert cold["same"] and warm["same"], runs
    assert cold["file"].endswith("module_utils/_envblock.py")
    assert cold_files and warm_files == cold_files  # the warm run wrote nothing (not even the same file again): it read


_PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: A gpufleet module (its payload from the collection under test)
      gpufleet.serving.process_env:
        tag: GPUFLEET_NO_SUCH_SERVICE=memo-test
        expected: {NCCL_ALGO: Ring}
        target: all_selected
        allow_empty: true
    - name: An ansible-core module
      ansible.builtin.ping:
"""


def test_a_built_payload_is_reused_by_later_runs_until_a_module_util_changes(collections, tmp_path):
    """ansible-core's per-run cache of built payloads, kept across runs in a directory named by what the payload is
    made of: a second run reuses it (the file is not written again), an edited module_util gets a new one."""
    memo = tmp_path / "memo"
    memo.mkdir()
    play = tmp_path / "play.yml"
    play.write_text(_PLAY)
    env = dict(os.environ, GPUFLEET_ANSIBALLZ_MEMO=str(memo), ANSIBLE_COLLECTIONS_PATH=str(collections))

    def run() -> dict:
        r = helpers.run_playbook(play, env=env, timeout=120)
        assert r.returncode == 0 and "ok=2" in r.stdout, r.stdout[-3000:]
        return {str(p.relative_to(memo)): p.stat().st_mtime_ns for p in (memo / "built").glob("*/ansiballz_cache/*")
                if not p.name.endswith(".lock")}

    first = run()
    names = sorted(n.split("/")[-1] for n in first)
    assert names == ["ansible.modules.ping-ZIP_DEFLATED-none",
                     "ansible_collections.gpufleet.serving.plugins.modules.process_env-ZIP_DEFLATED-none"], first
    assert run() == first  # reused: neither written again nor a new one
    mu = collections / "ansible_collections/gpufleet/serving/plugins/module_utils/_nolog.py"  # any module_util
    mu.write_text(mu.read_text() + "\n# edited\n")
    third = run()
    new = {n for n in third if n not in first}
    assert [n.split("/")[-1] for n in new] == ["ansible_collections.gpufleet.serving.plugins.modules.process_env-ZIP_DEFLATED-none"], third
    assert all(third[n] == first[n] for n in first)  # the ping payload did not depend on it
    mu.write_text(mu.read_text() + "# edited again\n")
    r = helpers.run_playbook(play, env=dict(env, GPUFLEET_ANSIBALLZ_MEMO=""), timeout=120)  # off: built as without it
    assert r.returncode == 0, r.stdout[-3000:]
    assert sorted((memo / "built").iterdir()) == sorted({(memo / n).parent.parent for n in third})


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
