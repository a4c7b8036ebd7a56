# SPDX-License-Identifier: GPL-3.0-or-later
"""nccl_conf through real ansible-playbook runs on nccl.conf files in the test directory."""
from __future__ import annotations

import os

from nccl_helpers import play

EXISTING = "NCCL_SOCKET_IFNAME==ens1f0\nNCCL_DEBUG=WARN\n"
ENV = {"NCCL_PROTO": "LL", "NCCL_BUFFSIZE": 16777216, "NCCL_IB_HCA": "^mlx5_0:1"}


def task(title, register, check=None, **args):
    t = {"name": title, "gpufleet.serving.nccl_conf": args, "register": register}
    if check is not None:
        t["check_mode"] = check
    return t


def test_check_real_idempotent_absent_through_a_safe_symlink(tmp_path):
    etc = tmp_path / "etc"
    real = tmp_path / "shared" / "nccl.conf"
    etc.mkdir()
    real.parent.mkdir()
    real.write_text(EXISTING)
    link = etc / "nccl.conf"
    link.symlink_to(real)
    args = dict(path=str(link), env=ENV, name="nccl", backup=True)
    tasks = [
        task("Add (check mode)", "c1", check=True, **args),
        task("Add", "r1", **args),
        task("Add again (check mode)", "c2", check=True, **args),
        task("Add again", "r2", **args),
    ]
    proc, res = play(tmp_path, tasks, ["c1", "r1", "c2", "r2"], name="add", diff=True)
    assert proc.returncode == 0, proc.stdout
    assert res["c1"]["changed"] and res["r1"]["changed"] and not res["c2"]["changed"] and not res["r2"]["changed"]
    want = {k: str(v) for k, v in ENV.items()}
    assert res["c1"]["effective_conf"] == res["r1"]["effective_conf"] == want
    assert res["r1"]["real_path"] == str(real) and os.path.islink(link)
    assert real.read_text() == EXISTING + (
        "# BEGIN gpufleet nccl\n# Managed by Ansible (gpufleet.serving.nccl_conf); edits inside this block are lost.\n"
        "NCCL_BUFFSIZE=16777216\nNCCL_IB_HCA=^mlx5_0:1\nNCCL_PROTO=LL\n# END gpufleet nccl\n")
    assert res["r1"]["backup_file"] and open(res["r1"]["backup_file"]).read() == EXISTING
    # The file's own lines are counted, not printed (as sitecustomize_env's diff does).
    assert res["c1"]["diff"]["before"] == "# ... 2 lines not written by gpufleet (unchanged, not shown)\n"
    assert res["c1"]["diff"] == res["r1"]["diff"] and "ens1f0" not in res["c1"]["diff"]["after"]
    # The debugging knobs are named in a warning (nccl_names defaults to warn).
    assert any("debugging knobs" in w for w in res["r1"]["warnings"])

    proc, res = play(tmp_path, [task("Remove", "r3", state="absent", path=str(link), name="nccl"),
                                task("Remove again", "r4", state="absent", path=str(link), name="nccl")],
                     ["r3", "r4"], name="remove")
    assert proc.returncode == 0, proc.stdout
    assert res["r3"]["changed"] and not res["r4"]["changed"]
    assert res["r3"]["effective_conf"] == {k: None for k in ENV}
    assert real.read_bytes() == EXISTING.encode()


def test_created_file_is_removed_with_its_block(tmp_path):
    conf = tmp_path / "nccl.conf"
    proc, res = play(tmp_path, [task("Create", "r1", path=str(conf), env={"NCCL_DEBUG": "WARN"}),
                                task("Remove", "r2", path=str(conf), state="absent")], ["r1", "r2"])
    assert proc.returncode == 0, proc.stdout
    assert res["r1"]["created"] and res["r2"]["removed"] and not conf.exists()


def test_refusals_change_nothing(tmp_path):
    conf = tmp_path / "nccl.conf"
    conf.write_text(EXISTING + "NCCL_PROTO=Simple\n")
    tasks = [
        dict(task("Earlier line shadows the block", "s", path=str(conf), env={"NCCL_PROTO": "LL"}), ignore_errors=True),
        dict(task("Line break in a value", "nl", path=str(conf), env={"NCCL_ALGO": "Ring\nNCCL_PROTO=LL"}), ignore_errors=True),
        dict(task("Trailing space", "sp", path=str(conf), env={"NCCL_ALGO": "Ring "}), ignore_errors=True),
        dict(task("Typo refused", "ty", path=str(conf), env={"NCCL_PROTOCOL": "LL"}, nccl_names="fail"), ignore_errors=True),
        task("Typo warned", "tw", check=True, path=str(conf), env={"NCCL_PROTOCOL": "LL"}),
    ]
    proc, res = play(tmp_path, tasks, ["s", "nl", "sp", "ty", "tw"])
    assert proc.returncode == 0, proc.stdout
    assert res["s"]["failed"] and "NCCL_PROTO (line 3)" in res["s"]["msg"]
    assert res["nl"]["failed"] and "line break" in res["nl"]["msg"] and "NCCL_ALGO" in res["nl"]["msg"]
    assert res["sp"]["failed"] and "whitespace" in res["sp"]["msg"]
    assert res["ty"]["failed"] and "NCCL_PROTOCOL is not a known NCCL environment variable (did you mean NCCL_PROTO?)" in res["ty"]["msg"]
    assert not res["tw"].get("failed") and any("did you mean NCCL_PROTO" in w for w in res["tw"]["warnings"])
    assert conf.read_text() == EXISTING + "NCCL_PROTO=Simple\n"


