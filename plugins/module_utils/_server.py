# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Server launch helpers: the launch in a new session, its preflight (command, user, files, room) and its log.

The readiness gate is _ready.py, the state file and pidfile _statefile.py, the host lock _hostlock.py, HTTP _http.py."""

from __future__ import annotations

import grp
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _proc, _select, _statefile

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ServerError(Exception):
    def __init__(self, msg: str, **details: t.Any) -> None:
        super().__init__(msg)
        self.details = details


# ---------------------------------------------------------------- launch


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
            d = os.path.dirname(d)  # the nearest directory that exists: _statefile.ensure_dir makes the rest on its filesystem
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


def open_log(log_path: str) -> int:
    """The launch log, opened for appending; one gpufleet creates is 0644, whatever the umask of the connection."""
    _statefile.ensure_dir(os.path.dirname(log_path) or ".")
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
        _statefile.write_pidfile(pidfile, p)
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


# ---------------------------------------------------------------- state file and lock


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
