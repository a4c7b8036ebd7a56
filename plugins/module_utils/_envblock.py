# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Marked blocks in host files, shared by sitecustomize_env and nccl_conf.

Both layers keep the rest of the file byte for byte: a block is the lines from
``# BEGIN gpufleet NAME`` to ``# END gpufleet NAME``. A file the module creates gets a
header line, so removing its last block removes the file and restores the host exactly.
Writes go to a temp file in the target's directory and are moved over it atomically.
"""

from __future__ import annotations

import base64
import decimal
import json
import math
import os
import re
import stat
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _statefile
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError

ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
BLOCK_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+", re.ASCII)
MARK = "gpufleet"


class BlockError(Exception):
    """A refusal with a one-sentence reason; nothing has been changed when it is raised."""


def begin_marker(name: str) -> str:
    return "# BEGIN %s %s" % (MARK, name)


def end_marker(name: str) -> str:
    return "# END %s %s" % (MARK, name)


def check_block_name(name: str) -> str:
    if not isinstance(name, str) or not BLOCK_NAME_RE.fullmatch(name):
        raise BlockError("name must match [A-Za-z0-9_.-]+ (it is written into the block markers), got %r" % (name,))
    return name


def normalize_env(env: t.Any, field: str = "env") -> t.Dict[str, str]:
    """Validate an env dict: identifier names; string or finite number values, returned as strings."""
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise BlockError("%s must be a dict of NAME: value, got %s" % (field, type(env).__name__))
    out: t.Dict[str, str] = {}
    for k, v in env.items():
        if not isinstance(k, str) or not ENV_NAME_RE.fullmatch(k):
            raise BlockError("%s: variable name %r is not a valid name (it must match ^[A-Za-z_][A-Za-z0-9_]*$)" % (field, k))
        if isinstance(v, bool) or v is None or not isinstance(v, (str, int, float)):
            raise BlockError("%s: value of %s must be a string or a number, got %s" % (field, k, "null" if v is None else type(v).__name__))
        if isinstance(v, float):
            if not math.isfinite(v):
                raise BlockError("%s: value of %s must be a finite number, got %r" % (field, k, v))
            v = repr(v)
            if "e" in v:
                # Decimal text, never an exponent: 1e20 is 100000000000000000000 (an integer parse of 1e+20 reads 1).
                v = format(decimal.Decimal(v), "f")
        v = str(v)
        if "\0" in v:
            raise BlockError("%s: value of %s contains a NUL character, which no environment can hold" % (field, k))
        out[k] = v
    return out


class Block(t.NamedTuple):
    start: int  # index of the BEGIN line
    end: int  # index of the END line


def split_lines(text: str) -> t.List[str]:
    return text.splitlines(keepends=True)


def find_block(lines: t.Sequence[str], name: str, path: str = "file") -> t.Optional[Block]:
    begin, end = begin_marker(name), end_marker(name)
    starts = [i for i, ln in enumerate(lines) if ln.rstrip("\r\n") == begin]
    ends = [i for i, ln in enumerate(lines) if ln.rstrip("\r\n") == end]
    if not starts and not ends:
        return None
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise BlockError(
            "%s has a damaged block %r (%d BEGIN and %d END markers, expected one of each in order); fix it by hand"
            % (path, name, len(starts), len(ends)))
    return Block(starts[0], ends[0])


def block_lines(lines: t.Sequence[str], name: str, path: str = "file") -> t.List[str]:
    """The lines strictly inside the block (empty when there is no block)."""
    b = find_block(lines, name, path)
    return [] if b is None else list(lines[b.start + 1:b.end])


def replace_block(text: t.Optional[str], name: str, body: t.Optional[str], header: str,
                  path: str = "file") -> t.Optional[str]:
    """Return the new file content, or None for 'no file'.

    text None means the file does not exist. body None removes the block. The file keeps
    everything outside the block; a new block is appended at the end. A file this module
    creates starts with `header`; when removing a block leaves only that header, the result
    is None (remove the file), which restores the host exactly.
    """
    if text is None:
        if body is None:
            return None
        return header + begin_marker(name) + "\n" + body + end_marker(name) + "\n"
    lines = split_lines(text)
    b = find_block(lines, name, path)
    if body is None:
        if b is None:
            return text
        new = "".join(list(lines[:b.start]) + list(lines[b.end + 1:]))
        return None if new == header else new
    new_block = begin_marker(name) + "\n" + body + end_marker(name) + "\n"
    if b is not None:
        return "".join(lines[:b.start]) + new_block + "".join(lines[b.end + 1:])
    sep = "" if text == "" or text.endswith("\n") else "\n"
    return text + sep + new_block


# --- safe file handling ---------------------------------------------------------------

def _trusted_uids() -> t.Set[int]:
    uid = os.geteuid()
    return {0} if uid == 0 else {0, uid}


def _check_dir_chain(directory: str, trusted: t.Set[int], what: str) -> None:
    """Every directory from / down to `directory` must be owned by a trusted user and not be
    writable by group or others; the sticky bit (as on /tmp) is accepted above the last level,
    because then only an entry's owner can rename or remove the (already checked) entry below."""
    directory = os.path.abspath(directory)
    parts = [p for p in directory.split(os.sep) if p]
    cur = os.sep
    chain = [cur] + [os.path.join(os.sep, *parts[:i + 1]) for i in range(len(parts))]
    for i, d in enumerate(chain):
        st = os.stat(d)  # follows links: the directory actually traversed
        if st.st_uid not in trusted:
            raise BlockError("refusing to follow the symlink %s: directory %s is owned by uid %d, not root" % (what, d, st.st_uid))
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            last = i == len(chain) - 1
            if last or not st.st_mode & stat.S_ISVTX:
                raise BlockError("refusing to follow the symlink %s: directory %s is writable by group or others (mode %s)"
                                 % (what, d, oct(st.st_mode & 0o7777)))


