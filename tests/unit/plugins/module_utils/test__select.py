# SPDX-License-Identifier: GPL-3.0-or-later
"""_select over synthetic process tables, and pidfiles over real processes (tag and trees: tests/foundation)."""
from __future__ import annotations

import os
import re
import subprocess
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
        P(2, 0, "", pgid=0, sid=0, flags=_proc._PF_KTHREAD),               # kthreadd
        P(3, 2, "", pgid=0, sid=0, flags=_proc._PF_KTHREAD),               # kworker
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
    (dict(cmdline_regex="("), "cmdline_regex: invalid regular expression"),
    (dict(pids=[1], exclude_regex=["[z-a]"]), "exclude_regex: invalid regular expression"),
    (dict(pidfile="/x", pidfile_cmdline_regex="*"), "pidfile_cmdline_regex: invalid regular expression"),
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


@pytest.mark.parametrize("content,status", [
    ("600 1000\n", "unconfirmed"),    # ours in form, exact start time: but a start time alone confirms nothing
    ("600 1001\n", "stale"),          # ours, but pid 600 is now another process
    ("600\n", "unconfirmed"),         # foreign: older than the file, but nothing says it is the server
    ("4242\n", "not_running"),
    ("950 1000\n", "not_running"),    # zombie
])
def test_check_pidfile(tmp_path, content, status):
    f = tmp_path / "srv.pid"
    f.write_text(content)
    r = _select.check_pidfile(str(f), table(), None)
    assert r["status"] == status, r
    assert str(f) in r["reason"]


def test_foreign_pidfile_older_than_process(tmp_path):
    procs = table()
    procs[600] = procs[600]._replace(start_time=_now_ticks())  # started just now
    f = tmp_path / "old.pid"
    f.write_text("600\n")
    os.utime(f, (time.time() - 3600, time.time() - 3600))       # written an hour ago
    r = _select.check_pidfile(str(f), procs, None)
    assert r["status"] == "stale" and "started after the pidfile was written" in r["reason"]


def test_pidfile_cmdline_regex(tmp_path):
    f = tmp_path / "srv.pid"
    f.write_text("600 1000")
    assert _select.check_pidfile(str(f), table(), r"sglang")["status"] == "confirmed"
    r = _select.check_pidfile(str(f), table(), r"vllm")
    assert r["status"] == "unconfirmed" and "does not match" in r["reason"]


def test_pidfile_missing_and_garbage(tmp_path):
    r = _select.check_pidfile(str(tmp_path / "nope.pid"), table(), None)
    assert r["status"] == "missing" and r["pid"] is None and "does not exist" in r["reason"]
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


# --- pidfiles over real processes (issue 13): a pidfile alone never selects a process ---

NOBODY = 65534


@pytest.fixture
def real_sleep():
    """Start a real `sleep` (own session), optionally with extra environment or as another user (root only)."""
    started = []

    def start(env=None, uid=None):
        if uid is not None and os.geteuid() != 0:
            pytest.skip("starting another user's process needs root")

        def demote():
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)

        e = dict(os.environ, **(env or {}))
        po = subprocess.Popen(["sleep", "600"], env=e, start_new_session=True, preexec_fn=demote)
        started.append(po)
        # Popen returns once exec has closed its error pipe, which the kernel does before it maps the new
        # argv: /proc/PID/cmdline can read empty for a moment (seen in CI). Wait for it, bounded.
        deadline = time.monotonic() + 5.0
        p = _proc.read_proc(po.pid)
        while (p is None or p.cmdline != ["sleep", "600"]) and time.monotonic() < deadline:
            time.sleep(0.005)
            p = _proc.read_proc(po.pid)
        assert p is not None and p.cmdline == ["sleep", "600"], p
        return p

    yield start
    for po in started:
        po.kill()
        po.wait()


def _pidfile(tmp_path, text, age_s=0.0):
    f = tmp_path / "srv.pid"
    f.write_text(text)
    if age_s:
        os.utime(f, (time.time() - age_s, time.time() - age_s))
    return str(f)


