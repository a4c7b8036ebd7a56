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

Both the lock (O(action=lock)) and the check with O(decide) take over the lock of a dead run from this controller
(a second module call with O(break_owner)). With O(decide) (the gpu_server role's check), the check is followed here
by what the role did in tasks of its own (each a task execution per host, skipped or not: issue 25): the refusals
and the decision (plugin_utils/_check.py), returned in RV(decision).
"""

from __future__ import annotations

import socket
import typing as t

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible.utils.vars import merge_hash
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _check
from ansible_collections.gpufleet.serving.plugins.plugin_utils._run import owner_alive

display = Display()

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

    def _module(self, task_vars, args: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
        wrap_async = self._task.async_val and not self._connection.has_native_async
        res = self._execute_module(module_args=dict(args), task_vars=task_vars, wrap_async=wrap_async)
        if not wrap_async:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return res

    def _locked_module(self, task_vars, args: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
        """The module; a lock left by a run of this controller that is gone (Ctrl-C, SIGTERM, a killed CI job) is taken
        over at once (a second call with O(break_owner): the module waits for a restart of that run still working on the
        host). Another controller's run, or a live one, fails the host as the module said."""
        res = self._module(task_vars, args)
        holder = res.get("holder")
        if res.get("failed") and holder is not None and args.get("owner") and not args.get("break_owner"):
            if owner_alive(str(holder), socket.gethostname()) is False:
                display.display("%s: taking over the host lock of dead run %s (its ansible-playbook process on this "
                                "controller is gone)" % (task_vars.get("inventory_hostname", "?"), holder))
                res = self._module(task_vars, dict(args, break_owner=str(holder)))
                res["took_over_from"] = str(holder)
        return res

    def _inherited_tags(self) -> t.List[str]:
        """The tags the task carries from its blocks, its role, its import or include (`tags:` on an import_role, an
        include_role's `apply`), less `always`: the role tags the call always (on its import) so that ansible-core runs
        it whatever the selection, and each step then goes by the tags of its own task. The task's tags, not its
        parent block's: a block does not carry what the role's import or include gave it (helper-42)."""
        try:
            return [str(x) for x in (self._task.tags or []) if str(x) != "always"]
        except Exception:  # pylint: disable=broad-exception-caught  # no tags to read: none inherited
            return []

    def _selected(self, task_vars, own: t.Sequence[t.Any]) -> bool:
        """Whether --tags/--skip-tags select a step whose task of its own carried `own` (none: the step always runs
        with the task)."""
        if not own:
            return True
        return _check.tags_select(self._inherited_tags() + [str(x) for x in own], task_vars.get("ansible_run_tags") or ["all"],
                                  task_vars.get("ansible_skip_tags") or [])

    def _tuned_check(self, task_vars, args: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
        """O(tune): the lock, the NCCL layers' write under it, then the check with its decision."""
        tune = dict(args.get("tune") or {})
        check_args = {k: v for k, v in args.items() if k != "tune"}
        layers: t.Dict[str, t.Any] = {}
        lock: t.Dict[str, t.Any] = {}
        layer_args = {k: tune[k] for k in ("sitecustomize", "nccl_conf", "backup", "keep_previous") if tune.get(k) is not None}
        write = "sitecustomize" in layer_args or "nccl_conf" in layer_args
        if write and self._selected(task_vars, tune.get("tags") or []):
            lock = self._locked_module(task_vars, dict(
                action="lock", name=args.get("name"), state_file=args.get("state_file"), lock_file=args.get("lock_file"),
                owner=args.get("owner"), lock_ttl=args.get("lock_ttl", 1800.0), lock_wait=args.get("lock_wait", 0.0)))
            if lock.get("failed"):
                return dict(lock, changed=False, locked=False)
            # A write only under the lock (check mode takes none, and writes nothing).
            if self._task.check_mode or lock.get("locked"):
                layers = self._execute_module(module_name="gpufleet.serving.nccl_layers", module_args=layer_args,
                                              task_vars=task_vars)
                self._remove_tmp_path(self._connection._shell.tmpdir)
                if layers.get("failed"):
                    return dict(failed=True, changed=bool(layers.get("changed")), locked=bool(lock.get("locked")),
                                msg=layers.get("msg", "the NCCL layers could not be written"), layers=layers,
                                warnings=[w for r in (lock, layers) for w in (r.get("warnings") or [])],
                                **({"took_over_from": lock["took_over_from"]} if lock.get("took_over_from") else {}))
                # Written as asked: the check does not verify them again (the role passes O(nccl_layers) only for a
                # run that left the write out).
                check_args.pop("nccl_layers", None)
        if self._selected(task_vars, (args.get("decide") or {}).get("tags") or []):
            res = self._check_and_decide(task_vars, check_args)
        else:
            res = dict(changed=False, checked=False)
        if lock:
            res["locked"] = bool(res.get("locked")) or bool(lock.get("locked"))  # the check keeps a lock held before it
            if lock.get("took_over_from") and not res.get("took_over_from"):
                res["took_over_from"] = lock["took_over_from"]
        if layers:
            res["layers"] = layers
            res["changed"] = bool(res.get("changed")) or bool(layers.get("changed"))
            if layers.get("diff"):
                res["diff"] = layers["diff"]
        # What each step warned of, in their order (the lock's takeover of a dead run's, the layers' access fixes).
        warnings = [w for r in (lock, layers, res) for w in (r.get("warnings") or [])]
        if warnings:
            res["warnings"] = warnings
        return res

    def _check_and_decide(self, task_vars, args: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
        decide = args.get("decide") or {}
        profile = decide.get("nccl_profile")
        if profile not in (None, "") and not boolean(decide.get("nccl_known", True), strict=False):
            return dict(failed=True, changed=False, msg=_check.unknown_nccl_refusal(str(profile)))
        res = self._locked_module(task_vars, args)
        owner = args.get("owner")
        if res.get("failed"):
            left = _check.recorded_drains(res, [str(n) for n in decide.get("balancers") or []], decide.get("idents") or {})
            if left:
                res["left_out_of_rotation"] = left
            return res
        force = boolean(decide.get("force", False), strict=False)
        refused = _check.refusal(res, force, bool(owner), profile)
        if refused:
            # Its only change was the host lock, which the role releases again (helper-42: changed true on a refusal).
            return dict(res, failed=True, changed=False, msg=refused)
        res["decision"] = _check.decide(res, force, [str(n) for n in decide.get("balancers") or []], bool(owner),
                                        bool(self._task.check_mode), decide.get("idents") or {},
                                        service=str(args.get("name") or ""))
        if res["decision"].get("error"):
            return dict(res, failed=True, changed=False, msg=res["decision"]["error"])
        stale = _check.stale_records(res, [str(n) for n in decide.get("balancers") or []])
        if stale:
            res["warnings"] = list(res.get("warnings") or []) + stale
        return res

    def run(self, tmp=None, task_vars=None):
        result = self._run(tmp, task_vars)
        # Which service of the host this call was for (O(name)), failed or not: a host can run several, each with a
        # flow of its own in one play, and the rollout summary keeps a row per service (helper-44).
        if isinstance(result, dict) and self._task.args.get("name") not in (None, ""):
            result.setdefault("service", str(self._task.args["name"]))
        return result

    def _run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp  # tmp no longer has any effect

        args = self._task.args
        strategy = self._play_strategy()
        # Only a call that takes the lock (the role's; the read-only audit and the fast path pass no owner).
        if args.get("owner") and args.get("action", "check") in ("check", "lock") and independent_strategy(strategy):
            result.update(failed=True, changed=False, strategy=strategy, msg=strategy_refusal(str(strategy), task_vars or {}))
            return result

        if args.get("tune") is not None and args.get("action", "check") == "check":
            return merge_hash(result, self._tuned_check(task_vars or {}, args))
        if args.get("decide") is not None and args.get("action", "check") == "check":
            return merge_hash(result, self._check_and_decide(task_vars or {}, args))
        if args.get("action") == "unlock" and args.get("fail_msg"):
            # The role's last task: the release, then the host's failure (its flow failed earlier). The failure is the
            # flow's; a release that failed too is named after it, with the lock it could not release.
            released = self._module(task_vars, {k: v for k, v in args.items() if k != "fail_msg"})
            msg = str(args["fail_msg"])
            if released.get("failed"):
                msg += "; the host lock could not be released either: %s" % released.get("msg", "failed")
            return merge_hash(result, dict(released, failed=True, changed=False, msg=msg))
        if args.get("action") == "lock":
            # The lock before the NCCL layers are written (the rollout's tuning, a user's play): a dead run's lock of
            # this controller is taken over here, so the rerun after an interrupted run tunes the host (issue 24: it
            # used to skip the tuning and then refuse the restart as if --tags had left the role out).
            return merge_hash(result, self._locked_module(task_vars or {}, args))
        return merge_hash(result, self._module(task_vars, args))
