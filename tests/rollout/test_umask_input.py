# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_server's input check of gpufleet_server_umask (issue 16 item 3), on localhost: YAML reads an unquoted 0022 as
the number 18, which would otherwise reach the host as umask 18 (0o22 by luck, 0o18 is no mode at all)."""
from __future__ import annotations

import os

import pytest
import yaml

from collection_copy import private_collections
from helpers import run_playbook


def preflight(tmp_path, umask_yaml):
    pb = tmp_path / "preflight.yml"
    pb.write_text(yaml.safe_dump([{
        "name": "Preflight", "hosts": "localhost", "gather_facts": False,
        "vars": {"gpufleet_server_name": "demo", "gpufleet_server_command": ["/bin/true"],
                 "gpufleet_server_health_url": "http://127.0.0.1:1/health"},
        "tasks": [{"name": "Run the role's input checks", "ansible.builtin.include_role": {
            "name": "gpufleet.serving.gpu_server", "tasks_from": "preflight"}}]}], sort_keys=False))
    # The value as an inventory file spells it (the YAML typing is the point).
    (tmp_path / "umask.yml").write_text("gpufleet_server_umask: %s\n" % umask_yaml)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(private_collections()))
    return run_playbook(pb, "-e", "@%s" % (tmp_path / "umask.yml"), env=env, timeout=120)


@pytest.mark.parametrize("umask_yaml, got", [('"0022"', None), ('"027"', None), ("0022", 'int 18'),
                                             ('"0o22"', 'str "0o22"'), ('"0888"', 'str "0888"'), ('"22"', 'str "22"')])
def test_the_umask_must_be_a_quoted_octal_string(tmp_path, umask_yaml, got):
    r = preflight(tmp_path, umask_yaml)
    if got is None:
        assert r.returncode == 0, r.stdout[-3000:]
    else:
        assert r.returncode == 2, r.stdout[-3000:]
        # As the summary shows it (its failure column).
        assert ('gpufleet_server_umask must be three or four octal digits in quotes, such as "0022" or "027" (got %s'
                % got) in r.stdout, r.stdout[-3000:]
        # The YAML hint only where YAML is the cause (a number).
        assert ("YAML reads an unquoted 0022 as the number 18" in r.stdout) == got.startswith("int"), r.stdout[-3000:]
