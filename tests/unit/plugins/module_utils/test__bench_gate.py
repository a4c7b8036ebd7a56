# SPDX-License-Identifier: GPL-3.0-or-later
"""The restart's performance gate: which recorded measurement is a baseline, and the record keeping it."""
from __future__ import annotations

import json

from ansible_collections.gpufleet.serving.plugins.module_utils import _bench, _statefile


def gate(**kw):
    g = {"request": {"url": "http://127.0.0.1:30000/generate", "method": "POST", "body": {"text": "x"},
                     "headers": {"Authorization": "Bearer a"}, "validate_certs": True},
         "api": "auto", "metric": "output_tokens_per_s", "warmup": 2, "requests": 16, "concurrency": 4, "rounds": 3,
         "timeout": 120.0, "min_ratio": 0.9}
    g.update(kw)
    return g


def test_a_baseline_is_the_recorded_median_of_the_same_benchmark_only():
    g = gate()
    rec = {"key": _bench.gate_key(g), "median": 120.5}
    assert _bench.gate_baseline(rec, g) == 120.5
    # Secret headers, the number of rounds, the timeout and the ratio do not change what is measured.
    assert _bench.gate_baseline(rec, gate(request=dict(g["request"], headers={"Authorization": "Bearer b"}),
                                          rounds=5, timeout=10.0, min_ratio=0.5)) == 120.5
    for other in (gate(metric="requests_per_s"), gate(concurrency=8), gate(requests=4), gate(warmup=0),
                  gate(request=dict(g["request"], body={"text": "y"})),
                  gate(request=dict(g["request"], url="http://127.0.0.1:30000/v1/completions"))):
        assert _bench.gate_baseline(rec, other) is None, other
    for bad in (None, {}, {"key": rec["key"]}, {"key": rec["key"], "median": 0}, {"key": rec["key"], "median": "9"}):
        assert _bench.gate_baseline(bad, g) is None, bad


def test_the_record_keeps_the_last_known_good_until_a_new_gate_passes(tmp_path):
    state, pidfile = tmp_path / "demo.json", tmp_path / "demo.pid"
    pidfile.write_text("1 1\n")
    measured = {"key": "k1", "metric": "output_tokens_per_s", "median": 90.0}
    _statefile.record_state(str(state), "demo", "f1", str(pidfile), {}, gate=measured)
    assert json.loads(state.read_text())["gate"] == dict(measured, fingerprint="f1")
    _statefile.mark_unverified(str(state))  # a launch that then fails its gate leaves this mark and the measurement
    assert json.loads(state.read_text())["gate"]["median"] == 90.0
    _statefile.record_state(str(state), "demo", "f2", str(pidfile), {})  # a restart without the gate
    assert json.loads(state.read_text())["gate"] == dict(measured, fingerprint="f1")
    _statefile.record_state(str(state), "demo", "f3", str(pidfile), {}, gate=dict(measured, median=95.0))
    assert json.loads(state.read_text())["gate"]["median"] == 95.0


def test_server_restart_refuses_a_bad_gate_before_anything_is_read_or_killed(run_module, tmp_path):
    from ansible_collections.gpufleet.serving.plugins.modules import server_restart

    base = {"name": "ut-gate", "command": ["/bin/true"], "pidfile": str(tmp_path / "p.pid"),
            "log_path": str(tmp_path / "s.log"), "wait_ready": {"health_url": "http://127.0.0.1:9/health"}}
    r = run_module(server_restart.main, dict(base, gate=gate(concurrency=0)))
    assert r["failed"] and r["msg"].startswith("gate: ") and "concurrency" in r["msg"], r
    r = run_module(server_restart.main, dict(base, gate=dict(gate(), request={"url": "ftp://x/y"})))
    assert r["failed"] and r["msg"].startswith("gate: "), r
    r = run_module(server_restart.main, dict(base, stop_only=True, gate=gate()))
    assert r["failed"] and r["msg"] == "gate: a stop (stop_only) starts no server to measure", r
    assert not (tmp_path / "p.pid").exists() and not (tmp_path / "s.log").exists()
