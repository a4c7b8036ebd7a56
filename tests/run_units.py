#!/usr/bin/env python
# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run `ansible-test units` on an installed copy of this checkout, offline, without Docker.

    .venv/bin/python tests/run_units.py [--python 3.11] [--dir DIR] [ansible-test units options / test paths...]
    .venv-core-newest/bin/python tests/run_units.py      # the newest ansible-core (scripts/setup)

The copy, the get-pip stand-in and the environment are tests/ansible_test_offline.py's: the checkout is copied to
DIR/ansible_collections/gpufleet/serving and committed to a throw-away git repo, and
`ansible-test units --venv --python X` runs there. `--venv` rather than `--local`: ansible-test runs pytest
with `-n auto`, and its venv brings pytest-xdist and its other unit requirements; `.venv` need not.
In the copy, tests/unit/conftest.py imports the collection from the copy itself (collection_copy.installed_base).

Prints `UNITS: <passed> passed, <failed> failed, <errors> errors, <skipped> skipped` from ansible-test's junit
files and exits non-zero when ansible-test failed or no test ran (ansible-test exits 0 when it collects none).
"""
from __future__ import annotations

import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ansible_test_offline as offline  # noqa: E402


def junit_counts(junit_dir: Path) -> dict:
    counts = dict(tests=0, failures=0, errors=0, skipped=0)
    for f in sorted(junit_dir.glob("*-units.xml")):
        root = ET.parse(str(f)).getroot()
        for suite in root.iter("testsuite"):
            for k in counts:
                counts[k] += int(suite.get(k, 0))
    return counts


def main(argv: list[str] | None = None) -> int:
    with offline.copy_for("units", __doc__, argv, get_pip=True) as s:
        junit = s.dest / "tests" / "output" / "junit"
        shutil.rmtree(junit, ignore_errors=True)  # count this run's tests only
        rc = offline.ansible_test(s, ["units", "--venv"], unset=("FAKE_NVML_CONFIG", "PYTHONPATH"))
        c = junit_counts(junit)
        passed = c["tests"] - c["failures"] - c["errors"] - c["skipped"]
        print("UNITS: %d passed, %d failed, %d errors, %d skipped" % (passed, c["failures"], c["errors"], c["skipped"]),
              flush=True)
        if rc == 0 and passed == 0:
            print("ansible-test units ran no test: that is a failure", flush=True)
            return 3
        return rc


if __name__ == "__main__":
    sys.exit(main())
