# SPDX-License-Identifier: GPL-3.0-or-later
"""`python -m gpufleet_ci rollout` (ansible-runner) against 3 sandbox hosts: exit status, summary, artifacts."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from collection_copy import private_collections
from rollout_helpers import ROOT

pytestmark = pytest.mark.sandbox

ALL = ["host1", "host2", "host3"]
# Inside the fleet's hub subnet (10.200.0.0/24, hosts from .11), never given to a host: no route to it.
UNUSED_ADDR = "10.200.0.250"


def gpufleet_ci(rf, name, *args, host_vars=None):
    inv = rf.inventory(host_vars=host_vars)
    out = rf.workdir / ("ci-%s-%d" % (name, rf.runs))
    out.mkdir()
    pdd = out / "pdd"
    argv = [sys.executable, "-m", "gpufleet_ci", "rollout", "--inventory", str(inv), "--ident", name,
            "--private-data-dir", str(pdd), "--json", str(out / "report.json"), "--markdown", str(out / "report.md"),
            "--collections-path", str(private_collections()),
            "-e", json.dumps({"gpufleet_rollout_serial": ["100%"]})] + list(args)
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=str(ROOT), check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    print("gpufleet_ci rollout %s: rc=%d in %.1fs" % (name, p.returncode, time.monotonic() - t0))
    return p, out, pdd


def test_rollout_through_ansible_runner_exits_0_with_a_per_host_summary(stale):
    rf = stale
    before = rf.snapshot()

    # The CI gate first: --check --diff reports what would restart and changes nothing.
    p, out, pdd = gpufleet_ci(rf, "check", "--check", "--diff")

    assert p.returncode == 0, p.stdout[-6000:]
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is True
    assert all(h["would_restart"] is True and h["restarted"] is False for h in report["hosts"]), report["hosts"]
    assert (pdd / "env" / "cmdline").read_text().split() == ["--check", "--diff"]
    md = (out / "report.md").read_text()
    # The callback's table (one renderer), columns padded to their widths.
    assert all(re.search(r"^\|\s*%s\s*\|\s*ok\s*\|\s*would\s*\|" % h, md, re.M) for h in ALL), md
    checked = rf.snapshot()
    for h in ALL:
        assert checked.identities(h) == before.identities(h)
        assert checked[h]["sitecustomize_sha"] == before[h]["sitecustomize_sha"]

    p, out, pdd = gpufleet_ci(rf, "first")

    assert p.returncode == 0, p.stdout[-6000:]
    # progress: one line per host and task as the events arrive
    for h in ALL:
        assert any(h in line and "changed" in line and "Restart the server (" in line for line in p.stdout.splitlines()), h
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is True and report["rc"] == 0 and report["status"] == "successful"
    assert report["ident"] == "first" and report["artifacts"] == str(pdd / "artifacts" / "first")
    hosts = {h["host"]: h for h in report["hosts"]}
    assert sorted(hosts) == ALL
    after = rf.snapshot()
    for h in ALL:
        assert hosts[h]["status"] == "ok" and hosts[h]["restarted"] is True, hosts[h]
        assert isinstance(hosts[h]["clean_s"], float) and 0 <= hosts[h]["clean_s"] < 10
        assert hosts[h]["workers_verified"] == 2
        assert not before.identities(h) & after.identities(h)
    md = (out / "report.md").read_text()
    assert md.startswith("### gpufleet rollout: OK (rc 0)")
    rows = [line for line in md.splitlines() if line.startswith("| host")]
    assert len(rows) == 4  # header + 3 hosts
    for h in ALL:
        row = [c.strip() for c in next(r for r in rows if r.startswith("| %s |" % h)).strip("|").split("|")]
        assert row[1] == "ok" and row[2] == "yes" and row[7] == "2", row
    # ansible-runner's private_data_dir, as the module docstring lays it out
    assert (pdd / "project" / "site.yml").read_text().count("import_playbook: gpufleet.serving.rollout") == 1
    assert (pdd / "inventory" / "servers.yml").exists() and (pdd / "inventory" / "fleet.yml").exists()
    for f in ("envvars", "extravars", "cmdline"):
        assert (pdd / "env" / f).exists()
    art = pdd / "artifacts" / "first"
    assert (art / "rc").read_text().strip() == "0"
    assert (art / "status").read_text().strip() == "successful"
    assert list((art / "job_events").iterdir())
    assert json.loads((pdd / "artifacts" / "summary" / "rollout-summary.json").read_text())["hosts"]
    rf.state = "clean"


def test_an_unreachable_host_fails_the_run_and_is_reported_with_its_reason(rolled_out):
    rf = rolled_out("clean")
    before = rf.snapshot()

    p, out, pdd = gpufleet_ci(rf, "unreach", host_vars={"host3": {"ansible_host": UNUSED_ADDR}})

    assert p.returncode == 2, p.stdout[-6000:]
    assert "UNREACHABLE" in p.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is False and report["rc"] != 0 and report["status"] == "failed"
    hosts = {h["host"]: h for h in report["hosts"]}
    assert sorted(hosts) == ALL
    assert hosts["host3"]["status"] == "unreachable"
    assert hosts["host3"]["failure"] and ("ssh" in hosts["host3"]["failure"].lower()), hosts["host3"]
    assert hosts["host1"]["status"] != "unreachable" and hosts["host2"]["status"] != "unreachable"
    md = (out / "report.md").read_text()
    assert md.startswith("### gpufleet rollout: FAILED")
    assert "| host3 | unreachable |" in md
    art = pdd / "artifacts" / "unreach"
    assert (art / "rc").read_text().strip() not in ("", "0")
    assert (art / "status").read_text().strip() == "failed"
    after = rf.snapshot()
    for h in ALL:  # nothing needed a restart: nothing restarted
        assert after.identities(h) == before.identities(h)
    rf.state = "clean"
