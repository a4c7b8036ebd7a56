#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: server_ready
short_description: Wait until a server answers its health check and a real request, failing fast if it dies
version_added: 0.1.0
description:
  - Polls O(health_url) until it answers HTTP 200, then sends O(request) (a real request) until it succeeds.
  - C(/health) can answer 200 while the server hangs (sglang#22779), so a real request is the stronger gate.
  - Watches the server process named by O(pidfile). If it exits during start-up the module fails at once with
    the tail of O(log_path), instead of waiting out O(timeout).
  - Check mode polls exactly as a real run does (as M(ansible.builtin.wait_for) waits in check mode) and returns the
    same result, so O(request) should be one that changes nothing on the server, such as a one-token generation.
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
  - gpufleet.serving._attributes.INFO_MODULE
attributes:
  check_mode:
    support: full
    details:
      - Polls in check mode too, with the same result (and the same failure for a server that is not up). In a
        check run after a launch that check mode did not make, skip this task with C(when) on C(ansible_check_mode).
options:
  health_url:
    description: URL that must answer HTTP 200. Empty skips the health poll.
    type: str
    default: ""
  request:
    description:
      - A real request that must succeed. Empty skips it.
    type: dict
    default: {}
    suboptions:
      url:
        description: URL of the request. Required when any other key is set.
        type: str
      method:
        description: HTTP method; C(POST) when unset.
        type: str
      body:
        description:
          - Request body. A dict or a list is sent as JSON (with C(Content-Type application/json) unless
            O(request.headers) sets one); a string is sent as it is.
        type: raw
      headers:
        description:
          - Request headers.
          - The values are secret (C(no_log)), as the values of O(gpufleet.serving.server_launch#module:env) are,
            so an C(Authorization) header may hold a token.
        type: dict
      status:
        description: Status the response must have; C(200) when unset.
        type: int
      expect_regex:
        description: Regular expression the response body must match.
        type: str
      timeout:
        description: Seconds per attempt; C(10) when unset.
        type: float
  pidfile:
    description: Pidfile (C(PID START_TIME)) of the server process to watch.
    type: path
  timeout:
    description: Seconds to wait for readiness. Must be greater than 0.
    type: float
    default: 600
  interval:
    description: Seconds between polls.
    type: float
    default: 0.25
  log_path:
    description: Server log whose tail is returned on failure.
    type: path
    default: ""
  log_tail_lines:
    description: Lines of log returned on failure.
    type: int
    default: 40
  log_tail_path:
    version_added: 0.2.0
    description:
      - The server's own log file, for a server that writes its log there (its C(--log) option, say) rather than
        to the output that O(log_path) captures. The failure's log tail is read from it, and from O(log_path) when
        it is missing or empty.
    type: path
  check_listener:
    version_added: 0.2.0
    description:
      - With O(pidfile), count an answer only when the socket it came from (of those listening on the URL's port, the
        one on the first of the URL host's addresses that has one) belongs to the process the pidfile names or one of
        its descendants (read from C(/proc/net/tcp), C(/proc/net/tcp6) and C(/proc/PID/fd), as
        C(ss -ltnp) does). An answer from another process on the port (a foreign listener, while the server itself
        died on C(EADDRINUSE)) is not counted, and the failure names that process (pid, user, command line); it is
        never signalled.
      - When the URL's host is not an address of this host, or no listening socket of the port can be attributed to
        a process here (a port forwarded into a container), the answer counts and RV(listener.assumed) says what was
        assumed. V(false) counts every answer, as a server behind a proxy process of its own (C(docker-proxy))
        needs.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Wait for sglang, with a real generation request
  gpufleet.serving.server_ready:
    health_url: http://127.0.0.1:30000/health
    request:
      url: http://127.0.0.1:30000/generate
      body: '{"text": "ping", "sampling_params": {"max_new_tokens": 1}}'
      headers: {Content-Type: application/json}
    pidfile: /run/gpufleet/sglang.pid
    log_path: /var/log/gpufleet/sglang.log
    timeout: 900
"""

RETURN = r"""
ready_s:
  description: Seconds until the server was ready.
  returned: success
  type: float
health_s:
  description: Seconds until /health first answered 200.
  returned: success
  type: float
log_tail:
  description: Last lines of the server log.
  returned: failure
  type: str
phase:
  description: On failure, V(startup) (the process died) or V(ready) (timeout).
  returned: failure
  type: str
exit_status:
  version_added: 0.2.0
  description: How the server process ended (V(exit status 1), V(killed by SIGKILL)), when this module could read it
    (only the parent of a process can); null otherwise.
  returned: failure in phase startup
  type: str
listener:
  version_added: 0.2.0
  description: Who answered, by the socket listening on the URL's port (O(check_listener)).
  returned: success, with O(pidfile) and O(check_listener)
  type: dict
  contains:
    port:
      description: The port checked.
      type: int
    checked:
      description: Whether the listening socket was attributed to a process.
      type: bool
    ours:
      description: Pids of the server's processes holding the listening socket.
      type: list
      elements: int
    assumed:
      description: When not checked, what was assumed and why (the host is not local, no visible listener).
      type: str
"""

from ansible_collections.gpufleet.serving.plugins.module_utils import _nolog, _ready, _server, _statefile


def main() -> None:
    module = _nolog.NoLogModule(
        argument_spec=dict(
            health_url=dict(type="str", default=""),
            request=dict(type="dict", default={}, options=_ready.request_argspec()),
            pidfile=dict(type="path"),
            timeout=dict(type="float", default=600.0),
            interval=dict(type="float", default=0.25),
            log_path=dict(type="path", default=""),
            log_tail_lines=dict(type="int", default=40),
            log_tail_path=dict(type="path"),
            check_listener=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    err = _ready.ready_input_error(p["health_url"], p["request"], p["timeout"], p["interval"]) or (
        "log_tail_lines must be >= 0, got %s" % p["log_tail_lines"] if p["log_tail_lines"] < 0 else None)
    if err:
        module.fail_json(msg=err)
    # No check-mode branch: polling is a read (GET health_url and the user's request), so check mode polls too.
    ident = _statefile.pidfile_identity(p["pidfile"]) if p["pidfile"] else None
    if p["pidfile"] and ident is None:
        module.fail_json(msg="pidfile %s is missing or unreadable; was the server launched?" % p["pidfile"])
    try:
        res = _ready.wait_ready(ident, p["health_url"], p["request"], p["timeout"], p["interval"],
                                p["log_path"], p["log_tail_lines"], p["log_tail_path"],
                                check_listener=p["check_listener"])
    except _server.ServerError as e:
        module.fail_json(msg=str(e), **e.details)
    if (res.get("listener") or {}).get("assumed"):
        module.warn(res["listener"]["assumed"])
    module.exit_json(changed=False, **res)


if __name__ == "__main__":
    main()
