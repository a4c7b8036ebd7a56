#!/usr/bin/env python
# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run `ansible-test units` on an installed copy of this checkout, offline, without Docker.

    .venv/bin/python tests/run_units.py [--python 3.11] [--dir DIR] [ansible-test units options / test paths...]
    .venv-core-newest/bin/python tests/run_units.py      # the newest ansible-core (scripts/setup)

Like tests/run_sanity.py (whose copy and pip bootstrap it reuses): the checkout is copied to
DIR/ansible_collections/gpufleet/serving and committed to a throw-away git repo, and
`ansible-test units --venv --python X` runs there. `--venv` rather than `--local`: ansible-test runs pytest
with `-n auto`, and its venv brings pytest-xdist and its other unit requirements; `.venv` need not.
In the copy, tests/unit/conftest.py imports the collection from the copy itself (collection_copy.installed_base).

Prints `UNITS: <passed> passed, <failed> failed, <errors> errors, <skipped> skipped` from ansible-test's junit
files and exits non-zero when ansible-test failed or no test ran (ansible-test exits 0 when it collects none).
"""
from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_sanity import BIN, copy_collection, core_version, ensure_get_pip_stand_in  # noqa: E402


def junit_counts(junit_dir: Path) -> dict:
    counts = dict(tests=0, failures=0, errors=0, skipped=0)
    for f in sorted(junit_dir.glob("*-units.xml")):
        root = ET.parse(str(f)).getroot()
        for suite in root.iter("testsuite"):
            for k in counts:
                counts[k] += int(suite.get(k, 0))
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default="%d.%d" % sys.version_info[:2])
    ap.add_argument("--dir", default=str(Path.home() / ".cache" / ("gpufleet-units-%s" % core_version())),
                    help="where the copy (and ansible-test's cached delegation venv) lives; reused between runs")
    a, rest = ap.parse_known_args(argv)
    ensure_get_pip_stand_in()
    base = Path(a.dir)
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one run at a time per copy
        dest = copy_collection(base)
        junit = dest / "tests" / "output" / "junit"
        shutil.rmtree(junit, ignore_errors=True)  # count this run's tests only
        env = dict(os.environ)
        env["PATH"] = str(BIN) + os.pathsep + env.get("PATH", "")
        for k in ("ANSIBLE_COLLECTIONS_PATH", "FAKE_NVML_CONFIG", "PYTHONPATH"):
            env.pop(k, None)
        cmd = [str(BIN / "ansible-test"), "units", "--venv", "--python", a.python, "--color", "no"] + rest
        print("+ (cd %s && %s)" % (dest, " ".join(cmd)), flush=True)
        rc = subprocess.call(cmd, cwd=str(dest), env=env)
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
