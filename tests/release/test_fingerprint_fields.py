# SPDX-License-Identifier: GPL-3.0-or-later
"""The server's fingerprint covers exactly what docs/concepts.md ("The fingerprint") lists: what defines the running
server restarts it when changed; health checks, timeouts and kill settings restart nothing."""
from __future__ import annotations

import re

import pytest
import yaml

from release_helpers import ROOT

pytestmark = pytest.mark.fast  # reads files only
DOCUMENTED = {"gpufleet_server_command", "gpufleet_server_env", "gpufleet_server_user", "gpufleet_server_workdir",
              "gpufleet_server_launcher", "gpufleet_server_gpus", "gpufleet_server_env_passthrough",
              "_gpufleet_server_nccl_env", "gpufleet_server_tag_name", "gpufleet_server_umask", "_gpufleet_server_env_file"}


def test_the_fingerprint_digests_the_documented_variables_and_no_setting_of_the_checks():
    expr = yaml.safe_load((ROOT / "roles" / "gpu_server" / "vars" / "main.yml").read_text())["_gpufleet_server_fingerprint"]
    used = set(re.findall(r"\b_?gpufleet_\w+", expr))
    assert used == DOCUMENTED, used ^ DOCUMENTED
    doc = (ROOT / "docs" / "concepts.md").read_text()
    section = doc[doc.index("## The fingerprint"):]
    for name in DOCUMENTED - {"_gpufleet_server_nccl_env", "_gpufleet_server_env_file"}:
        assert "`%s`" % name in section, name
    # Nothing of the readiness gate, the timeouts or the kill/clean settings.
    assert not [v for v in used if re.search(r"health|timeout|grace|final_wait|clean_|interval|kill|lock", v)], used
