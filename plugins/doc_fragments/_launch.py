# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This doc fragment is PRIVATE and should only be used by this collection.

from __future__ import annotations


class ModuleDocFragment(object):

    # What a launch needs, shared by server_launch and server_restart (argument spec: _server.launch_argspec). Its
    # command is each module's own: server_restart's systemd launcher takes it from the unit.
    DOCUMENTATION = r"""
options:
  name:
    description: Service name; the value of the launch tag.
    type: str
    required: true
  env:
    description:
      - Environment variables for the server (names must match C(^[A-Za-z_][A-Za-z0-9_]*$)).
      - The values are secret (C(no_log)), so an C(HF_TOKEN) or an API key belongs here. The output shows them
        masked and returns none of them. A value of 8 characters or more is also masked anywhere else in the output
        (a log tail the server printed it into); a shorter one is not, because ansible masks by substring and a
        value like V(1) would mask every number of the result.
    type: dict
    default: {}
  env_passthrough:
    description: Names copied from the module's own environment (for example C(CUDA_HOME)).
    type: list
    elements: str
    default: []
  user:
    description: User to run the server as.
    type: str
    default: root
  workdir:
    description: Working directory.
    type: path
    default: /
  log_path:
    description:
      - File the server's stdout and stderr are appended to.
      - A log file this module creates is mode 0644 (owned by O(user)), and a missing directory on its path 0755,
        whatever the umask of the connection. An existing file or directory keeps its mode.
    type: path
    required: true
  tag_name:
    description: Name of the launch tag variable.
    type: str
    default: GPUFLEET_SERVICE
  umask:
    version_added: 0.2.0
    description:
      - The server's umask, in octal (V(0022) or V(022)), set in the server process before it runs O(command);
        its workers inherit it.
      - The server never inherits the umask of whoever ran the rollout (C(umask 077) in root's shell would make
        every file the server and its workers create private), so one definition gives the same file modes
        wherever it is launched from. V(0022) is what a systemd service gets.
    type: str
    default: "0022"
"""
