# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Are the NCCL tuning layers already as asked? sitecustomize_env's and nccl_conf's own code, run in check mode."""

from __future__ import annotations

import typing as t

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.gpufleet.serving.plugins.module_utils import _ncclconf, _sitecustomize
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step, ignore_warning

RUNNERS: t.Dict[str, t.Callable[[t.Any, Step], t.Dict[str, t.Any]]] = {
    "sitecustomize": _sitecustomize.run,
    "nccl_conf": _ncclconf.run,
}


def argument_spec() -> t.Dict[str, t.Any]:
    """server_state's nccl_layers option. Each layer is validated against its module's own argument spec at run
    time (ArgumentSpecValidator), so the options are written once, in the layer's module."""
    return dict(sitecustomize=dict(type="dict"), nccl_conf=dict(type="dict"))


def _layer_spec(key: str) -> t.Dict[str, t.Any]:
    spec = (_sitecustomize if key == "sitecustomize" else _ncclconf).argument_spec()
    spec.pop("backup")  # nothing is written here
    return spec


def up_to_date(layers: t.Mapping[str, t.Any], warn: t.Callable[[str], None] = ignore_warning
               ) -> t.Dict[str, t.Any]:
    """Run each asked layer's module code in check mode; up to date when none would change and, for sitecustomize,
    every interpreter already sees the values. A layer whose check fails is not up to date (its module, run for
    real, reports the error)."""
    out: t.Dict[str, t.Any] = {"up_to_date": True}
    for key, runner in RUNNERS.items():
        params = layers.get(key)
        if params is None:
            continue
        checked = ArgumentSpecValidator(_layer_spec(key)).validate(params)
        if checked.error_messages:
            out[key] = {"up_to_date": False, "error": "; ".join(checked.error_messages)}
            out["up_to_date"] = False
            continue
        try:
            res = runner(dict(checked.validated_parameters, backup=False), Step(check_mode=True, warn=warn))
        except StepError as e:
            out[key] = {"up_to_date": False, "error": str(e)}
            out["up_to_date"] = False
            continue
        ok = not res["changed"] and not res.get("not_effective")
        out[key] = {"up_to_date": ok, "files": [f.get("path") for f in res.get("files", [])] or [res.get("path")]}
        if res.get("import_failures"):
            # Why the block's values do not reach the interpreters, in the audit's and the check's own words.
            out[key]["error"] = "; ".join(res["import_failures"])
        if res.get("access_fixes"):
            # Root reads the file whatever its mode; a server run as another user would not (the roles fix it).
            out[key]["access"] = [f["reason"] for f in res["access_fixes"]]
        if not ok:
            out["up_to_date"] = False
    return out