def resolve_target(path: str, max_hops: int = 40) -> t.Tuple[str, t.List[str]]:
    """Return (real path to write, [symlinks followed]).

    A symlink is followed only when each link is owned by a trusted user (root; also the current
    user when not root) and every directory holding a link or the final target passes
    _check_dir_chain; otherwise the module refuses (the lesson of the ansible.posix authorized_key symlink fix).
    """
    trusted = _trusted_uids()
    links: t.List[str] = []
    cur = os.path.abspath(path)
    for _hop in range(max_hops):
        # Resolve symlinks in the directory part, checking the chain each time.
        parent = os.path.dirname(cur)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            if links:
                _check_dir_chain(os.path.realpath(parent), trusted, links[0])
            return os.path.join(os.path.realpath(parent), os.path.basename(cur)), links
        if not stat.S_ISLNK(st.st_mode):
            if not stat.S_ISREG(st.st_mode):
                raise BlockError("%s is not a regular file" % cur)
            if links:
                _check_dir_chain(os.path.realpath(parent), trusted, links[0])
                if st.st_uid not in trusted:
                    raise BlockError("refusing to follow the symlink %s: its target %s is owned by uid %d, not root"
                                     % (links[0], cur, st.st_uid))
            return os.path.join(os.path.realpath(parent), os.path.basename(cur)), links
        if st.st_uid not in trusted:
            raise BlockError("refusing to follow the symlink %s: the link is owned by uid %d, not root" % (cur, st.st_uid))
        _check_dir_chain(os.path.realpath(parent), trusted, cur)
        links.append(cur)
        target = os.readlink(cur)
        cur = os.path.normpath(os.path.join(os.path.realpath(parent), target))
    raise BlockError("%s: too many levels of symbolic links" % path)


