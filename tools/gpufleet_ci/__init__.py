# SPDX-License-Identifier: GPL-3.0-or-later
"""CI entry for gpufleet rollouts through ansible-runner (see docs/ci.md)."""
