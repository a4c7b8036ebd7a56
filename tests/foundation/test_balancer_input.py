# SPDX-License-Identifier: GPL-3.0-or-later
"""Bad load balancer input (issue 17) fails with every broken rule named, before anything is touched: the role's
preflight (its argument spec's nested options) and the rollout's capacity guard (capacity.yml), run on localhost."""
from __future__ import annotations

import os

from collection_copy import private_collections
from helpers import ROOT, run_playbook

PLAY = """- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: gpufleet.serving.gpu_server
        tasks_from: %s
"""


def _run(tmp_path, entry, extra):
    pb = tmp_path / ("%s.yml" % entry)
    pb.write_text(PLAY % entry)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH="%s:%s" % (private_collections(), ROOT / "collections"))
    return run_playbook(str(pb), env=env, extra_vars=extra, timeout=120)


GOOD = {"gpufleet_server_name": "demo", "gpufleet_server_command": ["python3", "-m", "x"],
        "gpufleet_server_health_url": "http://127.0.0.1:30000/health"}


def test_every_broken_balancer_rule_is_named(tmp_path):
    # The role's argument spec (nested options) checks each entry's keys, types and what its type requires; the
    # balancer module checks the rest (http(s) URLs, unique names: tests/unit/plugins/modules/test_balancer.py).
    r = _run(tmp_path, "preflight", dict(GOOD, gpufleet_server_drain_on_timeout="wait", gpufleet_server_balancers=[
        {"type": "haproxy"}, {"type": "sglang_router", "url": "http://router:30000"}, {"type": "http", "remove": {"url": "http://x/a"}},
        {"type": "nginx"}, "text", {"type": "none"}, {"type": "haproxy", "delegate_to": "lb1", "name": "a", "sokcet": "/x"},
        {"type": "http", "name": "b", "remove": {"url": "http://x"}, "add": {"url": "http://x"}}]))
    assert r.returncode != 0
    out = " ".join(r.stdout.split())
    for msg in ("type is haproxy but all of the following are missing: delegate_to found in gpufleet_server_balancers",
                "type is http but all of the following are missing: add found in gpufleet_server_balancers",
                "value of type must be one of: haproxy, sglang_router, http, none, got: nginx found in "
                "gpufleet_server_balancers",
                "Elements value for option 'gpufleet_server_balancers' is of type str and we were unable to convert to dict",
                "sokcet", "value of gpufleet_server_drain_on_timeout must be one of: fail, proceed, got: wait"):
        assert msg in out, (msg, r.stdout[-3000:])
    assert "sglang_router but" not in out


def test_good_balancers_pass(tmp_path):
    r = _run(tmp_path, "preflight", dict(GOOD, gpufleet_server_drain_on_timeout="fail", gpufleet_server_balancers=[
        {"type": "haproxy", "delegate_to": "lb1"}, {"type": "sglang_router", "url": "http://router:30000"},
        {"type": "http", "remove": {"url": "http://x/a", "headers": {"A": "b"}, "status_code": [200]},
         "add": {"url": "http://x/b", "body": {"port": 1}}}, {"type": "none"}]))
    assert r.returncode == 0, r.stdout[-3000:]


def test_capacity_guard_names_a_bad_setting(tmp_path):
    r = _run(tmp_path, "capacity", {"gpufleet_rollout_min_in_service": "lots",
                                    "gpufleet_server_balancers": [{"type": "haproxy", "delegate_to": "lb1"}]})
    assert r.returncode != 0
    assert ('gpufleet_rollout_min_in_service must be a number of servers (>= 0) or a percentage such as "75%" (got lots)'
            in " ".join(r.stdout.split())), r.stdout[-3000:]


def test_capacity_guard_lets_a_batch_that_fits_through(tmp_path):
    # One host with balancers, already up to date: the batch drains nobody, so no balancer is read (lb1 has none here).
    r = _run(tmp_path, "capacity", {"gpufleet_rollout_min_in_service": 1, "_gpufleet_capacity_up_to_date": ["localhost"],
                                    "gpufleet_server_balancers": [{"type": "haproxy", "delegate_to": "lb1"}]})
    assert r.returncode == 0, r.stdout[-3000:]
    r = _run(tmp_path, "capacity", {"gpufleet_rollout_min_in_service": "100%", "_gpufleet_capacity_up_to_date": [],
                                    "gpufleet_server_balancers": [{"type": "haproxy", "delegate_to": "lb1"}]})
    # A batch that drains must read the balancers: lb1 has no HAProxy socket here, so the guard refuses to count.
    assert r.returncode != 0
    out = " ".join(r.stdout.split())
    assert ("gpufleet_rollout_min_in_service: could not read HAProxy /var/run/haproxy.sock on lb1 (cannot reach the "
            "HAProxy admin socket /var/run/haproxy.sock: [Errno 2] No such file or directory) to count the servers in "
            "rotation; nothing was touched" in out), r.stdout[-3000:]
    assert "Traceback" not in out


def test_the_rollout_check_action_outside_the_gpu_server_role_is_refused_by_name(tmp_path):
    # It reads the role's variables as the role's tasks see them: a play of the user's calling it bare gets a clear
    # refusal, not a traceback (the role's own task is tested through the rollout: tests/rollout/test_rollout_check.py).
    pb = tmp_path / "bare.yml"
    pb.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n    - gpufleet.serving.rollout_check:\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH="%s:%s" % (private_collections(), ROOT / "collections"))
    r = run_playbook(str(pb), env=env, extra_vars=GOOD, timeout=120)
    assert r.returncode == 2, r.stdout[-3000:]
    assert "gpufleet.serving.rollout_check runs only as the gpu_server role's task" in r.stdout, r.stdout[-3000:]
    assert "Traceback" not in r.stdout
