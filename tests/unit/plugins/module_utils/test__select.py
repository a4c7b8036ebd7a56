# SPDX-License-Identifier: GPL-3.0-or-later
"""_select over synthetic process tables (tag and pidfile over real processes live in tests/foundation)."""
from __future__ import annotations

import os
import time

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _proc, _select

ME = 500  # the "module" process in the synthetic table


def P(pid, ppid, cmd, pgid=None, sid=None, uid=0, state="S", start=1000, flags=0):
    return _proc.Proc(pid=pid, ppid=ppid, pgid=pgid if pgid is not None else pid, sid=sid if sid is not None else 1,
                      uid=uid, state=state, start_time=start, flags=flags, comm=cmd.split()[0][-15:] if cmd else "k",
                      cmdline=cmd.split() if cmd else [])


def table():
    procs = [
        P(1, 0, "/sbin/init", pgid=1, sid=1),
        P(2, 0, "", pgid=0, sid=0),                                        # kthreadd
        P(3, 2, "", pgid=0, sid=0),                                        # kworker
        P(100, 1, "sshd: root@pts/0", pgid=100, sid=100),
        P(101, 100, "-bash", pgid=101, sid=101),
        P(400, 101, "ansible-playbook site.yml", pgid=400, sid=101),
        P(450, 400, "/bin/sh -c python3", pgid=400, sid=101),
        P(ME, 450, "python3 AnsiballZ_process_kill.py", pgid=400, sid=101),
        # server launched with setsid: session + group leader 600, workers in its session
        P(600, 1, "python3 -m sglang.launch_server --port 30000", pgid=600, sid=600),
        P(601, 600, "python3 -c from multiprocessing.spawn import spawn_main", pgid=600, sid=600),
        P(602, 600, "python3 -c from multiprocessing.spawn import spawn_main", pgid=600, sid=600),
        P(603, 601, "python3 -c compile_worker", pgid=600, sid=600),
        P(610, 1, "python3 orphan_worker", pgid=600, sid=600),            # launcher died: reparented
        # a worker started from the login shell's session, not leading anything
        P(700, 101, "python3 bench_worker", pgid=101, sid=101),
        P(800, 1, "/usr/bin/nvidia-persistenced --user nvidia-persistenced", pgid=800, sid=800),
        P(801, 800, "helper-of-persistenced", pgid=800, sid=800),
        P(900, 1, "unrelated daemon", pgid=900, sid=900, uid=1000),
        P(950, 1, "python3 -m sglang.launch_server zombie", pgid=950, sid=950, state="Z"),
    ]
    return {p.pid: p for p in procs}


def sel(**kw):
    return _select.select(_select.Selector(**kw), table(), self_pid=ME)


@pytest.mark.parametrize("kw,selected", [
    (dict(pids=[600]), {600, 601, 602, 603, 610}),                     # leader: session incl. the orphan
    (dict(pids=[600], include_groups=False), {600, 601, 602, 603}),    # descendants only
    (dict(pids=[600], include_groups=False, include_descendants=False), {600}),
    (dict(pids=[601]), {601, 603}),                                    # non-leader: its subtree only
    (dict(pids=[700]), {700}),                                         # shares the login session: no shell
    (dict(cmdline_regex=r"sglang\.launch_server"), {600, 601, 602, 603, 610}),
    (dict(cmdline_regex=r"orphan_worker", include_groups=False), {610}),
    (dict(user="1000"), {900}),
    (dict(gpu_holder_pids=[602, 603], include_groups=False), {602, 603}),
    (dict(pids=[4242]), set()),
])
def test_selection(kw, selected):
    assert set(sel(**kw)["selected"]) == selected


def test_reasons_are_recorded():
    r = sel(pids=[601], cmdline_regex="compile_worker")
    assert r["selected"][601] == ["pid"]
    assert r["selected"][603] == ["cmdline", "descendant"]


@pytest.mark.parametrize("pids", [[1], [ME], [450], [400], [101], [100], [2], [3]])
def test_protected_never_selected_nor_expanded(pids):
    """pid 1, kernel threads and the module's own chain are excluded, and do not pull in their trees."""
    r = sel(pids=pids)
    assert r["selected"] == {}
    assert set(r["excluded"]) == set(pids)
    assert all("protected" in v for v in r["excluded"].values())


def test_regex_matching_own_chain_selects_nothing_of_it():
    r = sel(cmdline_regex=r"ansible-playbook|AnsiballZ|bash")
    assert set(r["selected"]) == set()
    assert {400, 101} <= set(r["excluded"]) and ME not in r["excluded"]


