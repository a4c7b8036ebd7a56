#!/usr/bin/env python
# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run `ansible-test sanity` on this checkout, offline (no Docker, no ci-files.testing.ansible.com).

    .venv/bin/python tests/run_sanity.py [--python 3.11] [--dir DIR] [ansible-test sanity options...]
    .venv-core-newest/bin/python tests/run_sanity.py      # the newest ansible-core (scripts/setup)

The copy, the get-pip stand-in and the environment are tests/ansible_test_offline.py's: `ansible-test sanity --venv
--python X` runs in DIR/ansible_collections/gpufleet/serving (requirements come from PyPI into cached venvs under
~/.ansible/test/venv). Exit status is ansible-test's.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ansible_test_offline as offline  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    with offline.copy_for("sanity", __doc__, argv, get_pip=True) as s:
        return offline.ansible_test(s, ["sanity", "--venv"])


if __name__ == "__main__":
    sys.exit(main())
