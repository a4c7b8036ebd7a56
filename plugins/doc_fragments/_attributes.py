# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This doc fragment is PRIVATE and should only be used by this collection.

from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in C(check_mode) and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in C(check_mode)), when in diff mode.
  idempotent:
    description:
      - When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
      - This assumes that the system controlled/queried by the module has not changed in a relevant way.
"""

    INFO_MODULE = r"""
options: {}
attributes:
  check_mode:
    support: full
    details:
      - This action does not modify state.
  diff_mode:
    support: N/A
    details:
      - This action does not modify state.
  idempotent:
    support: full
"""

    NVML = r"""
options:
  backend:
    description:
      - Which GPU backend to use.
      - V(auto) uses NVML through C(pynvml) (PyPI C(nvidia-ml-py)) and falls back to parsing
        C(nvidia-smi) CSV output when C(pynvml) or the driver library is missing.
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
requirements:
  - nvidia-ml-py (imported as C(pynvml)) on the target, or C(nvidia-smi) on the target's PATH.
"""
