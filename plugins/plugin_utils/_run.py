# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Run ids of this controller (the gpufleet.serving.run lookup's) and whether the run an id names is alive: shared by
the lookup and the server_state action, which takes over a dead run's host lock without a task of its own."""

from __future__ import annotations

import multiprocessing
import os
import re
import time
import uuid

from ansible_collections.gpufleet.serving.plugins.module_utils import _runid


def playbook_pid() -> int:
    """The ansible-playbook process: lookups run in a worker forked from it (multiprocessing), or in it."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None and parent.pid else os.getpid()


def boot_id() -> str | None:
    """This controller's boot id (Linux); None where /proc does not tell."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            value = f.read().strip()
    except OSError:
        return None
    return value if re.fullmatch(r"[0-9A-Za-z-]+", value) else None


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot); None when the process or /proc is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return None
    # The command (field 2) is in parentheses and may hold spaces or ')': split after the last ')'.
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[19])  # field 22 = the 20th after pid and comm
    except (IndexError, ValueError):
        return None


def process_started(ticks: int | None) -> float:
    """Wall-clock start of the process that started `ticks` clock ticks after boot: the same for every batch of a
    run (each batch makes a new id), so the order of two runs does not change while they go. The lookup's own time
    where /proc does not tell."""
    if ticks is not None:
        try:
            with open("/proc/stat") as f:
                btime = next(int(ln.split()[1]) for ln in f if ln.startswith("btime "))
            return btime + ticks / os.sysconf("SC_CLK_TCK")
        except (OSError, StopIteration, ValueError, IndexError):
            pass
    return time.time()


def new_id(host: str, pid: int) -> str:
    boot, ticks = boot_id(), start_ticks(pid)
    base = "%s:%d:%s.%s.%s" % (host, pid, boot or "-", "-" if ticks is None else ticks, uuid.uuid4())
    return _runid.with_start(base, process_started(ticks))


def process_id(host: str, pid: int, run_dir: str) -> str:
    """One id for the whole ansible-playbook process (the lookup's V(process)): made once, by the first worker that asks,
    and kept in `run_dir`, the process's own temporary directory (ansible-core's DEFAULT_LOCAL_TMP: made when the
    process starts, inherited by every worker it forks, removed when it exits). Every task of a role then names the
    same owner for the host lock without a set_fact of its own (issue 25), on any controller (no /proc needed)."""
    path = os.path.join(run_dir, "gpufleet-run-id")
    try:
        with open(path) as f:
            value = f.read().strip()
        if value:
            return value
    except OSError:
        pass
    value = new_id(host, pid)
    tmp = "%s.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(value)
    try:
        os.link(tmp, path)  # never replaces: two workers that race both keep the first one's id
    except FileExistsError:
        with open(path) as f:
            value = f.read().strip() or value
    finally:
        os.unlink(tmp)
    return value


def owner_alive(owner: str, host: str):
    """True, False, or None (unknown: another controller, another boot, no /proc, or an id not of this format)."""
    parts = owner.split(":")
    if len(parts) == 4 and _runid.started(owner) is not None:
        parts = parts[:3]  # the start time is not needed here
    if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
        return None
    token = parts[2].split(".")
    if len(token) != 3 or not token[1].isdigit():
        return None
    me = boot_id()
    if me is None or token[0] != me:
        return None
    pid = int(parts[1])
    ticks = start_ticks(pid)
    if ticks is None:
        # This boot's /proc answers for every live process: no entry means it is gone.
        return False if not os.path.exists("/proc/%d" % pid) else None
    return ticks == int(token[1])
