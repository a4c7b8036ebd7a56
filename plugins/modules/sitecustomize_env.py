#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: sitecustomize_env
short_description: Export environment variables from every Python process at start-up, through sitecustomize.py
version_added: 0.1.0
description:
  - Manages a marked block in the C(sitecustomize.py) that each given interpreter imports at start-up, so that
    every Python process of that interpreter, and every C(spawn)-started worker (torch.multiprocessing, vLLM,
    SGLang tensor-parallel workers), sees the variables, whatever started the launcher (systemd, a shell, a scheduler).
  - The file is found by asking each interpreter itself, started with an empty environment (or O(probe_env)),
    which C(sitecustomize) it imports, or where C(import sitecustomize) would look when none exists; a new
    file is created in the interpreter's standard library directory. Interpreters that share one file
    (a venv and its base interpreter) are edited once.
  - On Debian and Ubuntu C(/usr/lib/python3.X/sitecustomize.py) is a symlink to C(/etc/python3.X/sitecustomize.py).
    The module edits the target and keeps the link, and only when the link and every directory holding the link
    or its target are owned by root (or the current user when not root) and not writable by group or others;
    otherwise it refuses.
  - A venv with C(include-system-site-packages = false) still imports the standard library's C(sitecustomize.py),
    which shadows any C(sitecustomize.py) in the venv's C(site-packages); shadowed copies are reported as warnings.
  - The block is delimited by C(# BEGIN gpufleet NAME) and C(# END gpufleet NAME); everything else in the file is
    kept byte for byte (a last line without its line break gets one), and several blocks (different O(name)) can coexist. A file the module creates starts with
    a header line and is removed again when its last block is removed.
  - Only NCCL's own variables (C(NCCL_*)) and the names listed in O(allow_vars) are written, and never a variable
    that changes how every program, the Python interpreter or the dynamic loader behaves (C(LD_PRELOAD),
    C(PYTHONPATH), C(PATH), ...), because every Python process on the host would export it.
  - Names and values are written as ASCII Python string literals, so no name or value can inject code; the block
    catches every C(Exception), because a failing C(sitecustomize) breaks every Python process on the host,
    Ansible included.
  - Writes are safe. The module renders the whole new file, compiles it, writes it to a temporary file in the same
    directory, runs that file with each target interpreter in a subprocess and checks the exported values, and
    only then moves it over the old file atomically, keeping its owner and mode (V(0644) for a new file).
  - The file must be readable by every user, because it exists to reach every Python process on the host, a
    server run as an unprivileged user included (C(site) skips a C(sitecustomize) it cannot read, silently). With
    O(state=present), a managed file without read permission for group and others (a C(chmod 0600)) gets it
    (V(0600) becomes V(0644)), and so does search permission on the directory holding it and on the one holding a
    followed symlink (V(0700) becomes V(0711)); nothing else of their modes changes. This counts as a change, in
    check mode and in the diff too, so an audit run in check mode reports such a file as drift (RV(access_fixes)).
    Directories further up are left alone.
  - After writing, each interpreter is started with an empty environment and the managed variables it exports are
    returned as RV(effective_env); the module fails when they differ from what was asked (with O(state=absent),
    when they are still set).
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
  - gpufleet.serving._layershare
attributes:
  check_mode:
    support: full
    details: Computes the change and reports the currently exported values; writes nothing.
  diff_mode:
    support: full
    details: Returns gpufleet's blocks of each file before and after (the file's other lines, unchanged, as a line
      that counts them, as they may export secrets), one entry per file, and each mode it changes (RV(access_fixes)).
  idempotent:
    support: full
