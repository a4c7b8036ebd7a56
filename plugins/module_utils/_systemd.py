# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""The systemd launcher's side of the restart engine and of the check: systemctl and journalctl, nothing else.

systemd itself is the authority on what a unit runs: `systemctl show` gives the main pid, the state and the drop-ins
in force; the unit file the role wrote is compared byte for byte with the desired one. The calls go through a runner
(AnsibleModule.run_command in the modules) so the modules' environment and error handling apply.
"""

from __future__ import annotations

import glob
import os
import stat
import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _envblock

Runner = t.Callable[[t.List[str]], t.Tuple[int, str, str]]

# What the engine and the check read; one `systemctl show` call.
PROPERTIES = ("LoadState", "ActiveState", "SubState", "MainPID", "Result", "ExecMainCode", "ExecMainStatus",
              "UnitFileState", "FragmentPath", "DropInPaths", "NeedDaemonReload", "TimeoutStopUSec", "KillMode",
              "Restart")

_SPAN_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def span_seconds(text: str) -> t.Optional[float]:
    """systemctl show's time span ('5min', '1min 30s', '500ms', '2s') in seconds; None for infinity or unparsable."""
    total = 0.0
    parts = (text or "").split()
    if not parts:
        return None
    for part in parts:
        num = part.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = part[len(num):] or "s"
        if unit not in _SPAN_UNITS:
            return None
        try:
            total += float(num) * _SPAN_UNITS[unit]
        except ValueError:
            return None
    return total


# siginfo's si_code for a child's end, as systemctl status spells it.
_EXIT_CODES = {"1": "exited", "2": "killed", "3": "dumped"}


class SystemdError(Exception):
    def __init__(self, msg: str, **details: t.Any) -> None:
        super().__init__(msg)
        self.details = details


def _call(run: Runner, argv: t.List[str], ok: t.Sequence[int] = (0,)) -> str:
    rc, out, err = run(argv)
    if rc not in ok:
        raise SystemdError("%s failed (rc=%d): %s" % (" ".join(argv), rc, (err or out).strip()[-400:]), rc=rc)
    return out


def show(run: Runner, unit: str) -> t.Dict[str, str]:
    """The unit's properties (PROPERTIES); an unknown unit reads LoadState=not-found, MainPID=0."""
    out = _call(run, ["systemctl", "show", "--property=" + ",".join(PROPERTIES), "--", unit])
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {k: props.get(k, "") for k in PROPERTIES}


def main_pid(props: t.Mapping[str, str]) -> int:
    try:
        return int(props.get("MainPID") or 0)
    except ValueError:
        return 0


def _dropin_dir_names(unit: str) -> t.List[str]:
    """The drop-in directories systemd reads for `unit`: its own (UNIT.d) and those of each dash prefix of its name
    (gpufleet-demo.service: gpufleet-.service.d), as systemd.unit(5) says."""
    name, dot, suffix = unit.rpartition(".")
    dirs = [unit + ".d"]
    parts = name.split("-")
    for i in range(1, len(parts)):
        dirs.append("-".join(parts[:i]) + "-" + dot + suffix + ".d")
    return dirs


def foreign_dropins(props: t.Mapping[str, str], unit: str) -> t.List[str]:
    """The drop-ins in force for this unit: its own (`systemctl edit`: UNIT.d/*.conf under /etc, /run or /usr/lib)
    and those of a name prefix (gpufleet-.service.d/, which apply to it too).

    Type-wide drop-ins (service.d/) are left out: they apply to every service of the host and are the host's policy,
    not an edit of this unit. The role writes no drop-in, so every one listed here is someone else's."""
    paths = (props.get("DropInPaths") or "").split()
    if not paths and props.get("LoadState") == "not-found":
        # A unit not installed yet (the first rollout) has no DropInPaths, but drop-ins made for it beforehand apply
        # once it is: read them where systemd will (its own directories; a name prefix's are found once it is loaded).
        paths = sorted(p for d in _dropin_dir_names(unit) for base in ("/etc", "/run", "/usr/lib")
                       for p in glob.glob("%s/systemd/system/%s/*.conf" % (base, glob.escape(d))))
    return [p for p in paths if os.path.basename(os.path.dirname(p)) != "service.d"]


