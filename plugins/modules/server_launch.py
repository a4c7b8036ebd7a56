#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: server_launch
short_description: Start a server process in its own session, tagged, with a pidfile and a log
version_added: 0.1.0
description:
  - Starts O(command) in a new session (setsid) as O(user) in O(workdir), appending its output to O(log_path).
  - The environment is clean and explicit, like a systemd unit's, C(PATH), C(HOME), C(USER), C(LOGNAME), C(SHELL),
    C(LANG), the names in O(env_passthrough), then O(env), then the launch tag O(tag_name)=O(name).
    Every worker inherits the tag, so C(gpufleet.serving.process_kill tag=...) finds orphans later.
  - Writes O(pidfile) as C(PID START_TIME) so a reused pid is never mistaken for the server.
  - Does nothing (C(changed=false)) when the pidfile names a live process;
    the gpu_server role kills and verifies the GPUs clean before it calls this module.
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
attributes:
  check_mode:
    support: full
    details: Reports whether it would launch; starts nothing.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: A second run finds the server running and reports no change.
options:
  name:
    description: Service name; the value of the launch tag.
    type: str
    required: true
  command:
    description: Argument vector to execute (no shell).
    type: list
    elements: str
    required: true
  env:
    description: Environment variables for the server (names must match C(^[A-Za-z_][A-Za-z0-9_]*$)).
    type: dict
    default: {}
  env_passthrough:
    description: Names copied from the module's own environment (for example C(CUDA_HOME)).
    type: list
    elements: str
    default: []
  user:
    description: User to run the server as.
    type: str
    default: root
  workdir:
    description: Working directory.
    type: path
    default: /
  log_path:
    description: File the server's stdout and stderr are appended to.
    type: path
    required: true
  pidfile:
    description: Pidfile to write (C(PID START_TIME)).
    type: path
    required: true
  tag_name:
    description: Name of the launch tag variable.
    type: str
    default: GPUFLEET_SERVICE
"""

EXAMPLES = r"""
- name: Launch sglang tagged GPUFLEET_SERVICE=sglang
  gpufleet.serving.server_launch:
    name: sglang
    command: [python3, -m, sglang.launch_server, --model-path, /models/kimi, --tp, "8"]
    env: {HF_HUB_OFFLINE: "1"}
    log_path: /var/log/gpufleet/sglang.log
    pidfile: /run/gpufleet/sglang.pid
"""

RETURN = r"""
pid:
  description: Pid of the launched (or already running) server.
  returned: success
  type: int
start_time:
  description: Start time of that process (clock ticks since boot, /proc/PID/stat field 22).
  returned: success
  type: int
already_running:
  description: True when the pidfile named a live process and nothing was started.
  returned: success
  type: bool
launch_s:
  description: Seconds the launch took.
  returned: success
  type: float
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _proc, _server


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            command=dict(type="list", elements="str", required=True),
            env=dict(type="dict", default={}),
            env_passthrough=dict(type="list", elements="str", default=[], no_log=False),
            user=dict(type="str", default="root"),
            workdir=dict(type="path", default="/"),
            log_path=dict(type="path", required=True),
            pidfile=dict(type="path", required=True),
            tag_name=dict(type="str", default="GPUFLEET_SERVICE"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not p["command"] or not p["command"][0]:
        module.fail_json(msg="command must be a non-empty argument list")
    try:
        env = _server.validate_env(p["env"])
        _server.validate_env({p["tag_name"]: p["name"]}, field="tag_name")
    except _server.ServerError as e:
        module.fail_json(msg=str(e))
    ident = _server.pidfile_identity(p["pidfile"])
    if ident and _proc.is_alive(ident):
        module.exit_json(changed=False, pid=ident[0], start_time=ident[1], already_running=True, launch_s=0.0)
    if module.check_mode:
        module.exit_json(changed=True, pid=None, start_time=None, already_running=False, launch_s=0.0)
    t0 = time.monotonic()
    try:
        full = _server.base_env(p["user"], p["env_passthrough"])
        full.update(env)
        full[p["tag_name"]] = p["name"]
        proc = _server.launch(p["command"], full, p["user"], p["workdir"], p["log_path"], p["pidfile"])
    except (_server.ServerError, KeyError) as e:
        module.fail_json(msg="launch of %s failed: %s" % (p["name"], e))
    module.exit_json(changed=True, pid=proc.pid, start_time=proc.start_time, already_running=False,
                     launch_s=round(time.monotonic() - t0, 4))


if __name__ == "__main__":
    main()
