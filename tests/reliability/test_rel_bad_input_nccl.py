# SPDX-License-Identifier: GPL-3.0-or-later
"""Bad NCCL tuning input given to the gpufleet.serving.nccl_tuning role (both layers), on a throw-away Debian-like
interpreter tree (tests/nccl/nccl_helpers.SysPython) and an nccl.conf in the test's directory.

Run 1 plays the role once per refused input in one ansible-playbook run, inside a private mount namespace where one
directory is mounted read-only; afterwards every file the role could touch is byte for byte what it was.
Run 2 gives hostile values that must end up as data: written, read back exactly by a started interpreter, never run.
"""
from __future__ import annotations

import hashlib
import os
import sys
import typing as t
from pathlib import Path

import pytest

from rel_helpers import ROOT, role_cases

sys.path.insert(0, str(ROOT / "tests" / "nccl"))
from nccl_helpers import ORIGINAL_SITECUSTOMIZE, SysPython, base_python  # noqa: E402

# One task writes both layers (nccl_layers); the layer that refuses starts the message. nccl.conf's stricter rules are
# checked first, before either layer is written.
LAYERS_TASK = "Manage the NCCL blocks in the Python interpreters' sitecustomize.py and in nccl.conf"
SITE_TASK = (LAYERS_TASK, "sitecustomize: ")
CONF_CHECK = (LAYERS_TASK, "nccl_conf: ")
ASSERT = "Assert the NCCL tuning variables are valid"
ARGSPEC = "Validating arguments against arg spec 'main' - NCCL tuning that reaches every spawned worker"
NAMES = ASSERT  # the names are checked in the same task as the input's form (one task result per host fewer)
CONF_TEXT = "# site nccl.conf\nNCCL_DEBUG=WARN\n"


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    base = tmp_path_factory.mktemp("rel-nccl")
    syspy = SysPython(base / "prefix", *base_python())
    conf = base / "nccl.conf"
    conf.write_text(CONF_TEXT)
    # A sitecustomize.py that the interpreters import through PYTHONPATH, in a directory mounted read-only for run 1.
    ro = base / "ro"
    ro.mkdir()
    (ro / "sitecustomize.py").write_text("# service sitecustomize\n")
    # A root-owned link pointing into a world-writable directory (any user could swap the target).
    world = base / "world"
    world.mkdir()
    os.chmod(world, 0o777)
    (world / "sitecustomize.py").write_text("# planted\n")
    (base / "links").mkdir()
    (base / "links" / "sitecustomize.py").symlink_to(world / "sitecustomize.py")
    notpy = base / "notpython.sh"
    notpy.write_text("#!/bin/sh\necho 'I am not python'\n")
    os.chmod(notpy, 0o755)
    return {"base": base, "syspy": syspy, "conf": conf, "ro": ro, "world": world, "links": base / "links",
            "notpy": notpy}


def _files(tr) -> t.Dict[str, t.Any]:
    """Every file either layer could write, create or leave a temp file beside (nccl.conf's dir: its files only)."""
    out = {}
    for d in (tr["syspy"].etc_dir, tr["syspy"].stdlib, tr["ro"], tr["world"], tr["links"], tr["base"]):
        for n in sorted(os.listdir(d)):
            if d == tr["base"] and "nccl.conf" not in n:
                continue
            p = Path(d) / n
            if p.is_symlink():
                out[str(p)] = "-> " + os.readlink(p)
            elif p.is_file():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# id -> (role variables, task that must fail, text the message must contain)