options:
  interpreters:
    description:
      - Absolute paths of the Python interpreters whose start-up must export the variables, for example a venv's
        C(bin/python). Symlinks are not resolved, so a venv interpreter stays a venv interpreter.
      - Empty means the system interpreters C(/usr/bin/python3*) and C(/usr/local/bin/python3*) (only C(python3) and
        C(python3.X)), resolved and de-duplicated.
    type: list
    elements: path
    default: []
  path:
    description:
      - Manage this file instead of the one the interpreters import (for example a C(sitecustomize.py) in a directory
        that the service puts on C(PYTHONPATH)).
      - It must be named C(sitecustomize.py) or C(usercustomize.py), also after following links; any other file is
        refused and nothing is changed.
      - The interpreters are still started to test and to verify the file, with O(probe_env), so O(probe_env) must make
        them import it.
    type: path
  env:
    description:
      - Variables to export. Names must match C(^[A-Za-z_][A-Za-z0-9_]*$); values must be strings or numbers
        (numbers are exported as their decimal text; booleans, lists and dicts are refused).
      - Every Python process of the interpreters exports them, so only NCCL's own variables (C(NCCL_*)) and the names
        listed in O(allow_vars) are accepted; anything else is refused, naming the variable, before anything changes.
    type: dict
    default: {}
  allow_vars:
    version_added: 0.2.0
    description:
      - Exact names besides C(NCCL_*) that O(env) may set, such as C(TORCH_NCCL_ASYNC_ERROR_HANDLING),
        C(NVSHMEM_DISABLE_NCCL) or C(TORCH_SYMM_MEM_DISABLE_MULTICAST). Patterns are not accepted.
      - A listed C(NCCL_*) name is not reported as unknown by O(nccl_names) (a variable newer than the module's list).
      - Names that change how every program, the Python interpreter or the dynamic loader behaves are refused even
        when listed, upper or lower case; set them in the service's own environment instead. They are C(LD_*),
        C(MALLOC_*), C(PYTHON*), C(LC_*), C(BASH_FUNC_*), glibc's other loader variables (C(GLIBC_TUNABLES),
        C(GCONV_PATH), C(GETCONF_DIR), C(HOSTALIASES), C(LOCALDOMAIN), C(LOCPATH), C(NIS_PATH), C(NLSPATH),
        C(RESOLV_HOST_CONF), C(RES_OPTIONS), C(TZDIR)), C(PATH), C(HOME), C(SHELL), C(IFS), C(ENV), C(BASH_ENV),
        C(CDPATH), C(PS4), C(TMPDIR), C(TMP), C(TEMP), C(LANG), C(LANGUAGE), C(TZ), C(USER), C(LOGNAME), other
        runtimes' code and option variables (C(PERL5LIB), C(PERL5OPT), C(PERLLIB), C(RUBYLIB), C(RUBYOPT),
        C(NODE_OPTIONS), C(NODE_PATH), C(JAVA_TOOL_OPTIONS), C(_JAVA_OPTIONS), C(JDK_JAVA_OPTIONS)), and the proxy
        and CA bundle variables (C(HTTP_PROXY), C(HTTPS_PROXY), C(FTP_PROXY), C(ALL_PROXY), C(NO_PROXY),
        C(SSL_CERT_FILE), C(SSL_CERT_DIR), C(REQUESTS_CA_BUNDLE), C(CURL_CA_BUNDLE)).
      - Not checked with O(state=absent), so a block can always be removed.
    type: list
    elements: str
    default: []
  state:
    description: V(present) writes the block, V(absent) removes it.
    type: str
    choices: [present, absent]
    default: present
  mode:
    description:
      - V(setdefault) sets a variable only when the process did not get it already, so an explicitly exported value
        wins (C(os.environ.setdefault)).
      - V(override) always sets it (C(os.environ[NAME] = value)).
    type: str
    choices: [setdefault, override]
    default: setdefault
  name:
    description: Block name, written into the markers; several blocks with different names can coexist.
    type: str
    default: gpufleet
  backup:
    description: Keep a timestamped copy of the file before changing it.
    type: bool
    default: false
  probe_env:
    description:
      - Environment given to the interpreters when the module locates, tests and verifies the file. Empty by default,
        so the result holds for a process started with an empty environment.
    type: dict
    default: {}
  nccl_names:
    description:
      - How to treat C(NCCL_*) names in O(env). V(warn) warns about unknown names (with the closest known name),
        about NCCL debugging knobs and deprecated names; V(fail) refuses unknown names before changing anything.
      - Names that are not C(NCCL_*) are governed by O(allow_vars) whatever this option says.
    type: str
    choices: [ignore, warn, fail]
    default: ignore
