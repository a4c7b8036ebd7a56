# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Server lifecycle helpers: launch in a new session, readiness gate, state file, host lock."""

from __future__ import annotations

import grp
import json
import math
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _http, _listener, _proc, _select

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ServerError(Exception):
    def __init__(self, msg: str, **details: t.Any) -> None:
        super().__init__(msg)
        self.details = details


# ---------------------------------------------------------------- launch

def request_argspec() -> t.Dict[str, t.Any]:
    """The readiness request (server_ready's request, wait_ready.request). Its headers are secret (Authorization).

    No defaults here: an option left out stays None, so `compact_request` tells an empty request from a set one;
    wait_ready applies the documented defaults (POST, status 200, 10 s).
    """
    return dict(
        url=dict(type="str"),
        method=dict(type="str"),
        # raw: a YAML dict is sent as JSON (request_body); as a str option it became its Python repr.
        body=dict(type="raw"),
        headers=dict(type="dict", no_log=True),
        status=dict(type="int"),
        expect_regex=dict(type="str"),
        timeout=dict(type="float"),
    )


def body_type_error(body: t.Any) -> t.Optional[str]:
    """A body request_body cannot send (a number, a bool), or None."""
    if body is None or isinstance(body, (str, dict, list)):
        return None
    return "request.body must be a dict or a list (sent as JSON) or a string, got %s" % type(body).__name__


def request_body(body: t.Any, headers: t.Mapping[str, str]) -> t.Tuple[t.Optional[str], t.Dict[str, str]]:
    """The body as sent, and the headers to send it with: a dict or a list as JSON, with Content-Type application/json
    unless the headers set one (in any case); a string as it is. The readiness request and the gate's share it."""
    out = dict(headers)
    if isinstance(body, (dict, list)):
        if not any(k.lower() == "content-type" for k in out):
            out["Content-Type"] = "application/json"
        return json.dumps(body), out
    return body, out


def compact_request(request: t.Optional[t.Mapping[str, t.Any]]) -> t.Dict[str, t.Any]:
    """The request's options that were set ({} when none was)."""
    return {k: v for k, v in (request or {}).items() if v is not None}


def launch_argspec(**extra: t.Any) -> t.Dict[str, t.Any]:
    """Options of a launch, shared by server_launch and server_restart (doc fragment gpufleet.serving._launch)."""
    spec: t.Dict[str, t.Any] = dict(
        name=dict(type="str", required=True),
        command=dict(type="list", elements="str", required=True),
        # The values are secret (HF_TOKEN, API keys): masked in every result (_nolog.NoLogModule).
        env=dict(type="dict", default={}, no_log=True),
        env_passthrough=dict(type="list", elements="str", default=[], no_log=False),
        user=dict(type="str", default="root"),
        workdir=dict(type="path", default="/"),
        log_path=dict(type="path", required=True),
        tag_name=dict(type="str", default="GPUFLEET_SERVICE"),
        umask=dict(type="str", default="0022"),
    )
    spec.update(extra)
    return spec


def ready_argspec() -> t.Dict[str, t.Any]:
    """server_restart's wait_ready: server_ready's options for the server the restart launched."""
    return dict(
        health_url=dict(type="str", default=""),
        request=dict(type="dict", default={}, options=request_argspec()),
        timeout=dict(type="float", default=600.0),
        interval=dict(type="float", default=0.25),
        log_tail_lines=dict(type="int", default=40),
        log_tail_path=dict(type="path"),
        check_listener=dict(type="bool", default=True),
    )


def launch_input_error(p: t.Mapping[str, t.Any]) -> t.Optional[str]:
    """What is wrong with the options of launch_argspec (env, tag, umask), or None: server_launch and server_restart
    check their common options with this one function."""
    try:
        validate_env(p["env"])
        validate_env({p["tag_name"]: p["name"]}, field="tag_name")
        parse_umask(p["umask"])
    except ServerError as e:
        return str(e)
    return None


