# SPDX-License-Identifier: GPL-3.0-or-later
"""_proc: /proc parsing against a synthetic proc root and against this machine's real /proc."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _proc


def _stat_line(pid: int, comm: str, state: str = "S", ppid: int = 1, pgid: int = 100, sid: int = 100,
               flags: int = 4194560, start: int = 123456) -> str:
    # Fields 3.. of /proc/PID/stat; field 22 (start time) is rest[19].
    rest = [state, str(ppid), str(pgid), str(sid), "0", "-1", str(flags)] + ["0"] * 12 + [str(start)] + ["0"] * 30
    return "%d (%s) %s\n" % (pid, comm, " ".join(rest))


def _fake_proc(root, pid: int, comm: str, cmdline: bytes = b"python3\0-m\0server\0", environ: bytes = b"", **kw) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(_stat_line(pid, comm, **kw))
    (d / "cmdline").write_bytes(cmdline)
    (d / "environ").write_bytes(environ)


@pytest.mark.parametrize("comm", [
    "python3",
    "my server",          # space
    "a) (b",              # parens that fool a split on the first ')'
    "x) S 1 2 3 (",       # looks like fields
    ")",
    "",
])
def test_read_proc_comm_with_spaces_and_parens(tmp_path, comm):
    _fake_proc(tmp_path, 4242, comm, ppid=77, pgid=4242, sid=4000, start=987654, state="R")
    p = _proc.read_proc(4242, str(tmp_path))
    assert p is not None
    assert p.comm == comm
    assert (p.pid, p.ppid, p.pgid, p.sid, p.state, p.start_time) == (4242, 77, 4242, 4000, "R", 987654)
    assert p.identity == (4242, 987654)
    assert p.cmdline == ["python3", "-m", "server"]
    assert p.command == "python3 -m server"


def test_read_proc_gone_and_garbage(tmp_path):
    assert _proc.read_proc(99999, str(tmp_path)) is None
    d = tmp_path / "5"
    d.mkdir()
    (d / "stat").write_text("garbage without parens")
    (d / "cmdline").write_bytes(b"")
    assert _proc.read_proc(5, str(tmp_path)) is None


@pytest.mark.parametrize("raw,expected", [
    (b"", []),
    (b"a\0", ["a"]),
    (b"a\0b c\0", ["a", "b c"]),
    (b"caf\xc3\xa9\0\xff\0", ["caf\u00e9", "\udcff"]),  # invalid UTF-8 survives via surrogateescape
])
def test_cmdline_split(tmp_path, raw, expected):
    _fake_proc(tmp_path, 7, "x", cmdline=raw)
    assert _proc.read_proc(7, str(tmp_path)).cmdline == expected


def test_command_of_kernel_thread_uses_comm(tmp_path):
    _fake_proc(tmp_path, 9, "kworker/0:1", cmdline=b"", ppid=2, flags=_proc._PF_KTHREAD)
    p = _proc.read_proc(9, str(tmp_path))
    assert p.command == "[kworker/0:1]"
    assert p.is_kernel_thread


@pytest.mark.parametrize("pid,ppid,flags,kthread", [
    (2, 0, _proc._PF_KTHREAD, True),   # kthreadd
    (50, 2, _proc._PF_KTHREAD, True),  # a child of kthreadd
    (51, 1, _proc._PF_KTHREAD, True),  # PF_KTHREAD flag
    (52, 1, 4194560, False),           # ordinary process
    (2, 0, 4194560, False),            # pid 2 in a pid namespace of its own (a container's server launcher)
    (3, 2, 4194560, False),            # its worker
])
def test_is_kernel_thread(tmp_path, pid, ppid, flags, kthread):
    _fake_proc(tmp_path, pid, "k", ppid=ppid, flags=flags)
    assert _proc.read_proc(pid, str(tmp_path)).is_kernel_thread is kthread


def _tree(tmp_path):
    # 10 (session+group leader) -> 11 -> 12 ; 10 -> 13 (own group 13 in session 10)
    # 20 is in session 10 but is not a leader of anything; 30 is unrelated.
    _fake_proc(tmp_path, 1, "init", ppid=0, pgid=1, sid=1)
    _fake_proc(tmp_path, 10, "launcher", ppid=1, pgid=10, sid=10)
    _fake_proc(tmp_path, 11, "w1", ppid=10, pgid=10, sid=10)
    _fake_proc(tmp_path, 12, "w1child", ppid=11, pgid=10, sid=10)
    _fake_proc(tmp_path, 13, "w2", ppid=10, pgid=13, sid=10)
    _fake_proc(tmp_path, 20, "orphan", ppid=1, pgid=10, sid=10)
    _fake_proc(tmp_path, 30, "unrelated", ppid=1, pgid=30, sid=30)
    return _proc.snapshot(str(tmp_path))


def test_snapshot_descendants_ancestors(tmp_path):
    procs = _tree(tmp_path)
    assert sorted(procs) == [1, 10, 11, 12, 13, 20, 30]
    assert _proc.descendants([10], procs) == {11, 12, 13}
    assert _proc.descendants([11], procs) == {12}
    assert _proc.descendants([30], procs) == set()
    assert _proc.ancestors(12, procs) == [11, 10, 1]
    assert _proc.children_map(procs)[10] == [11, 13]


@pytest.mark.parametrize("leaders,members", [
    ([10], {10, 11, 12, 13, 20}),   # session leader: whole session (orphan 20 included)
    ([13], {13}),                   # group leader of its own group, not a session leader
    ([11], set()),                  # not a leader of anything: expands to nothing
    ([20], set()),                  # shares the session, leads nothing: must not pull the session in
    ([999], set()),
])
def test_group_members_only_for_leaders(tmp_path, leaders, members):
    assert _proc.group_members(leaders, _tree(tmp_path)) == members


def test_protected_pids_synthetic(tmp_path):
    procs = _tree(tmp_path)
    _fake_proc(tmp_path, 2, "kthreadd", ppid=0, pgid=0, sid=0, flags=_proc._PF_KTHREAD)
    _fake_proc(tmp_path, 3, "kworker", ppid=2, pgid=0, sid=0, flags=_proc._PF_KTHREAD)
    _fake_proc(tmp_path, 4, "worker", ppid=2, pgid=0, sid=0)  # a child of pid 2 without the flag: ordinary
    procs = _proc.snapshot(str(tmp_path))
    assert _proc.protected_pids(procs, self_pid=12) == {1, 2, 3, 10, 11, 12}


def test_protected_pids_real_chain():
    procs = _proc.snapshot()
    prot = _proc.protected_pids(procs)
    assert {1, os.getpid(), os.getppid()} <= prot
    for pid in _proc.ancestors(os.getpid(), procs):
        assert pid in prot


def _after_exec(pid: int) -> _proc.Proc:
    """Until exec completes a fresh child still shows the parent's cmdline and environ."""
    deadline = time.monotonic() + 10
    while True:
        p = _proc.read_proc(pid)
        if p is not None and "-c" in p.cmdline:
            return p
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_real_process_identity_and_liveness():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        p = _after_exec(child.pid)
        assert p is not None and p.ppid == os.getpid()
        assert p.cmdline[0] == sys.executable
        assert _proc.is_alive(p.identity)
        assert not _proc.is_alive((child.pid, p.start_time + 1)), "a different start time is a different process"
        assert child.pid in _proc.descendants([os.getpid()], _proc.snapshot())
        started = _proc.start_epoch(p)
        assert abs(started - time.time()) < 30
    finally:
        child.kill()
        child.wait()
    assert not _proc.is_alive(p.identity)
    assert _proc.read_proc(child.pid) is None or _proc.read_proc(child.pid).start_time != p.start_time


