# SPDX-License-Identifier: GPL-3.0-or-later
"""The rollout_summary callback's fork_gc_freeze: a real fork in a fresh interpreter, whose child reports what its
garbage collector left frozen. The callback file is loaded by path, without the collection loader, as tools/gpufleet_ci
loads it. The play through ansible-playbook is in tests/foundation/test_fork_gc.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = r"""
import gc, importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("rollout_summary_by_path", sys.argv[2])
cb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cb)
calls = [cb.install_fork_gc_freeze() for _ in range(int(sys.argv[1]))]
junk = [[i] for i in range(5000)]  # objects the child inherits
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    os.write(w, json.dumps({"child": gc.get_freeze_count()}).encode())
    os._exit(0)
os.close(w)
child = json.loads(os.read(r, 4096))
os.waitpid(pid, 0)
print(json.dumps(dict(child, parent=gc.get_freeze_count(), calls=calls, installed=cb._FORK_GC_FREEZE["installed"])))
"""


def _run(installs: int):
    # The callback file of the collection the tests import (ansible-test units' copy or the checkout's collections/).
    import ansible_collections.gpufleet.serving.plugins.callback.rollout_summary as cb
    out = subprocess.run([sys.executable, "-c", CHILD, str(installs), str(Path(cb.__file__))], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))  # ansible importable
    return json.loads(out.stdout)


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="needs os.register_at_fork (POSIX)")
def test_install_freezes_what_a_forked_child_inherits_and_leaves_the_parent_alone():
    got = _run(1)
    assert got["calls"] == [True] and got["installed"] is True, got
    assert got["child"] > 5000, got  # everything the child inherited, the 5000 lists included
    assert got["parent"] == 0, got  # the main process collects as before


def test_without_install_a_child_collects_everything_and_install_registers_once():
    assert _run(0)["child"] == 0
    got = _run(3)
    assert got["calls"] == [True, False, False] and got["child"] > 5000, got
