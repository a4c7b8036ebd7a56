# SPDX-License-Identifier: GPL-3.0-or-later
"""Test-only callback for tests/gpu/e2e.py: wall time of each task (controller clock, first start to last result),
written as JSON to $GPUFLEET_TASK_TIMES when the playbook ends."""
from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: task_times
type: aggregate
short_description: Per-task wall times as JSON (test-only)
description: Writes [{task, start_s, duration_s}] to the file named by GPUFLEET_TASK_TIMES.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.t0 = time.monotonic()
        self.tasks = {}

    def v2_playbook_on_task_start(self, task, is_conditional):
        self.tasks.setdefault(task._uuid, {"task": task.get_name(), "start_s": time.monotonic() - self.t0, "end_s": None})

    def _done(self, result, *a, **kw):
        t = self.tasks.get(result._task._uuid)
        if t is not None:
            t["end_s"] = time.monotonic() - self.t0

    v2_runner_on_ok = v2_runner_on_failed = v2_runner_on_skipped = v2_runner_on_unreachable = _done

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("GPUFLEET_TASK_TIMES")
        if not path:
            return
        rows = [{"task": t["task"], "start_s": round(t["start_s"], 3),
                 "duration_s": round(t["end_s"] - t["start_s"], 3) if t["end_s"] is not None else None}
                for t in self.tasks.values()]
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