@pytest.mark.parametrize("uid", [None, NOBODY], ids=["same-user", "other-user"])
def test_pid_only_pidfile_newer_than_unrelated_process_selects_nothing(real_sleep, tmp_path, uid):
    """The reported bug: server stopped by hand, its pidfile now holds only the pid of an older, unrelated process
    (written after it started, so the age check passes). Nothing confirms it: not selected, reported unconfirmed."""
    victim = real_sleep(uid=uid)
    path = _pidfile(tmp_path, "%d\n" % victim.pid)
    r = _select.select(_select.Selector(pidfile=path, tag="GPUFLEET_SERVICE=demo", cmdline_regex=r"demo_server\.py"))
    assert victim.pid not in r["selected"], r
    pf = r["pidfile"]
    assert pf["pid"] == victim.pid and pf["status"] == "unconfirmed" and pf["path"] == path, pf
    assert pf["confirmed_by"] is None and "left alone" in pf["reason"]
    assert pf["user"] == _proc.user_name(victim.uid) and pf["cmdline"] == "sleep 600"
    assert any("unconfirmed" in n and str(victim.pid) in n for n in r["notes"]), r["notes"]
    assert _proc.is_alive(victim.identity)


def test_pid_only_pidfile_older_than_process_is_stale(real_sleep, tmp_path):
    victim = real_sleep()
    path = _pidfile(tmp_path, "%d\n" % victim.pid, age_s=3600)
    r = _select.select(_select.Selector(pidfile=path, pidfile_cmdline_regex="sleep"))
    assert r["selected"] == {}
    assert r["pidfile"]["status"] == "stale" and "started after the pidfile was written" in r["pidfile"]["reason"]


@pytest.mark.parametrize("uid", [None, NOBODY], ids=["same-user", "other-user"])
@pytest.mark.parametrize("how", ["start_time+tag", "tag", "pidfile_cmdline_regex", "cmdline_regex"])
def test_confirmed_pidfile_selects_its_process(real_sleep, tmp_path, how, uid):
    env = {"GPUFLEET_SERVICE": "demo"} if how.endswith("tag") else None
    server = real_sleep(env=env, uid=uid)
    text = "%d %d\n" % server.identity if how.startswith("start_time") else "%d\n" % server.pid
    kw = {"tag": ("GPUFLEET_SERVICE=demo", "GPUFLEET_SERVICE=other")[not how.endswith("tag")]}
    if how == "pidfile_cmdline_regex":
        kw["pidfile_cmdline_regex"] = r"^sleep 600$"
    if how == "cmdline_regex":
        kw["cmdline_regex"] = r"^sleep 600$"
    r = _select.select(_select.Selector(pidfile=_pidfile(tmp_path, text), **kw))
    assert "pidfile" in r["selected"].get(server.pid, []), r
    by = "tag" if how.endswith("tag") else how
    assert r["pidfile"]["status"] == "confirmed" and r["pidfile"]["confirmed_by"] == by, r["pidfile"]


@pytest.mark.parametrize("uid", [None, NOBODY], ids=["same-user", "other-user"])
def test_pidfile_with_the_real_start_time_of_an_unrelated_process_selects_nothing(real_sleep, tmp_path, uid):
    """The reported bug: 'PID START_TIME' of an unrelated process (its real start time) written into the pidfile.
    The start time matches, but only the launch tag or the adopt regex confirms: unconfirmed, not selected."""
    victim = real_sleep(uid=uid)
    path = _pidfile(tmp_path, "%d %d\n" % victim.identity)
    r = _select.select(_select.Selector(pidfile=path, tag="GPUFLEET_SERVICE=demo", cmdline_regex=r"demo_server\.py"))
    assert victim.pid not in r["selected"], r
    pf = r["pidfile"]
    assert pf["pid"] == victim.pid and pf["status"] == "unconfirmed" and pf["confirmed_by"] is None, pf
    assert "left alone" in pf["reason"] and "start time alone confirms nothing" in pf["reason"], pf
    assert _proc.is_alive(victim.identity)
    # the same pidfile naming a process that carries the launch tag is confirmed by the tag
    server = real_sleep(env={"GPUFLEET_SERVICE": "demo"}, uid=uid)
    path = _pidfile(tmp_path, "%d %d\n" % server.identity)
    r = _select.select(_select.Selector(pidfile=path, tag="GPUFLEET_SERVICE=demo"))
    assert "pidfile" in r["selected"].get(server.pid, []), r
    assert r["pidfile"]["status"] == "confirmed" and r["pidfile"]["confirmed_by"] == "tag", r["pidfile"]