def removable_dropin(path: str, unit: str) -> bool:
    """A drop-in of this unit alone, in the admin's or the runtime's directory: one gpufleet may delete."""
    d = os.path.dirname(path)
    return (os.path.basename(d) == unit + ".d" and path.endswith(".conf")
            and d in ("/etc/systemd/system/" + unit + ".d", "/run/systemd/system/" + unit + ".d"))


def exit_status(props: t.Mapping[str, str]) -> str:
    """'code=exited, status=1' / 'code=killed, status=9' (as systemctl status says it), or ''."""
    code = _EXIT_CODES.get(props.get("ExecMainCode") or "")
    if not code:
        return ""
    return "Result=%s, code=%s, status=%s" % (props.get("Result") or "?", code, props.get("ExecMainStatus") or "?")


def _file_drift(path: str, desired: str, what: str, secret: bool) -> t.Optional[str]:
    """Why the file at `path` is not `desired` (a regular file, root's, 0600 when `secret`), or None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "%s %s is missing" % (what, path)
    if stat.S_ISLNK(st.st_mode):
        return "%s %s is a symlink, not the file gpufleet writes" % (what, path)
    try:
        with open(path, "rb") as f:
            same = f.read() == desired.encode()
    except OSError as e:
        return "%s %s is unreadable: %s" % (what, path, e.strerror)
    if not same:
        return "%s %s differs from the desired one (edited by hand, or a changed setting)" % (what, path)
    if secret and (stat.S_IMODE(st.st_mode) != 0o600 or st.st_uid != 0):
        return "%s %s is mode %04o owned by uid %d, not 0600 root's (its values are secret)" % (
            what, path, stat.S_IMODE(st.st_mode), st.st_uid)
    return None


def drift(props: t.Mapping[str, str], unit: str, unit_path: str, desired: t.Optional[str],
          enabled: t.Optional[bool], env_file: t.Optional[str] = None,
          env_content: t.Optional[str] = None,
          loaded_settings: t.Optional[t.Mapping[str, t.Any]] = None) -> t.Dict[str, t.Any]:
    """How the unit systemd would run differs from the desired one.

    `restart`: reasons the running server does not run the desired unit (a restart applies them). `other`: drift a
    restart does not fix (enablement, drop-ins), reported and handled by the caller."""
    restart: t.List[str] = []
    other: t.List[str] = []
    loaded = props.get("LoadState") == "loaded"
    content_matches: t.Optional[bool] = None
    if desired is not None:
        why = _file_drift(unit_path, desired, "unit file", secret=False)
        content_matches = why is None
        if why:
            restart.append(why.replace("the desired one", "the desired unit"))
    if env_file and env_content is not None:
        # The server's environment (its secrets): the unit reads it at each start, a reboot's included.
        why = _file_drift(env_file, env_content, "environment file", secret=True)
        if why:
            restart.append(why)
    fragment = props.get("FragmentPath") or ""
    if loaded and fragment and fragment != unit_path and fragment != "/dev/null":
        # Another unit file of the same name wins over the role's (/etc/systemd/system.control, a unit path earlier
        # in systemd's list): rewriting the role's file and restarting would change nothing, at each run.
        raise SystemdError("systemd loads %s from %s, not from %s (another unit file of that name overrides the "
                           "role's): remove it (and systemctl daemon-reload); nothing was changed"
                           % (unit, fragment, unit_path), fragment_path=fragment)
    if (loaded and content_matches and props.get("NeedDaemonReload") != "yes" and loaded_settings
            and not foreign_dropins(props, unit)):  # drop-ins change these on purpose: reported as such
        # The file is right but systemd may run an older one (restored with its old mtime after a reload): compare
        # what the role sets with what systemd has loaded.
        for key, want in sorted(loaded_settings.items()):
            have = props.get(key, "")
            same = (abs((span_seconds(have) or -1.0) - float(want)) < 0.0015 if key == "TimeoutStopUSec"
                    else have == str(want))
            if not same:
                restart.append("systemd runs %s with %s=%s, not the unit file's %s (a daemon-reload applies the file)"
                               % (unit, key, have or "?", want))
    if loaded and props.get("NeedDaemonReload") == "yes":
        # The file on disk is not what systemd runs: a restart after a daemon-reload makes them one.
        restart.append("the unit file changed on disk since systemd loaded it (daemon-reload pending)")
    # A unit not installed yet: the drop-ins made for it beforehand (found on disk) apply once it is.
    dropins = foreign_dropins(props, unit) if loaded or props.get("LoadState") == "not-found" else []
    if dropins:
        other.append("drop-ins gpufleet did not write change the unit: %s" % ", ".join(dropins))
    state = props.get("UnitFileState") or ""
    if enabled is not None and loaded:
        # Only "enabled" survives a reboot as the role means it: enabled-runtime is gone after one, an alias or a
        # linked unit is not the role's file.
        if enabled and state != "enabled":
            other.append("unit is %s, not enabled (the server would not come back after a reboot)" % (state or "not enabled"))
        elif not enabled and state in ("enabled", "enabled-runtime"):
            other.append("unit is enabled, and gpufleet_server_systemd_enabled is false")
    return dict(restart=restart, other=other, dropins=dropins, content_matches=content_matches,
                enabled_state=state, loaded=loaded)


def daemon_reload(run: Runner) -> None:
    _call(run, ["systemctl", "daemon-reload"])


def stop(run: Runner, unit: str, bound: t.Optional[float] = None, final_wait: float = 5.0,
         poll: float = 0.1) -> bool:
    """`systemctl stop`: the unit's own TERM -> TimeoutStopSec -> KILL of its whole cgroup; returns when it is down.

    With `bound` (seconds: the kill grace and a margin), the stop is not left to the unit's TimeoutStopSec alone: a
    drop-in may set it to infinity, and a server ignoring SIGTERM would then hold the restart, its host lock and its
    drain for ever. Past the bound the whole cgroup gets SIGKILL (`systemctl kill`), and the stop waits `final_wait`
    more. Returns whether it had to. SystemdError when the unit is still up after that."""
    if bound is None:
        # 5: the unit is not loaded (never installed): nothing to stop.
        _call(run, ["systemctl", "stop", "--", unit], ok=(0, 5))
        return False
    _call(run, ["systemctl", "stop", "--no-block", "--", unit], ok=(0, 5))
    if _wait_down(run, unit, time.monotonic() + bound, poll):
        return False
    _call(run, ["systemctl", "kill", "--kill-who=all", "--signal=SIGKILL", "--", unit], ok=(0, 1, 5))
    if _wait_down(run, unit, time.monotonic() + final_wait, poll):
        return True
    raise SystemdError("%s did not stop: still %s %.0f s after the grace and a SIGKILL of its cgroup"
                       % (unit, show(run, unit).get("ActiveState") or "?", final_wait))


def _wait_down(run: Runner, unit: str, deadline: float, poll: float) -> bool:
    """Whether the unit reached inactive (or failed, or is not loaded) by `deadline`."""
    while True:
        props = show(run, unit)
        if props.get("ActiveState") in ("inactive", "failed", "") or props.get("LoadState") == "not-found":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


def start(run: Runner, unit: str) -> None:
    _call(run, ["systemctl", "start", "--", unit])


def set_enabled(run: Runner, unit: str, enabled: bool) -> None:
    _call(run, ["systemctl", "enable" if enabled else "disable", "--", unit])


def journal_tail(run: Runner, unit: str, since: float, lines: int = 10) -> str:
    """systemd's own lines about the unit since `since` (epoch seconds): how its main process ended."""
    rc, out, _err = run(["journalctl", "--no-pager", "--quiet", "-o", "cat", "-n", str(lines),
                         "--since", "@%d" % int(since), "-u", unit])
    return out.strip() if rc == 0 else ""