def read_text(path: str) -> t.Optional[str]:
    """File content (undecodable bytes kept through surrogateescape), or None when it does not exist."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return data.decode("utf-8", "surrogateescape")


def encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def write_temp(real_path: str, text: t.Union[str, bytes], mode: int = 0o644) -> str:
    """Write text (or bytes, as they are) to a new temp file beside real_path (_statefile's writer: the same
    filesystem, so the move is atomic); nothing is left behind when the write fails."""
    return _statefile.write_temp(real_path, text if isinstance(text, bytes) else encode(text), mode)


def write_atomic(real_path: str, data: bytes, mode: int, owner: t.Optional[t.Tuple[int, int]] = None) -> None:
    """Replace real_path with `data` (mode, and owner uid/gid where the caller may set it) in one rename; nothing is
    left behind when it fails."""
    _statefile.replace_with(write_temp(real_path, data, mode), real_path, owner)


def outdate_bytecode(real_path: str, before_mtime_ns: t.Optional[int]) -> None:
    """Make sure no cached bytecode of the file it replaced is taken for the new .py file. Python trusts a
    __pycache__ .pyc whose recorded source mtime (whole seconds) and size match the source: a sitecustomize.py
    written again within the second, with a value of the same length (NCCL_NTHREADS 512 -> 128 -> 512), ran the
    previous content, found by the role's own test of a put-back. The cache sits beside the path Python imported
    (a symlink's directory, not the real file's), so the new file is dated at least one whole second after the one it
    replaced instead: no .pyc of an earlier content can match it."""
    if before_mtime_ns is None or not real_path.endswith(".py"):
        return
    st = os.stat(real_path)
    old_s = before_mtime_ns // 1000000000
    if st.st_mtime_ns // 1000000000 <= old_s:
        os.utime(real_path, ns=(st.st_atime_ns, (old_s + 1) * 1000000000))


def diff_entry(path: str, before: t.Optional[str], after: t.Optional[str]) -> t.Dict[str, str]:
    return {
        "before_header": path if before is not None else "%s (absent)" % path,
        "after_header": path if after is not None else "%s (absent)" % path,
        "before": before or "",
        "after": after or "",
    }


def blocks_only(text: t.Optional[str]) -> t.Optional[str]:
    """`text` with gpufleet's blocks as they are and every run of other lines as one summary line: what --diff
    shows of a file that is not gpufleet's alone. Those lines are unchanged (only blocks are written) and may set
    secrets (a sitecustomize.py exporting a token), which a diff must not print."""
    if text is None:
        return None
    out: t.List[str] = []
    hidden = 0
    inside = False
    for ln in split_lines(text):
        bare = ln.rstrip("\r\n")
        if not inside and bare.startswith("# BEGIN %s " % MARK):
            inside = True
        if inside:
            if hidden:
                out.append("# ... %d line%s not written by gpufleet (unchanged, not shown)\n" % (hidden, "" if hidden == 1 else "s"))
                hidden = 0
            out.append(ln)
            inside = not bare.startswith("# END %s " % MARK)
        else:
            hidden += 1
    if hidden:
        out.append("# ... %d line%s not written by gpufleet (unchanged, not shown)\n" % (hidden, "" if hidden == 1 else "s"))
    return "".join(out)


class FileOps(t.Protocol):
    """What writing a layer file needs of AnsibleModule: its backup and its atomic move (SELinux contexts kept)."""

    def backup_local(self, fn: str) -> str: ...

    def atomic_move(self, src: str, dest: str, unsafe_writes: bool = False, keep_dest_attrs: bool = True) -> None: ...


class Previous:
    """FileOps that keeps each layer file as it was before this call first changed it (its bytes, mode and owner, or
    that it was absent) in `path`, a root-only JSON file written before the change, so restore_previous() can put the
    layers back byte for byte (the gpu_server role does when its restart is refused before the kill). A snapshot an
    earlier call left is dropped first: the file only ever holds this call's."""

    def __init__(self, files: FileOps, path: str) -> None:
        self.files, self.path = files, path
        self.kept: t.Dict[str, t.Dict[str, t.Any]] = {}
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:  # a directory there, a read-only /run: said before any layer changes
            raise StepError("cannot drop the earlier snapshot %s: %s; nothing was changed" % (path, e.strerror or e),
                            path=path) from None

    def keep(self, real_path: str) -> None:
        """Record `real_path` as it is now, once per call, before it changes (the snapshot is written first)."""
        if real_path in self.kept:
            return
        try:
            st = os.lstat(real_path)
            with open(real_path, "rb") as f:
                data: t.Optional[str] = base64.b64encode(f.read()).decode("ascii")
            entry = {"path": real_path, "content": data, "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid,
                     "gid": st.st_gid}
        except FileNotFoundError:
            entry = {"path": real_path, "content": None}
        self.kept[real_path] = entry
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), mode=0o755, exist_ok=True)
            _statefile.replace_with(write_temp(self.path, json.dumps({"files": list(self.kept.values())}), 0o600),
                                    self.path)
        except OSError as e:
            raise StepError("cannot keep %s as it was in %s: %s; it was not changed" % (real_path, self.path, e.strerror or e),
                            path=self.path) from None

    def backup_local(self, fn: str) -> str:
        return self.files.backup_local(fn)

    def atomic_move(self, src: str, dest: str, unsafe_writes: bool = False, keep_dest_attrs: bool = True) -> None:
        self.keep(dest)
        self.files.atomic_move(src, dest, unsafe_writes=unsafe_writes, keep_dest_attrs=keep_dest_attrs)