def test_zombie_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    p = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        p = _proc.read_proc(child.pid)
        if p is not None and p.state == "Z":
            break
        time.sleep(0.01)
    try:
        assert p is not None and p.state == "Z"
        assert not _proc.is_alive(p.identity)
    finally:
        child.wait()


def test_read_environ_only_requested_keys(tmp_path):
    env = b"HF_TOKEN=hf_secret\0GPUFLEET_SERVICE=sglang\0NCCL_DEBUG=INFO\0BAD\xff=v\xfe\0NOEQUALS\0EMPTY=\0A=b=c\0"
    _fake_proc(tmp_path, 40, "srv", environ=env)
    root = str(tmp_path)
    got = _proc.read_environ(40, ["GPUFLEET_SERVICE", "NCCL_DEBUG", "EMPTY", "A", "MISSING"], root)
    assert got == {"GPUFLEET_SERVICE": "sglang", "NCCL_DEBUG": "INFO", "EMPTY": "", "A": "b=c"}
    assert "hf_secret" not in repr(got)
    raw = _proc.read_environ_raw(40, root)
    assert raw["BAD\udcff"] == "v\udcfe"
    assert "NOEQUALS" not in raw
    assert _proc.environ_has(40, "GPUFLEET_SERVICE", "sglang", root)
    assert not _proc.environ_has(40, "GPUFLEET_SERVICE", "vllm", root)
    assert not _proc.environ_has(41, "GPUFLEET_SERVICE", "sglang", root)