def test_pidfile_start_time_mismatch_is_stale_even_with_a_matching_regex(real_sleep, tmp_path):
    victim = real_sleep()
    path = _pidfile(tmp_path, "%d %d\n" % (victim.pid, victim.start_time + 7))
    r = _select.select(_select.Selector(pidfile=path, pidfile_cmdline_regex="sleep"))
    assert r["selected"] == {} and r["pidfile"]["status"] == "stale"
    assert "now belongs to another process" in r["pidfile"]["reason"]


def test_pidfile_cmdline_regex_mismatch_is_unconfirmed(real_sleep, tmp_path):
    """An explicit pidfile_cmdline_regex must match, even when the start time does."""
    server = real_sleep()
    r = _select.select(_select.Selector(pidfile=_pidfile(tmp_path, "%d %d\n" % server.identity),
                                        pidfile_cmdline_regex="vllm"))
    assert r["selected"] == {} and r["pidfile"]["status"] == "unconfirmed"
    assert "does not match" in r["pidfile"]["reason"]


def test_a_pidfile_that_is_a_directory_is_named(tmp_path):
    with pytest.raises(_select.SelectError, match="pidfile %s is a directory; name the pidfile itself" % tmp_path):
        _select.read_pidfile(str(tmp_path))


# --- two services on one host (issue 24 item 1): another service's launch tag is never selected ---

TAG = "GPUFLEET_TEST_SERVICE_%d" % os.getpid()


@pytest.fixture
def two_services(tmp_path):
    """Two real 'servers' in their own sessions, each a launcher (`sh`, whose command line ends with the same
    server_sim.py marker, as an adopt regex in group_vars matches both) and two workers, tagged sglang and sgb."""
    marker = "server_sim.py-%s" % tmp_path.name
    started = {}
    for service in ("sglang", "sgb"):
        po = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600 & wait", marker],
                              env=dict(os.environ, **{TAG: service}), start_new_session=True)
        deadline = time.monotonic() + 10
        while len(_proc.descendants([po.pid], _proc.snapshot())) < 2:
            assert time.monotonic() < deadline, "the workers of %s did not start" % service
            time.sleep(0.01)
        started[service] = po
    yield marker, {s: po.pid for s, po in started.items()}
    for po in started.values():
        os.killpg(po.pid, 9)
        po.wait()


def _tree(pid):
    procs = _proc.snapshot()
    return {pid} | _proc.descendants([pid], procs)


@pytest.mark.parametrize("criterion", ["cmdline_regex", "user", "pids", "gpu_holders"])
def test_another_services_processes_are_never_selected_whatever_matches_them(two_services, criterion):
    """Each criterion would take sgb's launcher or a worker (and with it, through its session and tree, all of sgb);
    a selection for sglang (its tag) takes none of sgb's processes and names sgb for each."""
    marker, launchers = two_services
    mine, theirs = _tree(launchers["sglang"]), _tree(launchers["sgb"])
    worker = sorted(theirs - {launchers["sgb"]})[0]
    crit = {"cmdline_regex": dict(cmdline_regex=re.escape(marker)), "user": dict(user=_proc.user_name(os.getuid())),
            "pids": dict(pids=[launchers["sgb"]]), "gpu_holders": dict(gpu_holder_pids=[worker])}[criterion]
    r = _select.select(_select.Selector(tag="%s=sglang" % TAG, **crit))
    assert mine <= set(r["selected"]), r
    assert not theirs & set(r["selected"]), r
    for pid in theirs & set(r["excluded"]):
        assert r["excluded"][pid] == ("a process of gpufleet service sgb (%s=sgb), not of sglang: another service's "
                                      "launch tag" % TAG), r["excluded"][pid]
    assert launchers["sgb"] in r["excluded"] or worker in r["excluded"], r


