# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Run a single-step module's runner (it takes an AnsibleModule) inside another module, with its own parameters.

The composite modules (server_restart, server_state's nccl_layers check) reuse the exact code of the single-step
modules this way instead of a second implementation.
"""

from __future__ import annotations

import typing as t


class Failed(BaseException):
    """The runner called fail_json.

    A BaseException like the SystemExit of AnsibleModule.fail_json, which the runners expect: it passes through
    their `except Exception` handlers (backend_or_fail's) instead of being reported as an unexpected error."""

    def __init__(self, msg: str, **details: t.Any) -> None:
        super().__init__(msg)
        self.details = details


class Step:
    """What a runner needs from an AnsibleModule (params, check_mode, warn, fail_json); fail_json raises Failed."""

    _diff = False

    def __init__(self, module: t.Any, params: t.Dict[str, t.Any], check_mode: t.Optional[bool] = None) -> None:
        self.params = params
        self.check_mode = module.check_mode if check_mode is None else check_mode
        self.warn = module.warn

    def fail_json(self, msg: str, **kw: t.Any) -> t.NoReturn:
        kw.pop("exception", None)
        raise Failed(msg, **kw)
