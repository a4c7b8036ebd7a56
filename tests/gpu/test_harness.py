# SPDX-License-Identifier: GPL-3.0-or-later
"""The real-GPU harness keeps NVLink multicast off in everything it starts (the device's rule: all three variables),
checked here on any machine, without a GPU."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_device_script_exports_all_three_before_anything_starts():
    text = (HERE / "run_on_device.sh").read_text()
    export = re.search(r"^export (NCCL_NVLS_ENABLE=.*)$", text, re.M)
    assert export, "run_on_device.sh does not export the multicast-off variables"
    assert dict(kv.split("=", 1) for kv in export.group(1).split()) == MULTICAST_OFF
    assert text.index(export.group(0)) < text.index("tests/gpu/e2e.py")


def test_the_server_the_e2e_launches_carries_them_and_its_workers_are_checked_for_them():
    e2e = _load(HERE / "e2e.py")
    assert e2e.MULTICAST_OFF == MULTICAST_OFF
    gv = e2e.group_vars(["python3", "real_server.py"], 2)
    env = gv["gpufleet_server_env"]
    assert {k: env.get(k) for k in MULTICAST_OFF} == MULTICAST_OFF
    # The workers are verified: the non-NCCL two as expected env, the NCCL one through the tuning's block.
    assert gv["gpufleet_server_expected_env"] == {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    assert gv["gpufleet_nccl_env"] == {"NCCL_NVLS_ENABLE": "0"}


def test_the_allreduce_benchmark_starts_every_rank_with_them():
    bench = _load(ROOT / "bench" / "allreduce_bw.py")
    assert bench.ALWAYS == MULTICAST_OFF


def test_the_gate_and_rollback_numbers_in_the_docs_are_the_evidence():
    """docs/gpu-run.md's issue-26 table quotes docs/evidence/h200-gate-rollback.json (the device run of e2e.py step 9)."""
    import json

    ev = json.loads((ROOT / "docs" / "evidence" / "h200-gate-rollback.json").read_text())
    assert all(ev["checks"].values()), ev["checks"]
    doc = (ROOT / "docs" / "gpu-run.md").read_text()
    g = ev["gate"]
    base, slow, restored = g["baseline"]["gate"], g["slow"]["gate"], g["restored"]["gate"]
    assert base["baseline"] is None and slow["baseline"] == base["median"] == restored["baseline"]
    assert slow["ratio"] < g["definition"]["min_ratio"] <= restored["ratio"]
    for value in (base["median"], slow["median"], slow["ratio"], restored["median"], restored["ratio"]):
        assert "| %s |" % value in doc, value
    fp = g["slow"]["rolled_back"]["fingerprint"][:12]
    assert g["record_after_rollback"]["fingerprint"].startswith(fp) and "last known good `%s`" % fp in doc


def test_the_restart_breakdown_in_the_docs_is_the_evidence():
    """docs/gpu-run.md's breakdown of the restart's overhead (issue 25) quotes docs/evidence/h100-e2e-restart-breakdown.json
    row by row, and the ranges its text gives are the rows' own."""
    import json

    ev = json.loads((ROOT / "docs" / "evidence" / "h100-e2e-restart-breakdown.json").read_text())
    assert ev["ok"] and all(ev["checks"].values()), ev["checks"]
    doc = (ROOT / "docs" / "gpu-run.md").read_text()
    section = doc.split("## The restart's overhead broken down")[1].split("\n## ")[0]
    rows = [r for r in section.splitlines() if re.match(r"^\| \d \|", r)]
    assert len(rows) == len(ev["restarts"]) == 3
    for row, r in zip(rows, ev["restarts"]):
        t = r["timings"]
        want = [r["server_startup_s"], r["restart_task_s"], r["overhead_s"], round(t["cycle_s"] - r["server_startup_s"], 3),
                t["preflight_s"], t["kill_s"], t["clean_s"], t["busy_s"], t["verify_env_s"], r["check_task_s"]]
        got = [float(x) for x in row.strip("|").split("|")[1:]]
        assert got == pytest.approx(want, abs=0.0006), (row, want)  # quoted to 3 decimals
    outside = [r["restart_task_s"] - r["timings"]["cycle_s"] for r in ev["restarts"]]
    assert "minus its cycle is %.2f–%.2f s" % (min(outside), max(outside)) in " ".join(section.split())
    steps = [r["timings"]["preflight_s"] + r["timings"]["kill_s"] + r["timings"]["clean_s"] for r in ev["restarts"]]
    assert "clean gate %.2f–%.2f s" % (min(steps), max(steps)) in " ".join(section.split())
    over = [r["overhead_s"] for r in ev["restarts"]]
    assert "not met (%.2f–%.2f s here)" % (min(over), max(over)) in " ".join(section.split())
