# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Copy-on-write friendly garbage collection in ansible-playbook's forked workers (the rollout_summary callback's
O(fork_gc_freeze)).

ansible-core forks one worker per task and host from its main process, whose heap holds every loaded plugin, parsed
role and host variable. The worker's first cyclic collections walk every object it inherited and write the GC header
of each, so the kernel copies nearly every page of that heap into the worker, on every task of every host, and the
collector spends its time on objects the worker never frees. `gc.freeze()` in the child, right after the fork, moves
what it inherited to the permanent generation: its collections then look only at what the worker itself allocates.
Nothing it inherited is collected in the worker, which lives for one task and leaves with os._exit (no teardown).
The main process is not touched. Measured by bench/fork_gc.py (docs/benchmarks.md).

The standard library's os.register_at_fork is the whole mechanism: no ansible-core internals are patched. A handler
cannot be removed once registered, so it is registered at most once per process, whatever the number of callback
instances.
"""

from __future__ import annotations

import gc
import os

_installed = False


def install() -> bool:
    """Freeze the inherited heap in every child forked from now on; True when this call registered it."""
    global _installed  # pylint: disable=global-statement  # one registration per process, see the module's doc
    if _installed or not hasattr(os, "register_at_fork"):
        return False
    os.register_at_fork(after_in_child=gc.freeze)
    _installed = True
    return True


def installed() -> bool:
    return _installed
