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
  - Does nothing (C(changed=false)) when the pidfile names a live process that carries the launch tag
    O(tag_name)=O(name); a pidfile naming any other process is stale, and the server is launched.
  - Before the launch (in check mode too), the executable (a bare name is looked up on the server's C(PATH)), O(user),
    O(workdir) and the files it writes (O(log_path), O(pidfile)) are checked; a launch that could not start fails
    with RV(phase=launch) and starts nothing.
  - It neither waits for clean GPUs before the launch nor for the server after it. For those steps use
    M(gpufleet.serving.gpu_wait) and M(gpufleet.serving.server_ready), or M(gpufleet.serving.server_restart), which
    kills the running server, waits for clean GPUs, launches and waits for the server in one call (the gpu_server
    role's restart).
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
  - gpufleet.serving._launch
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
  command:
    description: Argument vector to execute (no shell).
    type: list
    elements: str
    required: true
  pidfile:
    description: Pidfile to write (C(PID START_TIME)).
    type: path
    required: true
seealso:
  - module: gpufleet.serving.gpu_wait
  - module: gpufleet.serving.server_ready
  - module: gpufleet.serving.server_restart
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
  description: Pid of the launched (or already running) server; null in check mode when it would be launched.
  returned: success
  type: int
start_time:
  description: Start time of that process (clock ticks since boot, /proc/PID/stat field 22); null in check mode
    when it would be launched.
  returned: success
  type: int
already_running:
  description: True when the pidfile named a live process carrying the launch tag, and nothing was started.
  returned: success
  type: bool
launch_s:
  description: Seconds the launch took.
  returned: success
  type: float
launch_problems:
  description: Why the launch could not start (executable, user, workdir, files), checked before anything is started.
  returned: when the launch could not start
  type: list
  elements: str
phase:
  description: Where it failed; V(launch).
  returned: failure
  type: str
"""

import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _nolog, _proc, _server, _statefile


def main() -> None:
    module = _nolog.NoLogModule(
        argument_spec=_server.launch_argspec(pidfile=dict(type="path", required=True)),
        supports_check_mode=True,
    )
    p = module.params
    # Every input is checked before anything is read or started.
    if not p["command"] or not p["command"][0]:
        module.fail_json(msg="command must be a non-empty argument list")
    err = _server.launch_input_error(p)
    if err:
        module.fail_json(msg=err)
    env = _server.validate_env(p["env"])

    result: t.Dict[str, t.Any] = dict(changed=False, already_running=False, launch_s=0.0)
    ident = _statefile.pidfile_identity(p["pidfile"])
    # The pidfile's process is the server only if it carries the launch tag (a pidfile never selects alone).
    if ident and _proc.is_alive(ident) and _proc.environ_has(ident[0], p["tag_name"], p["name"]):
        result.update(pid=ident[0], start_time=ident[1], already_running=True)
        module.exit_json(**result)
    # What would make the launch fail, in check mode too (so that it predicts the real run).
    problems = _server.launch_problems(p["command"][0], p["user"], p["workdir"],
                                       path=str(env.get("PATH") or _server.SAFE_PATH),
                                       files={"log_path": p["log_path"], "pidfile": p["pidfile"]})
    if problems:
        module.fail_json(msg="launch of %s failed: cannot run this server: %s" % (p["name"], "; ".join(problems)),
                         phase="launch", launch_problems=problems, **result)
    if module.check_mode:
        result.update(changed=True, pid=None, start_time=None)
    else:
        t0 = time.monotonic()
        try:
            proc = _server.start(p["name"], p["command"], env, p["env_passthrough"], p["user"], p["workdir"],
                                 p["log_path"], p["pidfile"], p["tag_name"], p["umask"])
        except _server.ServerError as e:
            module.fail_json(msg="launch of %s failed: %s" % (p["name"], e), phase="launch", **result)
        result.update(changed=True, pid=proc.pid, start_time=proc.start_time, launch_s=round(time.monotonic() - t0, 4))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
