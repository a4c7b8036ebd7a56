# SPDX-License-Identifier: GPL-3.0-or-later
"""sitecustomize_env through real ansible-playbook runs, against real interpreters laid out like Debian's
system python inside the test directory (the host's own python is never written)."""
from __future__ import annotations

import os
import stat

import pytest

from nccl_helpers import ORIGINAL_SITECUSTOMIZE, play

ENV = {
    "NCCL_PROTO": "LL",
    "NCCL_BUFFSIZE": 16777216,
    "GPUFLEET_ODD": "a'b\"c\n\\ __import__('os').system('touch /tmp/gpufleet-pwned')",
}
WANT = {k: str(v) for k, v in ENV.items()}


def task(title, register, check=None, **args):
    t = {"name": title, "gpufleet.serving.sitecustomize_env": args, "register": register}
    if check is not None:
        t["check_mode"] = check
    return t


def test_check_real_idempotent_absent_on_a_symlinked_system_python_with_a_shadowing_venv(tmp_path, syspy):
    venv_py = syspy.venv(tmp_path / "venv")
    interps = [str(syspy.python), str(venv_py)]
    args = dict(interpreters=interps, env=ENV, name="nccl", allow_vars=["GPUFLEET_ODD"])
    # A mode other than 0644 is kept (one that locks other users out is not: see the test of access_fixes).
    os.chmod(syspy.etc_file, 0o664)
    tasks = [
        task("Add the block (check mode)", "c1", check=True, **args),
        task("Add the block", "r1", **args),
        task("Add the block again (check mode)", "c2", check=True, **args),
        task("Add the block again", "r2", **args),
        task("Remove the block (check mode)", "c3", check=True, state="absent", **args),
        task("Remove the block", "r3", state="absent", **args),
        task("Remove the block again", "r4", state="absent", **args),
    ]
    # Two playbooks: look at the file between adding and removing.
    proc, res = play(tmp_path, tasks[:4], ["c1", "r1", "c2", "r2"], name="add", diff=True)
    assert proc.returncode == 0, proc.stdout
    c1, r1, c2, r2 = res["c1"], res["r1"], res["c2"], res["r2"]
    assert c1["changed"] and r1["changed"] and not c2["changed"] and not r2["changed"]
    # Check mode reported the state before the change; the real run proves the new one.
    assert c1["effective_env"] == {i: {k: None for k in WANT} for i in interps}
    assert r1["effective_env"] == r2["effective_env"] == {i: WANT for i in interps}
    # One file for both interpreters (the venv imports the base stdlib's copy), edited through the link.
    assert len(r1["files"]) == 1
    f = r1["files"][0]
    assert f["path"] == str(syspy.link) and f["real_path"] == str(syspy.etc_file) and f["symlinks"] == [str(syspy.link)]
    assert sorted(f["interpreters"]) == sorted(interps)
    venv_entry = [i for i in r1["interpreters"] if i["interpreter"] == str(venv_py)][0]
    assert venv_entry["venv"] and venv_entry["sitecustomize"] == str(syspy.link)
    shadow = str(tmp_path / "venv" / "lib" / ("python" + syspy.ver) / "site-packages" / "sitecustomize.py")
    assert venv_entry["shadowed"] == [shadow]
    assert any(shadow in w and "shadowed" in w for w in r1["warnings"])
    # Diff with headers, same in check and real mode.
    # The file's own lines (apport's hook here; a token elsewhere) are counted, not printed.
    assert c1["diff"]["before"] == "# ... 7 lines not written by gpufleet (unchanged, not shown)\n"
    assert c1["diff"]["before_header"] == str(syspy.etc_file) and "apport" not in proc.stdout
    assert c1["diff"] == r1["diff"] and "# BEGIN gpufleet nccl" in r1["diff"]["after"]
    assert "--- before: %s" % syspy.etc_file in proc.stdout and "+# BEGIN gpufleet nccl" in proc.stdout
    # The file: link kept, original content kept, mode kept, no injection ran.
    assert os.path.islink(syspy.link)
    text = syspy.etc_file.read_text()
    assert text.startswith(ORIGINAL_SITECUSTOMIZE) and text.count("# END gpufleet nccl") == 1
    assert stat.S_IMODE(os.stat(syspy.etc_file).st_mode) == 0o664
    assert not os.path.exists("/tmp/gpufleet-pwned")
    # Independent proof, outside the module: a fresh process of each interpreter, empty environment.
    for i in interps:
        assert syspy.env_of(i, list(WANT)) == WANT
    # An explicitly exported value wins in setdefault mode.
    assert syspy.env_of(venv_py, ["NCCL_PROTO"], env={"NCCL_PROTO": "Simple"}) == {"NCCL_PROTO": "Simple"}

    proc, res = play(tmp_path, tasks[4:], ["c3", "r3", "r4"], name="remove", diff=True)
    assert proc.returncode == 0, proc.stdout
    assert res["c3"]["changed"] and res["r3"]["changed"] and not res["r4"]["changed"]
    assert res["r3"]["effective_env"] == {i: {k: None for k in WANT} for i in interps}
    assert syspy.etc_file.read_bytes() == ORIGINAL_SITECUSTOMIZE.encode()  # byte for byte
    assert os.path.islink(syspy.link)