def test_the_stray_kills_selection_names_its_service_without_selecting_by_tag(two_services):
    """server_restart's stray kill selects the GPU holders with service_tag, not tag: sgb's worker stays out."""
    _marker, launchers = two_services
    theirs = sorted(_tree(launchers["sgb"]) - {launchers["sgb"]})
    mine = sorted(_tree(launchers["sglang"]) - {launchers["sglang"]})
    r = _select.select(_select.Selector(service_tag="%s=sglang" % TAG, gpu_holder_pids=[theirs[0], mine[0]],
                                        include_groups=False, include_descendants=False))
    assert list(r["selected"]) == [mine[0]] and r["selected"][mine[0]] == ["gpu_holder"], r
    assert "gpufleet service sgb" in r["excluded"][theirs[0]], r


def test_without_a_tag_the_selection_knows_no_service_and_takes_both(two_services):
    """The rule needs the selection's service: process_kill with only a regex is still `pkill -f`, made safe."""
    marker, launchers = two_services
    r = _select.select(_select.Selector(cmdline_regex=re.escape(marker)))
    assert _tree(launchers["sglang"]) | _tree(launchers["sgb"]) <= set(r["selected"]), r


def test_a_pidfile_naming_another_services_launcher_is_unconfirmed(two_services, tmp_path):
    marker, launchers = two_services
    pf = tmp_path / "sglang.pid"
    pid = launchers["sgb"]
    pf.write_text("%d %d\n" % (pid, _proc.read_proc(pid).start_time))
    r = _select.select(_select.Selector(tag="%s=sglang" % TAG, pidfile=str(pf), cmdline_regex=re.escape(marker)))
    assert r["pidfile"]["status"] == "unconfirmed", r["pidfile"]
    assert r["pidfile"]["reason"] == ("pidfile %s is unconfirmed: pid %d is a process of gpufleet service sgb (%s=sgb), "
                                      "not of sglang; left alone" % (pf, pid, TAG)), r["pidfile"]
    assert pid not in r["selected"], r


