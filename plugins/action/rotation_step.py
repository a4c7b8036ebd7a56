# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Action of gpufleet.serving.rotation_step: one step of a host's drain out of its load balancers, or of its return
into them, run as an item of the loop that is the whole drain (or return): plugin_utils/_drainflow.py says why and
how. The item's `delegate_to` gave this action the connection to the machine the step runs on; the step calls its
module there and keeps what it found for the next item."""

from __future__ import annotations

import typing as t

from ansible.plugins.action import ActionBase
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _drainflow

Flow = t.Union[_drainflow.Drain, _drainflow.Slow, _drainflow.Return]

# The module's documented options (plugins/modules/rotation_step.py).
ARGUMENT_SPEC = dict(
    step=dict(type="str", required=True, choices=list(_drainflow.STEPS + _drainflow.SLOW_STEPS + _drainflow.RETURN_STEPS)),
    index=dict(type="int", required=True),
    balancers=dict(type="list", elements="dict", default=[]),
    server=dict(type="str", default=""),
    worker_url=dict(type="str", default=""),
    names=dict(type="list", elements="str", default=[]),
    records=dict(type="dict", default={}),
    record=dict(type="dict", default={}),
    wait=dict(type="dict", default={}),
    rotation=dict(type="dict", default={}),
    first=dict(type="dict", default={}),
    up_timeout=dict(type="float", default=120),
    release_lock=dict(type="dict"),
)

# The arguments the first item carries for every item of its loop (see run()).
ONCE = ("records", "rotation", "first", "release_lock")

# The drain (or return) of each host in this worker process, by task and host: the items of one loop run one after
# another in the one process ansible-core forked for the host's task, the first item (index 0) starting it afresh.
_FLOWS: t.Dict[t.Tuple[str, str], Flow] = {}


class ActionModule(ActionBase):

    _supports_check_mode = True

    def _call(self, call: _drainflow.Call, task_vars) -> t.Dict[str, t.Any]:
        saved = self._task.check_mode
        if call.check_mode is not None:
            self._task.check_mode = call.check_mode  # the plan is a read: check mode in a real run too
        try:
            res = self._execute_module(module_name=call.module, module_args=dict(call.args), task_vars=task_vars)
        finally:
            self._task.check_mode = saved
        self._remove_tmp_path(self._connection._shell.tmpdir)
        return res

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]
        step = str(args["step"])
        kinds = {s: _drainflow.Drain for s in _drainflow.STEPS}
        kinds.update({s: _drainflow.Slow for s in _drainflow.SLOW_STEPS})
        kinds.update({s: _drainflow.Return for s in _drainflow.RETURN_STEPS})
        key = (str(self._task._uuid), str(task_vars.get("inventory_hostname")))
        if int(args.get("index") or 0) == 0:
            # What the host's flow composed before the loop, given to the first item only: the role passes it as
            # `X if index == 0 else omit`, so it is templated once per loop, not once per item (each is a composition of
            # the host's registered results, templated anew at every reference).
            _FLOWS[key] = kinds[step]({k: args[k] for k in ONCE}, bool(self._task.check_mode))
        flow = _FLOWS.get(key)
        if not isinstance(flow, kinds[step]):
            return dict(result, **_drainflow.missing(step))
        args.update(flow.once)
        todo = flow.call(step, args)
        out = flow.took(step, self._call(todo, task_vars)) if isinstance(todo, _drainflow.Call) else todo
        if step == "clear" and args.get("release_lock") and isinstance(todo, _drainflow.Call) and not out.get("failed"):
            # The host lock is released here, on the host, once the host is back in service and its record cleared:
            # a put-back outside the lock would race another run's drain of the host (helper-47). Its own call, in this
            # task: a task of its own would be a task execution of every restarted host (issue 25).
            released = self._call(_drainflow.Call("gpufleet.serving.server_state", dict(
                action="unlock", **{k: v for k, v in dict(args["release_lock"]).items()
                                    if k in ("name", "state_file", "lock_file", "owner")})), task_vars)
            out["lock_released"] = bool(released.get("released"))
            if released.get("failed"):
                out.setdefault("warnings", []).append(
                    "the host lock could not be released: %s (the role's last task releases it)" % released.get("msg"))
        if step in ("settle", "verdict", "clear"):  # the last step
            _FLOWS.pop(key, None)
        result.update(out)
        result["step"] = step
        return result
