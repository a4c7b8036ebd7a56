# SPDX-License-Identifier: GPL-3.0-or-later
"""A private, per-pytest-process copy of the collection.

Several sessions share this checkout and each pytest run re-copies collections/ansible_collections/
gpufleet/serving (tests/conftest.py); a playbook or import that lands in the middle of someone else's
copy sees a half-written collection. Our tests import from, and point ANSIBLE_COLLECTIONS_PATH at,
a copy nobody else touches.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_base: Path | None = None


def private_collections() -> Path:
    """Directory holding ansible_collections/gpufleet/serving (copied once per process)."""
    global _base
    if _base is None:
        base = Path(tempfile.mkdtemp(prefix="gpufleet-coll-%d-" % os.getpid()))
        atexit.register(shutil.rmtree, str(base), True)
        subprocess.run([sys.executable, str(ROOT / "scripts" / "install-collection"), str(base)], check=True,
                       stdout=subprocess.DEVNULL)
        _base = base
    return _base


def installed_base() -> Path | None:
    """The directory holding ansible_collections/ when this tree already is an installed copy (how
    `ansible-test units` runs it: from DIR/ansible_collections/gpufleet/serving), else None."""
    if ROOT.parts[-3:] == ("ansible_collections", "gpufleet", "serving"):
        return ROOT.parents[2]
    return None


def use_private_collections() -> Path:
    # An installed copy imports itself: ansible-test's own collection loader already serves it, and its
    # build_ignore'd scripts/ (install-collection) is not there to make another copy from.
    base = installed_base() or private_collections()
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    os.environ["ANSIBLE_COLLECTIONS_PATH"] = str(base)
    return base
