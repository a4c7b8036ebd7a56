# SPDX-License-Identifier: GPL-3.0-or-later
"""Every variable of its own that a playbook reads is in the playbook's header, and every playbook variable (read by a
playbook or by a role for it) is in docs/playbooks.md."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = ROOT / "playbooks"
# The playbooks' own inputs: what they read that no role documents (the roles' gpufleet_server_*/gpufleet_nccl_* are in
# docs/options). Facts and registered results the playbooks set themselves are not inputs.
OWN = re.compile(r"\b(gpufleet_target|gpufleet_rollback_to|gpufleet_rollout_[a-z_]+)\b")
SET_HERE = re.compile(r"^\s*(?:register:\s*|)(_*gpufleet_[a-z_]+):", re.M)


def _reads(text: str) -> set:
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    set_here = set(SET_HERE.findall(code)) | set(re.findall(r"register:\s*(\w+)", code))
    return {n for n in OWN.findall(code) if n not in set_here}


def _header(text: str) -> str:
    lines = []
    for line in text.splitlines()[1:]:
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines)


def test_every_playbook_variable_is_in_its_header_and_in_the_docs():
    doc = (ROOT / "docs" / "playbooks.md").read_text()
    seen = set()
    for p in sorted(PLAYBOOKS.glob("*.yml")):
        text = p.read_text()
        reads = _reads(text)
        seen |= reads
        header = _header(text)
        missing = sorted(n for n in reads if n not in header)
        assert not missing, "%s reads %s, not in its header" % (p.name, missing)
        for n in reads:
            assert "`%s`" % n in doc, "%s reads %s, not in docs/playbooks.md" % (p.name, n)
    # The roles read some of the playbooks' variables themselves (gpufleet_rollback_to: the check's generation).
    for p in sorted((ROOT / "roles").glob("*/tasks/*.yml")):
        seen |= _reads(p.read_text())
    # The playbooks do read these (a rename that missed this page would leave it stale).
    assert {"gpufleet_target", "gpufleet_rollout_serial", "gpufleet_rollout_min_in_service",
            "gpufleet_rollout_fast_check", "gpufleet_rollback_to"} <= seen, seen
    documented = set(re.findall(r"^\| `(gpufleet_[a-z_]+)`", doc, re.M))
    assert documented == seen, "docs/playbooks.md lists %s, the playbooks read %s" % (sorted(documented), sorted(seen))
