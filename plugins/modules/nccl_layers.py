#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: nccl_layers
short_description: Apply both NCCL tuning layers (the sitecustomize block and the nccl.conf block) in one call
version_added: 0.2.0
description:
  - Runs the code of M(gpufleet.serving.sitecustomize_env) with O(sitecustomize), then the code of
    M(gpufleet.serving.nccl_conf) with O(nccl_conf), in one module call (one task execution per host, where the two
    modules cost two and a read-only pre-check a third). The C(nccl_tuning) role and the C(gpu_server) role use it.
  - Each layer's options are exactly its module's, checked against that module's argument spec before anything is
    read or changed; an invalid one fails the call, naming the layer, with nothing changed.
  - When both layers are asked for, the nccl.conf layer is first checked without writing (its rules refuse values the
    sitecustomize layer accepts, such as line breaks or edge whitespace), so a value it refuses leaves both layers
    untouched instead of only the second.
  - Check and diff mode are those of the two modules; the diff lists each layer's.
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: The diffs of M(gpufleet.serving.sitecustomize_env) and M(gpufleet.serving.nccl_conf), in that order.
  idempotent:
    support: full
options:
  sitecustomize:
    description:
      - The options of M(gpufleet.serving.sitecustomize_env), O(backup) excepted. Unset leaves that layer alone.
    type: dict
  nccl_conf:
    description:
      - The options of M(gpufleet.serving.nccl_conf), O(backup) excepted. Unset leaves that layer alone.
    type: dict
  backup:
    description: Keep a timestamped copy of each file before it changes, as the two modules' O(backup) does.
    type: bool
    default: false
  keep_previous:
    description:
      - A file (root-only, mode C(0600)) where this call keeps each layer file as it was before the call changed it
        (its bytes, mode and owner, or that it was absent), written before the change, for O(restore_previous). A
        snapshot an earlier call left there is removed first; a call that changes nothing leaves none.
      - Not in check mode.
    type: path
    version_added: 0.2.0
  restore_previous:
    description:
      - Put each file of the snapshot O(keep_previous) wrote back as it was (byte for byte, its mode and owner; a
        file that was absent is removed), then remove the snapshot. No snapshot there is nothing to do.
      - The C(gpu_server) role does it when its restart is refused before the kill, so the old server, which runs on,
        and the layers agree again. A read permission a write added for every user (RV(access_fixes)) to a directory,
        or to a file whose content it did not change, stays.
      - Not with O(sitecustomize) or O(nccl_conf).
    type: path
    version_added: 0.2.0
seealso:
  - module: gpufleet.serving.sitecustomize_env
  - module: gpufleet.serving.nccl_conf
  - module: gpufleet.serving.server_state
    description: Its O(gpufleet.serving.server_state#module:nccl_layers) option checks the same dicts without writing.
"""

EXAMPLES = r"""
- name: Export the PCIe-only NCCL variables to every spawned worker, with the nccl.conf fallback
  gpufleet.serving.nccl_layers:
    sitecustomize:
      interpreters: [/usr/bin/python3]
      env: {NCCL_PROTO: LL, NCCL_ALGO: Ring, NCCL_P2P_LEVEL: SYS}
    nccl_conf:
      env: {NCCL_PROTO: LL, NCCL_ALGO: Ring, NCCL_P2P_LEVEL: SYS}
    backup: true
  register: layers
"""

RETURN = r"""
sitecustomize:
  description: The result of the sitecustomize layer, as M(gpufleet.serving.sitecustomize_env) returns it (its diff in
    the task's).
  returned: when O(sitecustomize) is set and that layer ran
  type: dict
nccl_conf:
  description: The result of the nccl.conf layer, as M(gpufleet.serving.nccl_conf) returns it (its diff in the task's).
  returned: when O(nccl_conf) is set and that layer ran
  type: dict
access_fixes:
  description: Both layers' C(access_fixes) (why a file or directory was, or would be, made readable by every user).
  returned: always
  type: list
  elements: dict
previous_kept:
  description: The O(keep_previous) file, when this call kept a file there before changing it (and so wrote it).
  returned: when O(keep_previous) is set and a file changed
  type: str
restored:
  description: With O(restore_previous), the files put back (or, in check mode, that would be).
  returned: when O(restore_previous) is set
  type: list
  elements: str
failed_layer:
  description: On failure, the layer that failed (V(sitecustomize) or V(nccl_conf)); a sitecustomize result beside it
    says what was already written.
  returned: on failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _envblock, _layers
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError, fail
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            sitecustomize=dict(type="dict"),
            nccl_conf=dict(type="dict"),
            backup=dict(type="bool", default=False),
            keep_previous=dict(type="path"),
            restore_previous=dict(type="path"),
        ),
        required_one_of=[("sitecustomize", "nccl_conf", "restore_previous")],
        mutually_exclusive=[("sitecustomize", "restore_previous"), ("nccl_conf", "restore_previous"),
                            ("keep_previous", "restore_previous")],
        supports_check_mode=True,
    )
    try:
        if module.params["restore_previous"]:
            result = _envblock.restore_previous(module.params["restore_previous"], module.check_mode)
        else:
            result = _layers.apply(module.params, Step.of(module))
    except StepError as e:
        fail(module, e)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
