# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This doc fragment is PRIVATE and should only be used by this collection.

from __future__ import annotations


class ModuleDocFragment(object):

    # The host-wide NCCL layers shared by two services (sitecustomize_env, nccl_conf; module_utils/_layershare.py).
    DOCUMENTATION = r"""
options:
  service_tag:
    version_added: 0.2.0
    description:
      - The launch tag (C(NAME=VALUE), for example C(GPUFLEET_SERVICE=sglang)) of the service this tuning is for. The
        file is host-wide, so every service on the host starts with its values.
      - When set, a change of the block's values (a variable set, changed or removed) is refused, before anything is
        written and in check mode too, while a process of another gpufleet service runs on the host. Another
        service's process is told apart as the kill tells it, whatever the tag names - its environment has the same
        C(NAME) with another value, its C(GPUFLEET_LAUNCH_TAG) (which every gpufleet launch carries) names another
        service, or, for a C(NAME) other than C(GPUFLEET_SERVICE), it carries C(GPUFLEET_SERVICE) with another value.
        The message names that service, its oldest pid and the variables that would change, never their values. A
        change that leaves the values as they are is made.
      - Unset or empty, nothing is checked (the module does not know which service it tunes).
      - The role C(gpufleet.serving.nccl_tuning) sets it from C(gpufleet_server_name) when that is set.
    type: str
  service_locks:
    version_added: 0.2.0
    description:
      - With O(service_tag), the directory of the services' host locks (C(<name>.lock), the gpu_server role's
        C(gpufleet_server_run_dir)). A change of the block's values is refused too while another service's lock there
        is held by a run and not past its expiry, naming the service and the run, since that run may be between its
        kill and its launch (no process of the service to see), and it launches onto the values it was checked against.
    type: path
"""