def remove_dropins(paths: t.Sequence[str], unit: str) -> t.List[str]:
    """Delete the named drop-ins of `unit`; refuses, before deleting any, a path that is not one (a typo, a prefix
    drop-in other units share, a package's under /usr/lib must not be deleted)."""
    bad = [p for p in paths if not removable_dropin(p, unit)]
    if bad:
        raise SystemdError("%s: not a drop-in of %s alone under /etc or /run/systemd/system; nothing was removed"
                           % (", ".join(bad), unit))
    removed = []
    for p in paths:
        try:
            os.unlink(p)
            removed.append(p)
        except FileNotFoundError:
            pass
    return removed


def snapshot(paths: t.Sequence[str]) -> t.List[t.Dict[str, str]]:
    """Each existing file of `paths` as put_back() writes it again (path, mode, content): the drop-ins a restart is
    about to remove, so that its rollback puts back what the operator had, not an older generation's copy."""
    out = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                content = f.read().decode("utf-8", "surrogateescape")
        except (FileNotFoundError, IsADirectoryError):
            continue
        out.append({"path": path, "mode": "%04o" % stat.S_IMODE(st.st_mode), "content": content})
    return out


def environment_files(run: Runner, unit: str) -> t.List[str]:
    """The unit's EnvironmentFile= paths in force (a leading `-`, which only makes a missing file no error, dropped).
    Asked apart from show(): systemctl prints one `EnvironmentFiles=PATH (ignore_errors=no)` line per file."""
    out = _call(run, ["systemctl", "show", "--property=EnvironmentFiles", "--", unit])
    paths = []
    for line in out.splitlines():
        if line.startswith("EnvironmentFiles="):
            path = line[len("EnvironmentFiles="):].rsplit(" (ignore_errors=", 1)[0].strip().lstrip("-")
            if path.startswith("/") and path not in paths:
                paths.append(path)
    return paths