def test_new_file_is_created_where_the_interpreter_imports_it_and_removed_again(tmp_path, syspy_nolink):
    py = str(syspy_nolink.python)
    args = dict(interpreters=[py], env={"NCCL_P2P_LEVEL": "SYS"})
    proc, res = play(tmp_path, [task("Create", "r1", **args), task("Remove", "r2", state="absent", **args)],
                     ["r1", "r2"])
    assert proc.returncode == 0, proc.stdout
    f = res["r1"]["files"][0]
    assert f["created"] and f["path"] == str(syspy_nolink.stdlib / "sitecustomize.py")
    assert res["r1"]["interpreters"][0]["exists"] is False
    assert res["r1"]["effective_env"] == {py: {"NCCL_P2P_LEVEL": "SYS"}}
    assert res["r2"]["files"][0]["removed"]
    assert not (syspy_nolink.stdlib / "sitecustomize.py").exists()  # the host is as before


def test_path_option_with_pythonpath_and_two_blocks_coexist(tmp_path, syspy):
    site = tmp_path / "site"
    site.mkdir()
    path = site / "sitecustomize.py"
    path.write_text("import os\nos.environ.setdefault('FROM_USER_CODE', '1')\n")
    common = dict(interpreters=[str(syspy.python)], path=str(path), probe_env={"PYTHONPATH": str(site)})
    tasks = [
        task("Block a", "a", name="a", env={"NCCL_PROTO": "LL"}, mode="override", **common),
        task("Block b", "b", name="b", env={"NCCL_ALGO": "Ring"}, **common),
        task("Remove a", "ra", name="a", state="absent", **common),
    ]
    proc, res = play(tmp_path, tasks, ["a", "b", "ra"])
    assert proc.returncode == 0, proc.stdout
    assert res["a"]["effective_env"] == {str(syspy.python): {"NCCL_PROTO": "LL"}}
    assert res["b"]["effective_env"] == {str(syspy.python): {"NCCL_ALGO": "Ring"}}
    text = path.read_text()
    assert text.startswith("import os\nos.environ.setdefault('FROM_USER_CODE', '1')\n# BEGIN gpufleet b\n")
    assert "gpufleet a" not in text
    # The system-like interpreter's own file was not touched.
    assert syspy.etc_file.read_text() == ORIGINAL_SITECUSTOMIZE


