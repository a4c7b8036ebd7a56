# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Run ids (the gpufleet.serving.run lookup) and the order of two runs, for the host lock's wait-die rule."""

from __future__ import annotations

import re
import time
import typing as t

# CONTROLLER_HOST:PID:BOOT_ID.START_TICKS.UUID, then :STARTED, the ansible-playbook process's start as
# seconds since the epoch. Ids without it (written by an older gpufleet) stay valid; their runs have no known order.
_STARTED = re.compile(r"^[0-9]{1,12}(\.[0-9]{1,6})?$")


def with_start(run_id: str, started: float) -> str:
    """The run id with its start time appended (microseconds: two controllers started in the same tick still
    differ by their clocks' sub-tick readings more often than not; a tie is broken by the id string)."""
    return "%s:%.6f" % (run_id, started)


def started(run_id: t.Optional[str]) -> t.Optional[float]:
    """When the run started (seconds since the epoch), or None for an id without a start time."""
    parts = (run_id or "").split(":")
    if len(parts) < 4 or not _STARTED.match(parts[-1]):
        return None
    return float(parts[-1])


def started_text(run_id: t.Optional[str]) -> str:
    s = started(run_id)
    return "start unknown" if s is None else "started %s" % time.strftime("%H:%M:%S", time.localtime(s))


def is_earlier(a: str, b: str) -> t.Optional[bool]:
    """Whether run `a` started before run `b` (ties broken by the id string, so two different runs are always
    ordered), or None when either id has no start time (an id of an older gpufleet)."""
    sa, sb = started(a), started(b)
    if sa is None or sb is None:
        return None
    return (sa, a) < (sb, b)
