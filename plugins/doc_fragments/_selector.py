# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This doc fragment is PRIVATE and should only be used by this collection.

from __future__ import annotations


class ModuleDocFragment(object):

    # The process selection shared by process_kill and process_env (argument spec: _killmod.selector_argspec).
    DOCUMENTATION = r"""
options:
  tag:
    description: Select processes whose C(/proc/PID/environ) holds this C(NAME=VALUE) pair.
    type: str
  pidfile:
    description:
      - Select the process named by this pidfile.
      - A pidfile written by gpufleet holds C(PID START_TIME) and must match exactly; a foreign pidfile's pid
        must have started before the file was written (and match O(pidfile_cmdline_regex) if given), so a
        stale pidfile whose pid now belongs to another process selects nothing.
    type: path
  pidfile_cmdline_regex:
    description: Regex the pidfile's process command line must match.
    type: str
  pids:
    description: Select these pids.
    type: list
    elements: int
    default: []
  cmdline_regex:
    description: Select processes whose command line (arguments joined by spaces) matches this Python regex.
    type: str
  user:
    description: Select every process of this user (name or uid).
    type: str
  gpu_holders:
    description:
      - Select the processes holding these GPU indices (NVML compute and graphics processes).
      - This is C(fuser -k /dev/nvidia*) made safe; O(exclude_regex) and the protected set still apply.
    type: list
    elements: int
    default: []
  include_descendants:
    description: Also select every descendant of a selected process.
    type: bool
    default: true
  include_groups:
    description: Also select the members of the sessions and process groups that a selected process leads.
    type: bool
    default: true
  exclude_regex:
    description:
      - Never select processes whose command line matches one of these regexes.
      - The default excludes nvidia-persistenced, nv-hostengine, DCGM, GPU exporters and nvidia-fabricmanager.
    type: list
    elements: str
"""