def test_refusals_change_nothing(tmp_path, syspy):
    py = [str(syspy.python)]
    os.chmod(syspy.etc_dir, 0o777)
    tasks = [
        dict(task("Writable target directory", "w", interpreters=py, env={"NCCL_DEBUG": "WARN"}), ignore_errors=True),
        dict(task("Boolean value", "b", interpreters=py, env={"NCCL_P2P_DISABLE": True}), ignore_errors=True),
        dict(task("Bad name", "n", interpreters=py, env={"NCCL PROTO": "LL"}), ignore_errors=True),
        dict(task("Unknown NCCL name refused", "u", interpreters=py, env={"NCCL_PROTOCOL": "LL"}, nccl_names="fail"),
             ignore_errors=True),
        dict(task("Relative interpreter", "rel", interpreters=["python3"], env={"NCCL_DEBUG": "WARN"}), ignore_errors=True),
    ]
    proc, res = play(tmp_path, tasks, ["w", "b", "n", "u", "rel"])
    assert proc.returncode == 0, proc.stdout
    assert res["w"]["failed"] and "writable by group or others" in res["w"]["msg"] and str(syspy.etc_dir) in res["w"]["msg"]
    assert res["b"]["failed"] and "NCCL_P2P_DISABLE" in res["b"]["msg"] and "bool" in res["b"]["msg"]
    assert res["n"]["failed"] and "'NCCL PROTO'" in res["n"]["msg"]
    assert res["u"]["failed"] and "did you mean NCCL_PROTO" in res["u"]["msg"]
    assert res["rel"]["failed"] and "not an absolute path" in res["rel"]["msg"]
    assert syspy.etc_file.read_text() == ORIGINAL_SITECUSTOMIZE


def test_a_file_that_fails_at_import_is_never_installed(tmp_path, syspy):
    # The existing file already raises at the end: site.py prints "Error in sitecustomize" and goes on.
    broken = ORIGINAL_SITECUSTOMIZE + "raise RuntimeError('already broken')\n"
    syspy.etc_file.write_text(broken)
    proc, res = play(tmp_path, [dict(task("Add", "r", interpreters=[str(syspy.python)], env={"NCCL_DEBUG": "WARN"}),
                                     ignore_errors=True)], ["r"])
    assert proc.returncode == 0, proc.stdout
    assert res["r"]["failed"] and "nothing was changed" in res["r"]["msg"] and "already broken" in res["r"]["stderr"]
    assert syspy.etc_file.read_text() == broken
    assert not [n for n in os.listdir(syspy.etc_dir) if n != "sitecustomize.py"]  # no temp file left behind


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="no system python3")
def test_default_interpreters_are_the_system_ones_check_mode_only(tmp_path):
    # Check mode: the host's python is only started, never written.
    before = {p: open(p, "rb").read() for p in ("/usr/bin/python3",)}
    proc, res = play(tmp_path, [task("Resolve the system interpreters", "r", check=True, env={"GPUFLEET_T": "1"},
                                     allow_vars=["GPUFLEET_T"])],
                     ["r"])
    assert proc.returncode == 0, proc.stdout
    r = res["r"]
    interps = [i["interpreter"] for i in r["interpreters"]]
    assert os.path.realpath("/usr/bin/python3") in interps
    assert all(not os.path.islink(i) for i in interps)
    for i in r["interpreters"]:
        assert i["sitecustomize"].endswith("sitecustomize.py") and not i["venv"]
    assert r["effective_env"] == {i: {"GPUFLEET_T": None} for i in interps}
    assert before == {p: open(p, "rb").read() for p in before}