@pytest.mark.parametrize("theirs_env,own_tag", [
    # sgb has a tag name of its own (gpufleet_server_tag_name) and was launched by this gpufleet: the fixed
    # GPUFLEET_LAUNCH_TAG names it to a service that looks for the default tag name.
    ({"SGB_SERVICE": "sgb", "GPUFLEET_LAUNCH_TAG": "SGB_SERVICE=sgb"}, "GPUFLEET_SERVICE=sglang"),
    # sgb carries the default tag (any gpufleet, either launcher); the service restarting has a tag name of its own.
    ({"GPUFLEET_SERVICE": "sgb"}, "SGB_SERVICE=sglang"),
], ids=["other_tag_name_with_launch_tag", "default_tag_seen_by_a_custom_tag_name"])
def test_another_tag_name_is_still_another_services(tmp_path, theirs_env, own_tag):
    """Issue 24, found by the new-user pass: a service with its own gpufleet_server_tag_name was killed by another's
    adopt regex (the rule looked only for the restarting service's tag name), and it killed the other's."""
    marker = "server_sim.py-%s" % tmp_path.name
    po = subprocess.Popen(["sh", "-c", "sleep 600 & wait", marker], env=dict(os.environ, **theirs_env),
                          start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not _proc.descendants([po.pid], _proc.snapshot()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = _select.select(_select.Selector(tag=own_tag, cmdline_regex=re.escape(marker)))
        assert not _tree(po.pid) & set(r["selected"]), r
        assert "a process of gpufleet service sgb" in r["excluded"][po.pid], r
    finally:
        os.killpg(po.pid, 9)
        po.wait()


def test_a_process_launch_carries_its_tag_under_the_fixed_name_too(tmp_path):
    """What makes the rule above hold for a tag name of one's own: the process launcher sets GPUFLEET_LAUNCH_TAG."""
    from ansible_collections.gpufleet.serving.plugins.module_utils import _server

    p = _server.start("sgb", ["sleep", "600"], {}, [], _proc.user_name(os.getuid()), str(tmp_path),
                      str(tmp_path / "log"), str(tmp_path / "pid"), "SGB_SERVICE")
    try:
        env = _proc.read_environ(p.pid, ["SGB_SERVICE", _select.LAUNCH_TAG_VAR])
        assert env == {"SGB_SERVICE": "sgb", _select.LAUNCH_TAG_VAR: "SGB_SERVICE=sgb"}, env
        assert _select.other_service(p.pid, ("GPUFLEET_SERVICE", "sglang")) == "sgb"
        assert _select.other_service(p.pid, ("SGB_SERVICE", "sgb")) is None
    finally:
        os.kill(p.pid, 9)


def test_a_tag_scan_is_exact_and_only_the_pidfile_follows_a_tag_name_change(tmp_path):
    """A tag selection takes exactly NAME=VALUE (a final CI run caught a scan that also took every process of the same
    service name under another tag name: other tests' and the sandbox hosts' servers). Only the service's own pidfile
    follows a change of gpufleet_server_tag_name: the process it names, launched under the old name, is confirmed."""
    value = "svc-%d" % os.getpid()
    po = subprocess.Popen(["sleep", "600"], env=dict(os.environ, OLD_TAG_T=value, GPUFLEET_LAUNCH_TAG="OLD_TAG_T=" + value),
                          start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while _proc.read_environ(po.pid, ["OLD_TAG_T"]).get("OLD_TAG_T") != value:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        scan = _select.select(_select.Selector(tag="NEW_TAG_T=%s" % value))
        assert po.pid not in scan["selected"], scan
        pf = tmp_path / "svc.pid"
        pf.write_text("%d %d\n" % (po.pid, _proc.read_proc(po.pid).start_time))
        r = _select.select(_select.Selector(tag="NEW_TAG_T=%s" % value, pidfile=str(pf)))
        assert r["pidfile"]["status"] == "confirmed" and r["pidfile"]["confirmed_by"] == "tag", r["pidfile"]
        assert "pidfile" in r["selected"][po.pid], r
    finally:
        po.kill()
        po.wait()


def test_tag_users_limit_the_tag_to_those_users_and_the_confirmed_pidfiles(tmp_path):
    """Anyone can put a launch tag into its process's environment: with tag_users the tag selects only those users'
    processes, and the process a confirmed pidfile names (a server launched under a former gpufleet_server_user)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as nobody")
    tag = "%s_USERS" % TAG
    forged = subprocess.Popen(["/bin/sleep", "600"], env={tag: "svc"}, user=65534, group=65534, cwd="/",
                              start_new_session=True)
    mine = subprocess.Popen(["/bin/sleep", "600"], env={tag: "svc"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (_proc.read_proc(forged.pid).uid == 65534 and "sleep" in _proc.read_proc(forged.pid).command):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = _select.select(_select.Selector(tag="%s=svc" % tag, tag_users=["root"]))
        assert mine.pid in r["selected"] and forged.pid not in r["selected"], r
        assert r["excluded"][forged.pid].startswith("carries the launch tag %s=svc but runs as user %s, not as the "
                                                    "server's user (root)" % (tag, _proc.user_name(65534)))
        # Without tag_users (process_kill: the tag is the caller's whole selector) every tagged process is taken.
        assert {mine.pid, forged.pid} <= set(_select.select(_select.Selector(tag="%s=svc" % tag))["selected"])
        pf = tmp_path / "svc.pid"
        pf.write_text("%d %d\n" % (forged.pid, _proc.read_proc(forged.pid).start_time))
        r = _select.select(_select.Selector(tag="%s=svc" % tag, tag_users=["root"], pidfile=str(pf)))
        assert r["pidfile"]["status"] == "confirmed" and {mine.pid, forged.pid} <= set(r["selected"]), r
    finally:
        for p in (forged, mine):
            p.kill()
            p.wait()
