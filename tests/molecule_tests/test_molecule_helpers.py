# SPDX-License-Identifier: GPL-3.0-or-later
"""Quick checks of the molecule scenarios' helpers (no sandbox needed): the servers inventory that create.yml
writes is sandbox.server_vars() of the fleet's python, and podman_fleet finds the mirror apt uses."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from gpufleet_ci import sandbox  # noqa: E402
from sandbox.fixtures import podman_fleet  # noqa: E402


@pytest.mark.parametrize("extra", [{}, {"gpufleet_server_launcher": "systemd"}])
def test_servers_inventory_is_sandbox_server_vars_of_the_fleet_python(tmp_path, extra):
    (tmp_path / "fleet.json").write_text(json.dumps({"python": "/usr/bin/python3", "host_info": [
        {"name": "host1"}, {"name": "host2"}, {"name": "host3"}]}))
    out = tmp_path / "gpufleet_servers.yml"
    p = subprocess.run([sys.executable, str(ROOT / "molecule" / "shared" / "servers_inventory.py"), "--fleet-state",
                        str(tmp_path), "--out", str(out), "--vars", json.dumps(extra)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stdout
    inv = yaml.safe_load(out.read_text())
    group = inv["gpufleet_servers"]
    assert sorted(group["hosts"]) == ["host1", "host2", "host3"]
    gv = group["vars"]
    # The product's server_vars, not the suite's (tests/conftest.py adds gpufleet_server_rollback: false in-process).
    expected = getattr(sandbox.server_vars, "__wrapped__", sandbox.server_vars)("/usr/bin/python3")
    # Only the timeouts/poll interval may differ (quick on 2 cores), plus the scenario's own vars.
    quick = {"gpufleet_server_kill_grace", "gpufleet_server_clean_timeout", "gpufleet_server_start_timeout",
             "gpufleet_server_ready_interval"}
    assert {k: v for k, v in gv.items() if k not in quick and k not in extra and k != "molecule_stale_server_cmd"} \
        == {k: v for k, v in expected.items() if k not in quick}
    assert gv["gpufleet_nccl_profile"] == "pcie_only"
    assert gv["gpufleet_server_adopt_cmdline_regex"] == r"demo_server\.py"
    assert gv["molecule_stale_server_cmd"] == sandbox.stale_server_cmd("/usr/bin/python3")
    for k, v in extra.items():
        assert gv[k] == v


@pytest.mark.parametrize("files, mirror", [
    ({"sources.list.d/debian.sources": "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
                                       "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n"
                                       "Suites: bookworm-security\nComponents: main\n"}, "http://mirror.example/debian"),
    ({"sources.list": "# comment\ndeb http://security.example/debian-security bookworm-security main\n"
                      "deb [arch=amd64] http://one.example/debian/ bookworm main\n"}, "http://one.example/debian"),
])
def test_apt_mirror_is_the_one_apt_uses_for_bookworm(tmp_path, files, mirror):
    for rel, text in files.items():
        f = tmp_path / "etc" / "apt" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    assert podman_fleet().apt_mirror(str(tmp_path)) == mirror


def test_no_mirror_in_the_apt_sources_is_a_clear_error_not_a_guessed_host(tmp_path):
    f = tmp_path / "etc" / "apt" / "sources.list.d" / "other.list"
    f.parent.mkdir(parents=True)
    f.write_text("deb https://packages.example/apt stable main\n")
    with pytest.raises(RuntimeError, match=r"no Debian bookworm mirror in .*sources.list.*add a 'bookworm' source"):
        podman_fleet().apt_mirror(str(tmp_path))
