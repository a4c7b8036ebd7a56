# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Apply both NCCL tuning layers in one module call (nccl_layers): sitecustomize_env's and nccl_conf's own code,
in that order, each validated against its module's argument spec first."""

from __future__ import annotations

import typing as t

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.gpufleet.serving.plugins.module_utils import _envblock, _ncclconf, _sitecustomize
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step, ignore_warning

# In the order they are written: the sitecustomize layer, then the nccl.conf fallback (the roles' order).
LAYERS: t.Tuple[t.Tuple[str, t.Any], ...] = (("sitecustomize", _sitecustomize), ("nccl_conf", _ncclconf))


def validated(key: str, params: t.Mapping[str, t.Any], backup: bool) -> t.Dict[str, t.Any]:
    """The layer's options as its module would see them (defaults filled in); StepError naming the layer when they are
    not valid. `backup` is this call's, not the layer's."""
    if "backup" in params:
        raise StepError("%s: set backup on the task, not inside the layer's options" % key, failed_layer=key)
    spec = dict(t.cast(t.Any, dict(LAYERS)[key]).argument_spec())
    checked = ArgumentSpecValidator(spec).validate(dict(params, backup=backup))
    if checked.error_messages:
        raise StepError("%s: %s; nothing was changed" % (key, "; ".join(checked.error_messages)), failed_layer=key)
    return dict(checked.validated_parameters)


def apply(p: t.Mapping[str, t.Any], step: Step = Step()) -> t.Dict[str, t.Any]:
    """Make each asked layer what its options say (nothing in check mode); the result has each layer's result, the
    diffs of both in order, and their access fixes. StepError (with `failed_layer`, and the sitecustomize result when
    the nccl.conf layer fails after it) when a layer cannot. With `keep_previous`, each file is kept there as it was
    before its change (_envblock.Previous), for _envblock.restore_previous."""
    check_mode, diff, warn, files = step.check_mode, step.diff, step.warn, step.files
    asked = [(k, validated(k, p[k], p["backup"])) for k, _mod in LAYERS if p.get(k) is not None]
    runners = dict(LAYERS)
    if len(asked) == 2:
        # nccl.conf refuses values sitecustomize accepts: a refusal must come before the first write. Its names are
        # warned about (or refused) once, by the real runs.
        try:
            _ncclconf.run(dict(asked[1][1], nccl_names="ignore", backup=False), Step(check_mode=True))
        except StepError as e:
            said = str(e).rstrip(".")
            raise StepError("nccl_conf: %s" % (said if said.endswith("nothing was changed") else said + "; nothing was changed"),
                            **dict(e.details, failed_layer="nccl_conf")) from None
    if p.get("keep_previous") and files is not None and not check_mode:
        files = _envblock.Previous(files, p["keep_previous"])
    result: t.Dict[str, t.Any] = dict(changed=False, access_fixes=[])
    diffs: t.List[t.Any] = []
    for key, params in asked:
        try:
            res = runners[key].run(params, Step(check_mode, diff, warn, files))
        except StepError as e:
            done = {k: result[k] for k in ("sitecustomize",) if k in result}
            raise StepError("%s: %s" % (key, e), **dict(e.details, failed_layer=key, changed=result["changed"], **done)) \
                from None
        d = res.pop("diff", None)
        if d:
            diffs.extend(d if isinstance(d, list) else [d])
        result[key] = res
        result["changed"] = result["changed"] or bool(res.get("changed"))
        result["access_fixes"].extend(res.get("access_fixes") or [])
    if diffs:
        result["diff"] = diffs if len(diffs) > 1 else diffs[0]
    if isinstance(files, _envblock.Previous) and files.kept:
        result["previous_kept"] = files.path  # this call's snapshot: the only one restore_previous should be given
    return result


def put_back_refusal(layers: t.Optional[t.Mapping[str, t.Any]], warn: t.Callable[[str], None] = ignore_warning,
                     files: t.Optional[_envblock.FileOps] = None) -> t.Optional[str]:
    """Why putting back a last known good generation's NCCL layers (`layers`, as it recorded them) would be refused,
    found in check mode before anything is stopped (another service runs with the layers' current values, a file that
    cannot be written); None when it would not be. A rollback that learns it only after the kill leaves the host
    without a server."""
    if not layers:
        return None
    try:
        apply(dict(layers, backup=False), Step(check_mode=True, warn=warn, files=files))
    except StepError as e:
        return str(e)
    return None