REFUSED: t.Dict[str, t.Tuple[t.Dict[str, t.Any], str, str]] = {
    "name-space": ({"gpufleet_nccl_env": {"NCCL PROTO": "LL"}}, CONF_CHECK, "env: variable name 'NCCL PROTO' is not a valid name"),
    "name-equals": ({"gpufleet_nccl_env": {"NCCL_PROTO=LL": "1"}}, CONF_CHECK, "env: variable name 'NCCL_PROTO=LL' is not a valid name"),
    "name-quote": ({"gpufleet_nccl_env": {"NCCL_'X": "1"}}, CONF_CHECK, "is not a valid name"),
    "name-unicode": ({"gpufleet_nccl_env": {"NCCL_PR\u00d8TO": "LL"}}, CONF_CHECK, "env: variable name 'NCCL_PR\u00d8TO' is not a valid name"),
    "name-leading-digit": ({"gpufleet_nccl_env": {"9NCCL": "1"}}, CONF_CHECK, "env: variable name '9NCCL' is not a valid name"),
    "value-newline-both-layers": ({"gpufleet_nccl_env": {"NCCL_SOCKET_IFNAME": "eth0\nNCCL_P2P_DISABLE=1"}}, CONF_CHECK,
                                  "env: value of NCCL_SOCKET_IFNAME contains a line break, which nccl.conf cannot hold"),
    "unknown-nccl-name-fail": ({"gpufleet_nccl_env": {"NCCL_PROTOCOL": "LL"}, "gpufleet_nccl_unknown_vars": "fail"}, NAMES,
                               "NCCL_PROTOCOL is not a known NCCL environment variable (did you mean NCCL_PROTO?)"),
    "profile-unknown": ({"gpufleet_nccl_profile": "turbo"}, ARGSPEC, "gpufleet_nccl_profile"),
    "env-list-for-dict": ({"gpufleet_nccl_env": ["NCCL_PROTO=LL"]}, ARGSPEC, "gpufleet_nccl_env"),
    "backup-string-for-bool": ({"gpufleet_nccl_backup": "maybe"}, ARGSPEC, "gpufleet_nccl_backup"),
    "value-list-for-string": ({"gpufleet_nccl_env": {"NCCL_ALGO": ["Ring", "Tree"]}}, CONF_CHECK,
                              "env: value of NCCL_ALGO must be a string or a number, got list"),
    "interpreter-missing": ({"gpufleet_nccl_interpreters": ["/nonexistent/bin/python3"]}, SITE_TASK,
                            "interpreter /nonexistent/bin/python3 does not exist or is not executable"),
    "interpreter-not-python": ({"gpufleet_nccl_interpreters": ["/bin/true"]}, SITE_TASK,
                               "interpreter /bin/true failed to report its sitecustomize"),
    "interpreter-shell-script": ({"gpufleet_nccl_interpreters": ["@notpy"]}, SITE_TASK, "interpreter @notpy "),
    "path-read-only": ({"gpufleet_nccl_sitecustomize_path": "@ro/sitecustomize.py", "gpufleet_nccl_probe_env": {"PYTHONPATH": "@ro"}},
                       SITE_TASK, "cannot write @ro/sitecustomize.py: Read-only file system"),
    "path-symlink-to-world-writable": ({"gpufleet_nccl_sitecustomize_path": "@links/sitecustomize.py",
                                        "gpufleet_nccl_probe_env": {"PYTHONPATH": "@links"}}, SITE_TASK,
                                       "refusing to follow the symlink @links/sitecustomize.py: directory @world is writable by "
                                       "group or others"),
    # Both layers write host-wide: only NCCL_* and exact allow-listed names, never loader/interpreter variables.
    "host-wide-ld-preload-fail": ({"gpufleet_nccl_profile": "custom", "gpufleet_nccl_unknown_vars": "fail",
                                   "gpufleet_nccl_env": {"NCCL_PROTO": "LL", "LD_PRELOAD": "@world/evil.so"}}, NAMES,
                                  "LD_PRELOAD (the dynamic loader or the C library reads it in every program) is never "
                                  "written host-wide, even when listed in gpufleet_nccl_allow_vars"),
    "host-wide-pythonpath-warn": ({"gpufleet_nccl_profile": "custom", "gpufleet_nccl_unknown_vars": "warn",
                                   "gpufleet_nccl_env": {"PYTHONPATH": "@world"}}, NAMES,
                                  "PYTHONPATH (the Python interpreter reads it when any Python process starts) is never "
                                  "written host-wide"),
    "host-wide-ld-preload-allowed": ({"gpufleet_nccl_profile": "custom", "gpufleet_nccl_env": {"LD_PRELOAD": "@world/evil.so"},
                                      "gpufleet_nccl_allow_vars": ["LD_PRELOAD"]}, NAMES,
                                     "LD_PRELOAD (the dynamic loader or the C library reads it in every program) is never "
                                     "written host-wide, even when listed in gpufleet_nccl_allow_vars"),
    "host-wide-other-fail": ({"gpufleet_nccl_profile": "custom", "gpufleet_nccl_unknown_vars": "fail",
                              "gpufleet_nccl_env": {"NCCL_PROTO": "LL", "FOO": "bar"}}, NAMES,
                             "FOO in gpufleet_nccl_env is not an NCCL variable (NCCL_*): list each exact name in "
                             "gpufleet_nccl_allow_vars"),
    "host-wide-other-warn": ({"gpufleet_nccl_profile": "custom", "gpufleet_nccl_unknown_vars": "warn",
                              "gpufleet_nccl_env": {"FOO": "bar", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}}, NAMES,
                             "FOO, TORCH_NCCL_ASYNC_ERROR_HANDLING in gpufleet_nccl_env are not NCCL variables (NCCL_*)"),
    "host-wide-allow-pattern": ({"gpufleet_nccl_profile": "custom", "gpufleet_nccl_env": {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
                                 "gpufleet_nccl_allow_vars": ["TORCH_NCCL_*"]}, NAMES,
                                "gpufleet_nccl_allow_vars must list exact variable names (no patterns), got \"TORCH_NCCL_*\""),
}


def _sub(v: t.Any, tr) -> t.Any:
    """Replace @ro, @links, @world, @notpy in strings with the tree's real paths."""
    if isinstance(v, str):
        for k in ("notpy", "links", "world", "ro"):
            v = v.replace("@" + k, str(tr[k]))
        return v
    if isinstance(v, list):
        return [_sub(x, tr) for x in v]
    if isinstance(v, dict):
        return {k: _sub(x, tr) for k, x in v.items()}
    return v


@pytest.fixture(scope="module")
def refused(tree):
    base = {"gpufleet_nccl_profile": "pcie_only", "gpufleet_nccl_layers": ["sitecustomize", "nccl_conf"],
            "gpufleet_nccl_interpreters": [str(tree["syspy"].python)], "gpufleet_nccl_conf_path": str(tree["conf"]),
            "gpufleet_nccl_block_name": "nccl"}
    before = _files(tree)
    ro = str(tree["ro"])
    # The read-only bind mount exists only in this private mount namespace, for this one ansible-playbook run.
    wrap = ["unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
            'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && shift && exec "$@"', ro, "--"]
    res = role_cases(tree["base"], "gpufleet.serving.nccl_tuning", base,
                     [(k, _sub(v[0], tree)) for k, v in REFUSED.items()], dict(os.environ), name="refused", wrap=wrap)
    return {"res": res, "before": before, "after": _files(tree)}


def _check(refused, tree, ids):
    for cid in ids:
        _v, task, text = REFUSED[cid]
        r = refused["res"][cid]
        assert r["failed"] is True, "%s was accepted:\n%s" % (cid, refused["res"]["_stdout"][-3000:])
        if isinstance(task, tuple):
            assert r["task"] == task[0] and r["msg"].startswith(task[1]), (cid, r)
            if task == CONF_CHECK:
                assert "nothing was changed" in r["msg"], (cid, r)
        else:
            assert r["task"] == task, (cid, r)
        assert _sub(text, tree) in r["msg"], (cid, r["msg"])
    assert refused["after"] == refused["before"], "a file changed"
    assert tree["syspy"].etc_file.read_text() == ORIGINAL_SITECUSTOMIZE
    assert tree["conf"].read_text() == CONF_TEXT


@pytest.mark.reliability(
    section="input", case="NCCL/env names with spaces, '=', quotes, unicode, leading digits",
    provoked="gpufleet_nccl_env names 'NCCL PROTO', 'NCCL_PROTO=LL', \"NCCL_'X\", 'NCCL_PR\u00d8TO', '9NCCL' (both layers)",
    outcome="refused before anything is written (by the read-only nccl.conf check, the first module to see them): "
            "\"env: variable name '...' is not a valid name\"; sitecustomize.py and nccl.conf byte for byte unchanged, "
            "no temp file left")
def test_bad_nccl_names_are_refused(refused, tree):
    _check(refused, tree, [k for k in REFUSED if k.startswith("name-")])


@pytest.mark.reliability(
    section="input", case="Value with a line break for both layers",
    provoked="gpufleet_nccl_env {NCCL_SOCKET_IFNAME: \"eth0\\nNCCL_P2P_DISABLE=1\"} with layers sitecustomize and nccl_conf",
    outcome="refused by the read-only nccl.conf check that now runs first ('contains a line break, which nccl.conf "
            "cannot hold'); neither layer is changed (before the fix the sitecustomize layer was already written)")
def test_line_break_value_changes_neither_layer(refused, tree):
    _check(refused, tree, ["value-newline-both-layers"])


@pytest.mark.reliability(
    section="input", case="Unknown NCCL variable name (NCCL_PROTOCOL) with gpufleet_nccl_unknown_vars=fail",
    provoked="gpufleet_nccl_env {NCCL_PROTOCOL: LL}, gpufleet_nccl_unknown_vars fail",
    outcome="refused by the role's input check, before any host call, naming the variable and the closest known name "
            "(did you mean NCCL_PROTO?); nothing changed")
def test_unknown_nccl_name_is_refused_with_fail(refused, tree):
    _check(refused, tree, ["unknown-nccl-name-fail"])


@pytest.mark.reliability(
    section="input", case="Unknown profile, wrong types",
    provoked="gpufleet_nccl_profile turbo; gpufleet_nccl_env as a list; gpufleet_nccl_backup 'maybe'; a list as a value",
    outcome="argument spec validation (or the module, for a value) fails naming the variable; nothing changed")
def test_unknown_profile_and_wrong_types_are_refused(refused, tree):
    _check(refused, tree, ["profile-unknown", "env-list-for-dict", "backup-string-for-bool", "value-list-for-string"])


@pytest.mark.reliability(
    section="input", case="Non-existent interpreter, interpreter that is not Python",
    provoked="gpufleet_nccl_interpreters [/nonexistent/bin/python3], [/bin/true], [a #!/bin/sh script]",
    outcome="sitecustomize_env fails naming the interpreter before writing anything; nothing changed")
def test_bad_interpreters_are_refused(refused, tree):
    _check(refused, tree, ["interpreter-missing", "interpreter-not-python", "interpreter-shell-script"])


@pytest.mark.reliability(
    section="input", case="sitecustomize path not writable",
    provoked="gpufleet_nccl_sitecustomize_path in a directory bind-mounted read-only (private mount namespace)",
    outcome="'cannot write <path>: Read-only file system'; the file and the directory are unchanged")
def test_read_only_sitecustomize_path_is_reported(refused, tree):
    _check(refused, tree, ["path-read-only"])


@pytest.mark.reliability(
    section="input", case="Symlink pointing to a user-writable place",
    provoked="gpufleet_nccl_sitecustomize_path is a root-owned link to sitecustomize.py in a mode 0777 directory",
    outcome="'refusing to follow the symlink ...: directory ... is writable by group or others'; link and target "
            "unchanged")
def test_symlink_into_a_world_writable_directory_is_refused(refused, tree):
    _check(refused, tree, ["path-symlink-to-world-writable"])


@pytest.mark.reliability(
    section="input", case="Variables outside NCCL's for the host-wide layers (LD_PRELOAD, PYTHONPATH, FOO)",
    provoked="profile custom, both layers, gpufleet_nccl_unknown_vars fail and warn: gpufleet_nccl_env with LD_PRELOAD, "
             "PYTHONPATH, FOO or TORCH_NCCL_ASYNC_ERROR_HANDLING not allow-listed; LD_PRELOAD in "
             "gpufleet_nccl_allow_vars; a pattern (TORCH_NCCL_*) in gpufleet_nccl_allow_vars",
    outcome="refused in preflight, before any module runs, naming each variable and why (loader, interpreter) or the "
            "option to list it in (gpufleet_nccl_allow_vars); LD_PRELOAD refused even when allow-listed; "
            "sitecustomize.py and nccl.conf byte for byte unchanged")
def test_variables_outside_nccl_are_refused_before_anything_is_written(refused, tree):
    _check(refused, tree, [k for k in REFUSED if k.startswith("host-wide-")])


# Values that would be code if they were pasted into Python source or a shell, and must stay data.
HOSTILE = {
    "GPUFLEET_REL_QUOTES": "it's \"quoted\" and 'single'",
    "GPUFLEET_REL_BACKSLASH": "C:\\new\\table\\\\x\\",
    "GPUFLEET_REL_TRIPLE": '"""; import os; os.system("touch {pwned}"); """',
    "GPUFLEET_REL_IMPORT": "__import__('os').system('touch {pwned}')",
    "GPUFLEET_REL_UNICODE": "caf\u00e9 \u2603 \U0001f680",
}


@pytest.fixture(scope="module")
def applied(tree, tmp_path_factory):
    """Run 2: hostile values on both layers (block reldata), a newline value on the sitecustomize layer (relnl), and
    the unknown name NCCL_PROTOCOL under the default gpufleet_nccl_unknown_vars=warn (relwarn)."""
    work = tmp_path_factory.mktemp("rel-nccl-applied")
    pwned = work / "PWNED"
    env = {k: v.format(pwned=pwned) for k, v in HOSTILE.items()}
    nl = {"GPUFLEET_REL_NEWLINE": "line1\nline2 = __import__('os').system('touch %s')" % pwned}
    syspy = tree["syspy"]
    conf = work / "nccl.conf"
    # The hostile names are not NCCL's: listed by name in gpufleet_nccl_allow_vars, as a user would.
    base = {"gpufleet_nccl_profile": "custom", "gpufleet_nccl_interpreters": [str(syspy.python)],
            "gpufleet_nccl_conf_path": str(conf), "gpufleet_nccl_unknown_vars": "fail",
            "gpufleet_nccl_allow_vars": sorted(env) + sorted(nl)}
    res = role_cases(work, "gpufleet.serving.nccl_tuning", base, [
        ("both-layers", {"gpufleet_nccl_env": env, "gpufleet_nccl_layers": ["sitecustomize", "nccl_conf"],
                         "gpufleet_nccl_block_name": "reldata"}),
        ("newline", {"gpufleet_nccl_env": nl, "gpufleet_nccl_layers": ["sitecustomize"], "gpufleet_nccl_block_name": "relnl"}),
        ("warn", {"gpufleet_nccl_env": {"NCCL_PROTOCOL": "LL"}, "gpufleet_nccl_unknown_vars": "warn",
                  "gpufleet_nccl_block_name": "relwarn"}),
    ], dict(os.environ), name="applied")
    try:
        yield {"res": res, "env": env, "nl": nl, "conf": conf, "pwned": pwned,
               "read": syspy.env_of(syspy.python, list(env) + list(nl) + ["NCCL_PROTOCOL"]),
               "site": syspy.etc_file.read_bytes()}
    finally:
        syspy.etc_file.write_text(ORIGINAL_SITECUSTOMIZE)


@pytest.mark.reliability(
    section="input", case="Values with newlines, quotes, backslashes, triple quotes, __import__(...)",
    provoked="gpufleet_nccl_env values with quotes, backslashes, '\"\"\"; os.system(...)', "
             "\"__import__('os').system('touch PWNED')\", unicode; and a newline value (sitecustomize layer only)",
    outcome="written as data: an interpreter started with an empty environment reads every value back exactly, "
            "nccl.conf holds NAME=value verbatim, the PWNED file never appears")
def test_hostile_values_are_data(applied, tree):
    res = applied["res"]
    assert res["both-layers"]["failed"] is False, res["both-layers"]
    assert res["newline"]["failed"] is False, res["newline"]
    want = dict(applied["env"], **applied["nl"])
    assert {k: applied["read"][k] for k in want} == want
    text = applied["conf"].read_text()
    for k, v in applied["env"].items():
        assert "\n%s=%s\n" % (k, v) in text, (k, text)
    compile(applied["site"], str(tree["syspy"].etc_file), "exec")
    assert not applied["pwned"].exists(), "a value was executed"
    assert not os.path.exists("/tmp/pwned")


@pytest.mark.reliability(
    section="input", case="Unknown NCCL variable name (NCCL_PROTOCOL) with gpufleet_nccl_unknown_vars=warn",
    provoked="gpufleet_nccl_env {NCCL_PROTOCOL: LL}, gpufleet_nccl_unknown_vars warn (the default)",
    outcome="applied as asked, with the warning 'NCCL_PROTOCOL is not a known NCCL environment variable "
            "(did you mean NCCL_PROTO?)' in the run's output")
def test_unknown_nccl_name_is_warned_with_warn(applied):
    res = applied["res"]
    assert res["warn"]["failed"] is False, res["warn"]
    assert "[WARNING]: NCCL_PROTOCOL is not a known NCCL environment variable (did you mean NCCL_PROTO?)" in res["_stdout"]
    assert applied["read"]["NCCL_PROTOCOL"] == "LL"
