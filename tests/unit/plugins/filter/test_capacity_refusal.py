# SPDX-License-Identifier: GPL-3.0-or-later
"""capacity_refusal: the rollout's capacity guard (gpufleet_rollout_min_in_service) for one batch, from the balancers'
capacity reads (the guard against a real HAProxy and smg is tests/rollout/test_drain.py's)."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.filter.capacity_refusal import capacity_refusal, minimum

FLEET = ["h1", "h2", "h3"]
A, B = "HAProxy /s backend a", "HAProxy /s backend b"


def read(in_a=None, in_b=None, members=None):
    """One delegate's read: every host has a server in backends a and b; `in_*` those in rotation there (all unless
    given)."""
    in_a, in_b, members = (FLEET if x is None else x for x in (in_a, in_b, members))
    out = sorted(h for h in members if h not in in_a or h not in in_b)
    return {"out_hosts": out, "unread": [],
            "pools": {A: {"members": list(members), "in": list(in_a)}, B: {"members": list(members), "in": list(in_b)}}}


def guard(r, batch, minimum_in_service, drained=None, left_out=()):
    return capacity_refusal({"reads": [r], "fleet": FLEET, "batch": batch, "drained": list(batch if drained is None else drained),
                             "left_out": list(left_out), "min_in_service": minimum_in_service})


def test_a_batch_that_leaves_enough_goes_on():
    assert guard(read(), ["h1"], 2) == ""
    assert guard(read(), ["h1"], "66%") == ""
    assert guard(read(), ["h1", "h2"], 0) == ""


def test_a_batch_that_leaves_too_few_is_refused_naming_the_hosts_out():
    said = guard(read(in_a=["h1", "h2"], in_b=["h1", "h2"]), ["h1"], 2)
    assert said == ("gpufleet_rollout_min_in_service: draining h1 would leave 1 of 3 server(s) in rotation (h3 already "
                    "out), fewer than 2; nothing was touched: no batch can pass, as even a batch of one host would leave "
                    "fewer: lower gpufleet_rollout_min_in_service or put servers back into rotation")
    assert "use smaller batches" in guard(read(), ["h1", "h2"], 2)


def test_a_host_out_of_one_backend_only_is_still_drained_out_of_the_other():
    """helper-47 (High): h2 and h3 in an operator's MAINT in both backends, h1 in MAINT in backend b only. h1 counted as
    out already, so its drain 'changed nothing', and it was the last server of backend a: every request failed."""
    r = read(in_a=["h1"], in_b=[])
    said = guard(r, ["h1"], 1)
    assert said.startswith("gpufleet_rollout_min_in_service: draining h1 would leave 0 of 3 server(s) in rotation (h2, "
                           "h3 already out) (h1 out of some of its balancers and still in others), fewer than 1"), said
    # A host out of every balancer it has cannot lower the capacity: its batch goes on (it is put back, not drained).
    assert guard(read(in_a=[], in_b=[]), ["h1"], 1) == ""


def test_no_backend_is_left_without_a_server_whatever_the_fleets_count():
    # Backend a: only h1 in rotation (h2, h3 out there); backend b: all three. The fleet count after draining h1 is 0 of 3
    # in service anyway; with h2 and h3 in a only out there, count 1: the fleet would pass, backend a would not.
    r = read(in_a=["h1"], in_b=FLEET)
    said = guard(r, ["h1"], 1, left_out=())
    assert "would leave" in said
    r = {"out_hosts": [], "unread": [],
         "pools": {A: {"members": ["h1"], "in": ["h1"]}, B: {"members": FLEET, "in": FLEET}}}
    said = guard(r, ["h1"], 1)
    assert said == ("gpufleet_rollout_min_in_service: draining h1 would leave no server in rotation in HAProxy /s backend "
                    "a (it has no other server); nothing was touched: put a server of it back into rotation first, or "
                    "set gpufleet_rollout_min_in_service to 0 to drain it anyway")
    assert guard(r, ["h1"], 0) == ""  # no minimum: the drain goes on (the balancer module warns of the last server)
    assert guard(r, ["h2"], 1) == ""


def test_failed_and_stopped_hosts_are_out_whatever_the_balancers_say():
    said = guard(read(), ["h1"], 2, left_out=["h3"])
    assert "would leave 1 of 3 server(s) in rotation (h3 already out)" in said


def test_a_batch_found_up_to_date_drains_nobody():
    assert guard(read(in_a=["h1"], in_b=["h1"]), ["h1"], 1, drained=[]) == ""


@pytest.mark.parametrize("raw, n", [(0, 0), ("2", 2), ("50%", 2), ("100%", 3), ("33.4%", 2)])
def test_the_minimum_is_servers_or_a_share_of_the_fleet_rounded_up(raw, n):
    assert minimum(raw, 3) == n


@pytest.mark.parametrize("raw", ["-1", "lots", "101%", "1.5"])
def test_a_minimum_that_is_neither_is_refused(raw):
    said = capacity_refusal({"reads": [], "fleet": FLEET, "batch": ["h1"], "drained": ["h1"], "left_out": [],
                             "min_in_service": raw})
    assert said.startswith("gpufleet_rollout_min_in_service must be a number of servers (>= 0) or a percentage"), said


def test_an_unread_balancer_is_named():
    r = dict(read(), unread=["HAProxy /s on localhost (no such file)"])
    assert guard(r, ["h1"], 1) == ("gpufleet_rollout_min_in_service: could not read HAProxy /s on localhost (no such "
                                   "file) to count the servers in rotation; nothing was touched")
