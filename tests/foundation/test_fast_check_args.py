# SPDX-License-Identifier: GPL-3.0-or-later
"""The rollout's up-to-date check must ask the NCCL layer modules exactly what the apply tasks ask them (else a host
could be called up to date while the apply would change it): same argument names, same expressions."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.fast  # reads files only
ROLE = Path(__file__).resolve().parents[2] / "roles" / "nccl_tuning"


def _layer_call(path: Path, name: str):
    return next(t for t in yaml.safe_load(path.read_text()) if t.get("name") == name)


def test_the_apply_takes_each_layer_from_the_dict_the_check_passes():
    # One source: vars/main.yml's _gpufleet_nccl_*_args, which the rollout_check action hands to the up-to-date check (and,
    # as gpufleet_nccl_desired_layers, to the gpu_server role's write of the layers).
    task = _layer_call(ROLE / "tasks" / "configure.yml",
                       "Manage the NCCL blocks in the Python interpreters' sitecustomize.py and in nccl.conf")
    args = task["gpufleet.serving.nccl_layers"]
    assert args == {
        "sitecustomize": "{{ _gpufleet_nccl_sitecustomize_args if 'sitecustomize' in gpufleet_nccl_layers else omit }}",
        "nccl_conf": "{{ _gpufleet_nccl_conf_args if 'nccl_conf' in gpufleet_nccl_layers else omit }}",
        "backup": "{{ gpufleet_nccl_backup }}",
        # Where the files are kept as they were (under gpu_server's lock); it changes nothing the layers become.
        "keep_previous": "{{ _gpufleet_nccl_keep_previous | default(omit) }}"}
    # The rollout's check templates those very variables by name (its action), for the check and the write below: that
    # they agree is behaviour, tested by a second rollout that changes nothing, with and without the fast path
    # (tests/rollout/test_rollout.py).
    # The rollout's write under the host lock (explicit profiles) takes the very dicts the check took: the role's check
    # writes them first, in its own call (the server_state action's tune, vars/main.yml's _gpufleet_server_tune).
    main = ROLE.parent / "gpu_server" / "tasks" / "lifecycle.yml"
    block = next(t for t in yaml.safe_load(main.read_text()) if "block" in t)["block"]
    check = next(t for t in block if t.get("import_tasks", t.get("ansible.builtin.import_tasks")) == "check.yml")
    assert check["vars"] == {"_gpufleet_server_check_tune": "{{ _gpufleet_server_tune }}",
                             "_gpufleet_server_check_owner": "{{ _gpufleet_server_owner }}"} and check["tags"] == ["always"]
    role_vars = yaml.safe_load((ROLE.parent / "gpu_server" / "vars" / "main.yml").read_text())
    tune = " ".join(role_vars["_gpufleet_server_tune"].split())
    assert "combine(_gpufleet_server_nccl_desired if _gpufleet_server_nccl_tuning | default(false) | bool" in tune, tune
    assert "and _gpufleet_server_nccl_desired is not none else {})" in tune, tune
    # ... the dicts the rollout's check computed (its result, handed to the role as _gpufleet_server_checked).
    desired = " ".join(role_vars["_gpufleet_server_nccl_desired"].split())
    assert desired == ("{{ _gpufleet_server_checked.nccl_desired_layers if _gpufleet_server_checked is defined "
                       "else gpufleet_nccl_desired_layers | default(none) }}"), desired
    assert "'backup': gpufleet_nccl_backup | default(false)" in tune and "'keep_previous': _gpufleet_server_layers_previous" in tune
    assert "'tags': ['nccl_tuning', 'configure']" in tune, tune


def test_the_layer_arguments_set_every_option_of_the_modules_but_backup():
    # An option left to its module default would still be the same for apply and check, but a role setting must
    # reach both: every option the role controls is in the one dict.
    v = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    from ansible_collections.gpufleet.serving.plugins.module_utils import _ncclconf, _sitecustomize

    site = set(re.findall(r"'(\w+)':", v["_gpufleet_nccl_sitecustomize_args"]))
    assert site == set(_sitecustomize.argument_spec()) - {"backup"}
    assert set(v["_gpufleet_nccl_conf_args"]) == set(_ncclconf.argument_spec()) - {"backup"}


def test_fast_check_asks_the_server_check_what_the_roles_check_asks():
    """The rollout's one-call check (gpu_server tasks/rollout_check.yml) ends a host only when the roles' own check
    (tasks/check.yml) would say no restart: it must pass server_info the same arguments as server_state gets there, with
    the same values (server_info's action is the check)."""
    tasks = Path(__file__).resolve().parents[2] / "roles" / "gpu_server" / "tasks"

    def state_call(name: str) -> dict:  # the file's first server_state task
        return next(t["gpufleet.serving.server_state"] for t in yaml.safe_load((tasks / name).read_text())
                    if "gpufleet.serving.server_state" in t)

    full = state_call("check.yml")
    fast = yaml.safe_load((tasks / "rollout_check.yml").read_text())[0]["vars"]["_gpufleet_rollout_check_args"]
    # What only the roles' check needs: it takes the lock for the restart to come (owner, ttl, keep_lock, lock_wait),
    # and decides what the role does (decide, read by the action); the fast check only looks at the lock. The rollback
    # playbook's choice of a last known good (rollback) is the roles' check's alone: that playbook has no fast path.
    full_only = {"action", "owner", "lock_ttl", "keep_lock", "lock_wait", "decide", "rollback", "tune",
                 "worker_urls"}  # checked before a drain, which only the roles' check can lead to
    assert set(full) - full_only <= set(fast), set(full) - full_only - set(fast)
    differ = {k: (full[k], fast[k]) for k in set(full) - full_only if full[k] != fast[k]}
    # The lock file is the same, taken there and only looked at here; the drain record is read by both.
    assert set(differ) == {"nccl_layers"}, differ
    assert fast["lock_file"] == "{{ _gpufleet_server_lock_file }}" and "owner" not in fast
    # Both check the layers the rollout computed: the fast check always, the roles' check when this run left the
    # nccl_tuning role out.
    # The fast check templates gpufleet_nccl_desired_layers as its action computed it; the roles' check reads the same
    # value from that action's result (vars/main.yml's _gpufleet_server_nccl_desired, checked above).
    assert "gpufleet_nccl_desired_layers" in fast["nccl_layers"] and "_gpufleet_server_nccl_desired" in full["nccl_layers"]
    # Both read the drain record (it makes a host drained by an earlier run not up to date; the roles' check only in a
    # run that may drain, with an owner). Nothing is the fast check's alone.
    assert set(fast) - set(full) == set(), set(fast) - set(full)
    assert "_gpufleet_server_rotation_file" in fast["rotation_file"] and "_gpufleet_server_rotation_file" in full["rotation_file"]


def test_the_audit_asks_server_info_what_the_roles_check_asks():
    """The audit (gpu_server tasks/audit.yml) checks with server_info, read-only, and reports what the lifecycle's check
    (tasks/check.yml, server_state under the lock) would decide: the same check arguments with the same values, less
    the lock's owner (the lock is only looked at), the drain record (the audit reads it with a task of its own), the
    layers' write and the rollback."""
    tasks = Path(__file__).resolve().parents[2] / "roles" / "gpu_server" / "tasks"

    def call(name: str, module: str) -> dict:
        return next(t[module] for t in yaml.safe_load((tasks / name).read_text()) if module in t)

    full = call("check.yml", "gpufleet.serving.server_state")
    audit = call("audit.yml", "gpufleet.serving.server_info")
    assert "gpufleet.serving.server_state" not in (tasks / "audit.yml").read_text()
    lock_only = {"action", "owner", "lock_ttl", "lock_wait", "keep_lock", "rotation_file", "tune", "rollback"}
    assert set(audit) == set(full) - lock_only, set(audit) ^ (set(full) - lock_only)
    differ = {k: (full[k], audit[k]) for k in audit if full[k] != audit[k]}
    assert set(differ) == {"nccl_layers", "decide"}, differ
    # The layers as this run left them, never a rollback's (the audit has none).
    assert audit["nccl_layers"].replace(" ", "") in full["nccl_layers"].replace(" ", "").replace(
        "\n", "").replace("andnot_gpufleet_server_restore|default(false)", ""), (audit["nccl_layers"], full["nccl_layers"])
    # The decision's inputs are the lifecycle's, less the tune's tag and the rollback's exception.
    assert set(full["decide"]) - set(audit["decide"]) == {"tags"}
    for k in ("force", "balancers", "idents", "nccl_known"):
        assert audit["decide"][k] == full["decide"][k], k
    assert "gpufleet_nccl_profile" in audit["decide"]["nccl_profile"] and "_gpufleet_server_restore" not in audit["decide"]["nccl_profile"]