def validate_env(env: t.Mapping[str, t.Any], field: str = "env") -> t.Dict[str, str]:
    out = {}
    for k, v in env.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise ServerError("%s: invalid variable name %r (must match ^[A-Za-z_][A-Za-z0-9_]*$)" % (field, k))
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise ServerError("%s: value of %s must be a string or a number, got %s" % (field, k, type(v).__name__))
        s = str(v)
        if "\0" in s:
            raise ServerError("%s: value of %s contains a NUL byte" % (field, k))
        out[k] = s
    return out


_UMASK = re.compile(r"^0?[0-7]{3}$")


def parse_umask(value: str) -> int:
    """The server's umask from its octal spelling ("0022" or "022")."""
    if not isinstance(value, str) or not _UMASK.match(value):
        raise ServerError("umask must be an octal mode such as 0022 (three or four digits 0-7), got %r" % (value,))
    return int(value, 8)


def ensure_dir(path: str, mode: int = 0o755) -> None:
    """Create `path` and any missing parent with exactly `mode`, whatever the umask of the connection (umask 077
    in the operator's shell made them 0700). Directories that already exist are left as they are."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent != path:
        ensure_dir(parent, mode)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        return  # made meanwhile by a concurrent run (or not a directory: the caller's open reports it)
    os.chmod(path, mode)


def launch_problems(executable: str, user: str, workdir: str, path: t.Optional[str] = None,
                    files: t.Optional[t.Mapping[str, t.Optional[str]]] = None) -> t.List[str]:
    """Why a server with this executable (argv[0]), user and workdir could not be launched here; [] when it could.

    Checked before the kill, so a server that cannot be relaunched is never stopped. A bare name (no '/') is looked
    up on `path` (the server's PATH) when it is given. The executable and the workdir must be reachable by `user`
    (mode bits; ACLs are not read). `files` maps an option name to a file gpufleet will write (log, pidfile, state
    file): it must not be a directory or lie under a file.
    """
    out = []
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        try:
            pw = pwd.getpwuid(int(user))
        except (KeyError, ValueError):
            pw = None
            out.append("user %s does not exist" % user)
    if "/" not in executable and path is not None:
        found = shutil.which(executable, path=path)
        if found is None:
            out.append("command[0] %s is not found on the server's PATH (%s)" % (executable, path))
        executable = found or executable
    if executable.startswith("/") and not (os.path.isfile(executable) and os.access(executable, os.X_OK)):
        out.append("command[0] %s is not an executable file" % executable)
    elif executable.startswith("/") and pw is not None and not _reachable(executable, pw, os.X_OK):
        out.append("user %s cannot execute %s (or search a directory above it)" % (pw.pw_name, executable))
    if not os.path.isdir(workdir):
        out.append("workdir %s is not a directory" % workdir)
    elif pw is not None and not _reachable(workdir, pw, os.X_OK):
        out.append("user %s cannot enter workdir %s (or a directory above it)" % (pw.pw_name, workdir))
    for option, f in (files or {}).items():
        problem = file_path_problem(f) if f else None
        if problem:
            out.append("%s %s" % (option, problem))
    return out


def file_path_problem(path: str) -> t.Optional[str]:
    """Why gpufleet could not write a file at `path` (it is a directory, a part above it is a file, or this process
    may not write in the nearest directory above it that exists: mode bits, a read-only filesystem), or None."""
    if os.path.isdir(path):
        return "%s is a directory" % path
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        return "%s lies under %s, which is not a directory" % (path, parent)
    # The file is written (or, for the log, opened) by this process; access() also says EROFS for root.
    if parent and not os.access(parent, os.W_OK | os.X_OK):
        return "cannot be written: directory %s is not writable (a read-only filesystem, or its mode)" % parent
    return None


def restart_files(state_file: t.Optional[str], pidfile: t.Optional[str], lock_file: t.Optional[str],
                  log_path: t.Optional[str]) -> t.Dict[str, t.Optional[str]]:
    """The files server_restart writes after its kill (state file, pidfile, lock, launch log), by its option names: each
    must be writable there, with room in its directory (restart_problems). One list for the restart's preflight and
    server_state's check before the drain, which knows the same paths by its own options."""
    return {"record.state_file": state_file, "pidfile": pidfile, "release_lock.lock_file": lock_file,
            "log_path": log_path}


def restart_problems(files: t.Mapping[str, t.Optional[str]], command: t.Optional[str] = None, user: str = "root",
                     workdir: str = "/", path: t.Optional[str] = None, space: bool = True) -> t.List[str]:
    """Why a restart, once it killed the server, could not launch it again or write its files; [] when it could.
    server_restart's preflight (before its kill) and server_state's check (before the drain) both ask this, so a
    host is refused with the same words before it is drained as after.

    `files` maps server_restart's option names to the files it writes after the kill (log_path, pidfile,
    record.state_file, release_lock.lock_file; the check adds the drain record): none may be a directory or lie
    under a file or an unwritable directory, and (with `space`) their directories need room. `command` (argv[0]),
    `user`, `workdir` and `path` (the server's PATH, on which a bare command is looked up; SAFE_PATH when unset): the
    process launch, None when the restart launches nothing itself (a systemd unit, a stop only)."""
    out: t.List[str] = []
    if command is not None:
        out = launch_problems(command, user, workdir, path=path or SAFE_PATH, files={"log_path": files.get("log_path")})
    for option in ("pidfile", "record.state_file"):
        problem = file_path_problem(str(files[option])) if files.get(option) else None
        if problem:
            out.append("%s %s" % (option, problem))
    return out + (space_problems(files) if space else [])


# What gpufleet writes on a host between the kill and the end of a restart, each in a new file renamed into place (the
# old one freed only by the rename): the state file, the pidfile, the lock, and the log's launch line. A few hundred
# bytes each, but a filesystem gives at least a block (4 KiB) to each file and its temp file.
MIN_FREE_BYTES = 16 * 1024
MIN_FREE_INODES = 4


def space_problems(files: t.Mapping[str, t.Optional[str]], min_free: int = MIN_FREE_BYTES,
                   min_inodes: int = MIN_FREE_INODES) -> t.List[str]:
    """Why gpufleet could not write its files (`files`: option name -> path) for lack of space, one entry per directory
    short of it; [] when every directory has room. Checked before the kill: a full /var/lib/gpufleet once let a restart
    succeed, then failed its record, and every later run killed the healthy server again."""
    out = []
    seen: t.Dict[str, t.List[str]] = {}
    for option, f in files.items():
        if not f:
            continue
        d = os.path.dirname(os.path.abspath(f))
        while not os.path.isdir(d) and os.path.dirname(d) != d:
            d = os.path.dirname(d)  # the nearest directory that exists: ensure_dir makes the rest on its filesystem
        seen.setdefault(d, []).append(option)
    for d, options in seen.items():
        try:
            st = os.statvfs(d)
        except OSError:
            continue  # not statable: the write itself reports it, naming the file
        free = st.f_bavail * st.f_frsize
        # f_files 0: a filesystem without an inode count (btrfs, some FUSE) has no inode limit to run out of.
        inodes_short = st.f_files > 0 and st.f_favail < min_inodes
        if free < min_free or inodes_short:
            out.append("directory %s (%s) has %d bytes%s free, gpufleet needs at least %d bytes%s there"
                       % (d, ", ".join(options), free, " and %d inodes" % st.f_favail if inodes_short else "",
                          min_free, " and %d inodes" % min_inodes if inodes_short else ""))
    return out


def _reachable(path: str, pw: t.Any, mode: int) -> bool:
    """Whether the user `pw` may search every directory above `path` and has `mode` on it, by the mode bits (what
    the kernel checks without ACLs). root may do anything but execute a file with no x bit at all."""
    if pw.pw_uid == 0:
        return True
    groups = set(os.getgrouplist(pw.pw_name, pw.pw_gid))

    def allowed(p: str, want: int) -> bool:
        try:
            st = os.stat(p)
        except OSError:
            return False
        if st.st_uid == pw.pw_uid:
            bits = (st.st_mode >> 6) & 7
        elif st.st_gid in groups:
            bits = (st.st_mode >> 3) & 7
        else:
            bits = st.st_mode & 7
        return bits & want == want

    real = os.path.realpath(path)
    parts = real.split("/")
    for i in range(1, len(parts) - 1):
        if not allowed("/".join(parts[:i + 1]) or "/", 1):
            return False
    return allowed(real, 1 if mode == os.X_OK else 4)


def base_env(user: str, passthrough: t.Sequence[str] = ()) -> t.Dict[str, str]:
    """A clean, systemd-like environment: the server's env is exactly what the inventory says."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise ServerError("user %r does not exist on this host" % user)
    env = {"PATH": SAFE_PATH, "HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name,
           "SHELL": pw.pw_shell or "/bin/sh", "LANG": os.environ.get("LANG", "C.UTF-8")}
    for k in passthrough:
        if k in os.environ:
            env[k] = os.environ[k]
    return env


def write_pidfile(path: str, p: _proc.Proc) -> None:
    write_file_atomic(path, "%d %d\n" % (p.pid, p.start_time), 0o644)


def _write_temp(path: str, text: str, mode: int) -> str:
    """A fully written temp file beside `path` with `mode` from its creation on, whatever the umask; removed again on
    any error (a full filesystem fails the write or the close, and must not leave a partial `<path>.<pid>.tmp`).
    The error names `path`, the file gpufleet was writing (ENOSPC alone says nothing of which of its files)."""
    ensure_dir(os.path.dirname(path))
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        try:
            os.fchmod(fd, mode)  # a leftover temp file of the same name keeps its mode through O_CREAT
            data = text.encode()
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)  # tmpfs and most filesystems report ENOSPC at write; others only here
        finally:
            os.close(fd)
    except OSError as e:
        _remove_quietly(tmp)
        raise OSError(e.errno, "cannot write %s: %s" % (path, e.strerror or e)) from e
    return tmp


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_file_atomic(path: str, text: str, mode: int = 0o644) -> None:
    """Replace `path` with `text` through a temp file and rename: readers see the old file or the whole new one, and
    no temp file outlives a failure."""
    tmp = _write_temp(path, text, mode)
    try:
        os.rename(tmp, path)
    except OSError as e:
        _remove_quietly(tmp)
        raise OSError(e.errno, "cannot write %s: %s" % (path, e.strerror or e)) from e


def create_exclusive(path: str, text: str, mode: int = 0o644) -> bool:
    """Create `path` holding `text` only if it does not exist (False when it does), never as an empty or partial file:
    the temp file is written in full, then hard-linked to `path` (link() fails with EEXIST like O_EXCL does). An
    O_EXCL create written afterwards left a 0-byte lock on a full filesystem, which the next run read as corrupt."""
    tmp = _write_temp(path, text, mode)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError as e:
        raise OSError(e.errno, "cannot write %s: %s" % (path, e.strerror or e)) from e
    finally:
        _remove_quietly(tmp)
    return True


def open_log(log_path: str) -> int:
    """The launch log, opened for appending; one gpufleet creates is 0644, whatever the umask of the connection."""
    ensure_dir(os.path.dirname(log_path) or ".")
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
    except FileExistsError:
        return os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.fchmod(fd, 0o644)
    return fd


def _stop_untracked(child: "subprocess.Popen[bytes]") -> None:
    """SIGKILL the process group of a server launched a moment ago (its own session, so the group is the server and
    whatever it started), and reap it."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def launch(argv: t.Sequence[str], env: t.Mapping[str, str], user: str, workdir: str, log_path: str,
           pidfile: str, umask: int = 0o022) -> _proc.Proc:
    """Start argv in a new session (setsid) as `user` with `umask`, output appended to log_path; write 'PID START'
    pidfile."""
    if not argv:
        raise ServerError("command must not be empty")
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise ServerError("user %r does not exist on this host" % user)
    if not os.path.isdir(workdir):
        raise ServerError("workdir %s does not exist" % workdir)
    log_fd = open_log(log_path)
    if os.geteuid() == 0:
        os.fchown(log_fd, pw.pw_uid, pw.pw_gid)
    as_other = os.geteuid() == 0 and pw.pw_uid != 0

    def demote() -> None:  # runs in the child between fork and exec
        # The server's own, not the operator's: the module inherits the umask of whoever ran the rollout (077 in
        # root's shell), and the same definition must give the same file modes wherever it is launched from.
        os.umask(umask)
        if as_other:
            os.setgroups([g.gr_gid for g in grp.getgrall() if pw.pw_name in g.gr_mem] + [pw.pw_gid])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)

    # Quoted as a shell would need it, so the line can be pasted to start the server by hand.
    os.write(log_fd, ("==== gpufleet launch %s: %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S%z"), shlex.join(argv))).encode())
    try:
        child = subprocess.Popen(list(argv), env=dict(env), cwd=workdir, stdin=subprocess.DEVNULL, stdout=log_fd,
                                 stderr=log_fd, start_new_session=True, close_fds=True, preexec_fn=demote)
    except OSError as e:
        raise ServerError("cannot start %s: %s" % (argv[0], e.strerror or e))
    finally:
        os.close(log_fd)
    p = None
    for _attempt in range(200):
        p = _proc.read_proc(child.pid)
        if p is not None:
            break
        time.sleep(0.005)
    if p is None:
        raise ServerError("server process %d vanished right after start" % child.pid)
    try:
        write_pidfile(pidfile, p)
    except OSError as e:
        # A server nothing tracks (its pidfile is how every later step and run finds it) must not be left running: it
        # would hold the GPUs while the run says it was not relaunched. It is a few milliseconds old, alone in its
        # session (setsid): its process group is all of it.
        _stop_untracked(child)
        raise ServerError("%s: the server just launched (pid %d) was stopped again, as nothing could track it"
                          % (e.strerror or e, p.pid))
    # Not waited for: the server outlives this module (it is in its own session).
    child.returncode = 0
    return p