def test_existing_content_that_imports_from_dist_packages_keeps_working(tmp_path, syspy):
    # The candidate is tried with site-packages on sys.path (as at start-up), so a distro or admin
    # sitecustomize importing from dist-packages does not make the module refuse, and keeps working.
    dist = syspy.prefix / "lib" / "python3" / "dist-packages"
    dist.mkdir(parents=True)
    (dist / "gpufleet_site_helper.py").write_text("import os\nos.environ['FROM_HELPER'] = '1'\n")
    existing = "import gpufleet_site_helper\n"
    syspy.etc_file.write_text(existing)
    py = str(syspy.python)
    proc, res = play(tmp_path, [task("Add", "r", interpreters=[py], env={"NCCL_ALGO": "Ring"})], ["r"])
    assert proc.returncode == 0, proc.stdout
    assert res["r"]["effective_env"] == {py: {"NCCL_ALGO": "Ring"}}
    assert syspy.etc_file.read_text().startswith(existing)
    assert syspy.env_of(py, ["FROM_HELPER", "NCCL_ALGO"]) == {"FROM_HELPER": "1", "NCCL_ALGO": "Ring"}


def _tree_bytes(syspy):
    """The system-like interpreter's sitecustomize (through its link) and everything beside it, byte for byte."""
    return {str(p): (os.readlink(p) if p.is_symlink() else p.read_bytes())
            for p in [syspy.link] + sorted(syspy.etc_dir.iterdir())}


def test_only_nccl_and_allow_listed_names_are_written(tmp_path, syspy):
    # Every Python process of the host runs this file: a loader or interpreter variable there changes them all.
    py = [str(syspy.python)]
    before = _tree_bytes(syspy)
    refused = {
        "ld": dict(env={"NCCL_PROTO": "LL", "LD_PRELOAD": "/tmp/evil.so"}),
        "pypath": dict(env={"PYTHONPATH": "/tmp/evil"}, nccl_names="fail"),
        "foo": dict(env={"FOO": "bar"}, nccl_names="fail"),
        "ld_allowed": dict(env={"LD_PRELOAD": "/tmp/evil.so"}, allow_vars=["LD_PRELOAD"]),
        "allow_pattern": dict(env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}, allow_vars=["TORCH_NCCL_*"]),
    }
    tasks = [dict(task("Refused %s" % k, k, interpreters=py, **a), ignore_errors=True) for k, a in refused.items()]
    proc, res = play(tmp_path, tasks, list(refused))
    assert proc.returncode == 0, proc.stdout
    for k in refused:
        assert res[k]["failed"] and "nothing was changed" in res[k]["msg"], (k, res[k])
    assert "LD_PRELOAD (the dynamic loader or the C library reads it in every program) is never written host-wide, " \
           "even when listed in allow_vars" in res["ld"]["msg"]
    assert res["ld"]["forbidden_vars"] == {"LD_PRELOAD": "the dynamic loader or the C library reads it in every program"}
    assert "PYTHONPATH (the Python interpreter reads it when any Python process starts)" in res["pypath"]["msg"]
    assert "FOO is not an NCCL variable (NCCL_*); list each exact name in allow_vars" in res["foo"]["msg"]
    assert res["foo"]["not_allowed_vars"] == ["FOO"]
    assert "LD_PRELOAD (" in res["ld_allowed"]["msg"] and "even when listed in allow_vars" in res["ld_allowed"]["msg"]
    assert "allow_vars must list exact variable names (no patterns), got 'TORCH_NCCL_*'" in res["allow_pattern"]["msg"]
    assert _tree_bytes(syspy) == before
    assert syspy.etc_file.read_text() == ORIGINAL_SITECUSTOMIZE

    # Listed by name, a variable that belongs with NCCL's is written and exported.
    extra = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    proc, res = play(tmp_path, [task("Allowed", "ok", interpreters=py, env=dict(extra, NCCL_PROTO="LL"),
                                     allow_vars=sorted(extra), nccl_names="fail")], ["ok"], name="allowed")
    assert proc.returncode == 0, proc.stdout
    want = dict(extra, NCCL_PROTO="LL")
    assert res["ok"]["changed"] and res["ok"]["effective_env"] == {py[0]: want}
    assert syspy.env_of(syspy.python, sorted(want)) == want