def test_default_excludes_and_no_expansion_from_excluded():
    r = sel(cmdline_regex="^/usr/bin/nvidia-persistenced")
    assert r["selected"] == {}
    assert 800 in r["excluded"] and "excluded by" in r["excluded"][800]
    # An explicit empty exclude list lets it through (and then its tree follows).
    assert set(sel(cmdline_regex="^/usr/bin/nvidia-persistenced", exclude_regex=[])["selected"]) == {800, 801}


def test_zombie_excluded():
    r = sel(pids=[950])
    assert r["selected"] == {}
    assert r["excluded"][950].startswith("zombie")


def test_notes_for_missing_pid():
    assert sel(pids=[4242])["notes"] == ["pid 4242 is not running"]


def test_self_not_matched_by_own_cmdline():
    assert ME not in sel(cmdline_regex="AnsiballZ")["selected"]


@pytest.mark.parametrize("kw,msg", [
    (dict(cmdline_regex="("), "invalid regular expression"),
    (dict(pids=[1], exclude_regex=["[z-a]"]), "invalid regular expression"),
    (dict(pidfile="/x", pidfile_cmdline_regex="*"), "invalid regular expression"),
    (dict(tag="novalue"), "tag must look like NAME=VALUE"),
    (dict(tag="=x"), "tag must look like NAME=VALUE"),
    (dict(tag="1BAD=x"), "tag must look like NAME=VALUE"),
    (dict(tag="GOOD="), "tag must look like NAME=VALUE"),
    (dict(user="no-such-user-gpufleet"), "user 'no-such-user-gpufleet' does not exist"),
])
def test_bad_input(kw, msg):
    with pytest.raises(_select.SelectError, match=msg.replace("(", r"\(")):
        sel(**kw)


@pytest.mark.parametrize("tag,expected", [
    ("GPUFLEET_SERVICE=sglang", ("GPUFLEET_SERVICE", "sglang")),
    ("A=b=c", ("A", "b=c")),
])
def test_parse_tag(tag, expected):
    assert _select.parse_tag(tag) == expected


def test_is_empty():
    assert _select.Selector().is_empty()
    assert not _select.Selector(pids=[1]).is_empty()
    assert not _select.Selector(gpu_holder_pids=[3]).is_empty()


# --- pidfiles (synthetic table; start_time is compared, mtime against the real boot time) ---

def _now_ticks() -> int:
    return int((time.time() - _proc.boot_time()) * os.sysconf("SC_CLK_TCK"))


@pytest.mark.parametrize("content,ok", [
    ("600 1000\n", True),          # ours: exact start time
    ("600 1001\n", False),         # ours, but pid 600 is now another process
    ("600\n", True),               # foreign: started before the file was written
    ("4242\n", False),             # not running
    ("950 1000\n", False),         # zombie
])
def test_check_pidfile(tmp_path, content, ok):
    f = tmp_path / "srv.pid"
    f.write_text(content)
    pid, why = _select.check_pidfile(str(f), table(), None)
    assert (pid is not None) is ok, why
    assert str(f) in why


def test_foreign_pidfile_older_than_process(tmp_path):
    procs = table()
    procs[600] = procs[600]._replace(start_time=_now_ticks())  # started just now
    f = tmp_path / "old.pid"
    f.write_text("600\n")
    os.utime(f, (time.time() - 3600, time.time() - 3600))       # written an hour ago
    pid, why = _select.check_pidfile(str(f), procs, None)
    assert pid is None and "started after the pidfile was written" in why


def test_pidfile_cmdline_regex(tmp_path):
    f = tmp_path / "srv.pid"
    f.write_text("600 1000")
    assert _select.check_pidfile(str(f), table(), r"sglang")[0] == 600
    pid, why = _select.check_pidfile(str(f), table(), r"vllm")
    assert pid is None and "does not match" in why


def test_pidfile_missing_and_garbage(tmp_path):
    pid, why = _select.check_pidfile(str(tmp_path / "nope.pid"), table(), None)
    assert pid is None and "does not exist" in why
    g = tmp_path / "garbage.pid"
    g.write_text("hello")
    with pytest.raises(_select.SelectError, match="does not start with a pid"):
        _select.check_pidfile(str(g), table(), None)


def test_stale_pidfile_selects_nothing(tmp_path):
    f = tmp_path / "srv.pid"
    f.write_text("600 999")
    r = sel(pidfile=str(f))
    assert r["selected"] == {}
    assert "stale" in r["notes"][0]


def test_describe():
    d = _select.describe(600, table(), ["pid"])
    assert d == {"pid": 600, "ppid": 1, "start_time": 1000, "user": "root",
                 "cmdline": "python3 -m sglang.launch_server --port 30000", "matched_by": ["pid"]}