def test_read_environ_real_process_and_errors():
    env = dict(os.environ, GPUFLEET_SERVICE="unit-env", HF_TOKEN="hf_do_not_leak")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        _after_exec(child.pid)
        got = _proc.read_environ(child.pid, ["GPUFLEET_SERVICE"])
        assert got == {"GPUFLEET_SERVICE": "unit-env"}
    finally:
        child.kill()
        child.wait()
    with pytest.raises(_proc.ProcError, match="gone") as e:
        _proc.read_environ(child.pid, ["X"])
    assert e.value.pid == child.pid


def test_read_environ_permission_hint():
    """As an unprivileged user, another user's environ fails with the pid and a hint to use become."""
    d = tempfile.mkdtemp(prefix="gpufleet-proc-")
    try:
        os.chmod(d, 0o755)
        shutil.copy(_proc.__file__, os.path.join(d, "_proc_copy.py"))  # stdlib-only module
        os.chmod(os.path.join(d, "_proc_copy.py"), 0o644)
        code = (
            "import sys; sys.path.insert(0, %r)\n"
            "import _proc_copy as _proc\n"
            "try:\n    _proc.read_environ(1, ['X'])\nexcept _proc.ProcError as e:\n    print('ERR', e.pid, e)\n"
        ) % d

        def drop() -> None:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)

        r = subprocess.run([shutil.which("python3", path="/usr/bin:/bin") or "python3", "-c", code], preexec_fn=drop,
                           stdout=subprocess.PIPE, text=True, check=True, cwd=d)
    finally:
        shutil.rmtree(d)
    assert r.stdout.startswith("ERR 1 Permission denied reading /proc/1/environ")
    assert "become: true" in r.stdout


def test_device_holders(tmp_path):
    """Real fds: a process holding a file whose path matches the device regex is a holder."""
    dev = tmp_path / "nvidia0"
    dev.write_text("")
    other = tmp_path / "notes.txt"
    other.write_text("")
    with open(dev) as f1, open(other) as f2:
        assert f1 and f2
        rx = r"^%s$" % str(dev).replace(".", r"\.")
        holders = _proc.device_holders([os.getpid()], rx)
        assert holders == {os.getpid(): [str(dev)]}
    assert _proc.device_holders([os.getpid()], rx) == {}
    assert _proc.device_holders([999999999], rx) == {}


def test_boot_time_is_in_the_past():
    assert 0 < _proc.boot_time() < time.time()
    assert _proc.user_name(0) == "root"
    assert _proc.user_name(987654) == "987654"
