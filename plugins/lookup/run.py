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
  - With V(process), returns an id of the same form made once for the whole ansible-playbook process; every call of
    the run, in any task and worker, returns it (it is kept in the process's own temporary directory, ansible-core's
    C(DEFAULT_LOCAL_TMP), removed when the process exits). The gpu_server role names its host lock's owner with it
    when the play sets no C(gpufleet_run_id).
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
    description: V(new), V(process) or V(alive).
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
  description: The run id (V(new), V(process)), or V(true), V(false) or V(null) (V(alive)).
  type: list
  elements: raw
"""

import socket

from ansible import constants as C
from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase
from ansible_collections.gpufleet.serving.plugins.plugin_utils._run import new_id, owner_alive, playbook_pid, process_id


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        what = terms[0] if terms else "new"
        host = socket.gethostname()
        if what == "new":
            return [new_id(host, playbook_pid())]
        if what == "process":
            return [process_id(host, playbook_pid(), C.DEFAULT_LOCAL_TMP)]
        if what == "alive":
            owner = self.get_option("owner")
            if not owner:
                raise AnsibleError("lookup('gpufleet.serving.run', 'alive') needs owner=<a lock's owner id>")
            return [owner_alive(str(owner), host)]
        raise AnsibleError("lookup('gpufleet.serving.run', %r): the term must be 'new', 'process' or 'alive'" % (what,))
