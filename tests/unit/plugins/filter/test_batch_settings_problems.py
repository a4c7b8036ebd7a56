# SPDX-License-Identifier: GPL-3.0-or-later
"""batch_settings_problems: the rollout and clean playbooks' batch settings, checked before any host is touched
(batch_begin.yml); the refusal's words are the filter's (the playbook runs are tests/reliability/test_rel_bad_input_batches.py
and tests/release/test_own_play_batches.py)."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.filter.batch_settings_problems import batch_settings_problems

OK = {"max_fail_percentage": 0, "serial": [1, "25%"], "fast_check": True, "min_in_service": []}
SERIAL = 'gpufleet_rollout_serial must be a batch size (a number of hosts >= 1 or a percentage such as "50%"), or a list of them'


@pytest.mark.parametrize("settings", [
    OK, dict(OK, max_fail_percentage="100"), dict(OK, max_fail_percentage=12.5), dict(OK, serial=3),
    dict(OK, serial="50%"), dict(OK, serial=["12.5%", 2]), dict(OK, fast_check="no"), dict(OK, fast_check=0),
    dict(OK, min_in_service=["1 on h1, h2"]), {}])
def test_usable_settings_have_no_problem(settings):
    assert batch_settings_problems(settings) == []


@pytest.mark.parametrize("change, problem", [
    ({"max_fail_percentage": "abc"}, "gpufleet_rollout_max_fail_percentage must be a number from 0 to 100 (got str abc)"),
    ({"max_fail_percentage": -5}, "gpufleet_rollout_max_fail_percentage must be a number from 0 to 100 (got int -5)"),
    ({"max_fail_percentage": 100.5}, "gpufleet_rollout_max_fail_percentage must be a number from 0 to 100 (got float 100.5)"),
    ({"max_fail_percentage": "x" * 60}, "gpufleet_rollout_max_fail_percentage must be a number from 0 to 100 (got str %s...)"
     % ("x" * 37)),
    ({"serial": []}, SERIAL + " (got [] (an empty list))"),
    ({"serial": None}, SERIAL + " (got None)"),
    ({"serial": [0, "50%"]}, SERIAL + " (got 0)"),
    ({"serial": ["0%", 2, "lots"]}, SERIAL + " (got 0%, lots)"),
    ({"serial": "abc"}, SERIAL + " (got abc)"),
    ({"fast_check": "maybe"}, "gpufleet_rollout_fast_check must be true or false (got maybe)"),
    ({"min_in_service": ["1 on h1", "0 on h2, h3"]},
     "gpufleet_rollout_min_in_service is the minimum of the whole fleet, so it must be the same on every host of the "
     "play (got 1 on h1; 0 on h2, h3): set it in extra vars or in the group_vars of the whole group; nothing was touched"),
])
def test_each_problem_in_the_refusals_words(change, problem):
    assert batch_settings_problems(dict(OK, **change)) == [problem]


def test_every_problem_is_named_in_order():
    got = batch_settings_problems({"max_fail_percentage": "abc", "serial": [], "fast_check": "maybe",
                                   "min_in_service": ["1 on h1", "2 on h2"]})
    assert [p.split(" ", 1)[0] for p in got] == ["gpufleet_rollout_max_fail_percentage", "gpufleet_rollout_serial",
                                                 "gpufleet_rollout_fast_check", "gpufleet_rollout_min_in_service"]


def test_an_unknown_setting_is_a_programming_error():
    with pytest.raises(TypeError):
        batch_settings_problems({"serail": 1})
