#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: balancer
short_description: Take a server out of its load balancers, put it back as found, or read what they say of it
version_added: 0.2.0
description:
  - The load balancers of zero-drop rollouts, one call for every entry of a host that one machine reaches (the gpu_server
    role runs it where each entry's C(delegate_to) says, one call per such machine). Three kinds
    (O(balancers[].type)) - V(haproxy) (its admin socket), V(sglang_router) (the SGLang Model Gateway C(smg), its
    worker API) and V(http) (a remove and an add request; no read API).
  - O(state=out) reads every entry before it touches any (a server HAProxy does not have, or a worker URL the router
    does not list with no drain record of gpufleet's, fails with nothing touched), then takes the server out of each
    - HAProxy C(set server B/S state maint) in every backend that has it (or O(balancers[].backend)), waited for until
    MAINT; the router C(DELETE /workers/ID), waited for until it no longer lists the worker; http the remove request.
    A server found in MAINT with no drain record of gpufleet's (O(records)) is an operator's, left as found
    (C(left_as_found) in RV(rotation)). RV(drains) are the entries the role records on the host before the change; run it in
    check mode first to get them (and to learn that every entry can be drained).
  - O(state=in) puts the server back to the state it was found in (O(found)), per backend for HAProxy - C(set server
    B/S state ready), which also clears an admin DRAIN, or back to C(drain) where an operator had set DRAIN - and
    waits up to O(up_timeout) seconds until HAProxy reports it UP in each backend and the router lists it healthy. An
    operator's MAINT (O(left_as_found)) stays MAINT.
  - O(state=read) reads only. O(report=rotation) names the entries that have the server back in rotation
    (RV(back_in_rotation); the role runs it right before the kill, as an HAProxy reload without its server state file
    forgets MAINT). O(report=drift) returns the audit's lines (RV(drift)). O(report=capacity) reads entries of many
    hosts (each with C(host)) and returns the hosts out of rotation (RV(out_hosts); weight 0 counts as out) and the
    balancers that could not be read (RV(unread)).
  - HAProxy is spoken to directly, on its admin socket (C(show stat), C(set server)), not through
    community.general.haproxy - that module has no state that clears an admin DRAIN (its C(enabled) sends C(enable
    server), which leaves DRAIN set) and reads one backend per call; three text commands in one tested place need no
    other collection. The socket needs C(level admin).
  - HTTP goes through C(ansible.module_utils.urls) (proxies are not used). Headers and the credentials or query of a
    URL are never returned; a drain's C(server) for http is the remove URL without them.
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
attributes:
  check_mode:
    support: full
    details:
      - O(state=out) and O(state=in) read the balancers and report what they would change; nothing is written. A wrong
        server or worker URL fails as in a real run.
  diff_mode:
    support: none
  idempotent:
    support: full
    details:
      - A server already out (or back and UP) is not changed again. An http balancer cannot be read, so its request is
        sent each time (changed).
options:
  balancers:
    description:
      - The entries, as in the gpu_server role's C(gpufleet_server_balancers), each with a unique O(balancers[].name).
        Entries of O(balancers[].type=none) are skipped.
    type: list
    elements: dict
    required: true
    suboptions:
      type:
        description: The kind of balancer.
        type: str
        required: true
        choices: [haproxy, sglang_router, http, none]
      name:
        description: The entry's name (messages, the drain record, the summary).
        type: str
        required: true
      delegate_to:
        description: Where the call runs (the role's C(delegate_to)); named in messages only here.
        type: str
      host:
        description: With O(report=capacity), the inventory host the entry routes to.
        type: str
      socket:
        description: V(haproxy), the admin socket.
        type: str
        default: /var/run/haproxy.sock
      backend:
        description:
          - V(haproxy), the backend; empty is every backend that has the server.
          - With O(state=out), a server in rotation (at the entry's worker URL's address) in a backend of the same
            socket that no entry names is refused before anything is touched when that backend sent it a request in
            the last 300 s (C(show stat)'s C(lastsess)), as it would be stopped while that backend sends it more; a
            backend that sent it none (a pool no frontend uses, as far as HAProxy shows) is warned of.
        type: str
        default: ''
      server:
        description: V(haproxy), the server's name; default O(server).
        type: str
      url:
        description: V(sglang_router), the router, C(http(s)://host:port).
        type: str
      worker_url:
        description:
          - V(sglang_router), the server as the router knows it; default O(worker_url).
          - V(haproxy), where HAProxy reaches the server; default O(worker_url). Before a server is taken out, the
            address HAProxy has for it (C(show stat)'s C(addr), HAProxy 1.7 and later) must be this URL's host, as
            resolved where HAProxy runs, and port; another one (a server name of another host) fails the host with
            nothing touched.
        type: str
      headers:
        description: V(sglang_router), headers of every request (for C(--control-plane-api-keys)); secret.
        type: dict
      remove:
        description: V(http), the request that takes the server out.
        type: dict
        suboptions:
          url:
            description: The URL; its credentials and query are never shown.
            type: str
            required: true
          method:
            description: The method.
            type: str
            default: POST
          body:
            description: The body; a dict or list is sent as JSON. Secret (never shown), as the headers.
            type: raw
          headers:
            description: Headers; secret.
            type: dict
          status_code:
            description: The answers that mean done.
            type: list
            elements: int
            default: [200, 201, 202, 204]
      add:
        description: V(http), the request that puts the server back.
        type: dict
        suboptions:
          url:
            description: The URL; its credentials and query are never shown.
            type: str
            required: true
          method:
            description: The method.
            type: str
            default: POST
          body:
            description: The body; a dict or list is sent as JSON. Secret (never shown), as the headers.
            type: raw
          headers:
            description: Headers; secret.
            type: dict
          status_code:
            description: The answers that mean done.
            type: list
            elements: int
            default: [200, 201, 202, 204]
  state:
    description:
      - V(out) and V(in) change the balancers; V(read) only reads (see O(report)).
      - V(out) warns when the server is the last one in rotation of an HAProxy backend (the others not UP, or at weight
        0) or the last healthy worker the router lists, and takes it out all the same.
    type: str
    choices: [out, in, read]
    required: true
  report:
    description: With O(state=read), what to read for.
    type: str
    choices: [rotation, drift, capacity]
    default: rotation
  server:
    description: The server's name in HAProxy where an entry has no C(server) (the role - the inventory hostname).
    type: str
    default: ''
  worker_url:
    description: The worker URL where an entry has no C(worker_url) (the role - C(http://<ansible_host>:<port of the
      health URL>)).
    type: str
    default: ''
  names:
    description:
      - Every balancer name of the host, those other machines reach included. A drain record under another name that
        names the same server belongs to an entry renamed since (C(renamed) in RV(rotation)).
    type: list
    elements: str
    default: []
  records:
    description:
      - The host's drain record (gpufleet.serving.rotation_record's RV(gpufleet.serving.rotation_record#module:records)).
      - A record under an entry's name that names another server than the entry's is not a drain of this host (an
        entry copied from another host's variables when it was made). It does not count as gpufleet's drain, the audit
        (O(report=drift)) names it, and with O(state=in) the call fails with nothing touched.
    type: dict
    default: {}
  records_error:
    description: With O(report=drift), why the drain record could not be read (named in the lines).
    type: str
    default: ''
  found:
    description: With O(state=in), by name, the state each entry was found in (V(UP), V(DRAIN), V(b1=UP b2=MAINT), ...).
    type: dict
    default: {}
  left_as_found:
    description: With O(state=in), by name, the entries left as found (V(MAINT) - not put back).
    type: dict
    default: {}
  up_timeout:
    description: With O(state=in), seconds each entry gets to report the server UP (listed healthy).
    type: float
    default: 120
  interval:
    description: Seconds between two reads while waiting.
    type: float
    default: 1
  timeout:
    description: Seconds each HTTP request and socket command may take.
    type: float
    default: 10
  validate_certs:
    description: Verify HTTPS certificates.
    type: bool
    default: true
seealso:
  - module: gpufleet.serving.rotation_record
  - module: gpufleet.serving.inflight_wait
  - name: HAProxy management guide (the admin socket)
    description: The text commands C(show stat) and C(set server).
    link: https://docs.haproxy.org/2.8/management.html#9.3
"""

EXAMPLES = r"""
- name: Learn what would be drained (check mode), failing with nothing touched on a wrong entry
  gpufleet.serving.balancer:
    state: out
    balancers:
      - {type: haproxy, name: haproxy, socket: /run/haproxy/admin.sock, backend: sglang}
    server: "{{ inventory_hostname }}"
    records: "{{ drain_record.records }}"
  delegate_to: lb1
  check_mode: true
  register: plan

- name: Put the host back into the SGLang Model Gateway and wait until it is listed healthy
  gpufleet.serving.balancer:
    state: in
    balancers:
      - {type: sglang_router, name: smg, url: "http://router:30000"}
    worker_url: "http://10.0.0.5:30000"
    found: {smg: listed}

- name: Count the hosts in rotation (read-only)
  gpufleet.serving.balancer:
    state: read
    report: capacity
    balancers:
      - {type: haproxy, name: haproxy, host: host1, server: host1}
      - {type: haproxy, name: haproxy, host: host2, server: host2}
  delegate_to: lb1
  run_once: true
"""

RETURN = r"""
drains:
  description: O(state=out), the entries the host is (or would be) taken out of, as gpufleet.serving.rotation_record records them.
  returned: always
  type: list
  elements: dict
  sample: [{"balancer": "haproxy", "found": "UP", "server": "host1", "keep": false}]
rotation:
  description:
    - O(state=out) - C(out_of) (names), C(found) (name to the state to go back to), C(left_as_found) (an operator's
      MAINT), C(renamed) (a record's old name to the entry's). O(state=in) - C(back_in) (names), C(left_as_found)
      (an operator's DRAIN, or MAINT in some backends, restored) and C(records_kept) (entries left in an operator's
      MAINT whose drain record names another server, which the role's clear keeps). Empty with O(state=read).
  returned: always
  type: dict
  sample: {"out_of": ["haproxy"], "found": {"haproxy": "UP"}, "left_as_found": {}, "renamed": {}}
back_in_rotation:
  description: O(report=rotation), C({name, found}) of each entry that has the server in rotation again.
  returned: always
  type: list
  elements: dict
drift:
  description: O(report=drift), one line per entry where the server is out of rotation (and by whom) or not UP.
  returned: always
  type: list
  elements: str
  sample: ["out of rotation on haproxy (MAINT in backend gpufleet), not by gpufleet (no drain record of it)"]
out_hosts:
  description: O(report=capacity), the hosts a balancer has out of rotation.
  returned: always
  type: list
  elements: str
unread:
  description: O(report=capacity), the balancers that could not be read, one line each.
  returned: always
  type: list
  elements: str
pools:
  description:
    - O(report=capacity), each pool a request can be routed to (C(HAProxy SOCKET backend NAME), C(router URL)) with the
      hosts that have a server there (C(members)) and those in rotation there (C(in)). A host out of one backend only
      still serves another; the capacity guard (P(gpufleet.serving.capacity_refusal#filter)) drains no pool's last
      server in rotation.
  returned: with report capacity
  type: dict
  version_added: 0.3.0
  sample: {"HAProxy /run/haproxy/admin.sock backend gpufleet": {"members": [gpu1, gpu2], "in": [gpu1]}}
"""

import typing as t

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _balancer

_REQ = dict(url=dict(type="str", required=True), method=dict(type="str", default="POST"),
            # The body may hold a token as the headers do (an API key in a JSON field): secret too.
            body=dict(type="raw", no_log=True), headers=dict(type="dict", no_log=True),
            status_code=dict(type="list", elements="int", default=[200, 201, 202, 204]))

ARGUMENT_SPEC = dict(
    balancers=dict(type="list", elements="dict", required=True, options=dict(
        type=dict(type="str", required=True, choices=list(_balancer.TYPES)),
        name=dict(type="str", required=True),
        delegate_to=dict(type="str"),
        host=dict(type="str"),
        socket=dict(type="str", default=_balancer.HAPROXY_SOCKET),
        backend=dict(type="str", default=""),
        server=dict(type="str"),
        url=dict(type="str"),
        worker_url=dict(type="str"),
        headers=dict(type="dict", no_log=True),
        remove=dict(type="dict", options=_REQ),
        add=dict(type="dict", options=_REQ),
    )),
    state=dict(type="str", required=True, choices=["out", "in", "read"]),
    report=dict(type="str", default="rotation", choices=["rotation", "drift", "capacity"]),
    server=dict(type="str", default=""),
    worker_url=dict(type="str", default=""),
    names=dict(type="list", elements="str", default=[]),
    records=dict(type="dict", default={}),
    records_error=dict(type="str", default=""),
    found=dict(type="dict", default={}),
    left_as_found=dict(type="dict", default={}),
    up_timeout=dict(type="float", default=120),
    interval=dict(type="float", default=1),
    timeout=dict(type="float", default=10),
    validate_certs=dict(type="bool", default=True),
)


def run(p: t.Mapping[str, t.Any], check_mode: bool, warn: t.Callable[[str], None] = lambda msg: None) -> t.Dict[str, t.Any]:
    """The call's result (`warn`: module.warn); raises BalancerError."""
    # Capacity reads many hosts' entries (names repeat across hosts); the others are one host's.
    errs = _balancer.input_errors(p["balancers"]) if p["report"] != "capacity" or p["state"] != "read" else []
    if errs:
        raise _balancer.BalancerError("gpufleet_server_balancers: " + "; ".join(errs))
    bs = _balancer.Balancers(p["balancers"], p["server"], p["worker_url"], p["records"],
                             _balancer.Http(p["timeout"], p["validate_certs"]), p["interval"], names=p["names"])
    result: t.Dict[str, t.Any] = dict(changed=False, drains=[], rotation={}, back_in_rotation=[], drift=[],
                                      out_hosts=[], unread=[])
    if p["state"] == "out":
        plan = bs.plan_out()
        for w in bs.warnings:
            warn(w)
        result["drains"] = [s["drain"] for s in plan if "drain" in s]
        if check_mode:
            result["rotation"] = {"out_of": [s["name"] for s in plan if "back" in s],
                                  "found": {s["name"]: s["back"] for s in plan if "back" in s},
                                  "left_as_found": {s["name"]: s["left_as_found"] for s in plan if "left_as_found" in s},
                                  "renamed": {s["record"]: s["name"] for s in plan if s.get("record") not in (None, s["name"])}}
            result["changed"] = bool(result["drains"])
        else:
            result.update(bs.take_out(plan))
    elif p["state"] == "in":
        result.update(bs.put_back(p["found"], p["left_as_found"], p["up_timeout"], check_mode))
    elif p["report"] == "rotation":
        back = bs.back_in_rotation()
        result["back_in_rotation"] = [{"name": n, "found": f} for n, f in back]
        if back:
            result["msg"] = "; ".join(
                "%s has the server back in rotation (%s) since gpufleet took it out (put back by hand, or an HAProxy "
                "reload without server-state-file, which forgets MAINT: docs/runbook.md); nothing was killed" % nf
                for nf in back)
    elif p["report"] == "drift":
        result["drift"] = bs.drift(p["records_error"])
    else:
        result.update(bs.capacity())
    return result


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    # A URL's credentials (user:password@) and query (?token=) are secrets as headers are: masked in every output.
    for b in module.params["balancers"]:
        for req in (b.get("remove"), b.get("add")):
            if req:
                module.no_log_values.update(_balancer.url_secrets(req["url"]))
    try:
        result = run(module.params, module.check_mode, module.warn)
    except _balancer.BalancerError as e:
        module.fail_json(msg=str(e), **e.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
