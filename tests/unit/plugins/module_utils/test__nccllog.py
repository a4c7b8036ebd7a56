# SPDX-License-Identifier: GPL-3.0-or-later
"""_nccllog on NCCL log text in the formats NCCL writes (samples in tests/nccl/data, see its README)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _nccllog

DATA = Path(__file__).resolve().parents[3] / "nccl" / "data"
PCIE = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}


def entries(name):
    return _nccllog.parse_text((DATA / name).read_text(), name)


def test_prefixed_lines_per_pid_and_integer_period():
    es = entries("tp2_pcie_tuned.log")
    assert {e.pid for e in es} == {48211, 48212}
    buff = [e for e in es if e.name == "NCCL_BUFFSIZE"]
    assert [e.value for e in buff] == ["16777216", "16777216"]  # "16777216." in the log
    # Only "set by environment" lines: "P2P Chunksize set to 131072" is not a variable.
    assert {e.name for e in es} == set(PCIE)


def test_all_six_confirmed_for_both_workers():
    v = _nccllog.judge(entries("tp2_pcie_tuned.log"), PCIE, pids={48211, 48212})
    assert v["confirmed"] == sorted(PCIE) and v["contradicted"] == [] and v["not_logged"] == []
    assert set(v["pids"]) == {"48211", "48212"}
    assert all(c["status"] == "confirmed" for row in v["pids"].values() for c in row.values())


def test_other_pids_do_not_count():
    v = _nccllog.judge(entries("tp2_pcie_tuned.log"), PCIE, pids={48211})
    assert set(v["pids"]) == {"48211"} and v["other_pids"] == [48212]
    v = _nccllog.judge(entries("tp2_pcie_tuned.log"), PCIE, pids={999})
    assert v["pids"] == {} and v["not_logged"] == sorted(PCIE)


def test_launcher_prefixes():
    es = entries("torchrun_mpirun_prefixes.log")
    got = {(e.pid, e.name, e.value) for e in es}
    assert got == {
        (3021, "NCCL_BUFFSIZE", "16777216"), (3021, "NCCL_PROTO", "LL"), (2877, "NCCL_BUFFSIZE", "16777216"),
        (911, "NCCL_P2P_LEVEL", "SYS"), (911, "NCCL_ALGO", "Ring"), (912, "NCCL_ALGO", "Ring"),
        (5120, "NCCL_NTHREADS", "512"),
    }


def test_contradicted_and_invalid_values():
    want = {"NCCL_PROTO": "LL", "NCCL_BUFFSIZE": "16M", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS"}
    v = _nccllog.judge(entries("contradicted.log"), want, pids={51007, 51008})
    row = v["pids"]["51007"]
    assert row["NCCL_PROTO"]["status"] == "contradicted" and row["NCCL_PROTO"]["logged"] == "Simple"
    assert row["NCCL_BUFFSIZE"]["status"] == "contradicted" and row["NCCL_BUFFSIZE"]["invalid"] is True
    assert row["NCCL_ALGO"]["status"] == "confirmed"  # NCCL compares names case-insensitively
    assert row["NCCL_P2P_LEVEL"]["status"] == "confirmed"
    assert v["pids"]["51008"]["NCCL_PROTO"]["status"] == "confirmed"
    assert v["summary"]["NCCL_PROTO"] == "contradicted" and v["contradicted"] == ["NCCL_BUFFSIZE", "NCCL_PROTO"]


def test_size1_communicator_never_logs_proto_algo():
    v = _nccllog.judge(entries("size1_comm.log"), PCIE, pids={60410})
    assert v["confirmed"] == ["NCCL_BUFFSIZE", "NCCL_P2P_LEVEL"]
    assert v["not_logged"] == ["NCCL_ALGO", "NCCL_MAX_NCHANNELS", "NCCL_NTHREADS", "NCCL_PROTO"]
    assert v["contradicted"] == []


def test_unprefixed_lines_count_under_unknown():
    es = entries("unprefixed.log")
    assert {(e.pid, e.name, e.value) for e in es} == {(None, "NCCL_PROTO", "LL"), (None, "NCCL_BUFFSIZE", "16777216")}
    v = _nccllog.judge(es, {"NCCL_PROTO": "LL"}, pids={1})
    assert v["pids"]["unknown"]["NCCL_PROTO"]["status"] == "confirmed"


@pytest.mark.parametrize("expected,logged,same", [
    ("16777216", "16777216", True), ("0x1000000", "16777216", True), ("16777216", "4194304", False),
    ("LL", "ll", True), ("Simple", "LL", False), ("1", "01", True),
])
def test_same_value(expected, logged, same):
    assert _nccllog.same_value(expected, logged) is same


def test_old_numeric_p2p_level_line():
    es = _nccllog.parse_text("host1:4242:4242 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to 1\n")
    assert es == [_nccllog.Entry(4242, "NCCL_P2P_LEVEL", "1", False, 1, "<log>")]


def test_unreadable_files_are_noted(tmp_path):
    es, notes = _nccllog.parse_files([str(tmp_path / "missing.log"), str(DATA / "unprefixed.log")])
    assert len(es) == 2 and len(notes) == 1 and "missing.log" in notes[0]


def test_parse_files_expands_globs_of_per_process_logs(tmp_path):
    # NCCL_DEBUG_FILE=/dir/nccl.%h.%p.log writes one file per process.
    (tmp_path / "nccl.vm.11.log").write_text("vm:11:11 [0] NCCL INFO NCCL_BUFFSIZE set by environment to 16777216.\n")
    (tmp_path / "nccl.vm.12.log").write_text("vm:12:12 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS\n")
    entries, notes = _nccllog.parse_files([str(tmp_path / "nccl.*.log"), str(tmp_path / "none-*.log")])
    assert sorted((e.pid, e.name) for e in entries) == [(11, "NCCL_BUFFSIZE"), (12, "NCCL_P2P_LEVEL")]
    assert notes == ["no NCCL log matches %s" % (tmp_path / "none-*.log")]


def test_real_h200_worker_log_confirms_what_nccl_read():
    """Verbatim NCCL 2.28.9 log of a size-1 communicator on an H200 (docs/gpu-run.md)."""
    path = Path(__file__).resolve().parents[4] / "tests" / "nccl" / "data" / "h200-nccl-2.28.9-size1-worker.log"
    entries, notes = _nccllog.parse_files([str(path)])
    got = {e.name: e.value for e in entries}
    assert notes == []
    assert {e.pid for e in entries} == {731}
    assert got == {"NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16", "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}


def test_real_two_gpu_rank_log_confirms_protocol_and_algorithm_too():
    """Verbatim NCCL 2.28.9 log of rank 0 of a 2-rank communicator across two NVLink H200s (docs/gpu-run.md):
    unlike a size-1 communicator, it reads and logs NCCL_PROTO/NCCL_ALGO (strings: no trailing period)."""
    path = Path(__file__).resolve().parents[4] / "tests" / "nccl" / "data" / "h200x2-nccl-2.28.9-2rank-worker.log"
    entries, notes = _nccllog.parse_files([str(path)])
    got = {e.name: e.value for e in entries}
    assert notes == [] and {e.pid for e in entries} == {974}
    assert got == {"NCCL_P2P_LEVEL": "SYS", "NCCL_NVLS_ENABLE": "0", "NCCL_MAX_NCHANNELS": "16", "NCCL_BUFFSIZE": "16777216",
                   "NCCL_NTHREADS": "512", "NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
    verdict = _nccllog.judge(entries, {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_NVLS_ENABLE": "0"}, {974})
    assert verdict["confirmed"] == ["NCCL_ALGO", "NCCL_NVLS_ENABLE", "NCCL_PROTO"] and not verdict["contradicted"]
    assert _nccllog.judge(entries, {"NCCL_PROTO": "Simple"}, {974})["contradicted"] == ["NCCL_PROTO"]