notes:
  - C(/proc/PID/environ) shows the environment at exec. A launcher that ran this block itself does not show the
    variables there, but its C(spawn)-started workers do; use M(gpufleet.serving.process_env) to check workers.
  - Editing the system interpreter's C(sitecustomize.py) needs root; use C(become).
  - When the file does not end with a newline, one is added before a new block and stays after the block is removed.
seealso:
  - module: gpufleet.serving.nccl_conf
  - module: gpufleet.serving.process_env
"""

EXAMPLES = r"""
- name: Export the PCIe-only NCCL tuning from every system Python process
  gpufleet.serving.sitecustomize_env:
    name: nccl
    env:
      NCCL_PROTO: LL
      NCCL_ALGO: Ring
      NCCL_P2P_LEVEL: SYS
      NCCL_BUFFSIZE: 16777216
    nccl_names: warn
  become: true

- name: Also reach a venv interpreter (it shares the base interpreter's file, edited once)
  gpufleet.serving.sitecustomize_env:
    interpreters: [/usr/bin/python3.12, /opt/sglang/venv/bin/python]
    env: {NCCL_DEBUG: WARN}

- name: Remove the block again
  gpufleet.serving.sitecustomize_env:
    name: nccl
    state: absent
  become: true
"""

RETURN = r"""
interpreters:
  description:
    - One entry per interpreter with C(interpreter), C(executable), C(version), C(prefix), C(base_prefix), C(venv),
      C(sitecustomize) (the file it imports, or would create), C(exists), C(shadowed) (later copies it never imports)
      and C(managed_path) (the file this module manages for it).
  returned: always
  type: list
  elements: dict
files:
  description:
    - One entry per managed file with C(path), C(real_path) (after following a safe symlink), C(symlinks),
      C(changed), C(created), C(removed), C(interpreters), C(backup_file) and C(access_fixes) (as RV(access_fixes),
      for this file).
  returned: always
  type: list
  elements: dict
effective_env:
  description:
    - Per interpreter, the managed variables as a process started with an empty environment sees them
      (null when unset). In check mode, the values before any change.
  returned: always
  type: dict
  sample: {"/usr/bin/python3.12": {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}}
not_effective:
  version_added: 0.2.0
  description:
    - Interpreters whose RV(effective_env) differs from what the file asks for. Outside check mode the module fails
      on them; in check mode they are only listed (an unchanged file whose variables do not reach the interpreters
      is not up to date).
  returned: when any
  type: list
  elements: str
import_failures:
  version_added: 0.2.0
  description:
    - "For each sitecustomize.py an interpreter fails to import at start-up (Python then prints only C(Error in
      sitecustomize) and runs none of the file, gpufleet's block included), where and why, for example
      C(/etc/python3.11/sitecustomize.py fails to import outside gpufleet's block, at line 3: NameError: name 'x' is not
      defined). Outside check mode a block whose variables do not reach the interpreter then fails with this text
      first; the audit reports it as the reason the NCCL layers differ."
  returned: always
  type: list
  elements: str
access_fixes:
  version_added: 0.2.0
  description:
    - The modes changed (in check mode, that would change) so that every user can read a managed file, one entry
      per path with C(path), C(kind) (V(file) or V(directory)), C(mode_before), C(mode_after) and C(reason)
      (for example C(/etc/python3.11/sitecustomize.py is not readable by every user) followed by the mode).
    - Empty when every managed file and its directory were already readable and searchable by every user.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/etc/python3.11/sitecustomize.py", "kind": "file", "mode_before": "0600", "mode_after": "0644",
            "reason": "/etc/python3.11/sitecustomize.py is not readable by every user (mode 0600)"}]
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
shadowed:
  description: Warnings about C(sitecustomize.py) copies that are never imported because an earlier one wins.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _sitecustomize
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError, fail
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step


def main() -> None:
    module = AnsibleModule(
        argument_spec=_sitecustomize.argument_spec(),
        supports_check_mode=True,
    )
    try:
        result = _sitecustomize.run(module.params, Step.of(module))
    except StepError as e:
        fail(module, e)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