def definition_files(run: Runner, unit: str) -> t.List[t.Dict[str, str]]:
    """What defines the server systemd runs now, as files to put back later (a rollback to it): the unit file systemd
    loaded, the unit's own drop-ins under /etc or /run (those gpufleet may delete: gpufleet_server_systemd_dropins) and
    its environment files (secret values: the caller keeps them root-only). Each as {path, mode, content}. Type-wide
    and name-prefix drop-ins are the host's, not this unit's: not kept, never put back. SystemdError or OSError when
    one cannot be read."""
    props = show(run, unit)
    fragment = props.get("FragmentPath") or ""
    if props.get("LoadState") != "loaded" or not fragment.startswith("/") or fragment == "/dev/null":
        raise SystemdError("%s is not loaded from a unit file (LoadState=%s, FragmentPath=%s)"
                           % (unit, props.get("LoadState") or "?", fragment or "none"))
    paths = [fragment] + [d for d in (props.get("DropInPaths") or "").split() if removable_dropin(d, unit)]
    paths += [e for e in environment_files(run, unit) if e not in paths]
    files = []
    for path in paths:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            content = f.read().decode("utf-8")
        files.append({"path": path, "mode": "%04o" % stat.S_IMODE(st.st_mode), "content": content})
    return files


def is_dropin(path: str) -> bool:
    """A drop-in of a unit (UNIT.d/NAME.conf): the operator's, never written by gpufleet's role."""
    return os.path.basename(os.path.dirname(path)).endswith(".d") and path.endswith(".conf")


def put_back(files: t.Sequence[t.Mapping[str, t.Any]], dropins: t.Sequence[str] = ()) -> t.List[str]:
    """Write each of definition_files()' files back as it was (content and mode, root's), atomically; a drop-in's
    directory is made when it is gone. Drop-ins are the operator's: only those named in `dropins` (the ones the failed
    run removed, gpufleet_server_systemd_dropins remove) are put back, when gone; one edited, deleted or made since
    the generation stays as the operator left it. Returns the paths written. The caller reloads systemd."""
    changed = []
    for f in files:
        path, content = str(f["path"]), str(f["content"]).encode("utf-8")
        mode = int(str(f.get("mode") or "0644"), 8)
        if is_dropin(path) and (path not in dropins or os.path.lexists(path)):
            continue
        try:
            with open(path, "rb") as cur:
                st = os.fstat(cur.fileno())
                if cur.read() == content and stat.S_IMODE(st.st_mode) == mode and st.st_uid == 0:
                    continue
        except FileNotFoundError:
            pass
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        _envblock.write_atomic(path, content, mode)  # written 0600 first: a secret is never wider
        changed.append(path)
    return changed


def retire(run: Runner, unit: str, files: t.Sequence[str]) -> t.List[str]:
    """Take a unit the systemd launcher installed out of service (stop, disable) and delete its files: the server now
    runs from another launcher, and an enabled unit would start a second copy at the next boot. Returns the files
    deleted (none when the unit was never installed)."""
    present = [f for f in files if os.path.lexists(f)]
    if not present:
        return []
    _call(run, ["systemctl", "disable", "--now", "--", unit], ok=(0, 1, 5))
    for f in present:
        os.unlink(f)
    daemon_reload(run)
    return present