def restore_previous(path: str, check_mode: bool = False) -> t.Dict[str, t.Any]:
    """Put back each file of the snapshot `path` (Previous) as it was: its bytes, mode and owner, or absent; then drop
    the snapshot. No snapshot: nothing to put back. RV: changed, restored (the paths that differed)."""
    try:
        with open(path) as f:
            entries = json.load(f)["files"]
    except FileNotFoundError:
        return {"changed": False, "restored": []}
    except (ValueError, KeyError, TypeError) as e:
        raise StepError("%s is not a snapshot of the NCCL layers (%s); nothing was changed" % (path, e), path=path)
    try:
        return _restore(path, entries, check_mode)
    except OSError as e:
        raise StepError("cannot put the NCCL layers back from %s: %s" % (path, e.strerror or e), path=path) from None
    except (ValueError, KeyError, TypeError) as e:  # an entry without its keys, content that is not base64
        raise StepError("%s is not a snapshot of the NCCL layers (%s: %s); the layers may be partly put back"
                        % (path, type(e).__name__, e), path=path) from None


def _restore(path: str, entries: t.Sequence[t.Mapping[str, t.Any]], check_mode: bool) -> t.Dict[str, t.Any]:
    restored = []
    for e in entries:
        real, data = str(e["path"]), e["content"]
        want = None if data is None else base64.b64decode(data)
        try:
            with open(real, "rb") as f:
                now: t.Optional[bytes] = f.read()
        except FileNotFoundError:
            now = None
        if now == want and (want is None or stat.S_IMODE(os.stat(real).st_mode) == e["mode"]):
            continue
        restored.append(real)
        if check_mode:
            continue
        if want is None:
            os.unlink(real)
            continue
        before = os.stat(real).st_mtime_ns if now is not None else None
        write_atomic(real, want, int(e["mode"]), (int(e["uid"]), int(e["gid"])))
        outdate_bytecode(real, before)
    if not check_mode:
        try:
            os.unlink(path)
        except FileNotFoundError:  # gone meanwhile: the layers are back all the same
            pass
    return {"changed": bool(restored), "restored": restored}


