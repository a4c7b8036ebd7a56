# SPDX-License-Identifier: GPL-3.0-or-later
"""The suite's AnsiballZ memo (tests/accel/_gpufleet_ansiballz_memo.py) changes how fast the suite's ansible-playbook
builds a payload and how fast its modules start, never what they run: every gpufleet module's zip holds the same
sources, byte for byte, with the memo cold, warm and off, and with it a checked .pyc beside each; a warm memo compiles
only the modules themselves; an edited module_util is parsed again (its new import reaches the payload); the target's
interpreter loads the bytecode, and the source where the .pyc does not match it; the collection loader gets the code
compile() gives for the file; a built payload is reused by later runs until what it is made of changes; a memoised YAML
parse gives the types, values and data tags (Origin, TrustedAsTemplate) of a real one, a new object each call, an
edited file is parsed again, what it cannot give back whole (a vault value, a parse that warns) is parsed every time,
and ansible-playbook prints the same with it cold, warm and off; a memoised Jinja compile is the code object the real
one gives (what it renders, its errors and their template lines), a changed template or delimiter is compiled again,
and ansible-playbook prints the same with it cold, warm and off."""
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


_YAML_PROBE = r"""
import json, sys, yaml
from yaml.constructor import BaseConstructor
from ansible.module_utils._internal._datatag import AnsibleTagHelper
from ansible.module_utils.common.yaml import yaml_load
from ansible.parsing.dataloader import DataLoader
from ansible.parsing.yaml.loader import AnsibleLoader
from ansible.utils.collection_loader._collection_meta import _meta_yml_to_dict
from ansible._internal._datatag._tags import Origin, TrustedAsTemplate

parsed = []
real_get_single_data = BaseConstructor.get_single_data


def counting(self):
    parsed.append(1)
    return real_get_single_data(self)


BaseConstructor.get_single_data = counting


def real(stream, loader_type):  # yaml.load's own body, past the memo
    loader = loader_type(stream)
    try:
        return real_get_single_data(loader)
    finally:
        loader.dispose()


def shape(x, seen):
    # Type, data tags and value all the way down; a container met again is named by the order it was first met in.
    if isinstance(x, (dict, list)):
        if id(x) in seen:
            return ["shared", seen[id(x)]]
        seen[id(x)] = len(seen)
    tags = sorted(repr(tg) for tg in AnsibleTagHelper.tags(x))
    name = type(x).__module__ + "." + type(x).__qualname__
    if isinstance(x, dict):
        return [name, tags, [[shape(k, seen), shape(v, seen)] for k, v in x.items()]]
    if isinstance(x, list):
        return [name, tags, [shape(v, seen) for v in x]]
    return [name, tags, repr(x)]


path, runtime = sys.argv[1], sys.argv[2]
text = open(path).read()
plain = text.replace("!unsafe ", "")  # a tag only ansible-core's loaders know
plain_path = path + ".plain.yml"
with open(plain_path, "w") as f:
    f.write(plain)


def from_file():  # as ansible-core reads config/base.yml
    with open(plain_path, "rb") as f:
        return yaml_load(f)


with open(runtime, "rb") as f:
    runtime_bytes = f.read()
cases = {
    # DataLoader.load_from_file -> from_yaml: a role's or a playbook's file, its strings trusted as templates
    "dataloader": (lambda: DataLoader().load_from_file(path, trusted_as_template=True),
                   lambda: real(TrustedAsTemplate().tag(Origin(path=path).tag(text)), AnsibleLoader)),
    # the collection loader's meta/runtime.yml (CBaseLoader: every scalar a str)
    "meta": (lambda: _meta_yml_to_dict(runtime_bytes, ("x", runtime)),
             lambda: real(runtime_bytes, getattr(yaml, "CBaseLoader", yaml.BaseLoader))),
    # ansible-core's config definitions and module metadata (CSafeLoader)
    "safe": (lambda: yaml_load(plain), lambda: real(plain, getattr(yaml, "CSafeLoader", yaml.SafeLoader))),
    "safe-file": (from_file, lambda: real(plain, getattr(yaml, "CSafeLoader", yaml.SafeLoader))),
    # a plugin's DOCUMENTATION, its Origin a path alone (line numbers start at 1)
    "docs": (lambda: yaml.load(Origin(path=path).tag(text), Loader=AnsibleLoader),
             lambda: real(Origin(path=path).tag(text), AnsibleLoader)),
}
out = {}
for name, (entry, fresh) in cases.items():
    calls = []
    for _call in range(4):
        del parsed[:]
        got = entry()
        calls.append({"parsed": len(parsed), "same": shape(got, {}) == shape(fresh(), {}), "obj": got})
    first, last = calls[-2]["obj"], calls[-1]["obj"]
    kids = [(list(x.values()) if isinstance(x, dict) else list(x)) for x in (first, last)]
    out[name] = {"parsed": [c["parsed"] for c in calls], "same": [c["same"] for c in calls],
                 "fresh": first is not last and all(a is not b for a, b in zip(*kids) if isinstance(a, (dict, list)))}
print(json.dumps({"patched": yaml.load.__module__, "cases": out}))
"""

