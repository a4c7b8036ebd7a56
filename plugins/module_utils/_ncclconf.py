# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""nccl_conf: a marked block of NAME=VALUE lines in /etc/nccl.conf.

NCCL's own reader (src/misc/param.cc, setEnvFile) reads the file line by line, skips lines
starting with '#' (older releases: lines without '='), splits at the FIRST '=', keeps the
value verbatim (spaces included, at most 1023 bytes) and calls setenv without overwriting.
So the real environment wins over NCCL_CONF_FILE (or ~/.nccl.conf), which wins over
/etc/nccl.conf, and inside one file the first line for a name wins.
"""

from __future__ import annotations

import os
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _envblock, _layershare, _ncclvars
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step

HEADER = "# Created by gpufleet.serving.nccl_conf; removed with its last gpufleet block.\n"
MAX_VALUE_BYTES = 1023


def check_values(env: t.Mapping[str, str]) -> None:
    for k, v in env.items():
        if "\n" in v or "\r" in v:
            raise _envblock.BlockError("env: value of %s contains a line break, which nccl.conf cannot hold" % k)
        if v != v.strip():
            raise _envblock.BlockError("env: value of %s has leading or trailing whitespace, which NCCL would keep as part of the value" % k)
        if v == "":
            raise _envblock.BlockError("env: value of %s is empty; NCCL ignores empty values" % k)
        if len(_envblock.encode(v)) > MAX_VALUE_BYTES:
            raise _envblock.BlockError("env: value of %s is longer than the %d bytes NCCL reads from a conf file" % (k, MAX_VALUE_BYTES))


def render_body(env: t.Mapping[str, str]) -> str:
    return (
        "# Managed by Ansible (gpufleet.serving.nccl_conf); edits inside this block are lost.\n"
        + "".join("%s%s%s\n" % (k, "=", v) for k, v in sorted(env.items()))
    )


def parse_conf(text: str) -> t.Dict[str, t.Tuple[str, int]]:
    """What NCCL takes from this file: name -> (value, 1-based line); the first line for a name wins."""
    out: t.Dict[str, t.Tuple[str, int]] = {}
    for n, line in enumerate(text.split("\n"), 1):
        line = line[:-1] if line.endswith("\r") else line
        if line.startswith("#") or "=" not in line:
            continue
        k, _sep, v = line.partition("=")
        out.setdefault(k, (v[:MAX_VALUE_BYTES], n))
    return out


def argument_spec() -> t.Dict[str, t.Any]:
    """Options of nccl_conf (also server_state's nccl_layers.nccl_conf)."""
    return dict(
        path=dict(type="path", default="/etc/nccl.conf"),
        env=dict(type="dict", default={}),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        name=dict(type="str", default="gpufleet"),
        backup=dict(type="bool", default=False),
        nccl_names=dict(type="str", choices=["ignore", "warn", "fail"], default="warn"),
        allow_vars=dict(type="list", elements="str", default=[]),
        service_tag=dict(type="str"),
        service_locks=dict(type="path"),
    )


def run(p: t.Mapping[str, t.Any], step: Step = Step()) -> t.Dict[str, t.Any]:
    """nccl_conf: make the file's block what `p` asks (nothing in check mode) and return the result; StepError when it
    cannot. `step.files` (the AnsibleModule: backup_local, atomic_move) is needed only to write, so a check-mode run
    (server_state's layer check) passes none."""
    check_mode, diff, warn, files = step.check_mode, step.diff, step.warn, step.files
    present = p["state"] == "present"
    try:
        name = _envblock.check_block_name(p["name"])
        env = _envblock.normalize_env(p["env"], "env")
        check_values(env)
    except _envblock.BlockError as e:
        raise StepError(str(e))
    own = _layershare.parse_service_tag(p.get("service_tag"))
    if present:
        # NCCL setenv()s every NAME=VALUE line of the file, NCCL_* or not, in each process that initialises it (and
        # so in what that process starts later): the same names as sitecustomize_env, no more.
        try:
            _ncclvars.check_allowed(env, p["allow_vars"])
        except _ncclvars.NotAllowed as e:
            raise StepError(str(e), **e.extra)
        _ncclvars.apply_name_policy(warn, env, p["nccl_names"], p["allow_vars"])
    path = p["path"]
    real = path
    try:
        real, links = _envblock.resolve_target(path)
        current = _envblock.read_text(real)
        old_block = _envblock.block_lines(_envblock.split_lines(current or ""), name, real)
        body = render_body(env) if present else None
        desired = _envblock.replace_block(current, name, body, HEADER, real)
        # A file NCCL in the server's processes cannot read is a file without the block; nothing to keep readable
        # once the block is removed.
        fixes = _envblock.access_fixes(real, links) if present and desired is not None else []
    except _envblock.BlockError as e:
        raise StepError(str(e), path=path)
    except (OSError, ValueError) as e:
        raise StepError("cannot read %s: %s" % (path, e), path=path)

    # Before anything is written (and so in check mode too): another service runs on this host with these values.
    _layershare.refuse_if_shared(own, real, {k: v for k, (v, _line) in parse_conf("".join(old_block)).items()},
                                 env if present else {}, p.get("service_locks"))
    # Prove it before writing: read the candidate the way NCCL will.
    effective = parse_conf(desired or "")
    keys = sorted(env) if present else sorted(set(parse_conf("".join(old_block))) | set(env))
    eff = {k: effective[k][0] if k in effective else None for k in keys}
    if present:
        shadowed = {k: effective[k][1] for k in keys if eff[k] != env[k]}
        if shadowed:
            raise StepError("%s sets %s earlier in the file, outside the block, and NCCL uses the first line for a name; "
                            "nothing was changed" % (real, ", ".join("%s (line %d)" % kv for kv in sorted(shadowed.items()))),
                            path=real)
    else:
        still = [k for k in keys if eff[k] is not None]
        if still:
            warn("%s still sets %s outside the block" % (real, ", ".join(still)))

    content_changed = desired != current
    changed = content_changed or bool(fixes)
    result: t.Dict[str, t.Any] = dict(changed=changed, path=path, real_path=real, symlinks=links,
                                      created=content_changed and current is None,
                                      removed=content_changed and desired is None,
                                      backup_file=None, effective_conf=eff, access_fixes=fixes)
    if changed and diff:
        # Only gpufleet's blocks, as sitecustomize_env: the file's other lines are not this module's to print.
        diffs = ([_envblock.diff_entry(real, _envblock.blocks_only(current), _envblock.blocks_only(desired))]
                 if content_changed else []) + _envblock.access_diff(fixes)
        result["diff"] = diffs if len(diffs) > 1 else diffs[0]
    if content_changed and not check_mode:
        try:
            if desired is None:
                result["backup_file"] = _envblock.remove(files, real, p["backup"])
            else:
                tmp = _envblock.write_temp(real, desired)
                try:
                    result["backup_file"] = _envblock.install(files, real, tmp, current is not None, p["backup"])
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
        except OSError as e:
            hint = "; run as root (become: true)" if isinstance(e, PermissionError) else ""
            raise StepError("cannot write %s: %s%s" % (real, e.strerror or e, hint), path=real)
    _envblock.fix_access_or_fail(check_mode, fixes, real)
    if not check_mode:
        written = parse_conf(_envblock.read_text(real) or "")
        got = {k: written[k][0] if k in written else None for k in keys}
        if got != eff:
            raise StepError("%s does not hold what was written (changed by someone else meanwhile?)" % real, **result)
    return result