# ---------------------------------------------------------------- readiness

def log_tail(path: str, lines: int = 40, max_bytes: int = 65536) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


LAUNCH_LINE = "==== gpufleet launch "


def write_launch_line(log_path: str, what: str) -> None:
    """The launch line (failure_tail starts there) for a start that gpufleet does not make itself: systemd's,
    which appends the server's output to the same file."""
    fd = open_log(log_path)
    try:
        os.write(fd, ("%s%s: %s\n" % (LAUNCH_LINE, time.strftime("%Y-%m-%dT%H:%M:%S%z"), what)).encode())
    finally:
        os.close(fd)


def mark_unverified(state_file: str) -> None:
    """Before a launch: the record says its launch is not verified yet, until record_state writes the verified one.
    A launch that fails its checks (or a run that dies meanwhile) leaves it so; the check then restarts the server
    whatever runs, while a server systemd restarted by itself (a reboot, `systemctl restart`) keeps a verified record.
    Written also where there was no record (a first launch): the check's unrecorded_launch trusts a launch carrying
    the fingerprint only where no such mark says it failed."""
    state = read_state(state_file)
    state = {} if state.get("corrupt") else state
    state["verified"] = False
    write_json_atomic(state_file, state, STATE_MODE)


def drop_record(state_file: str) -> None:
    """After a launch that passed every check but whose record could not be written: remove the record (an unlink
    needs no free space), so its mark_unverified does not make the next check restart a good server."""
    try:
        os.unlink(state_file)
    except FileNotFoundError:
        pass


