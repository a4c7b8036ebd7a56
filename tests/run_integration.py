#!/usr/bin/env python
# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run `ansible-test integration --local` on an installed copy of this checkout (the module targets in
tests/integration/targets), without Docker.

    .venv/bin/python tests/run_integration.py [--python 3.11] [--dir DIR] [targets / ansible-test options...]

The copy and its throw-away git repo are tests/run_sanity.py's. `--local`: the targets run against this machine
through the venv's own ansible-playbook; each target that needs fake GPUs depends on setup_fake_nvml, which puts
the collection's test-only fake pynvml (tests/fakes/nvml) on the modules' PYTHONPATH. Exit status is ansible-test's.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_sanity import BIN, copy_collection, core_version  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default="%d.%d" % sys.version_info[:2])
    ap.add_argument("--dir", default=str(Path.home() / ".cache" / ("gpufleet-integration-%s" % core_version())),
                    help="where the copy lives; reused between runs")
    a, rest = ap.parse_known_args(argv)
    base = Path(a.dir)
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one run at a time per copy
        dest = copy_collection(base)
        env = dict(os.environ)
        env["PATH"] = str(BIN) + os.pathsep + env.get("PATH", "")
        for k in ("ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_CONFIG", "FAKE_NVML_CONFIG", "PYTHONPATH"):
            env.pop(k, None)
        cmd = [str(BIN / "ansible-test"), "integration", "--local", "--python", a.python, "--color", "no"] + rest
        print("+ (cd %s && %s)" % (dest, " ".join(cmd)), flush=True)
        return subprocess.call(cmd, cwd=str(dest), env=env)


if __name__ == "__main__":
    sys.exit(main())
