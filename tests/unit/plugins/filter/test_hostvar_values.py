# SPDX-License-Identifier: GPL-3.0-or-later
"""hostvar_values: the rollout's check that its fleet minimum is the same on every host (batch_begin.yml)."""
from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.filter.hostvar_values import hostvar_values


def test_each_value_is_named_with_its_hosts_and_an_unset_host_has_the_default():
    hv = {"h1": {"m": 2}, "h2": {}, "h3": {"m": "2"}, "h4": {"m": "50%"}}
    assert hostvar_values(["h1", "h2", "h3", "h4"], hv, "m", 0) == ["2 on h1, h3", "0 on h2", "50% on h4"]
    assert hostvar_values(["h1", "h3"], hv, "m", 0) == ["2 on h1, h3"]  # one value: the same everywhere
    assert hostvar_values([], hv, "m", 0) == []