_YAML_DOC = """\
# A role's tasks: every kind of value the loaders build, a few of them shared through an anchor, with enough text
# that the memo keeps it (a short document parses faster than its memo file is read).
- name: Anchored defaults
  vars: &defaults
    port: 8080
    ratio: 0.25
    enabled: true
    nothing: null
    when_built: 2024-05-01
    stamp: 2024-05-01 12:30:00
    greeting: "{{ 'hel' ~ 'lo' }}"
    raw: !unsafe "{{ not a template }}"
    hosts: [a, b, c]
  ansible.builtin.debug:
    msg: "{{ greeting }}"
- name: The same defaults again
  vars: *defaults
  ansible.builtin.debug:
    msg: |
      several
      lines
"""


def _yaml_probe(path: Path, memo, runtime: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_ANSIBALLZ_MEMO"}
    if memo is not None:
        env["GPUFLEET_ANSIBALLZ_MEMO"] = str(memo)
    env["ANSIBLE_CONFIG"] = str(helpers.ROOT / "ansible.cfg")
    out = subprocess.run([str(VENV_PY), "-c", _YAML_PROBE, str(path), str(runtime)], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _runtime_yml() -> Path:
    import ansible
    return Path(ansible.__file__).parent / "config" / "ansible_builtin_runtime.yml"


def test_a_memoised_yaml_parse_is_the_real_one_with_its_tags_and_a_fresh_object(tmp_path):
    """Each entry point ansible-core parses YAML through: the first parse of a text marks it, the second stores it, the
    later ones unpickle it; each result has the types, values and data tags (Origin with path, line and column;
    TrustedAsTemplate, not on an !unsafe string) of a real parse, shared where the document shares, and is a new
    object on every call."""
    doc = tmp_path / "tasks.yml"
    doc.write_text(_YAML_DOC)
    memo = tmp_path / "memo"
    memo.mkdir()
    off = _yaml_probe(doc, None, _runtime_yml())
    assert off["patched"] == "yaml"
    assert all(c["parsed"] == [1, 1, 1, 1] and all(c["same"]) for c in off["cases"].values()), off
    on = _yaml_probe(doc, memo, _runtime_yml())
    assert on["patched"] == "_gpufleet_ansiballz_memo"
    for name, case in on["cases"].items():
        assert case["same"] == [True] * 4, (name, case)
        assert case["parsed"] == [1, 1, 0, 0], (name, case)  # marked, stored, then read from the memo
        assert case["fresh"], (name, case)
    again = _yaml_probe(doc, memo, _runtime_yml())  # another process: read from the first call on
    assert all(c["parsed"] == [0, 0, 0, 0] and all(c["same"]) for c in again["cases"].values()), again


def test_an_edited_yaml_file_is_parsed_again(tmp_path):
    doc = tmp_path / "tasks.yml"
    doc.write_text(_YAML_DOC)
    memo = tmp_path / "memo"
    memo.mkdir()
    _yaml_probe(doc, memo, _runtime_yml())
    doc.write_text(_YAML_DOC.replace("port: 8080", "port: 8081"))
    got = _yaml_probe(doc, memo, _runtime_yml())
    # the changed text is parsed (marked, stored, read back) and equals its real parse; runtime.yml is read as before
    for name in ("dataloader", "safe", "safe-file", "docs"):
        assert got["cases"][name]["parsed"] == [1, 1, 0, 0] and all(got["cases"][name]["same"]), (name, got)
    assert got["cases"]["meta"]["parsed"] == [0, 0, 0, 0], got


_YAML_NOT_KEPT = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from yaml.constructor import BaseConstructor
from ansible.parsing.dataloader import DataLoader
parsed = []
real_get_single_data = BaseConstructor.get_single_data
BaseConstructor.get_single_data = lambda self: parsed.append(1) or real_get_single_data(self)
for _call in range(3):
    data = DataLoader().load_from_file(sys.argv[1])
print(json.dumps({"parsed": len(parsed), "type": type(data[0]["x"]).__name__}))
"""

_VAULTED = """\
# An encrypted value (its ciphertext is the text of an EncryptedString), and padding enough for the memo to consider it
- x: !vault |
    $ANSIBLE_VAULT;1.1;AES256
    62313365396662343061393464336163383764373764613633653634306231386433626436623361
    6134333665353966363534333632666535333761666131620a663537646436643839616531643561
    63396265333966386166373632626539326166353965363262633030333739313335336463353663
    6166383436653135640a396164643261323231383566376236346532363530303131386135613433
    3465
"""

_DUPLICATE_KEY = """\
# A duplicate key: ansible-core warns about it on each parse (DUPLICATE_YAML_DICT_KEY), so it is never memoised
- x: 1
  x: 2
  padding: "enough text that the memo would otherwise keep this document, as it does any of two hundred characters"
"""


@pytest.mark.parametrize("text, kind, warns", [(_VAULTED, "EncryptedString", False), (_DUPLICATE_KEY, "_AnsibleTaggedInt", True)],
                         ids=["vault", "duplicate-key"])
def test_yaml_the_memo_cannot_give_back_whole_is_parsed_every_time(tmp_path, text, kind, warns):
    doc = tmp_path / "vars.yml"
    doc.write_text(text)
    memo = tmp_path / "memo"
    memo.mkdir()
    env = dict(os.environ, GPUFLEET_ANSIBALLZ_MEMO=str(memo), ANSIBLE_CONFIG=str(helpers.ROOT / "ansible.cfg"))
    for _run in range(2):
        out = subprocess.run([str(VENV_PY), "-c", _YAML_NOT_KEPT, str(doc)], env=env, capture_output=True, text=True,
                             timeout=120, check=True)
        assert json.loads(out.stdout.strip().splitlines()[-1]) == {"parsed": 3, "type": kind}, out.stdout
        assert ("duplicate mapping key" in out.stdout + out.stderr) == warns, out.stderr
    assert not list(memo.glob("*.yaml.pickle"))


_YAML_PLAY = """\
# A play whose output shows what the parse gave: values, a template its trusted strings render, an !unsafe string
# left as it is, and an error that names the file, line and column of the task (the Origin tags).
- hosts: localhost
  gather_facts: false
  vars_files: [vars.yml]
  roles: [memo_role]
  tasks:
    - name: Values and templates
      ansible.builtin.debug:
        msg: "{{ greeting }} {{ port + 1 }} {{ ratio }} {{ when_built }} {{ hosts | join(',') }} {{ raw }}"
    - name: An error naming where it comes from
      ansible.builtin.debug:
        msg: "{{ no_such_variable }}"
      ignore_errors: true
"""

_YAML_VARS = """\
# Variables the play reads, long enough for the memo to keep them (a short document parses faster than its memo file
# is read); the same text the role's defaults hold would be keyed apart by its path (each value's Origin).
greeting: "{{ 'hel' ~ 'lo' }}"
port: 8080
ratio: 0.25
when_built: 2024-05-01
hosts: [a, b, c]
raw: !unsafe "{{ not a template }}"
"""

_YAML_ROLE_TASKS = """\
# The role's tasks, as a role of the collection has them; the loop shows the loop values parsed from the file.
- name: A role task
  ansible.builtin.debug:
    msg: "{{ item.name }} listens on {{ item.port }} ({{ role_greeting }})"
  loop:
    - {name: first, port: 1}
    - {name: second, port: 2}
"""


def test_ansible_playbook_prints_the_same_with_the_yaml_memo_cold_warm_and_off(tmp_path):
    play = tmp_path / "play.yml"
    play.write_text(_YAML_PLAY)
    (tmp_path / "vars.yml").write_text(_YAML_VARS)
    role = tmp_path / "roles" / "memo_role"
    (role / "tasks").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "tasks" / "main.yml").write_text(_YAML_ROLE_TASKS)
    (role / "defaults" / "main.yml").write_text(_YAML_VARS.replace("greeting:", "role_greeting:"))
    memo = tmp_path / "memo"
    memo.mkdir()

    def run(memo_dir: str) -> str:
        r = helpers.run_playbook(play, env=dict(os.environ, GPUFLEET_ANSIBALLZ_MEMO=memo_dir), timeout=120)
        assert r.returncode == 0, r.stdout[-3000:]
        return r.stdout

    off = run("")
    assert "hello 8081 0.25 2024-05-01 a,b,c {{ not a template }}" in off, off
    assert "first listens on 1 (hello)" in off and "second listens on 2 (hello)" in off, off
    assert "Origin: %s:13:14" % play in off, off  # the failing task's msg, by its Origin
    runs = [run(str(memo)) for _run in range(3)]  # marked, stored, read
    kept = sorted(p.name for p in memo.glob("*.yaml.pickle"))
    assert len(kept) >= 4, kept  # the play, its vars file, the role's tasks and defaults (and ansible-core's own)
    assert runs == [off] * 3


_JINJA_PROBE = r"""
import json, sys
import jinja2.environment as je
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from ansible._internal._datatag._tags import TrustedAsTemplate
from ansible._internal._templating._jinja_bits import AnsibleEnvironment, TemplateOverrides, _TemplateCompileContext

generated = []
real_generate = je.Environment._generate


def counting(self, *args, **kwargs):
    generated.append(1)
    return real_generate(self, *args, **kwargs)


je.Environment._generate = counting  # under the memo: what a real compile does
templar = Templar(loader=DataLoader(), variables={"port": 8080, "names": ["a", "b"], "zero": 0, "path": "c:\\new"})
env = templar._engine.environment


def template_frames(ex, src):
    # the frames of the template's code in each traceback of the error's chain: the code's line, and the template's
    # line jinja2 maps it to (the code's debug_info)
    import traceback
    frames = []
    while ex is not None:
        frames += [[f.filename, f.lineno, env.from_string(src).get_corresponding_lineno(f.lineno)]
                   for f in traceback.extract_tb(ex.__traceback__) if f.filename == "<template>"]
        ex = ex.__cause__ or ex.__context__
    return frames


out = []
for kind, src in json.loads(sys.argv[1]):
    del generated[:]
    frames, error = [], None
    try:
        if kind == "expression":
            got = templar.evaluate_expression(TrustedAsTemplate().tag(src))
        else:
            got = templar.template(TrustedAsTemplate().tag(src))
        got = repr(got)
    except Exception as ex:
        got, error = "%s: %s" % (type(ex).__name__, ex), ex
    compiled = len(generated)
    if got.startswith("AnsibleTemplateError"):
        frames = template_frames(error, src)
    same = None
    if kind == "template" and not got.startswith("AnsibleTemplateSyntaxError"):
        # the code through the memo (a second sight of the source) and the real compile's: the same code object; in the
        # environment ansible-core compiles it with (an overlay of the `#jinja2:` header's settings)
        body, overlay = templar._engine._create_overlay(src, TemplateOverrides.DEFAULT)
        with _TemplateCompileContext(escape_backslashes=True):
            memo, fresh = overlay.compile(body), je.Environment.compile(overlay, body)
        same = memo == fresh and memo.co_filename == fresh.co_filename
    out.append({"got": got, "compiled": compiled, "same": same, "frames": frames})
print(json.dumps({"patched": AnsibleEnvironment.compile.__module__, "out": out}))
"""

_JINJA_TEMPLATES = [
    ["template", "{{ port + 1 }} {{ names | join(',') | upper }} {{ names | map('upper') | list }}"],
    ["template", "{% if port > 8000 %}high {{ port }}{% else %}low{% endif %}\n{% for n in names %}{{ loop.index }}={{ n }} {% endfor %}"],
    ["template", "{{ path }} {{ 'c:\\new' }}"],  # ansible-core's lexer escapes backslashes in a compile it starts
    ["template", "#jinja2:variable_start_string:'[[', variable_end_string:']]'\n[[ port ]] {{ port }}"],
    ["template", "line one\n{{ port }}\n{{ port // zero }}"],  # fails on line 3 when rendered
    ["template", "{{ port | no_such_filter }}"],  # fails to compile: never memoised
    ["expression", "port > 8000 and names | length == 2"],
]


def _jinja_probe(memo, templates=None) -> dict:
    templates = _JINJA_TEMPLATES if templates is None else templates
    env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_ANSIBALLZ_MEMO"}
    if memo is not None:
        env["GPUFLEET_ANSIBALLZ_MEMO"] = str(memo)
    env["ANSIBLE_CONFIG"] = str(helpers.ROOT / "ansible.cfg")
    out = subprocess.run([str(VENV_PY), "-c", _JINJA_PROBE, json.dumps(templates)], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_memoised_jinja_compile_renders_as_the_real_one(tmp_path):
    """A template or expression compiled once only marks the memo, a second time stores its code, and a later process
    takes the code from it: what it renders, the errors it raises and the template lines their tracebacks name are
    those of the real compile, and the code object is the one compile gives. One that fails to compile is compiled
    every time."""
    memo = tmp_path / "memo"
    memo.mkdir()
    off = _jinja_probe(None)
    assert off["patched"] == "jinja2.environment"
    got = [o["got"] for o in off["out"]]
    assert got[:4] == ['"8081 A,B [\'A\', \'B\']"', "'high 80801=a 2=b '", "'c:\\\\new c:\\\\new'", "'8080 {{ port }}'"], got
    assert "modulo by zero" in got[4] and [f[2] for f in off["out"][4]["frames"]] == [3], off["out"][4]
    assert "No filter named 'no_such_filter'" in got[5] and got[6] == "True", got
    runs = [_jinja_probe(memo) for _run in range(2)]
    assert runs[0]["patched"] == "_gpufleet_ansiballz_memo"
    for run in runs:
        assert [o["got"] for o in run["out"]] == got, run
        assert [o["frames"] for o in run["out"]] == [o["frames"] for o in off["out"]], run
        assert [o["same"] for o in run["out"]] == [True] * 5 + [None] * 2, run
    assert [o["compiled"] for o in runs[0]["out"]] == [1] * 7  # each compiled (then again by the probe: stored)
    assert [o["compiled"] for o in runs[1]["out"]] == [0] * 4 + [0, 1, 1], runs[1]  # read; the expression seen once
    assert len(list(memo.glob("*.jinja.code"))) >= 6, sorted(memo.iterdir())  # and what ansible-core compiles itself
    again = _jinja_probe(memo)
    assert [o["compiled"] for o in again["out"]] == [0, 0, 0, 0, 0, 1, 0], again
    assert [o["got"] for o in again["out"]] == got


def test_a_changed_template_or_delimiter_is_compiled_again(tmp_path):
    memo = tmp_path / "memo"
    memo.mkdir()
    base = [["template", "{{ port }} {{ names | join('-') }} [[ port ]]"], ["expression", "port + 1"]]
    _jinja_probe(memo, base)  # marked
    _jinja_probe(memo, base)  # stored
    assert [o["compiled"] for o in _jinja_probe(memo, base)["out"]] == [0, 0]  # read
    changed = [
        ["template", "{{ port }} {{ names | join('+') }} [[ port ]]"],  # the source
        ["template", "#jinja2:variable_start_string:'[[', variable_end_string:']]'\n{{ port }} {{ names | join('-') }} [[ port ]]"],
        ["template", "#jinja2:trim_blocks:False\n{{ port }} {{ names | join('-') }} [[ port ]]"],  # a lexer setting
        ["expression", "port + 2"],
    ]
    got = _jinja_probe(memo, changed)["out"]
    assert [o["compiled"] for o in got] == [1, 1, 1, 1], got
    assert [o["got"] for o in got] == [repr("8080 a+b [[ port ]]"), repr("{{ port }} {{ names | join('-') }} 8080"),
                                       repr("8080 a-b [[ port ]]"), "8082"], got


_JINJA_PLAY = """\
# Templated vars, filters, a conditional, a loop and a template error: what ansible-playbook prints of them must not
# depend on where the compiled code came from.
- hosts: localhost
  gather_facts: false
  vars:
    base_port: 8000
    names: [alpha, beta, gamma]
    port: "{{ base_port | int + 80 }}"
    banner: "{{ names | map('upper') | join('/') }} on {{ port }}"
    nested: "{{ {'ports': range(base_port | int, base_port | int + 3) | list, 'first': names | first} }}"
  tasks:
    - name: Templated vars and filters
      ansible.builtin.debug:
        msg: "{{ banner }} {{ nested | to_json }} {{ (port | int / 3) | round(2) }}"
    - name: A conditional
      ansible.builtin.debug:
        msg: "{% if port | int > 8000 %}high{% else %}low{% endif %} {{ names | length }}"
      when: names | length > 2 and port | int == 8080
    - name: Skipped by its conditional
      ansible.builtin.debug:
        msg: never
      when: base_port | int > 9000
    - name: A loop
      ansible.builtin.debug:
        msg: "{{ item | capitalize }} is {{ idx }}"
      loop: "{{ names }}"
      loop_control:
        index_var: idx
    - name: A template error
      ansible.builtin.debug:
        msg: "{{ names | first }}\\n{{ base_port // 0 }}"
      ignore_errors: true
    - name: An undefined variable
      ansible.builtin.debug:
        msg: "{{ port }} {{ no_such_variable | upper }}"
      ignore_errors: true
"""


def test_ansible_playbook_prints_the_same_with_the_jinja_memo_cold_warm_and_off(tmp_path):
    play = tmp_path / "play.yml"
    play.write_text(_JINJA_PLAY)
    memo = tmp_path / "memo"
    memo.mkdir()

    def run(memo_dir: str) -> str:
        r = helpers.run_playbook(play, env=dict(os.environ, GPUFLEET_ANSIBALLZ_MEMO=memo_dir), timeout=120)
        assert r.returncode == 0, r.stdout[-3000:]
        return r.stdout

    off = run("")
    assert "ALPHA/BETA/GAMMA on 8080" in off and "high 3" in off and "Gamma is 2" in off, off
    assert "modulo by zero" in off and "no_such_variable" in off and "ok=5" in off and "ignored=2" in off, off
    runs, kept = [], []
    for _run in range(3):  # marked, stored, read
        runs.append(run(str(memo)))
        kept.append({p.name: p.stat().st_mtime_ns for p in memo.glob("*.jinja.code")})
    assert len(kept[1]) >= 8, sorted(p.name for p in memo.iterdir())
    assert kept[2] == kept[1]  # the third run read what the second stored (wrote nothing, not even the same again)
    assert runs == [off] * 3
