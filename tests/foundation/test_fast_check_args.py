# SPDX-License-Identifier: GPL-3.0-or-later
"""The rollout's up-to-date check must ask the NCCL layer modules exactly what the apply tasks ask them (else a host
could be called up to date while the apply would change it): same argument names, same expressions."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.fast  # reads files only
ROLE = Path(__file__).resolve().parents[2] / "roles" / "nccl_tuning"


def _apply_args():
    tasks = yaml.safe_load((ROLE / "tasks" / "configure.yml").read_text())
    by_name = {t["name"]: t for t in tasks}
    site = by_name["Manage the NCCL block in the Python interpreters' sitecustomize.py"]["gpufleet.serving.sitecustomize_env"]
    conf = by_name["Manage the NCCL block in nccl.conf"]["gpufleet.serving.nccl_conf"]
    return site, conf


def test_check_args_are_the_apply_args():
    v = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    site, conf = _apply_args()
    assert set(site) - {"backup"} == {"interpreters", "path", "env", "state", "mode", "name", "probe_env", "nccl_names",
                                      "allow_vars"}
    check_site = v["_gpufleet_nccl_sitecustomize_args"]
    for k, expr in site.items():
        if k == "backup":
            continue
        # The check's dict is one Jinja expression; each apply argument's variable must be in it under its name.
        inner = expr.strip().removeprefix("{{").removesuffix("}}").strip()
        name = "'%s'" % k
        assert name in check_site, "%s is missing from _gpufleet_nccl_sitecustomize_args" % k
        for var in [w for w in inner.replace("(", " ").replace(")", " ").split() if w.startswith("gpufleet_nccl_")
                    or w.startswith("_gpufleet_nccl_env")]:
            assert var in check_site, "%s: %s is not used by the check" % (k, var)
    assert {k: " ".join(str(x).split()) for k, x in conf.items() if k != "backup"} == \
        {k: " ".join(str(x).split()) for k, x in v["_gpufleet_nccl_conf_args"].items()}


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
    assert set(fast) - set(full) == set(), set(fast) - set(full)
