#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: nccl_conf
short_description: Manage a marked block of NCCL variables in /etc/nccl.conf
version_added: 0.1.0
description:
  - NCCL reads C(/etc/nccl.conf) itself in every process that initialises it, whatever started the process and
    whatever language it is written in. This module manages a block of C(NAME=VALUE) lines there, delimited by
    C(# BEGIN gpufleet NAME) and C(# END gpufleet NAME), and keeps the rest of the file byte for byte (a last line without its line break gets one).
  - "Precedence, as NCCL implements it (it calls C(setenv) without overwriting): a variable in the process's real
    environment wins; then the file named by C(NCCL_CONF_FILE) (NCCL 2.23 and later), or C(~/.nccl.conf) when
    C(NCCL_CONF_FILE) is unset; then C(/etc/nccl.conf). Inside one file the first line for a name wins."
  - So this layer is the fallback for processes the C(sitecustomize) layer (M(gpufleet.serving.sitecustomize_env))
    does not reach, and anything that layer exports (or the service exports) wins over it. NCCL only reads the file
    when it initialises, so running servers must be restarted.
  - Values are written verbatim, as NCCL reads them; values with line breaks, leading or trailing whitespace, empty
    values and values over 1023 bytes are refused. The module refuses to write a block whose variable is already set
    earlier in the file outside the block, because NCCL would ignore the block's line.
  - The symlink, atomic write, backup, check and diff behaviour is the one of M(gpufleet.serving.sitecustomize_env).
  - The file must be readable by every user, because NCCL reads it in the server's processes, as whatever user the server
    runs as, and skips a file it cannot open without a word. With O(state=present), a file without read permission
    for group and others (a C(chmod 0600)) gets it (V(0600) becomes V(0644)), and so does search permission on the
    directory holding it and on the one holding a followed symlink; nothing else of their modes changes. This
    counts as a change, in check mode and in the diff too (RV(access_fixes)).
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
  - gpufleet.serving._layershare
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: Shows gpufleet's blocks before and after; the file's other lines, unchanged, as a line that counts them.
  idempotent:
    support: full
options:
  path:
    description: The file to manage, for example a file named by C(NCCL_CONF_FILE).
    type: path
    default: /etc/nccl.conf
  env:
    description:
      - Variables to set. Names must match C(^[A-Za-z_][A-Za-z0-9_]*$); values must be strings or numbers.
      - NCCL sets every C(NAME=VALUE) line of the file in the process that reads it, C(NCCL_*) or not, so only
        C(NCCL_*) names and the names listed in O(allow_vars) are accepted; anything else is refused, naming the
        variable, before anything changes.
    type: dict
    default: {}
  allow_vars:
    version_added: 0.2.0
    description:
      - Exact names besides C(NCCL_*) that O(env) may set. Patterns are not accepted.
      - A listed C(NCCL_*) name is not reported as unknown by O(nccl_names).
      - Names that change how every program, the Python interpreter or the dynamic loader behaves (C(LD_*),
        C(PYTHON*), C(PATH), ...) are refused even when listed; the full list is in the O(allow_vars) option of
        M(gpufleet.serving.sitecustomize_env).
      - Not checked with O(state=absent), so a block can always be removed.
    type: list
    elements: str
    default: []
  state:
    description: V(present) writes the block, V(absent) removes it (and the file, when the module created it and nothing else is left).
    type: str
    choices: [present, absent]
    default: present
  name:
    description: Block name, written into the markers.
    type: str
    default: gpufleet
  backup:
    description: Keep a timestamped copy of the file before changing it.
    type: bool
    default: false
  nccl_names:
    description:
      - V(warn) warns about unknown C(NCCL_*) names (with the closest known name), NCCL debugging knobs and deprecated
        names; V(fail) refuses unknown names before changing anything; V(ignore) checks nothing.
      - Names that are not C(NCCL_*) are governed by O(allow_vars) whatever this option says.
    type: str
    choices: [ignore, warn, fail]
    default: warn
notes:
  - Only NCCL's own log proves that a process read the file; see the O(gpufleet.serving.process_env#module:nccl_log)
    option of M(gpufleet.serving.process_env).
seealso:
  - module: gpufleet.serving.sitecustomize_env
  - module: gpufleet.serving.process_env
"""

EXAMPLES = r"""
- name: Host-wide NCCL settings as a fallback layer
  gpufleet.serving.nccl_conf:
    name: nccl
    env:
      NCCL_SOCKET_IFNAME: "=ens1f0"
      NCCL_DEBUG: WARN
  become: true

- name: Remove the block
  gpufleet.serving.nccl_conf:
    name: nccl
    state: absent
  become: true
"""

RETURN = r"""
path:
  description: The managed path as given.
  returned: always
  type: str
real_path:
  description: The file written, after following a safe symlink.
  returned: always
  type: str
symlinks:
  description: Symlinks followed to reach RV(real_path).
  returned: always
  type: list
  elements: str
created:
  description: Whether the file was (or would be) created.
  returned: always
  type: bool
removed:
  description: Whether the file was (or would be) removed because only the module's header was left.
  returned: always
  type: bool
backup_file:
  description: The backup copy, when O(backup) made one.
  returned: always
  type: str
effective_conf:
  description:
    - The managed variables as NCCL reads them from the file after the change (null when the file does not set them);
      in check mode, as they would be.
  returned: always
  type: dict
  sample: {"NCCL_PROTO": "LL"}
access_fixes:
  version_added: 0.2.0
  description:
    - The modes changed (in check mode, that would change) so that every user can read the file, as
      RV(gpufleet.serving.sitecustomize_env#module:access_fixes) lists them; empty when nothing was in the way.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/etc/nccl.conf", "kind": "file", "mode_before": "0600", "mode_after": "0644",
            "reason": "/etc/nccl.conf is not readable by every user (mode 0600)"}]
  contains:
    path:
      description: The file or directory whose mode changed.
      type: str
    kind:
      description: V(file) or V(directory).
      type: str
    mode_before:
      description: Its mode before, in octal.
      type: str
    mode_after:
      description: Its mode after (in check mode, the mode it would get), in octal.
      type: str
    reason:
      description: Why it changed, naming the path and its old mode; the roles list these (C(gpufleet_nccl_access_fixes)).
      type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _ncclconf
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError, fail
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step


def main() -> None:
    module = AnsibleModule(
        argument_spec=_ncclconf.argument_spec(),
        supports_check_mode=True,
    )
    try:
        result = _ncclconf.run(module.params, Step.of(module))
    except StepError as e:
        fail(module, e)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
