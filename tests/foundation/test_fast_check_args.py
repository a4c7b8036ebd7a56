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


def _layer_calls():
    tasks = yaml.safe_load((ROLE / "tasks" / "configure.yml").read_text())
    return {t["name"]: next((k, v) for k, v in t.items() if k.startswith("gpufleet.serving.")) for t in tasks
            if any(k.startswith("gpufleet.serving.") for k in t)}


def _option_of(var, value):
    """The option an argument takes from the one dict `var`, or None when it comes from elsewhere."""
    m = re.fullmatch(r"\{\{ %s\.(\w+)( \| default\(omit\))? \}\}" % var, str(value))
    return m.group(1) if m else None


@pytest.mark.parametrize("task,module,var,own", [
    ("Manage the NCCL block in the Python interpreters' sitecustomize.py", "gpufleet.serving.sitecustomize_env",
     "_gpufleet_nccl_sitecustomize_args", {"backup": "{{ gpufleet_nccl_backup }}"}),
    ("Manage the NCCL block in nccl.conf", "gpufleet.serving.nccl_conf", "_gpufleet_nccl_conf_args",
     {"backup": "{{ gpufleet_nccl_backup }}"}),
    # Read-only, before either layer changes; the name policy is left to the sitecustomize task (one warning).
    ("Check the nccl.conf layer before changing either layer", "gpufleet.serving.nccl_conf", "_gpufleet_nccl_conf_args",
     {"nccl_names": "ignore"}),
])
def test_the_apply_tasks_take_every_argument_from_the_dict_the_check_passes(task, module, var, own):
    # One source: vars/main.yml's _gpufleet_nccl_*_args, which tasks/desired.yml hands to the up-to-date check.
    v = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    keys = set(v[var]) if isinstance(v[var], dict) else set(re.findall(r"'(\w+)':", v[var]))
    name, args = _layer_calls()[task]
    assert name == module
    assert {k: x for k, x in args.items() if k in own} == own
    taken = {k: _option_of(var, x) for k, x in args.items() if k not in own}
    assert all(taken[k] == k for k in taken), taken  # each option reads its own key of the dict
    assert set(taken) == keys - set(own), set(taken) ^ (keys - set(own))
    desired = (ROLE / "tasks" / "desired.yml").read_text()
    assert "': %s}" % var in desired


def test_the_layer_arguments_set_every_option_of_the_modules_but_backup():
    # An option left to its module default would still be the same for apply and check, but a role setting must
    # reach both: every option the role controls is in the one dict.
    v = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    from ansible_collections.gpufleet.serving.plugins.module_utils import _ncclconf, _sitecustomize

    site = set(re.findall(r"'(\w+)':", v["_gpufleet_nccl_sitecustomize_args"]))
    assert site == set(_sitecustomize.argument_spec()) - {"backup"}
    assert set(v["_gpufleet_nccl_conf_args"]) == set(_ncclconf.argument_spec()) - {"backup"}


def test_fast_check_asks_the_server_check_what_the_roles_check_asks():
    """The rollout's one-call check (gpu_server tasks/up_to_date.yml) ends a host only when the roles' own check
    (tasks/check.yml) would say no restart: it must pass the same server_state arguments with the same values."""
    tasks = Path(__file__).resolve().parents[2] / "roles" / "gpu_server" / "tasks"

    def state_call(name: str) -> dict:  # the file's first server_state task
        return next(t["gpufleet.serving.server_state"] for t in yaml.safe_load((tasks / name).read_text())
                    if "gpufleet.serving.server_state" in t)

    full, fast = state_call("check.yml"), state_call("up_to_date.yml")
    # What only the roles' check needs: it takes the lock for the restart to come (owner, ttl, keep_lock, lock_wait);
    # the fast check only looks at the lock.
    full_only = {"owner", "lock_ttl", "keep_lock", "lock_wait"}
    assert set(full) - full_only <= set(fast), set(full) - full_only - set(fast)
    differ = {k: (full[k], fast[k]) for k in set(full) - full_only if full[k] != fast[k]}
    assert set(differ) == {"lock_file", "nccl_layers"}, differ
    assert fast["lock_file"] == "{{ _gpufleet_server_lock_file }}" and "owner" not in fast
    # Both check the layers the rollout computed: the fast check always, the roles' check when this run left the
    # nccl_tuning role out.
    assert "gpufleet_nccl_desired_layers" in fast["nccl_layers"] and "gpufleet_nccl_desired_layers" in full["nccl_layers"]
    # What only the fast check needs: the drain record, which the roles read in their own step (check.yml, drain.yml)
    # and which makes a host drained by an earlier run not up to date here.
    assert set(fast) - set(full) == {"rotation_file"}, set(fast) - set(full)
    assert "_gpufleet_server_rotation_file" in fast["rotation_file"]
