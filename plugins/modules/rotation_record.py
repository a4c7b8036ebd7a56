#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: rotation_record
short_description: Keep the host's record of the load balancers gpufleet took it out of
version_added: 0.2.0
description:
  - The gpu_server role records each drain it makes (the balancer entry, the state it found the server in, when, the
    run) before it takes the host out, and clears the entries once the host is back in service. A balancer's own
    state cannot tell an earlier failed run's drain from a server an operator took out by hand, or from a wrong
    worker URL; the record can.
  - O(action=read) only reads. O(action=add) keeps an entry already there when O(keep=true) (what an earlier run found
    is what the host goes back to) and replaces it otherwise. O(action=clear) removes the entries of O(balancers); the file goes when none is left.
  - The file is root-only (mode 0600), as the server's state file.
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
attributes:
  check_mode:
    support: full
    details: V(add) and V(clear) report what they would change and write nothing.
  diff_mode:
    support: full
    details: V(add) and V(clear) show the record before and after.
  idempotent:
    support: full
options:
  path:
    description: The record file, for example C(/var/lib/gpufleet/NAME.rotation.json).
    type: path
    required: true
  action:
    description: What to do.
    type: str
    choices: [read, add, clear]
    default: read
  balancer:
    description: With V(add), the balancer entry's name.
    type: str
  found:
    description: With V(add), the state gpufleet found the server in there (for example V(UP), V(DRAIN), V(listed)).
    type: str
  server:
    description: With V(add), the server as the balancer names it (HAProxy server name, worker URL, request URL).
    type: str
  run:
    description: With V(add), the run that drains the host (the host lock's owner).
    type: str
  keep:
    description:
      - With V(add), keep an entry already there for O(balancer).
      - The role sets it false when it found the server in rotation, so a record that a put-back by hand left behind
        is replaced.
    type: bool
    default: true
  drains:
    description:
      - With V(add), several entries in one call, each C({balancer, found, server, keep}) (the
        gpufleet.serving.balancer module's RV(gpufleet.serving.balancer#module:drains)); O(run) is theirs too. Instead
        of O(balancer) and O(found).
    type: list
    elements: dict
  balancers:
    description: With V(clear), the balancer entries the host is back in.
    type: list
    elements: str
    default: []
  known:
    description:
      - With V(read), the names of the host's balancer entries (C(gpufleet_server_balancers)). The drains the record
        keeps of other entries (an entry removed or renamed since a run took the host out of it) are returned in
        RV(stale), one line each, since no rollout puts the host back there.
    type: list
    elements: str
    version_added: 0.3.0
"""

EXAMPLES = r"""
- name: Record that the host is taken out of HAProxy
  gpufleet.serving.rotation_record:
    path: /var/lib/gpufleet/sglang.rotation.json
    action: add
    balancer: haproxy
    found: UP
    server: host1
    run: "{{ gpufleet_run_id }}"

- name: Clear the record once the host is back in service
  gpufleet.serving.rotation_record:
    path: /var/lib/gpufleet/sglang.rotation.json
    action: clear
    balancers: [haproxy]
"""

RETURN = r"""
records:
  description: The record after the call, by balancer name (each with C(found), C(server), C(run), C(at)).
  returned: always
  type: dict
  sample: {"haproxy": {"found": "UP", "server": "host1", "run": "ctl:1234:...", "at": "2026-11-30T22:00:00+0000"}}
stale:
  description: With V(read) and O(known), one line for each drain of an entry the host no longer has.
  returned: when O(action=read) and O(known) is given
  type: list
  elements: str
  version_added: 0.3.0
"""

import typing as t

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _rotation


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            action=dict(type="str", choices=["read", "add", "clear"], default="read"),
            balancer=dict(type="str"),
            found=dict(type="str"),
            server=dict(type="str"),
            run=dict(type="str"),
            keep=dict(type="bool", default=True),
            balancers=dict(type="list", elements="str", default=[]),
            known=dict(type="list", elements="str"),
            drains=dict(type="list", elements="dict"),
        ),
        required_if=[("action", "add", ("balancer", "drains"), True)],
        required_together=[("balancer", "found")],
        supports_check_mode=True,
    )
    p = module.params
    try:
        before = _rotation.read(p["path"])
        if p["action"] == "read":
            res: t.Dict[str, t.Any] = dict(changed=False, records=before)
            if p["known"] is not None:
                res["stale"] = _rotation.stale(before, p["known"])
            module.exit_json(**res)
        if p["action"] == "add":
            drains = list(p["drains"] or []) + ([dict(balancer=p["balancer"], found=p["found"], server=p["server"],
                                                keep=p["keep"])] if p["balancer"] else [])
            changed, records = False, before
            for d in drains:
                one, records = _rotation.add(p["path"], str(d["balancer"]),
                                             {"found": d.get("found"), "server": d.get("server"), "run": p["run"]},
                                             bool(d.get("keep", True)), module.check_mode, records)
                changed = changed or one
        else:
            changed, records = _rotation.clear(p["path"], p["balancers"], module.check_mode)
    except (_rotation.RecordError, OSError) as e:
        module.fail_json(msg="drain record %s: %s" % (p["path"], e), path=p["path"])
    result: t.Dict[str, t.Any] = dict(changed=changed, records=records)
    if module._diff and changed:
        result["diff"] = dict(before=_rotation.render(before), after=_rotation.render(records),
                              before_header=p["path"], after_header=p["path"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