def install(files: t.Optional[FileOps], real_path: str, tmp: str, existed: bool, backup: bool) -> t.Optional[str]:
    """Move tmp over real_path (keeping the old file's owner and mode); return the backup path."""
    if files is None:
        raise StepError("cannot write %s: no file operations given (a check-only run)" % real_path, path=real_path)
    backup_file = None
    if existed and backup:
        backup_file = files.backup_local(real_path)
    before = None
    if existed:
        st = os.stat(real_path)
        before = st.st_mtime_ns
        os.chmod(tmp, stat.S_IMODE(st.st_mode))
        try:
            os.chown(tmp, st.st_uid, st.st_gid)
        except PermissionError:
            pass
    files.atomic_move(tmp, real_path, unsafe_writes=False)
    if not existed:
        os.chmod(real_path, 0o644)
    outdate_bytecode(real_path, before)
    return backup_file


def _mode(m: int) -> str:
    return "%04o" % stat.S_IMODE(m)


def access_fixes(real_path: str, links: t.Sequence[str] = ()) -> t.List[t.Dict[str, str]]:
    """What keeps other users from reading the file: the file without read for group and others, its directory
    (or a followed symlink's) without search for them. Each: path, kind, mode_before, mode_after, reason.

    The file exists to reach every process on the host (a server run as an unprivileged user reads it as that
    user), and root reads it whatever its mode, so a check run as root alone never notices. Only the directories
    holding the file and its links are looked at: one above them that others cannot search locks them out of the
    interpreter itself, and is not this file's to change.
    """
    out: t.List[t.Dict[str, str]] = []
    seen: t.Set[str] = set()
    for d in [os.path.dirname(real_path)] + [os.path.dirname(os.path.abspath(ln)) for ln in links]:
        d = os.path.realpath(d)
        if d in seen:
            continue
        seen.add(d)
        try:
            m = os.stat(d).st_mode
        except FileNotFoundError:
            continue
        if m & 0o111 != 0o111:
            out.append(dict(path=d, kind="directory", mode_before=_mode(m), mode_after=_mode(m | 0o111),
                            reason="directory %s is not searchable by every user (mode %s)" % (d, _mode(m))))
    try:
        m = os.stat(real_path).st_mode
    except FileNotFoundError:
        return out  # created 0644 (install)
    if m & 0o444 != 0o444:
        out.append(dict(path=real_path, kind="file", mode_before=_mode(m), mode_after=_mode(m | 0o444),
                        reason="%s is not readable by every user (mode %s)" % (real_path, _mode(m))))
    return out


def fix_access_or_fail(check_mode: bool, fixes: t.Sequence[t.Mapping[str, t.Any]], real: str) -> None:
    """Apply `fixes` (not in check mode), or raise StepError naming the file and, for a permission error, the cure."""
    if not fixes or check_mode:
        return
    try:
        apply_access_fixes(fixes)
    except OSError as e:
        hint = "; run as root (become: true)" if isinstance(e, PermissionError) else ""
        raise StepError("cannot make %s readable by every user: %s%s" % (real, e.strerror or e, hint), path=real)


def apply_access_fixes(fixes: t.Sequence[t.Mapping[str, str]]) -> None:
    """Add read (file) and search (directory) for every user; nothing else of the mode changes."""
    for f in fixes:
        os.chmod(f["path"], stat.S_IMODE(os.stat(f["path"]).st_mode) | (0o444 if f["kind"] == "file" else 0o111))


def access_diff(fixes: t.Sequence[t.Mapping[str, str]]) -> t.List[t.Dict[str, str]]:
    """Diff entries for mode changes, one per path, as the file module shows them."""
    return [{"before_header": "%s (mode)" % f["path"], "after_header": "%s (mode)" % f["path"],
             "before": "mode: %s\n" % f["mode_before"], "after": "mode: %s\n" % f["mode_after"]} for f in fixes]


def remove(files: t.Optional[FileOps], real_path: str, backup: bool) -> t.Optional[str]:
    if files is None:
        raise StepError("cannot remove %s: no file operations given (a check-only run)" % real_path, path=real_path)
    backup_file = files.backup_local(real_path) if backup else None
    if isinstance(files, Previous):
        files.keep(real_path)
    os.unlink(real_path)
    return backup_file