def test_only_nccl_and_allow_listed_names_are_written(tmp_path):
    # NCCL setenv()s every NAME=VALUE line of the file in each process that initialises it, NCCL_* or not.
    etc = tmp_path / "etc"
    etc.mkdir()
    conf = etc / "nccl.conf"
    conf.write_text(EXISTING)
    tasks = [
        dict(task("Loader variable", "ld", path=str(conf), env={"LD_PRELOAD": "/tmp/evil.so"}, allow_vars=["LD_PRELOAD"]),
             ignore_errors=True),
        dict(task("Other variable", "foo", path=str(conf), env={"NCCL_PROTO": "LL", "FOO": "bar"}, nccl_names="fail"),
             ignore_errors=True),
    ]
    proc, res = play(tmp_path, tasks, ["ld", "foo"])
    assert proc.returncode == 0, proc.stdout
    assert res["ld"]["failed"] and "LD_PRELOAD (the dynamic loader" in res["ld"]["msg"]
    assert "even when listed in allow_vars" in res["ld"]["msg"]
    assert res["foo"]["failed"] and "FOO is not an NCCL variable (NCCL_*); list each exact name in allow_vars" in res["foo"]["msg"]
    assert conf.read_bytes() == EXISTING.encode() and os.listdir(etc) == ["nccl.conf"]

    proc, res = play(tmp_path, [task("Allowed variable", "ok", path=str(conf), env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
                                     allow_vars=["TORCH_NCCL_ASYNC_ERROR_HANDLING"], nccl_names="fail")], ["ok"], name="ok")
    assert proc.returncode == 0, proc.stdout
    assert res["ok"]["changed"] and res["ok"]["effective_conf"] == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    assert conf.read_text().startswith(EXISTING) and "\nTORCH_NCCL_ASYNC_ERROR_HANDLING=1\n" in conf.read_text()


def test_a_file_other_users_cannot_read_is_made_readable_check_mode_and_diff_honest(tmp_path):
    """Issue 16 item 4: NCCL in a server run as an unprivileged user skips an /etc/nccl.conf it cannot open; root (the
    module) reads it whatever its mode. Same content, mode 0600 and its directory 0700: a change, in check mode too."""
    etc = tmp_path / "etc"
    etc.mkdir()
    conf = etc / "nccl.conf"
    args = dict(path=str(conf), env={"NCCL_PROTO": "LL"}, name="nccl", nccl_names="ignore")
    proc, res = play(tmp_path, [task("Create", "r0", **args)], ["r0"], name="create")
    assert proc.returncode == 0, proc.stdout
    text = conf.read_text()
    os.chmod(conf, 0o600)
    os.chmod(etc, 0o700)
    tasks = [task("Fix (check mode)", "c1", check=True, **args), task("Fix", "r1", **args),
             task("Fix again (check mode)", "c2", check=True, **args), task("Fix again", "r2", **args)]
    proc, res = play(tmp_path, tasks, ["c1", "r1", "c2", "r2"], name="fix", diff=True)
    assert proc.returncode == 0, proc.stdout
    assert res["c1"]["changed"] and res["r1"]["changed"] and not res["c2"]["changed"] and not res["r2"]["changed"]
    want = [dict(path=str(etc), kind="directory", mode_before="0700", mode_after="0711",
                 reason="directory %s is not searchable by every user (mode 0700)" % etc),
            dict(path=str(conf), kind="file", mode_before="0600", mode_after="0644",
                 reason="%s is not readable by every user (mode 0600)" % conf)]
    assert res["c1"]["access_fixes"] == res["r1"]["access_fixes"] == want and res["c2"]["access_fixes"] == []
    # The diff shows the modes only: the content is as asked.
    assert res["c1"]["diff"] == [{"before_header": "%s (mode)" % etc, "after_header": "%s (mode)" % etc,
                                  "before": "mode: 0700\n", "after": "mode: 0711\n"},
                                 {"before_header": "%s (mode)" % conf, "after_header": "%s (mode)" % conf,
                                  "before": "mode: 0600\n", "after": "mode: 0644\n"}]
    assert oct(os.stat(conf).st_mode & 0o7777) == "0o644" and oct(os.stat(etc).st_mode & 0o7777) == "0o711"
    assert conf.read_text() == text
