# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Action of gpufleet.serving.rollout_check: the rollout's whole pre-flight of one host in one task execution.

It was nine tasks per host (two argument-spec validations, two asserts, the NCCL layers' set_fact, an include and the
three tasks of the up-to-date check): each a fork of the main process and a look at the host's variables, ~38 ms of
controller CPU whether it ran or was skipped (issue 25, STYLE.md item 21). The rules stay where they were:

- the types, choices and defaults are the roles' meta/argument_specs.yml (gpu_server's O(preflight) entry,
  nccl_tuning's O(validate) entry), validated with ansible-core's own ArgumentSpecValidator on the values as the play
  has them, as the roles' automatic validation does;
- the rules the specs cannot say are the server_problems and nccl_names_refused filters' Python
  (plugin_utils/_preflight.py, module_utils/_ncclvars.py), and nccl_tuning's vars/main.yml for the input's form and
  the layers' arguments, templated here as the role templates them;
- the up-to-date check is one gpufleet.serving.server_info call (read-only) with the arguments the task's
  C(_gpufleet_rollout_check_args) variable wires (roles/gpu_server/tasks/rollout_check.yml).

The results are returned, not set as facts: an action's C(ansible_facts) are host facts, below set_fact's precedence
and visible as top-level variables only through INJECT_FACTS_AS_VARS. The playbooks register the result and hand it to
the gpu_server role (C(_gpufleet_server_checked)); the rollout summary reads RV(gpufleet_server_result).
"""

from __future__ import annotations

import os
import re
import typing as t
from collections import ChainMap

from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible_collections.gpufleet.serving.plugins.module_utils import _balancer, _ncclvars
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _check
from ansible_collections.gpufleet.serving.plugins.plugin_utils._preflight import definition_refusal

# The nccl_tuning role's variables the layers' arguments are templated from (its vars/main.yml): the one source for
# the role's own writes (tasks/configure.yml) and for the rollout's check and write under the host lock.
LAYER_ARGS = {"sitecustomize": "_gpufleet_nccl_sitecustomize_args", "nccl_conf": "_gpufleet_nccl_conf_args"}
CHECK_ARGS = "_gpufleet_rollout_check_args"
_TAGGED = re.compile(r"<class 'ansible\.[\w.]*\._AnsibleTagged(\w+)'>")


def _message(e: Exception) -> str:
    return to_text(getattr(e, "message", None) or e)


class ActionModule(ActionBase):

    _supports_check_mode = True
    _VALID_ARGS = frozenset(("nccl", "fast_check"))

    def _role_file(self, role: str, *parts: str) -> t.Any:
        """A file of one of the collection's roles, as its loader parsed it (strings trusted as templates, as Ansible
        loads role files). The roles sit side by side in the collection, next to this task's role."""
        here = self._task._role._role_path  # type: ignore[union-attr]  # run() checked it is gpu_server's
        path = os.path.join(os.path.dirname(here), role, *parts)
        # The main process parsed gpu_server's files when it loaded the role, before it forked this worker: read its
        # cache as it is (load_from_file would deep-copy the parsed argument specs, ~16 ms on every host). Read-only,
        # and this worker's copy goes with it.
        cached = getattr(self._loader, "_FILE_CACHE", {}).get(path)
        return cached if cached is not None else (self._loader.load_from_file(path, trusted_as_template=True) or {})

    def _spec(self, role: str, entry: str) -> t.Dict[str, t.Any]:
        return dict(self._role_file(role, "meta", "argument_specs.yml")["argument_specs"][entry]["options"])

    @staticmethod
    def _spec_errors(role: str, entry: str, spec: t.Mapping[str, t.Any], values: t.Mapping[str, t.Any]) -> t.Optional[str]:
        res = ArgumentSpecValidator(dict(spec)).validate(dict(values))
        if not res.error_messages:
            return None
        # ansible-core's own message for a role's argument spec, naming which one; a value's class is named as YAML
        # has it ("str", not ansible-core's internal tagged class).
        errors = [_TAGGED.sub(lambda m: m.group(1).lower(), e) for e in res.error_messages]
        return "Validation of arguments failed (role %s, argument spec %r):\n%s" % (role, entry, "\n".join(errors))

    def _values(self, templar: t.Any, names: t.Iterable[str], task_vars: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
        """The variables the play has for these names, templated (as ansible's validate_argument_spec takes them). A
        value that cannot be templated (an undefined variable in it) is named: ansible's own error names only the
        undefined variable, not the setting it is in."""
        out = {}
        for n in names:
            if n in task_vars:
                try:
                    out[n] = templar.template(task_vars[n])
                except AnsibleError as e:
                    raise AnsibleError("%s cannot be templated: %s" % (n, _message(e))) from None
        return out

    def _nccl(self, mode: str, templar: t.Any, task_vars: t.Mapping[str, t.Any]) -> t.Tuple[t.Optional[str], t.Dict[str, t.Any]]:
        """(refusal, what the NCCL layers should hold). `check` refuses bad input; `compute` (the rollback playbook, which
        restores a generation's own layers) only computes, an unusable input giving nothing, as before."""
        if mode == "compute":
            # A rollback restores a generation's own layers: what the inventory's NCCL input says is only the
            # fingerprint it reports, so nothing in it is refused, an undefined variable included.
            try:
                return self._desired(mode, templar, task_vars)
            except AnsibleError:
                return None, {"nccl_effective_env": None, "nccl_desired_layers": None}
        spec = self._spec("nccl_tuning", "validate")
        err = self._spec_errors("nccl_tuning", "validate", spec, self._values(templar, spec, task_vars))
        if err:
            return err, {}
        return self._desired(mode, templar, task_vars)

    def _desired(self, mode: str, templar: t.Any,
                 task_vars: t.Mapping[str, t.Any]) -> t.Tuple[t.Optional[str], t.Dict[str, t.Any]]:
        """(refusal, what the layers should hold) from nccl_tuning's own variables; `compute` refuses nothing."""
        defaults = self._role_file("nccl_tuning", "defaults", "main.yml")
        role_vars = self._role_file("nccl_tuning", "vars", "main.yml")
        # nccl_tuning's own precedence within this play: its vars over the play's over its defaults (the rollout
        # imports only gpu_server, whose variables this task sees as any of the role's tasks does).
        scope = ChainMap(role_vars, dict(task_vars), defaults)
        ntemplar = templar.copy_with_new_env(available_variables=scope)
        none = {"nccl_effective_env": None, "nccl_desired_layers": None}
        if mode == "check":
            refusal = to_text(ntemplar.template(role_vars["_gpufleet_nccl_input_refusal"]))
            if refusal:
                return refusal, {}
            usable = True
        else:  # the role's own test of its input (form and names, not the types), as the layers' arguments take it
            usable = boolean(ntemplar.template(role_vars["_gpufleet_nccl_inputs_valid"]), strict=False)
        profile = ntemplar.template(scope["gpufleet_nccl_profile"])
        if not usable:
            return None, none
        resolved: t.Dict[str, t.Any] = {}
        if profile == "auto":
            # Resolved on the host in a rollback too (one read of its GPUs): the inventory's fingerprint the rollback
            # reports, and compares with the generation it goes back to, includes the profile's variables; unresolved,
            # it was the fingerprint of no NCCL variables, another host's (helper-47). A host whose GPUs cannot be read
            # refuses nothing there (a rollback restores the generation's own layers): nothing is computed.
            refusal, resolved = self._auto(ntemplar.template(scope["gpufleet_nccl_gpu_backend"]), task_vars)
            if refusal:
                return (None, none) if mode != "check" else (refusal, {})
            profile = resolved["nccl_profile_resolved"]
        scope.maps.insert(0, {"_gpufleet_nccl_for": profile})
        env = ntemplar.copy_with_new_env(available_variables=scope).template(role_vars["_gpufleet_nccl_env_for"])
        scope.maps.insert(0, {"_gpufleet_nccl_env": env})
        ntemplar = ntemplar.copy_with_new_env(available_variables=scope)
        layers = ntemplar.template(scope["gpufleet_nccl_layers"])
        desired = {k: ntemplar.template(role_vars[v]) for k, v in LAYER_ARGS.items() if k in layers}
        return None, dict(resolved, nccl_effective_env=dict(env), nccl_desired_layers=desired)

    def _auto(self, backend: str, task_vars: t.Mapping[str, t.Any]) -> t.Tuple[t.Optional[str], t.Dict[str, t.Any]]:
        """(refusal, the profile auto resolves to on this host): pcie_only when gpu_info reports no active NVLink, else
        nvlink, as the nccl_tuning role resolves it (its tasks/preflight.yml). Read here, on the host, so that the rollout
        knows the layers and the fingerprint of an auto host before its lock, as it does for an explicit profile: its
        roles then write them in the check's own call, and a host already right takes the fast path (issue 25)."""
        res = self._execute_module(module_name="gpufleet.serving.gpu_info", module_args={"backend": backend},
                                   task_vars=task_vars)
        if res.get("failed"):
            return ("gpufleet_nccl_profile auto: gpu_info could not read this host's GPUs to choose between pcie_only and "
                    "nvlink (%s); set gpufleet_nccl_profile explicitly, or fix gpufleet_nccl_gpu_backend"
                    % str(res.get("msg") or "failed")[:300]), {}
        auto = _ncclvars.auto_profile(res)
        out: t.Dict[str, t.Any] = {"nccl_profile_resolved": auto["profile"]}
        if auto["warning"]:
            out["nccl_warning"] = auto["warning"]
        return None, out

    def _fast_check(self, templar: t.Any, task_vars: t.Mapping[str, t.Any], nccl: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
        """The read-only check (gpufleet.serving.server_info), with what this run computed for the NCCL layers in scope."""
        scope = ChainMap({"gpufleet_nccl_effective_env": nccl.get("nccl_effective_env"),
                          "gpufleet_nccl_desired_layers": nccl.get("nccl_desired_layers")}, dict(task_vars))
        ctemplar = templar.copy_with_new_env(available_variables=scope)
        args = dict(ctemplar.template(task_vars[CHECK_ARGS]))  # an omitted value is no key (ansible-core 2.19+)
        entries = ctemplar.template(task_vars["_gpufleet_server_balancers"]) or []
        balancers = [b.get("name") for b in entries]
        res = self._execute_module(module_name="gpufleet.serving.server_info", module_args=args, task_vars=task_vars)
        return dict(res, _balancer_names=balancers, _balancer_entries=entries)

    def _idents(self, templar: t.Any, task_vars: t.Mapping[str, t.Any], entries: t.Sequence[t.Any]) -> t.Dict[str, t.Any]:
        """The server each entry names for this host, as the roles' check has them (balancer_idents): a record under an
        entry's name of another server is not this host's drain. Only read for a refusal of a host with records."""
        if not entries:
            return {}
        try:
            url = templar.template(task_vars["_gpufleet_server_worker_url"])
        except (AnsibleError, KeyError):
            return {}  # the roles' check names it; here every record under an entry's name counts
        return _balancer.identity_map(entries, str(task_vars.get("inventory_hostname")), str(url))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp  # tmp no longer has any effect
        task_vars = task_vars or {}
        nccl_mode = str(self._task.args.get("nccl") or "none")
        if nccl_mode not in ("check", "compute", "none"):
            return dict(result, failed=True, msg="nccl must be check, compute or none (got %s)" % nccl_mode[:40])
        fast = boolean(self._task.args.get("fast_check", False), strict=False)
        templar = self._templar
        result.update(changed=False, up_to_date=False)
        if self._task._role is None or self._task._role.get_name(include_role_fqcn=False) != "gpu_server":
            # It reads the gpu_server role's variables (defaults, vars/main.yml) as that role's tasks see them.
            return dict(result, failed=True, msg="gpufleet.serving.rollout_check runs only as the gpu_server role's task: "
                        "import the role with tasks_from: rollout_check (see the rollout playbook)")

        # 1. The server definition: gpu_server's argument spec, then the rules it cannot say.
        spec = self._spec("gpu_server", "preflight")
        try:
            server = self._values(templar, spec, task_vars)
        except AnsibleError as e:
            return dict(result, failed=True, msg="gpu_server: invalid server definition: %s" % _message(e))
        err = self._spec_errors("gpu_server", "preflight", spec, server)
        if err:
            return dict(result, failed=True, msg=err)
        problem = definition_refusal(dict(server, gpufleet_server_gate=server.get("gpufleet_server_gate")))
        if problem:
            return dict(result, failed=True, msg=problem)

        # 2. The NCCL tuning input, and what the layers should hold.
        nccl: t.Dict[str, t.Any] = {"nccl_effective_env": None, "nccl_desired_layers": None}
        if nccl_mode != "none":
            try:
                refusal, nccl = self._nccl(nccl_mode, templar, task_vars)
            except AnsibleError as e:
                return dict(result, failed=True, msg="Invalid NCCL tuning input: %s" % _message(e))
            if refusal:
                return dict(result, failed=True, msg=refusal)
        warning = nccl.pop("nccl_warning", None)
        if warning:
            result["warnings"] = list(result.get("warnings") or []) + [warning]
        result.update(nccl)

        # 3. The fast path: one read-only check (not when the NCCL layers could not be computed), and any outcome but
        # "already right" leaves the host to the roles, which report it; only a server that cannot be launched fails the
        # host here, before anything on it changes.
        if not fast or (nccl_mode != "none" and nccl["nccl_desired_layers"] is None):
            return result
        try:
            check = self._fast_check(templar, task_vars, nccl)
        except AnsibleError as e:  # a templating error in the host's variables: the roles report it
            result["check_error"] = _message(e)
            return result
        names = check.pop("_balancer_names")
        entries = check.pop("_balancer_entries")
        verdict = _check.fast_verdict(check, names, str(server.get("gpufleet_server_name")))
        if verdict.get("failed"):
            # A host an earlier run left out of rotation (its drain record) stays out: said in the summary (helper-45),
            # less a record of another server under an entry's name (not this host's drain), as the roles' check says.
            left = _check.recorded_drains(check, names, self._idents(templar, task_vars, entries)
                                          if check.get("drain_records") else {})
            return dict(result, **verdict, **({"left_out_of_rotation": left} if left else {}))
        result.update(verdict)
        stale = _check.stale_records(check, names)
        if stale and verdict.get("up_to_date"):  # otherwise the roles' check says it
            result["warnings"] = list(result.get("warnings") or []) + stale
        return result
