# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: run
short_description: An id for this run of ansible-playbook, and whether the run named by a host lock is still alive
version_added: 0.2.0
description:
  - With V(new) (the default), returns an id for this run, C(CONTROLLER_HOST:PID:TOKEN), where PID is the
    ansible-playbook process and TOKEN is C(BOOT_ID.START_TICKS.UUID) - the controller's boot id
    (C(/proc/sys/kernel/random/boot_id)), the process's start time in clock ticks since boot (field 22 of
    C(/proc/PID/stat)) and a random UUID. Where C(/proc) is not available (a controller that is not Linux), BOOT_ID
    and START_TICKS are V(-). The host locks of M(gpufleet.serving.server_state) record it as their owner.
  - The id ends with C(:STARTED), when the ansible-playbook process started, in seconds since the epoch
    (its boot time plus its start ticks; the time of the lookup where C(/proc) is not available). It orders runs
    across controllers for the host lock's wait-die rule (see O(gpufleet.serving.server_state#module:lock_wait)); it is
    the same for every batch of one run. Ids without it, from an older gpufleet, are still read.
  - With V(alive) and O(owner), returns V(null) (unknown) unless the run that C(owner) names was started on this very
    controller - the same hostname AND the same boot id; two controllers that share a hostname (CI runners all
    called C(localhost), cloned images) never judge each other's runs. For a run of this controller it returns
    V(false) when its ansible-playbook process is gone, or when its pid now belongs to another process (the start
    ticks differ), so that run was interrupted (Ctrl-C, SIGTERM) and its lock may be taken over; otherwise V(true).
  - V(null) means nothing can be known here, so the lock is waited for until it expires (its TTL); a controller
    without C(/proc) always answers V(null).
  - Runs on the controller only, in Python (no shell), so the controller may be any OS ansible-core runs on.
options:
  _terms:
    description: V(new) or V(alive).
    type: list
    elements: str
  owner:
    description: With V(alive), the owner id of a lock, as returned by V(new).
    type: str
"""

EXAMPLES = r"""
- name: Name this run
  ansible.builtin.set_fact:
    gpufleet_run_id: "{{ lookup('gpufleet.serving.run') }}"
  run_once: true

- name: Is the run that holds the lock alive?
  ansible.builtin.debug:
    msg: "{{ lookup('gpufleet.serving.run', 'alive', owner=holder) }}"
"""

RETURN = r"""
_raw:
  description: The run id (V(new)), or V(true), V(false) or V(null) (V(alive)).
  type: list
  elements: raw
"""

import multiprocessing
import os
import re
import socket
import time
import uuid

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase
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


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        what = terms[0] if terms else "new"
        host = socket.gethostname()
        if what == "new":
            return [new_id(host, playbook_pid())]
        if what == "alive":
            owner = self.get_option("owner")
            if not owner:
                raise AnsibleError("lookup('gpufleet.serving.run', 'alive') needs owner=<a lock's owner id>")
            return [owner_alive(str(owner), host)]
        raise AnsibleError("lookup('gpufleet.serving.run', %r): the term must be 'new' or 'alive'" % (what,))