LogStamp = t.Tuple[int, int, int]


def log_stamp(path: str) -> LogStamp:
    """(inode, size, mtime) of a log, (0, 0, 0) when missing: taken at launch, it tells whether the server wrote since."""
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0, 0)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def failure_tail(log_path: str, lines: int, tail_path: t.Optional[str] = None,
                 tail_since: t.Optional[LogStamp] = None) -> t.Tuple[str, str]:
    """(tail, where) for a failed start: the server's own log (tail_path) when it has lines, else the launch log.

    Older runs' lines never pass for this start's cause: in the launch log only the lines from gpufleet's last
    launch line on count, and with `tail_since` (its stamp at launch) an own log the server did not write since
    is passed over. A server that logs to its own file (its --log) leaves only that launch line in the launch log.
    """
    note = ""
    if tail_path:
        if tail_since is None or log_stamp(tail_path) != tail_since:
            tail = log_tail(tail_path, lines)
            if tail.strip():
                return tail, tail_path
        note = "; nothing new in %s" % tail_path
    out = (log_tail(log_path, lines) if log_path else "").splitlines()
    starts = [i for i, ln in enumerate(out) if ln.startswith(LAUNCH_LINE)]
    if starts:
        out = out[starts[-1]:]
        if not tail_path and not any(ln.strip() for ln in out[1:]):
            note = ("; the server wrote nothing to stdout/stderr: if it logs to a file of its own, name that file "
                    "in log_tail_path (role: gpufleet_server_log_tail_path)")
    return "\n".join(out), (log_path or "no log") + note


