#!/usr/bin/env python
# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run `ansible-test integration --local` on an installed copy of this checkout (the module targets in
tests/integration/targets), without Docker.

    .venv/bin/python tests/run_integration.py [--python 3.11] [--dir DIR] [targets / ansible-test options...]

The copy and the environment are tests/ansible_test_offline.py's. `--local`: the targets run against this machine
through the venv's own ansible-playbook; each target that needs fake GPUs depends on setup_fake_nvml, which puts
the collection's test-only fake pynvml (tests/fakes/nvml) on the modules' PYTHONPATH. Exit status is ansible-test's.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ansible_test_offline as offline  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    with offline.copy_for("integration", __doc__, argv, get_pip=False) as s:
        return offline.ansible_test(s, ["integration", "--local"],
                                    unset=("ANSIBLE_CONFIG", "FAKE_NVML_CONFIG", "PYTHONPATH"))


if __name__ == "__main__":
    sys.exit(main())
