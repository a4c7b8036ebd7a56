# SPDX-License-Identifier: GPL-3.0-or-later
"""The rollout_summary callback's fork_gc_freeze (plugin_utils/_forkgc.py): a real fork in a fresh interpreter, whose
child reports what its garbage collector left frozen. The play through ansible-playbook is in
tests/foundation/test_fork_gc.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = r"""
import gc, json, os, sys
%s
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _forkgc
calls = [_forkgc.install() for _ in range(int(sys.argv[1]))]
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
print(json.dumps(dict(child, parent=gc.get_freeze_count(), calls=calls, installed=_forkgc.installed())))
"""


def _run(installs: int):
    # The collection as the tests import it (ansible-test units' layout or the checkout's collections/ copy).
    import ansible_collections.gpufleet.serving as pkg
    base = Path(pkg.__file__).resolve().parents[3] if pkg.__file__ else Path(list(pkg.__path__)[0]).parents[2]
    code = CHILD % ("sys.path.insert(0, %r)" % str(base))
    out = subprocess.run([sys.executable, "-c", code, str(installs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, check=True, env=dict(os.environ, PYTHONPATH=""))
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
