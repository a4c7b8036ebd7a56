# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""How a step's entry point is called, one shape for all (issue 25): `run(params, step)`, where `params` are its
module's validated parameters and `step` what else it needs of its module. A module passes Step.of(module); a step
that runs another (the layer check, the restart's kill and environment check) passes a Step of its own, in check
mode where it only looks. Errors are raised as StepError (_errors); only a module's main() turns one into fail_json."""

from __future__ import annotations

import typing as t


def ignore_warning(msg: str) -> None:
    """The `warn` of a step called without one."""


class Step(t.NamedTuple):
    """check_mode and diff as the module has them; warn (module.warn); files, what writing a file needs of
    AnsibleModule (backup_local, atomic_move: SELinux contexts kept), None where nothing is written; run_command
    (module.run_command), None where no command is run."""

    check_mode: bool = False
    diff: bool = False
    warn: t.Callable[[str], None] = ignore_warning
    files: t.Any = None
    run_command: t.Any = None

    @classmethod
    def of(cls, module: t.Any) -> "Step":
        return cls(check_mode=bool(module.check_mode), diff=bool(module._diff), warn=module.warn, files=module,
                   run_command=module.run_command)
