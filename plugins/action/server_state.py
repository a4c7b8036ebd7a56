# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Action of gpufleet.serving.server_state: refuses to take a host lock in a play whose strategy lets hosts run
independently (free, host_pinned), then runs the module as ansible.builtin's normal action does.

Under such a strategy a host of a later batch can be restarted while a host of an earlier batch fails, and the
gpu_server role's batch semantics (serial, max_fail_percentage, the rollout playbooks' batch gate) cannot hold. No
task variable tells a role its play's strategy: only the task object knows its play, so the check lives here, on the
call that takes the lock (the first that touches a host in the role), and costs no task of its own. The rollout
playbooks set `strategy: linear` on their plays, so a `strategy = free` in the user's ansible.cfg does not reach them.
The nccl_tuning role run on its own for a service takes the same lock (gpu_server's tasks/lock_layers.yml) before its
first layer write, so a play of the user's that lists both roles is refused there, before anything is written.
"""

from __future__ import annotations

import typing as t

from ansible.plugins.action import ActionBase
from ansible.utils.vars import merge_hash

# Strategies whose hosts do not go through the tasks together (ansible.builtin's and mitogen's *_free).
_INDEPENDENT = ("free", "host_pinned")


def independent_strategy(name: t.Optional[str]) -> bool:
    short = (name or "").rsplit(".", 1)[-1]
    return short in _INDEPENDENT or short.endswith("_free")


def strategy_refusal(strategy: str, task_vars: t.Mapping[str, t.Any]) -> str:
    """The refusal of a lock under an independent strategy. It is the first host write of both roles (gpu_server's
    check or lock, and the nccl_tuning role's lock before its layer writes when it runs on its own for a service), so
    nothing was changed, unless the NCCL layers were written earlier in this run without a lock (the nccl_tuning role
    run for no service: gpufleet_nccl_changed, the fact it sets, says whether they changed)."""
    if task_vars.get("gpufleet_nccl_changed") in (True, "True", "true"):
        done = ("this host's NCCL layers were changed earlier in this run (the nccl_tuning role, gpufleet_nccl_changed), "
                "before this refusal; nothing else was changed on it")
    else:
        done = "nothing was changed on this host"
    return ("gpufleet's roles cannot keep their batch semantics under the play's strategy %s (hosts go through the "
            "tasks independently: a host of a later batch could be restarted while one of an earlier batch fails), and "
            "the NCCL layers of a service are written only under its host lock, which is not taken: %s. Set 'strategy: "
            "linear' on the play (the gpufleet.serving playbooks set it whatever ansible.cfg or ANSIBLE_STRATEGY say) "
            "and run again" % (strategy, done))


class ActionModule(ActionBase):

    _supports_check_mode = True
    _supports_async = True

    def _play_strategy(self) -> t.Optional[str]:
        try:
            return str(self._task.get_play().strategy)
        except Exception:  # pylint: disable=broad-exception-caught  # a task without a play: nothing to refuse
            return None

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp  # tmp no longer has any effect

        args = self._task.args
        strategy = self._play_strategy()
        # Only a call that takes the lock (the role's; the read-only audit and the fast path pass no owner).
        if args.get("owner") and args.get("action", "check") in ("check", "lock") and independent_strategy(strategy):
            result.update(failed=True, changed=False, strategy=strategy, msg=strategy_refusal(str(strategy), task_vars or {}))
            return result

        wrap_async = self._task.async_val and not self._connection.has_native_async
        result = merge_hash(result, self._execute_module(task_vars=task_vars, wrap_async=wrap_async))
        if not wrap_async:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