def ready_input_error(health_url: str, request: t.Mapping[str, t.Any], timeout: float, interval: float) -> t.Optional[str]:
    """What is wrong with readiness options, or None."""
    request = compact_request(request)
    if not 0 < timeout < math.inf:  # NaN too: every comparison with it is false, a poll that never ends
        return "timeout must be greater than 0 seconds, got %s" % timeout
    if not 0 < interval < math.inf:
        return "interval must be greater than 0 seconds, got %s" % interval
    if not health_url and not request:
        return "set health_url or request (or both)"
    if request and not request.get("url"):
        return "request.url is required when request is set"
    for what, url in (("health_url", health_url), ("request.url", (request or {}).get("url"))):
        if url and not _http.is_http_url(url):
            return "%s must be an http:// or https:// URL with a host (and a valid port), got %r" % (what, url)
    if request and request.get("method") and not re.fullmatch(r"[A-Z]+", str(request["method"])):
        return "request.method must be an HTTP method such as GET or POST, got %r" % request["method"]
    if request and body_type_error(request.get("body")):
        return body_type_error(request.get("body"))
    if request and request.get("expect_regex"):
        try:
            re.compile(request["expect_regex"])
        except re.error as e:
            return "request.expect_regex: invalid regular expression %r: %s" % (request["expect_regex"], e)
    return None


