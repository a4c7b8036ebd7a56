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
    description:
      - Select processes whose C(/proc/PID/environ) holds this C(NAME=VALUE) pair.
      - It also names the service the selection is for. A process whose environment holds the same C(NAME) with
        another value (another gpufleet service's launch tag, for example a second service on the host) is never
        selected, whatever else matches it (O(pidfile), O(pids), O(cmdline_regex), O(user), O(gpu_holders), a session,
        group or tree); it is listed under RV(excluded) with the service it belongs to.
    type: str
  pidfile:
    description:
      - Select the process named by this pidfile, only when it is confirmed to be the server. A pidfile alone never
        selects a process, because a pid is reused and a pidfile can be rewritten by hand.
      - Confirmed means the process carries O(tag) (every server gpufleet launches carries its launch tag), or its
        command line matches O(pidfile_cmdline_regex) or O(cmdline_regex). A process of the same service (the tag's
        C(VALUE)) launched under another tag name, before it changed, confirms it too - its C(GPUFLEET_LAUNCH_TAG) names
        C(VALUE), or (for a C(NAME) other than C(GPUFLEET_SERVICE)) it carries C(GPUFLEET_SERVICE=VALUE).
      - The start time a pidfile records (C(PID START_TIME), as gpufleet writes it) is a staleness check only; a start
        time that differs, or a pidfile holding only a pid whose process started after the file was written, is
        stale. A matching start time never confirms on its own (anyone can write a process's pid and real start
        time). A live process that nothing confirms is unconfirmed. Either way it is left alone and reported in
        RV(pidfile) and RV(notes).
    type: path
  pidfile_cmdline_regex:
    description:
      - Regex the pidfile's process command line must match; a match confirms a pidfile that holds only a pid.
      - When set, a process that does not match is never selected through the pidfile, even when it carries O(tag).
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
