# SPDX-License-Identifier: GPL-3.0-or-later
"""_sitecustomize rendering: no name or value can inject code, values round-trip exactly through a real
import in a subprocess, and the block never raises at import (but does not swallow KeyboardInterrupt)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _envblock, _sitecustomize

PY = sys.executable


def _import_in_subprocess(path, keys, prelude="", env=None):
    """Run the file as site.py would (module name 'sitecustomize') in a fresh interpreter; return the keys."""
    code = (prelude + "\nimport os, sys, json, runpy\nrunpy.run_path(sys.argv[1], run_name='sitecustomize')\n"
            "print(json.dumps({k: os.environ.get(k) for k in json.loads(sys.argv[2])}))\n")
    r = subprocess.run(check=False, args=[PY, "-S", "-c", code, str(path), json.dumps(keys)], env=env or {}, cwd="/",
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    return r


BAD_NAMES = ["NCCL PROTO", "A=B", "A'B", 'A"B', "ÄNCCL", "NCCL_\u00e9", "1NCCL", "", "A\nB", "NCCL_X\n", "A;B", "A.B",
             "__import__('os')", "A-B", " A"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_refused(name):
    with pytest.raises(_envblock.BlockError) as e:
        _envblock.normalize_env({name: "x"})
    assert "variable name" in str(e.value) and repr(name) in str(e.value)


@pytest.mark.parametrize("value,kind", [(True, "bool"), (False, "bool"), ([1], "list"), ({"a": 1}, "dict"),
                                        (None, "null"), (float("nan"), "finite")])
def test_bad_values_are_refused_naming_the_key(value, kind):
    with pytest.raises(_envblock.BlockError) as e:
        _envblock.normalize_env({"NCCL_BUFFSIZE": value})
    assert "NCCL_BUFFSIZE" in str(e.value) and kind in str(e.value)


def test_nul_in_value_is_refused():
    with pytest.raises(_envblock.BlockError, match="NUL"):
        _envblock.normalize_env({"X": "a\0b"})


def test_numbers_become_their_text():
    assert _envblock.normalize_env({"A": 16777216, "B": 1.5, "C": "LL"}) == {"A": "16777216", "B": "1.5", "C": "LL"}


NASTY = {
    "NEWLINE": "a\nb\r\nc",
    "QUOTES": "it's \"quoted\"",
    "BACKSLASH": "C:\\path\\n\\x00 \\",
    "TRIPLE": '"""\'\'\' end',
    "INJECT": None,  # filled in with the test's own marker path
    "MARKER": "\n# END gpufleet nccl\nimport os; os.system('true')\n",
    "UNICODE": "h\u00e9llo \u2028 \U0001F600",
    "EMPTY": "",
    "NUMBER": "16777216",
}


@pytest.mark.parametrize("mode", ["setdefault", "override"])
def test_hostile_values_are_data_and_round_trip(tmp_path, mode):
    pwned = tmp_path / "pwned"
    env = dict(NASTY, INJECT="__import__('os').system('touch %s')" % pwned)
    text = _sitecustomize.new_text("# existing content\nX = 1\n", "nccl", env, mode, "t")
    assert text.startswith("# existing content\nX = 1\n# BEGIN gpufleet nccl\n")
    assert text.count("# END gpufleet nccl\n") == 1  # a value cannot forge a marker line
    text.encode("ascii")  # ascii() literals: the block is pure ASCII whatever the values
    f = tmp_path / "sitecustomize.py"
    f.write_text(text)
    r = _import_in_subprocess(f, sorted(env))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == env
    assert not pwned.exists()


def test_setdefault_keeps_an_exported_value_and_override_replaces_it(tmp_path):
    for mode, want in (("setdefault", "Simple"), ("override", "LL")):
        f = tmp_path / ("%s.py" % mode)
        f.write_text(_sitecustomize.new_text(None, "nccl", {"NCCL_PROTO": "LL"}, mode, "t"))
        r = _import_in_subprocess(f, ["NCCL_PROTO"], env={"NCCL_PROTO": "Simple"})
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"NCCL_PROTO": want}


def test_block_never_raises_at_import(tmp_path):
    f = tmp_path / "sitecustomize.py"
    f.write_text(_sitecustomize.new_text(None, "nccl", {"NCCL_PROTO": "LL"}, "setdefault", "t"))
    # Make the environment itself fail: the rest of start-up must go on.
    prelude = ("import os\nclass Broken(dict):\n    def setdefault(self, *a):\n        raise RuntimeError('boom')\n"
               "os.environ = Broken()\n")
    r = _import_in_subprocess(f, ["NCCL_PROTO"], prelude=prelude)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"NCCL_PROTO": None}


def test_block_does_not_swallow_keyboard_interrupt(tmp_path):
    # Ctrl-C during start-up must still stop the process: only Exception is caught.
    f = tmp_path / "sitecustomize.py"
    f.write_text(_sitecustomize.new_text(None, "nccl", {"NCCL_PROTO": "LL"}, "setdefault", "t"))
    prelude = ("import os\nclass Stop(dict):\n    def setdefault(self, *a):\n        raise KeyboardInterrupt\n"
               "os.environ = Stop()\n")
    r = _import_in_subprocess(f, ["NCCL_PROTO"], prelude=prelude)
    assert r.returncode != 0 and "KeyboardInterrupt" in r.stderr


def test_render_compiles_and_parses_back():
    env = {"NCCL_PROTO": "LL", "ODD": "a'b\n\"c"}
    body = _sitecustomize.render_body(env, "setdefault")
    compile(body, "t", "exec")
    assert _sitecustomize.parse_body(body.splitlines(keepends=True)) == env


def test_mode_is_validated():
    with pytest.raises(_envblock.BlockError):
        _sitecustomize.render_body({"A": "b"}, "append")


