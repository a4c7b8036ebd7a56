#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: server_launch
short_description: Start a server process in its own session, tagged, with a pidfile and a log; optionally gated and awaited
version_added: 0.1.0
description:
  - Starts O(command) in a new session (setsid) as O(user) in O(workdir), appending its output to O(log_path).
  - The environment is clean and explicit, like a systemd unit's, C(PATH), C(HOME), C(USER), C(LOGNAME), C(SHELL),
    C(LANG), the names in O(env_passthrough), then O(env), then the launch tag O(tag_name)=O(name).
    Every worker inherits the tag, so C(gpufleet.serving.process_kill tag=...) finds orphans later.
  - Writes O(pidfile) as C(PID START_TIME) so a reused pid is never mistaken for the server.
  - Does nothing (C(changed=false)) when the pidfile names a live process;
    the gpu_server role kills before it calls this module.
  - With O(wait_clean), it first waits until the GPUs are clean, as C(gpufleet.serving.gpu_wait state=clean) does,
    and launches nothing when they are not; the failure lists every holder. The gate and the launch run in one
    process, so no other task runs between the check and the launch.
  - With O(wait_ready), it then waits until the server is ready, as C(gpufleet.serving.server_ready) does (a
    health URL and/or a real request, failing at once with the log tail if the server dies during start-up), also
    when it found the server already running.
  - Both cost no extra task (each ansible task start costs about 0.4 s; the gate about 10 ms on an idle GPU).
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
  wait_clean:
    version_added: 0.2.0
    description:
      - Before launching, wait until these GPUs are clean (no process, at most O(wait_clean.max_used_mib) MiB used).
      - Not evaluated in check mode, nor when the server already runs.
    type: dict
    suboptions:
      gpus:
        description: GPU indices. Empty means all GPUs.
        type: list
        elements: int
        default: []
      timeout:
        description: Seconds to wait before failing without launching. Must be greater than 0.
        type: float
        default: 30
      poll_interval:
        description: Seconds between polls. Must be greater than 0.
        type: float
        default: 0.02
      max_used_mib:
        description: Highest used memory (MiB) that still counts as clean; unset picks the default of C(gpu_wait).
        type: int
      backend:
        description: GPU backend.
        type: str
        choices: [auto, nvml, nvidia-smi]
        default: auto
seealso:
  - module: gpufleet.serving.gpu_wait
  - module: gpufleet.serving.server_ready
"""

EXAMPLES = r"""
- name: Launch sglang tagged GPUFLEET_SERVICE=sglang
  gpufleet.serving.server_launch:
    name: sglang
    command: [python3, -m, sglang.launch_server, --model-path, /models/kimi, --tp, "8"]
    env: {HF_HUB_OFFLINE: "1"}
    log_path: /var/log/gpufleet/sglang.log
    pidfile: /run/gpufleet/sglang.pid

- name: Verify GPUs 0-7 clean, launch, and wait for a real request, in one step
  gpufleet.serving.server_launch:
    name: sglang
    command: [python3, -m, sglang.launch_server, --model-path, /models/kimi, --tp, "8"]
    log_path: /var/log/gpufleet/sglang.log
    pidfile: /run/gpufleet/sglang.pid
    wait_clean:
      gpus: [0, 1, 2, 3, 4, 5, 6, 7]
      timeout: 20
    wait_ready:
      health_url: http://127.0.0.1:30000/health
      request:
        url: http://127.0.0.1:30000/generate
        body: '{"text": "ping", "sampling_params": {"max_new_tokens": 1}}'
      timeout: 900
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
clean:
  description:
    - With O(wait_clean), the gate's result as C(gpu_wait) returns it (C(waited_s), C(polls), C(backend),
      C(max_used_mib), C(gpus), C(holders)); also returned when the gate fails.
  returned: when wait_clean is set and evaluated
  type: dict
ready:
  description: With O(wait_ready), C(ready_s), C(health_s) and C(attempts) as C(server_ready) returns them.
  returned: when wait_ready is set and evaluated
  type: dict
log_tail:
  description: Last lines of the server log (O(wait_ready.log_tail_path) when set) when the readiness wait failed.
  returned: failure
  type: str
phase:
  description: Where it failed; V(clean) (nothing launched), V(launch), V(startup) (the server died) or V(ready) (timeout).
  returned: failure
  type: str
"""

import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _gpumod, _nolog, _proc, _server
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError, fail


def main() -> None:
    module = _nolog.NoLogModule(
        argument_spec=_server.launch_argspec(
            pidfile=dict(type="path", required=True),
            wait_clean=dict(type="dict", options=_gpumod.clean_gate_argspec()),
        ),
        supports_check_mode=True,
    )
    p = module.params
    gate, ready = p["wait_clean"], p["wait_ready"]
    # Every input is checked before anything is read, killed or started.
    if not p["command"] or not p["command"][0]:
        module.fail_json(msg="command must be a non-empty argument list")
    err = _server.launch_input_error(p)
    if err:
        module.fail_json(msg=err)
    env = _server.validate_env(p["env"])

    result: t.Dict[str, t.Any] = dict(changed=False, already_running=False, launch_s=0.0)
    tail_since = None  # found running: whatever its own log holds is this server's
    ident = _server.pidfile_identity(p["pidfile"])
    if ident and _proc.is_alive(ident):
        result.update(pid=ident[0], start_time=ident[1], already_running=True)
    elif module.check_mode:
        module.exit_json(changed=True, pid=None, start_time=None, already_running=False, launch_s=0.0)
    else:
        if gate:
            try:
                result["clean"] = _gpumod.wait_or_fail(gate, result_key="clean", phase="clean", changed=False)
            except StepError as e:
                fail(module, e)
        tail_since = _server.log_stamp(ready["log_tail_path"]) if ready and ready["log_tail_path"] else None
        t0 = time.monotonic()
        try:
            proc = _server.start(p["name"], p["command"], env, p["env_passthrough"], p["user"], p["workdir"],
                                 p["log_path"], p["pidfile"], p["tag_name"], p["umask"])
        except _server.ServerError as e:
            module.fail_json(msg="launch of %s failed: %s" % (p["name"], e), phase="launch", **result)
        ident = (proc.pid, proc.start_time)
        result.update(changed=True, pid=proc.pid, start_time=proc.start_time, launch_s=round(time.monotonic() - t0, 4))
    if ready and not module.check_mode:
        try:
            result["ready"] = _server.wait_ready(ident, ready["health_url"], ready["request"], ready["timeout"],
                                                 ready["interval"], p["log_path"], ready["log_tail_lines"],
                                                 ready["log_tail_path"], tail_since)
        except _server.ServerError as e:
            details = dict(e.details)
            module.fail_json(msg=str(e), **dict(result, **details))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
