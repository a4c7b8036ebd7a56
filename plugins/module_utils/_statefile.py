# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""The server's state file (what was launched, its fingerprint and timings), its pidfile, and the atomic, root-only
writes they and the host lock's and drain record's files use."""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _proc


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


def write_pidfile(path: str, p: _proc.Proc) -> None:
    write_file_atomic(path, "%d %d\n" % (p.pid, p.start_time), 0o644)


def write_temp(path: str, data: bytes, mode: int = 0o644) -> str:
    """A fully written temp file beside `path` (the same filesystem, so a rename onto `path` is atomic), `mode` once
    written: created 0600 (mkstemp: a unique name, no symlink followed, a secret never readable wider on the way),
    then fchmod. Removed again on any error: a full filesystem fails the write, the fsync or the close, and must not
    leave a partial temp file. The one temp-file writer of the collection (state files, locks, pidfiles, the NCCL
    layers, systemd units); the OSError is the system's, callers name the file."""
    fd, tmp = tempfile.mkstemp(prefix=".%s.gpufleet-" % os.path.basename(path), suffix=".tmp",
                               dir=os.path.dirname(path) or ".")
    try:
        try:
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)  # tmpfs and most filesystems report ENOSPC at write; others only here
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    except BaseException:
        remove_quietly(tmp)
        raise
    return tmp


def replace_with(tmp: str, path: str, owner: t.Optional[t.Tuple[int, int]] = None) -> None:
    """Move a temp file of write_temp onto `path` in one rename (owner uid/gid first, where the caller may set it);
    the temp file is removed when it fails."""
    try:
        if owner is not None:
            try:
                os.chown(tmp, owner[0], owner[1])
            except PermissionError:
                pass
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _named(path: str, e: OSError) -> OSError:
    # ENOSPC alone says nothing of which of gpufleet's files could not be written.
    return OSError(e.errno, "cannot write %s: %s" % (path, e.strerror or e))


def write_file_atomic(path: str, text: str, mode: int = 0o644) -> None:
    """Replace `path` with `text` through a temp file and rename: readers see the old file or the whole new one, and
    no temp file outlives a failure. The state directory is made first."""
    ensure_dir(os.path.dirname(path))
    try:
        replace_with(write_temp(path, text.encode(), mode), path)
    except OSError as e:
        raise _named(path, e) from e


def create_exclusive(path: str, text: str, mode: int = 0o644) -> bool:
    """Create `path` holding `text` only if it does not exist (False when it does), never as an empty or partial file:
    the temp file is written in full, then hard-linked to `path` (link() fails with EEXIST like O_EXCL does). An
    O_EXCL create written afterwards left a 0-byte lock on a full filesystem, which the next run read as corrupt."""
    ensure_dir(os.path.dirname(path))
    try:
        tmp = write_temp(path, text.encode(), mode)
    except OSError as e:
        raise _named(path, e) from e
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError as e:
        raise _named(path, e) from e
    finally:
        remove_quietly(tmp)
    return True


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