def test_discover_interpreters_only_takes_python3_names(tmp_path):
    for n in ("python3", "python3.11", "python3-config", "python3.11-config", "python3m"):
        p = tmp_path / n
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
    (tmp_path / "python3.99").symlink_to(tmp_path / "python3.11")
    got = _sitecustomize.discover_interpreters([str(tmp_path / "python3*")])
    # python3.99 resolves to python3.11: de-duplicated.
    assert got == [str(tmp_path / "python3"), str(tmp_path / "python3.11")]


@pytest.mark.parametrize("value, text", [(1e20, "100000000000000000000"), (1.5e-7, "0.00000015"), (0.5, "0.5"),
                                         (2.0, "2.0"), (16777216, "16777216")])
def test_numbers_are_exported_as_decimal_text_never_an_exponent(value, text):
    # An integer parse of '1e+20' (strtol, NCCL's) reads 1.
    assert _envblock.normalize_env({"NCCL_BUFFSIZE": value}) == {"NCCL_BUFFSIZE": text}


def test_a_file_that_compiles_only_with_the_block_is_refused_and_left_alone(tmp_path, run_module):
    from ansible_collections.gpufleet.serving.plugins.modules import sitecustomize_env
    site = tmp_path / "site"
    site.mkdir()
    path = site / "sitecustomize.py"
    broken = "X = 1 \\"  # a trailing backslash, no final newline: it would swallow the BEGIN marker
    path.write_text(broken)
    layer = {"path": str(path), "env": {"NCCL_PROTO": "LL"}, "interpreters": [sys.executable],
             "probe_env": {"PYTHONPATH": str(site)}}
    for check_mode in (True, False):
        r = run_module(sitecustomize_env.main, layer, check_mode=check_mode)
        assert r["failed"] is True and "does not compile without gpufleet's block" in r["msg"], r
        assert "nothing was changed" in r["msg"] and path.read_text() == broken


def test_marker_lines_inside_a_string_are_refused_not_edited(tmp_path, run_module):
    from ansible_collections.gpufleet.serving.plugins.modules import sitecustomize_env
    site = tmp_path / "site"
    site.mkdir()
    path = site / "sitecustomize.py"
    text = '"""\n# BEGIN gpufleet nccl\nhello\n# END gpufleet nccl\n"""\nimport os\n'
    path.write_text(text)
    layer = {"path": str(path), "env": {"NCCL_PROTO": "LL"}, "interpreters": [sys.executable],
             "probe_env": {"PYTHONPATH": str(site)}, "name": "nccl"}
    for state in ("present", "absent"):
        r = run_module(sitecustomize_env.main, dict(layer, state=state))
        assert r["failed"] is True and "reads like a gpufleet block marker inside a string (line 2, 4)" in r["msg"], r
        assert path.read_text() == text


def test_the_rest_of_the_file_is_kept_byte_for_byte_but_a_last_line_gets_its_line_break(tmp_path, run_module):
    from ansible_collections.gpufleet.serving.plugins.modules import sitecustomize_env
    site = tmp_path / "site"
    site.mkdir()
    path = site / "sitecustomize.py"
    layer = {"path": str(path), "env": {"NCCL_PROTO": "LL"}, "interpreters": [sys.executable],
             "probe_env": {"PYTHONPATH": str(site)}}
    for before, after in (("import os\nx = 1\n", "import os\nx = 1\n"), ("import os\nx = 1", "import os\nx = 1\n")):
        path.write_text(before)
        assert run_module(sitecustomize_env.main, layer)["changed"] is True
        assert path.read_text().startswith(after) and "# BEGIN gpufleet" in path.read_text()
        assert run_module(sitecustomize_env.main, dict(layer, state="absent"))["changed"] is True
        assert path.read_text() == after


@pytest.mark.parametrize("edit, line, error", [
    ("import os\nif os.sep\n    X = 1\n", 2, "SyntaxError: expected ':'"),
    ("import os\n\nimport gpufleet_no_such_module\n", 3, "ModuleNotFoundError: No module named 'gpufleet_no_such_module'"),
])
def test_an_operators_error_outside_the_block_is_named_with_its_line(tmp_path, run_module, edit, line, error):
    """Issue 24: the block already in place, an operator's edit above it that fails to import: start-up prints only
    'Error in sitecustomize' and skips the whole file. The failure and the layer check name the file, the line and the
    error, not only the symptom ('not exported as asked (got null)')."""
    from ansible_collections.gpufleet.serving.plugins.module_utils import _layercheck
    from ansible_collections.gpufleet.serving.plugins.modules import sitecustomize_env
    site = tmp_path / "site"
    site.mkdir()
    path = site / "sitecustomize.py"
    layer = {"path": str(path), "env": {"NCCL_PROTO": "LL"}, "interpreters": [sys.executable],
             "probe_env": {"PYTHONPATH": str(site)}, "name": "nccl"}
    assert run_module(sitecustomize_env.main, layer)["changed"] is True
    path.write_text(edit + path.read_text())
    want = "%s fails to import outside gpufleet's block, at line %d: %s" % (path, line, error)
    r = run_module(sitecustomize_env.main, layer)
    assert r["failed"] is True and r["msg"].startswith(want), r["msg"]
    assert "NCCL_PROTO unset" in r["msg"]
    checked = run_module(sitecustomize_env.main, layer, check_mode=True)
    assert checked["import_failures"] == [want] and checked["not_effective"], checked
    layers = _layercheck.up_to_date({"sitecustomize": layer})
    assert layers["up_to_date"] is False and layers["sitecustomize"]["error"] == want, layers
    assert path.read_text().startswith(edit)  # the operator's lines are theirs: left as they are