def test_a_sitecustomize_other_users_cannot_read_is_made_readable_check_mode_and_diff_honest(tmp_path, syspy):
    """Issue 16 item 4: `chmod 0600 /etc/python3.X/sitecustomize.py`: root (the module, its probes) still imports it,
    a server run as an unprivileged user does not. The block already as asked, the file is still not as asked."""
    args = dict(interpreters=[str(syspy.python)], env={"NCCL_PROTO": "LL"}, name="nccl")
    proc, res = play(tmp_path, [task("Add", "r0", **args)], ["r0"], name="add")
    assert proc.returncode == 0, proc.stdout
    text = syspy.etc_file.read_text()
    os.chmod(syspy.etc_file, 0o600)
    os.chmod(syspy.etc_dir, 0o700)
    tasks = [task("Fix (check mode)", "c1", check=True, **args), task("Fix", "r1", **args),
             task("Fix again (check mode)", "c2", check=True, **args), task("Fix again", "r2", **args)]
    proc, res = play(tmp_path, tasks, ["c1", "r1", "c2", "r2"], name="fix", diff=True)
    assert proc.returncode == 0, proc.stdout
    assert res["c1"]["changed"] and res["r1"]["changed"] and not res["c2"]["changed"] and not res["r2"]["changed"]
    want = [dict(path=str(syspy.etc_dir), kind="directory", mode_before="0700", mode_after="0711",
                 reason="directory %s is not searchable by every user (mode 0700)" % syspy.etc_dir),
            dict(path=str(syspy.etc_file), kind="file", mode_before="0600", mode_after="0644",
                 reason="%s is not readable by every user (mode 0600)" % syspy.etc_file)]
    assert res["c1"]["access_fixes"] == res["r1"]["access_fixes"] == want and res["c2"]["access_fixes"] == []
    assert res["c1"]["files"][0]["changed"] and res["c1"]["files"][0]["access_fixes"] == want
    assert not res["c1"]["files"][0]["created"] and not res["c1"]["files"][0]["removed"]
    assert [d["before_header"] for d in res["c1"]["diff"]] == ["%s (mode)" % syspy.etc_dir, "%s (mode)" % syspy.etc_file]
    assert stat.S_IMODE(os.stat(syspy.etc_file).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(syspy.etc_dir).st_mode) == 0o711
    assert syspy.etc_file.read_text() == text and os.path.islink(syspy.link)


def test_path_must_name_a_python_start_up_hook(tmp_path, syspy):
    """A path option pointing anywhere else (a tester used /etc/ld.so.preload: every program, Python or not, then
    read the block) is refused, also through a link, in check mode too, and nothing is written."""
    preload = tmp_path / "ld.so.preload"
    preload.write_text("")
    disguised = tmp_path / "sitecustomize.py"
    disguised.symlink_to(preload)
    py = [str(syspy.python)]
    tasks = [
        dict(task("Not a hook", "p", interpreters=py, path=str(preload), env={"NCCL_DEBUG": "WARN"}), ignore_errors=True),
        dict(task("A hook name linking to a non-hook", "l", interpreters=py, path=str(disguised),
                  env={"NCCL_DEBUG": "WARN"}), ignore_errors=True),
        dict(task("Not a hook, check mode", "c", check=True, interpreters=py, path=str(tmp_path / "os.py"),
                  env={"NCCL_DEBUG": "WARN"}), ignore_errors=True),
    ]
    proc, res = play(tmp_path, tasks, ["p", "l", "c"])
    assert proc.returncode == 0, proc.stdout
    for k in ("p", "l", "c"):
        assert res[k]["failed"] and "path must name a sitecustomize.py or usercustomize.py file" in res[k]["msg"], res[k]
    assert "ld.so.preload" in res["l"]["msg"]
    assert preload.read_text() == "" and not (tmp_path / "os.py").exists()
    assert syspy.etc_file.read_text() == ORIGINAL_SITECUSTOMIZE