def exit_status(pid: int) -> t.Optional[str]:
    """How a launcher that this process started (and has not reaped) ended: 'exit status 1', 'killed by SIGKILL';
    None when it is not this process's child (server_ready watching a pidfile) or still runs."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if got != pid:
        return None
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            return "killed by %s" % signal.Signals(sig).name
        except ValueError:
            return "killed by signal %d" % sig
    return "exit status %d" % os.WEXITSTATUS(status)


def wait_ready(identity: t.Optional[t.Tuple[int, int]], health_url: str, request: t.Mapping[str, t.Any],
               timeout: float, interval: float, log_path: str, tail_lines: int = 40, tail_path: t.Optional[str] = None,
               tail_since: t.Optional[LogStamp] = None, tag: t.Optional[t.Tuple[str, str]] = None,
               check_listener: bool = True) -> t.Dict[str, t.Any]:
    """Poll health (then a real request) until both pass; fail at once if the server dies (tail: failure_tail).

    With `identity` (the launcher's pid and start time), an answer counts only when the socket listening on the URL's
    port belongs to the launcher's tree (or, with `tag`, to a process carrying the launch tag): a foreign listener on
    the port answers 200 while the launched server dies on EADDRINUSE. Where the socket cannot be attributed (the
    URL's host is not this host, no visible listener), the answer counts and `listener.assumed` says so.
    """
    request = compact_request(request)
    body, headers = request_body(request.get("body"), request.get("headers") or {})
    client = _http.http_client()
    t0 = time.monotonic()
    deadline = t0 + timeout
    last = "not polled yet"
    health_ok_at = None
    attempts = 0
    ours = _listener.tree_of(identity, tag) if identity is not None else None
    listener: t.Dict[str, t.Any] = {}

    def foreign_answer(url: str, what: str) -> t.Optional[str]:
        """Why an answer from `url` is not the launched server's (None: it is, or it cannot be told)."""
        if ours is None or not check_listener:
            return None
        res = _listener.port_holders(url, ours, reached_only=True)
        listener.clear()
        listener.update(res)
        if not res["foreign"] or res["ours"]:
            return None
        if res["elsewhere"]:
            # The server listens, on another address of the port: the URL will keep reaching the other process.
            raise ServerError(
                "%s answered from %s on port %d, not from the server gpufleet launched, which listens there on another "
                "address (pid %s): %s reaches that process first. Give the URL the server's own address (for example "
                "http://127.0.0.1:%d/...) or stop that process"
                % (what, _listener.foreign_text(res), res["port"], ", ".join(str(x) for x in res["elsewhere"]), url,
                   res["port"]), phase="ready", foreign_listener=res["foreign"])
        return ("%s answered, but port %d is held by %s, not by the server gpufleet launched (pid %d); not counted"
                % (what, res["port"], _listener.foreign_text(res), identity[0]))

    def done(extra: t.Dict[str, t.Any]) -> t.Dict[str, t.Any]:
        out = {"ready_s": round(time.monotonic() - t0, 3), "health_s": health_ok_at, "attempts": attempts}
        out.update(extra)
        if listener:
            out["listener"] = {k: listener[k] for k in ("port", "checked", "ours", "assumed")}
        return out

    while True:
        if identity is not None and not _proc.is_alive(identity):
            tail, where = failure_tail(log_path, tail_lines, tail_path, tail_since)
            # The last lines hold the cause (a traceback ends with it); keep them short enough for one-line summaries.
            # The launch line says nothing of the cause.
            last = " | ".join(ln.strip() for ln in tail.splitlines()[-3:] if ln.strip() and not ln.startswith(LAUNCH_LINE))
            if len(last) > 300:
                last = "..." + last[-297:]
            status = exit_status(identity[0])
            # EADDRINUSE: say who holds the port (never killed: it is not this service's).
            held = ""
            url = health_url or request.get("url")
            if url and check_listener:
                res = _listener.port_holders(url, _listener.tree_of(identity, tag))
                if res["foreign"]:
                    held = "; port %d is held by %s" % (res["port"], _listener.foreign_text(res))
            raise ServerError("server process %d exited during start-up after %.1f s%s%s; log tail (%s): %s"
                              % (identity[0], time.monotonic() - t0, " (%s)" % status if status else "", held, where,
                                 last or "(empty)"),
                              log_tail=tail, phase="startup", exit_status=status)
        attempts += 1
        try:
            if health_url and health_ok_at is None:
                code, _body = _http.http(health_url, timeout=min(5.0, max(0.1, deadline - time.monotonic())),
                                         client=client)
                if code == 200:
                    why = foreign_answer(health_url, "health")
                    if why:
                        last = why
                    else:
                        health_ok_at = time.monotonic() - t0
                else:
                    last = "health returned HTTP %d" % code
            if health_ok_at is not None or not health_url:
                if not request:
                    return done({})
                code, text = _http.http(request["url"], request.get("method") or "POST", body, headers,
                                        timeout=float(request.get("timeout") or 10), client=client)
                want = int(request.get("status") or 200)
                rx = request.get("expect_regex")
                if code == want and (not rx or re.search(rx, text)):
                    why = foreign_answer(request["url"], "the real request")
                    if why:
                        last = why
                        health_ok_at = None  # the health answer may have come from the same listener
                    else:
                        return done({"request_status": code, "response": text[:300]})
                else:
                    last = "real request returned HTTP %d: %s" % (code, text[:200])
        except _http.url_errors() as e:
            reason = getattr(e, "reason", e)
            last = ("real request" if health_ok_at is not None else "health") + " failed: %s" % reason
        if time.monotonic() >= deadline:
            hint = ""
            if health_ok_at is not None and request:
                hint = " (/health answered 200 but the real request did not succeed: the server may be hung)"
            raise ServerError("server not ready after %.1f s: %s%s" % (timeout, last, hint),
                              log_tail=failure_tail(log_path, tail_lines, tail_path, tail_since)[0], phase="ready",
                              health_ok=health_ok_at is not None)
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


# ---------------------------------------------------------------- state file and lock

# A process launch carries the fingerprint it is recorded under in this variable (the launch tag's name + the suffix):
# the server's own copy of its record, which no full or broken state filesystem can lose (server_state's check).
FINGERPRINT_SUFFIX = "_FINGERPRINT"

# The state file holds the fingerprint, an unsalted digest over the server definition, secret env values included:
# readable by others, it would let a local user test guesses of a secret. Only gpufleet (root) reads it. The lock and
# the pidfile hold no secret and stay 0644.
STATE_MODE = 0o600


def record_state(state_file: str, name: str, fingerprint: str, pidfile: str, timings: t.Mapping[str, t.Any],
                 check_mode: bool = False,
                 gate: t.Optional[t.Mapping[str, t.Any]] = None) -> t.Tuple[bool, t.Dict[str, t.Any]]:
    """Write what was launched (fingerprint, pid, start time, timings); changed when the launch identity differs.
    `gate`: the performance gate's passing measurement (the host's new baseline); without one, the record keeps the
    measurement it had (a restart without the gate does not forget the last known good)."""
    ident = pidfile_identity(pidfile)
    new = {"fingerprint": fingerprint, "pid": ident[0] if ident else None,
           "start_time": ident[1] if ident else None, "name": name, "timings": dict(timings)}
    old = read_state(state_file)
    if gate is not None:
        new["gate"] = dict(gate, fingerprint=fingerprint)
    elif isinstance(old.get("gate"), dict):
        new["gate"] = old["gate"]
    keys = ("fingerprint", "pid", "start_time")
    changed = {k: old.get(k) for k in keys} != {k: new[k] for k in keys} or old.get("verified") is False
    new["recorded_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if changed and not check_mode:
        write_json_atomic(state_file, new, STATE_MODE)
    elif not check_mode:
        restrict_mode(state_file, STATE_MODE)  # one an older gpufleet wrote 0644
    return changed, new


def restrict_mode(path: str, mode: int) -> None:
    """Give an existing regular file `mode` if it has another one (not a change to report: no content changes)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)


def start(name: str, command: t.Sequence[str], env: t.Mapping[str, str], passthrough: t.Sequence[str], user: str,
          workdir: str, log_path: str, pidfile: str, tag_name: str, umask: str = "0022") -> _proc.Proc:
    """Launch with the clean base environment, then `env`, then the launch tag (which every worker inherits)."""
    full = base_env(user, passthrough)
    full.update(env)
    full[tag_name] = name
    # The tag under a fixed name too, so a service with another tag name still knows this one (_select).
    full[_select.LAUNCH_TAG_VAR] = "%s=%s" % (tag_name, name)
    try:
        return launch(command, full, user, workdir, log_path, pidfile, parse_umask(umask))
    except KeyError as e:
        raise ServerError(str(e))


def read_state(path: str) -> t.Dict[str, t.Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, NotADirectoryError):  # the latter: a part above it is a regular file, so it cannot exist
        return {}
    except ValueError:
        return {"corrupt": True}


def write_json_atomic(path: str, data: t.Mapping[str, t.Any], mode: int = 0o644) -> None:
    """Replace path with data (JSON) through a temp file that has `mode` from its creation on, whatever the umask."""
    write_file_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n", mode)


def pidfile_identity(path: str) -> t.Optional[t.Tuple[int, int]]:
    try:
        with open(path) as f:
            parts = f.read().split()
        return int(parts[0]), int(parts[1])
    except (OSError, ValueError, IndexError):
        return None


def pidfile_uid(path: str, procs: t.Optional[t.Mapping[int, _proc.Proc]] = None) -> t.Optional[int]:
    """The uid of the live process a gpufleet pidfile ('PID START_TIME') names (None when none does): the run dir is
    root's, so the pidfile tells which user a service's server runs as."""
    ident = pidfile_identity(path)
    if ident is None:
        return None
    p = procs.get(ident[0]) if procs is not None else _proc.read_proc(ident[0])
    return p.uid if p is not None and p.start_time == ident[1] else None
