# SPDX-License-Identifier: GPL-3.0-or-later
"""Run tests/foundation/playbooks/steps.yml (a list of module steps) and read every result back."""
from __future__ import annotations

import json
import typing as t
from pathlib import Path

from helpers import run_playbook

HERE = Path(__file__).resolve().parent
STEPS = HERE / "playbooks" / "steps.yml"


def play(tmp_path: Path, steps: t.List[t.Dict[str, t.Any]], env: t.Dict[str, str], check: bool = False,
         name: str = "run") -> t.List[t.Dict[str, t.Any]]:
    out = tmp_path / ("out-" + name)
    out.mkdir()
    for s in steps:
        s.setdefault("args", {})
    vars_file = tmp_path / ("vars-%s.json" % name)  # a file, so selectors never appear on a command line
    vars_file.write_text(json.dumps({"out": str(out), "steps": steps}))
    r = run_playbook(STEPS, "-e", "@%s" % vars_file, env=env, check=check)
    assert r.returncode == 0, r.stdout[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert len(results) == len(steps), r.stdout[-4000:]
    return results
