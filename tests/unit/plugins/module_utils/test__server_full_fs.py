# SPDX-License-Identifier: GPL-3.0-or-later
"""_server's writes on a full filesystem (issue 24, item 6): a real 64 KiB tmpfs, filled, mounted in a private mount
namespace of a child process (`unshare -m`), so nothing of it is seen outside the test. The child runs the real
_server code and reports what it saw; the directory listing shows what a failure left behind."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="needs root and util-linux unshare (a tmpfs in a private mount namespace)")

CHILD = r'''
import json, os, sys, time
from ansible_collections.gpufleet.serving.plugins.module_utils import _hostlock, _proc, _server, _statefile
d, what = sys.argv[1], sys.argv[2]
out = {}
try:
    if what == "state":
        _statefile.write_json_atomic(os.path.join(d, "sglang.json"), {"fingerprint": "x" * 100000}, 0o600)
    elif what == "lock":
        out["lock"] = _hostlock.acquire_lock(os.path.join(d, "sglang.lock"), "run-1", 60, 0)
    elif what == "pidfile":
        _statefile.write_pidfile(os.path.join(d, "sglang.pid"), _proc.read_proc(os.getpid()))
    elif what == "launch":
        # The pidfile is the one file of the launch on the full filesystem (the log is not): the server starts, then
        # cannot be tracked. Its marker finds it in /proc if it survived.
        marker = "gpufleet-untracked-%d" % os.getpid()
        try:
            _server.launch([sys.executable, "-c", "import time; time.sleep(120)", marker], {"PATH": "/usr/bin:/bin"},
                           "root", "/", sys.argv[3] + "/srv.log", os.path.join(d, "sglang.pid"))
        except _server.ServerError as e:
            out["error"] = str(e)
        out["alive"] = []
        for n in os.listdir("/proc"):
            try:  # a process may exit between the listing and the read
                if n.isdigit() and marker.encode() in open("/proc/%s/cmdline" % n, "rb").read().split(b"\0"):
                    out["alive"].append(n)
            except OSError:
                pass
    elif what == "space":
        out["problems"] = _server.space_problems({"record.state_file": os.path.join(d, "sub", "sglang.json"),
                                                  "pidfile": sys.argv[3] + "/run/sglang.pid"})
except OSError as e:
    out["error"] = str(e)
out["left"] = sorted(os.listdir(d))
out["sizes"] = {n: os.path.getsize(os.path.join(d, n)) for n in out["left"]}
print(json.dumps(out))
'''


def in_full_tmpfs(tmp_path, what: str, fill: bool = True) -> dict:
    """Run CHILD against a 64 KiB tmpfs at tmp_path/mnt (filled to the last byte unless fill is false)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    # dd stops at ENOSPC with a non-zero status: that is the point.
    fill_cmd = 'dd if=/dev/zero of="$1/filler" bs=4096 2>/dev/null; ' if fill else ""
    script = ('mount -t tmpfs -o size=64k tmpfs "$1" && %sexec "$2" -c "$3" "$1" "$4" "$5"' % fill_cmd)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    cp = subprocess.run(["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", script, "sh", str(mnt),
                         sys.executable, CHILD, what, str(tmp_path)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert cp.returncode == 0, cp.stderr
    assert not os.listdir(mnt), "the tmpfs must not be visible outside the child's mount namespace"
    return json.loads(cp.stdout.strip().splitlines()[-1])


def test_a_state_file_that_does_not_fit_names_the_file_and_leaves_no_temp_file(tmp_path):
    out = in_full_tmpfs(tmp_path, "state")
    assert "No space left on device" in out["error"] and "sglang.json" in out["error"], out
    assert out["left"] == ["filler"], out  # no sglang.json.<pid>.tmp, no partial sglang.json


def test_a_lock_on_a_full_filesystem_fails_naming_it_and_leaves_neither_an_empty_lock_nor_a_temp_file(tmp_path):
    out = in_full_tmpfs(tmp_path, "lock")
    assert "No space left on device" in out["error"] and "sglang.lock" in out["error"], out
    assert out["left"] == ["filler"], out  # no 0-byte sglang.lock (read later as corrupt), no .lock.<pid>.tmp


def test_a_pidfile_on_a_full_filesystem_fails_naming_it_and_leaves_no_temp_file(tmp_path):
    out = in_full_tmpfs(tmp_path, "pidfile")
    assert "No space left on device" in out["error"] and "sglang.pid" in out["error"], out
    assert out["left"] == ["filler"], out


def test_the_lock_is_created_whole_when_there_is_room(tmp_path):
    out = in_full_tmpfs(tmp_path, "lock", fill=False)
    assert out["lock"]["acquired"] and out["left"] == ["sglang.lock"] and out["sizes"]["sglang.lock"] > 0, out


def test_space_problems_names_the_full_directory_and_its_free_bytes(tmp_path):
    out = in_full_tmpfs(tmp_path, "space")
    mnt = str(tmp_path / "mnt")
    # The state file's directory does not exist yet: its nearest existing one, on the same filesystem, is checked.
    # The pidfile's directory, on the test's own filesystem, has room: not named.
    assert out["problems"] == ["directory %s (record.state_file) has 0 bytes free, gpufleet needs at least %d bytes there"
                               % (mnt, 16 * 1024)], out


def test_space_problems_passes_a_filesystem_with_room(tmp_path):
    assert in_full_tmpfs(tmp_path, "space", fill=False)["problems"] == []


def test_a_server_whose_pidfile_cannot_be_written_is_stopped_not_left_running_untracked(tmp_path):
    """/run/gpufleet full between the kill and the launch (seen by a new-user pass): the server started, its pidfile
    write failed, and the run said 'not relaunched' while the new server ran on, holding the GPUs, tracked by nothing."""
    out = in_full_tmpfs(tmp_path, "launch")
    assert "cannot write" in out["error"] and "sglang.pid" in out["error"] and "No space left on device" in out["error"], out
    assert "was stopped again" in out["error"], out
    assert out["alive"] == [], out  # no process of that launch is left
    assert out["left"] == ["filler"], out  # no pidfile, no temp file
