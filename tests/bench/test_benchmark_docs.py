# SPDX-License-Identifier: GPL-3.0-or-later
"""The fleet benchmark's numbers in docs/benchmarks.md and docs/scale.md are the evidence files' numbers: every table
row `bench/fleet_rollout.py --tables` prints for a documented run is in benchmarks.md as printed, and scale.md's
measured symbols are the fits of the run it names."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence"
BENCH_DOC = (ROOT / "docs" / "benchmarks.md").read_text()
SCALE_DOC = (ROOT / "docs" / "scale.md").read_text()

# Each documented run, as the JSON files whose tables benchmarks.md shows together.
RUNS = [
    ("fleet-rollout-bench-2-4.json", "fleet-rollout-bench-8-32.json"),
    ("fleet-rollout-bench-8-cuts.json",),
    ("fleet-rollout-bench-2-32-79bc33d.json",),
    ("fleet-rollout-bench-8-rollout-check.json",),
    ("fleet-rollout-bench-2-32-e6cf68f.json",),
    ("fleet-rollout-bench-8-74729d9-run1.json",),
    ("fleet-rollout-bench-8-74729d9-run2.json",),
    ("fleet-rollout-bench-8-ab6c5c1.json",),
    ("fleet-rollout-bench-8-9cbec0b.json",),
    ("fleet-rollout-bench-8-575f844.json",),
    ("fleet-rollout-bench-8-f8e29dd.json",),
    ("fleet-rollout-bench-2-32-f8e29dd.json",),
]


def _tables(files) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "fleet_rollout.py"), "--tables"]
                         + [str(EVIDENCE / f) for f in files], capture_output=True, text=True, check=True).stdout
    return out


def test_every_n_curve_the_docs_cite_is_checked_here():
    cited = set(re.findall(r"docs/evidence/(fleet-rollout-bench[\w.-]*\.json)", BENCH_DOC + SCALE_DOC))
    checked = {f for run in RUNS for f in run}
    # fleet-rollout-bench.json (the first runs) holds wall times only, in a table written by hand before --tables.
    assert cited - checked <= {"fleet-rollout-bench.json"}, cited - checked


@pytest.mark.parametrize("files", RUNS, ids=lambda r: "+".join(r))
def test_benchmarks_md_shows_the_tables_of_the_evidence_as_printed(files):
    rows = [line for line in _tables(files).splitlines() if line.startswith("| ") and not line.startswith("| hosts")
            and not line.startswith("| |")]
    assert rows
    missing = [r for r in rows if r not in BENCH_DOC]
    assert not missing, "\n".join(missing)


def test_scale_md_projects_from_the_fits_of_the_run_it_names():
    run = re.search(r"raw data `docs/evidence/(fleet-rollout-bench[\w.-]*\.json)`", SCALE_DOC).group(1)
    fits = {}
    for line in _tables([run]).splitlines():
        m = re.match(r"\| (restart|noop|ping|seed) \| ([-\d.]+) \| ([\d.]+) \| ([-\d.]+) \| ([\d.]+) \|", line)
        if m:
            fits[m.group(1)] = {"cpu": float(m.group(3)), "main": float(m.group(5))}
    assert set(fits) == {"restart", "noop", "ping", "seed"}, fits

    def row(symbol):
        return next(line for line in SCALE_DOC.splitlines() if line.startswith("| `%s`" % symbol))

    for symbol, kind in (("c_noop", "noop"), ("c_restart", "restart"), ("c_ping", "ping")):
        assert "| %.2f s (fit)" % fits[kind]["cpu"] in row(symbol), (row(symbol), fits[kind])
    assert "%.2f s, %.2f s per host fit" % (fits["noop"]["main"], fits["restart"]["main"]) in row("m_noop`, `m_restart")
    # The projections: 1000 hosts × the fit, in CPU-minutes and main-process minutes.
    assert "≈ %.0f CPU-minutes" % (1000 * fits["noop"]["cpu"] / 60) in SCALE_DOC
    assert "≈ %.0f CPU-minutes (`ansible -m ping`" % (1000 * fits["restart"]["cpu"] / 60) in SCALE_DOC
    assert "`1000 × m_noop` ≈ %.1f min" % (1000 * fits["noop"]["main"] / 60) in SCALE_DOC
    assert "`1000 × m_restart` ≈ %.1f min" % (1000 * fits["restart"]["main"] / 60) in SCALE_DOC
    assert "(`ansible -m ping`: %.0f CPU-minutes)" % (1000 * fits["ping"]["cpu"] / 60) in SCALE_DOC
    # Task executions per host, from the profile's fork count: each task on each host is a fork of the main process,
    # and 4 tasks of a run run once (the batch's bookkeeping).
    profiles = re.search(r"profiles `docs/evidence/(fleet-profile[\w.-]*)/`", SCALE_DOC).group(1)
    forks = {}
    for kind in ("noop", "restart"):
        text = (EVIDENCE / profiles / ("%s-8hosts-profile.txt" % kind)).read_text()
        forks[kind] = int(re.search(r"^\s*(\d+)\s.*\{built-in method posix.fork\}", text, re.M).group(1))
    # The batch's bookkeeping runs once in both runs (4 or 5 forks, by the commit): the same count leaves a multiple of 8.
    once = [r for r in range(8) if all((f - r) % 8 == 0 for f in forks.values())]
    assert len(once) == 1, forks
    per_host = {kind: (f - once[0]) // 8 for kind, f in forks.items()}
    assert "%d task executions per host)" % per_host["noop"] in row("c_noop")
    assert "%d task executions per host)" % per_host["restart"] in row("c_restart")
    ms = 1000 * fits["noop"]["main"] / per_host["noop"]
    assert "≈ %.1f ms of main-process time (m_noop / %d)" % (ms, per_host["noop"]) in SCALE_DOC
    assert "~1 s / %.1f ms ≈ %d forks" % (ms, round(1000 / ms)) in SCALE_DOC
    assert "main floor %.1f / 8 min per slice; CPU\n  %.0f CPU-min / 8 cores" % (
        1000 * fits["noop"]["main"] / 60, 1000 * fits["noop"]["cpu"] / 60) in SCALE_DOC
    assert json.loads((EVIDENCE / run).read_text())
