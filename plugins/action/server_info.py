# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Action of gpufleet.serving.server_info: the module's read-only check, then, with O(decide), what the gpu_server role
would do with the host, decided on the controller by the code server_state's check uses (plugin_utils/_check.py). The
audit's row of a host is that decision; nothing here writes or takes a lock, so it needs no strategy refusal."""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible.utils.vars import merge_hash
from ansible_collections.gpufleet.serving.plugins.action.server_state import ActionModule as _StateAction


class ActionModule(_StateAction):

    _supports_check_mode = True
    _supports_async = True

    def _run(self, tmp=None, task_vars=None):
        result = ActionBase.run(self, tmp, task_vars)
        del tmp  # tmp no longer has any effect
        args = self._task.args
        if args.get("decide") is not None:
            # No owner: _locked_module takes nothing over, and the decision is a read-only run's.
            return merge_hash(result, self._check_and_decide(task_vars or {}, args))
        return merge_hash(result, self._module(task_vars, args))
