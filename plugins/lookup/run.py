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
  - With V(new) (the default), returns an id for this run, C(CONTROLLER_HOST:PID:UUID), where PID is the
    ansible-playbook process. The host locks of M(gpufleet.serving.server_state) record it as their owner.
  - With V(alive) and O(owner), returns V(true) when the run that C(owner) names was started on this controller and
    its ansible-playbook process still runs, V(false) when it was started here and is gone (a run interrupted by
    Ctrl-C or SIGTERM, whose lock may be taken over), and V(null) when it was started elsewhere (nothing can be known
    here, so the lock is waited for until it expires).
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
  description: The run id (V(new)), or true, false or null (V(alive)).
  type: list
  elements: raw
"""

import multiprocessing
import os
import socket
import uuid

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase


def playbook_pid() -> int:
    """The ansible-playbook process: lookups run in a worker forked from it (multiprocessing), or in it."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None and parent.pid else os.getpid()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def owner_alive(owner: str, host: str):
    parts = owner.split(":")
    if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
        return None
    return pid_alive(int(parts[1]))


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        what = terms[0] if terms else "new"
        host = socket.gethostname()
        if what == "new":
            return ["%s:%d:%s" % (host, playbook_pid(), uuid.uuid4())]
        if what == "alive":
            owner = self.get_option("owner")
            if not owner:
                raise AnsibleError("lookup('gpufleet.serving.run', 'alive') needs owner=<a lock's owner id>")
            return [owner_alive(str(owner), host)]
        raise AnsibleError("lookup('gpufleet.serving.run', %r): the term must be 'new' or 'alive'" % (what,))
