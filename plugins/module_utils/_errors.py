# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""The one error the collection's core logic raises; only a module's main() turns it into fail_json.

The composite modules (server_restart, server_state's NCCL layer check) run the single-step modules' code and catch
it like any other exception: it is an Exception, so a step's own `except Exception` handler must re-raise it.
"""

from __future__ import annotations

import typing as t


class StepError(Exception):
    """A step could not do what it was asked. `details` is its partial result: the keys fail_json returns beside
    `msg` (an `exception` key, a traceback, goes to fail_json's exception=)."""

    def __init__(self, msg: str, **details: t.Any) -> None:
        super().__init__(msg)
        self.details = details


def fail(module: t.Any, e: StepError, **extra: t.Any) -> t.NoReturn:
    """fail_json with the error's message and partial result (extra keys first, the error's win)."""
    module.fail_json(msg=str(e), **dict(extra, **e.details))
    raise AssertionError("fail_json returned")  # pragma: no cover - fail_json exits
