# SPDX-License-Identifier: GPL-3.0-or-later
"""ansible-lint with the production profile passes on what a plain `ansible-lint` at the repository root lints.

scripts/lint runs it with no paths, so ansible-lint's own discovery picks the files (a contributor's plain run lints the
same ones: roles, playbooks, molecule, the example inventory, the metadata, execution-environment.yml, the plugins'
EXAMPLES, the changelog fragments). ansible-lint resolves gpufleet.serving.* (modules for the `args` rule, roles for syntax
checks) through ANSIBLE_COLLECTIONS_PATH, which the script points at a fresh copy of this checkout
(scripts/install-collection), and ANSIBLE_HOME at an empty directory, because ansible-lint puts
ANSIBLE_HOME/collections first on the collections path: a stale copy there would be linted instead.
"""
from __future__ import annotations

import re

import yaml

from release_helpers import ROOT, clean_env, run


def test_lint_config_is_production_and_every_skip_says_why():
    text = (ROOT / ".ansible-lint").read_text()
    cfg = yaml.safe_load(text)
    assert cfg["profile"] == "production"
    assert cfg.get("offline") is True
    assert not cfg.get("warn_list"), "warnings hide problems: fix them or skip with a reason"
    lines = text.splitlines()
    start = lines.index("skip_list:")
    for i, line in enumerate(lines[start + 1:], start + 1):
        if not line.startswith("  - "):
            if not line.startswith("  #"):
                break
            continue
        assert lines[i - 1].lstrip().startswith("#") or "#" in line, "skip %r has no comment giving its reason" % line
    # Each skip is a decision: a new one must be added here too.
    assert cfg["skip_list"] == ["var-naming[no-role-prefix]", "galaxy[no-repository]"]
    assert not (ROOT / ".ansible-lint-ignore").exists() and not (ROOT / ".config" / "ansible-lint-ignore.txt").exists()


def test_ansible_lint_production_profile_passes(tmp_path):
    r = run([str(ROOT / "scripts" / "lint"), "-vv", "--nocolor", "-f", "pep8", "--profile", "production"],
            env=clean_env(HOME=str(tmp_path)), timeout=240)
    assert r.returncode == 0, r.stdout[-6000:]
    assert re.search(r"Set ANSIBLE_COLLECTIONS_PATH=/\S+/home/collections:/\S+/collections\b", r.stdout), r.stdout[:3000]
    # It really looked at the roles and playbooks (syntax checks through the collection copy).
    for target in ("role roles/gpu_server", "role roles/nccl_tuning", "playbook playbooks/rollout.yml",
                   "playbook molecule/default/converge.yml"):
        assert re.search(r"syntax check on %s" % re.escape(target), r.stdout), (target, r.stdout[-3000:])
    assert "passed" in r.stdout.lower() or "0 failure" in r.stdout, r.stdout[-2000:]
    # It linted what a plain `ansible-lint` at the repository root lints, not a hand-picked list: the files below are
    # found by ansible-lint's own discovery (a list of paths left execution-environment.yml, changelogs/config.yaml and
    # the plugins' EXAMPLES out).
    examined = set(re.findall(r"Examining (\S+) of type", r.stdout))
    expected = {"execution-environment.yml", "changelogs/config.yaml", "galaxy.yml", "meta/runtime.yml",
                "roles/gpu_server/tasks/main.yml", "playbooks/rollout.yml", "inventories/example/hosts.yml"}
    expected |= {str(p.relative_to(ROOT)) for p in (ROOT / "changelogs" / "fragments").glob("*.yml")}
    expected |= {str(p.relative_to(ROOT)) for p in (ROOT / "plugins" / "modules").glob("*.py")}
    assert expected - examined == set(), sorted(examined)
    # .ansible-lint's exclude_paths still hold (tests/ exercises failure paths on purpose).
    assert not [f for f in examined if f.startswith(("tests/", "collections/", ".venv"))], sorted(examined)
