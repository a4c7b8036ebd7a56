# SPDX-License-Identifier: GPL-3.0-or-later
"""bench/fleet_rollout.py's arithmetic: medians with their range, ratios of medians of one size, the per-host fit."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("gpufleet_bench_fleet_rollout", ROOT / "bench" / "fleet_rollout.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _runs(walls, cpus, main=0.1, ssh=0.05):
    return [{"wall_s": w, "cpu_s": c, "ssh_cpu_s": ssh, "main_cpu_s": main} for w, c in zip(walls, cpus)]


def _size(n, restart_cpu_per_host, noop_cpu_per_host):
    # Fixed cost 1 s plus the per-host cost; wall = 2 × CPU; the seed takes 3.5 s per host and no CPU to speak of.
    r = {"hosts": n, "light_server": n >= 16, "load_before": 1.0, "load_after": 2.0,
         "noop_full_roles": [], "noop_ansible_defaults": []}
    for kind, per in (("restart", restart_cpu_per_host), ("noop", noop_cpu_per_host), ("ping", 0.25), ("seed", 0.1)):
        cpus = [1 + per * n * f for f in (0.9, 1.0, 1.2)]  # median is the middle one
        walls = [3.5 * n] * 3 if kind == "seed" else [2 * c for c in cpus]
        r[kind] = _runs(walls, cpus)
    return r


def test_fit_recovers_fixed_and_per_host_cost():
    b = _bench()
    f = b.fit([(n, 1.5 + 0.25 * n) for n in (2, 4, 8, 16, 32)])
    assert f == {"fixed_s": 1.5, "per_host_s": 0.25}
    assert b.fit([(8, 1.0)]) is None


def test_median_and_range():
    b = _bench()
    assert b.stat(_runs([3, 1, 2], [6, 2, 4]), "cpu_s", per=2) == (2, 1, 3)
    assert b.med([1, 2, 3, 4]) == 2.5


def test_tables_give_the_ratios_of_medians_of_each_size():
    b = _bench()
    out = b.tables([_size(8, 2.0, 1.0), _size(32, 2.0, 1.0)])
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| 8 ") or line.startswith("| 32 ")}
    # 8 hosts: restart wall = 2 × (1 + 16) = 34 s, seed 28 s → 0.82×; no-op 2 × 9 = 18 s, ping 2 × 3 = 6 s → 3.00×.
    first = [line for line in out.splitlines() if line.startswith("| 8 |")][0]
    assert "**0.82×**" in first and "**3.00×**" in first and "2 workers" in first, first
    assert "1 worker" in [line for line in out.splitlines() if line.startswith("| 32 |")][0]
    # CPU per host: no-op (1 + 8) / 8 = 1.125, ping (1 + 2) / 8 = 0.375 → 3.00×.
    cpu = [line for line in out.splitlines() if line.startswith("| 8 |")][1]
    assert "1.125 (1.025–1.325)" in cpu and "0.375" in cpu and "**3.00×**" in cpu, cpu
    assert rows
    fits = b.results_fits[0]
    assert fits["noop"]["cpu"] == {"fixed_s": 1.0, "per_host_s": 1.0}
    assert fits["restart"]["cpu"]["per_host_s"] == 2.0


def test_one_size_says_there_is_no_fit_instead_of_an_empty_table():
    out = _bench().tables([_size(2, 2.0, 1.0)])
    assert "(No least-squares fit: it needs at least two sizes.)" in out
    assert "| restart |" not in out and "Least-squares fit over the sizes" not in out
