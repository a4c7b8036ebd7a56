# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark-only callback: task executions per host (issue 25's contract), written as JSON to $GPUFLEET_TASK_COUNTS
when the playbook ends.

A task execution is one task run on one host: one worker fork and one result, whatever the result (ok, changed,
failed, skipped, unreachable). A loop is one execution per host (its items are not counted); a run_once task counts
for the host it ran on. This is what the controller pays per host (docs/scale.md: linear in task executions).
"""
from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: task_counts
type: aggregate
short_description: Task executions per host as JSON (benchmark-only)
description: Writes the task executions of each host (and their task names and statuses) as JSON to GPUFLEET_TASK_COUNTS.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_counts"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.hosts: dict = {}

    def _count(self, result, status: str) -> None:
        self.hosts.setdefault(result._host.get_name(), []).append([result._task.get_name(), status])

    def v2_runner_on_ok(self, result, **kw):
        self._count(result, "changed" if result._result.get("changed") else "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False, **kw):
        self._count(result, "failed")

    def v2_runner_on_skipped(self, result, **kw):
        self._count(result, "skipped")

    def v2_runner_on_unreachable(self, result, **kw):
        self._count(result, "unreachable")

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("GPUFLEET_TASK_COUNTS")
        if not path:
            return
        out = {"hosts": {h: {"executions": len(rows), "tasks": rows} for h, rows in sorted(self.hosts.items())}}
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
