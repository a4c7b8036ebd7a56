# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: balancer_idents
short_description: The server each balancer entry of the gpu_server role names for a host, by entry name
version_added: 0.3.0
description:
  - The host as each balancer knows it, as M(gpufleet.serving.balancer) names it (the same code), by entry name. HAProxy
    entries give their C(server), else the host's name; C(sglang_router) entries their C(worker_url), else the host's
    worker URL; C(http) entries their remove URL without its query or credentials.
  - The gpu_server role's check tells with it a drain record of the host from one that names another server under the
    same entry name (an entry copied from another host's variables when the drain was made).
options:
  _input:
    description: The entries, as P(gpufleet.serving.balancer_entries#filter) returns them.
    type: list
    elements: dict
    required: true
  server:
    description: The host's name (C(inventory_hostname)), for HAProxy entries without C(server).
    type: str
    required: true
  worker_url:
    description: The host's worker URL, for C(sglang_router) entries without C(worker_url).
    type: str
    required: true
"""

EXAMPLES = r"""
- name: The server each balancer names for this host
  ansible.builtin.debug:
    msg: "{{ gpufleet_server_balancers | gpufleet.serving.balancer_entries
             | gpufleet.serving.balancer_idents(inventory_hostname, 'http://10.0.0.1:30000') }}"
"""

RETURN = r"""
_value:
  description: Entry name to the server it names for the host.
  type: dict
"""

from ansible_collections.gpufleet.serving.plugins.module_utils._balancer import identity_map


def balancer_idents(entries, server, worker_url):
    return identity_map(entries, server, worker_url)


class FilterModule:
    def filters(self):
        return {"balancer_idents": balancer_idents}
