# SPDX-License-Identifier: GPL-3.0-or-later
"""Each role's meta/argument_specs.yml documents exactly its defaults/main.yml (STYLE.md section 3).

- main entry point: the same variable names as defaults/main.yml;
- every entry point: only names from defaults/main.yml, and a documented default equal to the real one
  (options marked required have a placeholder in defaults and no documented default);
- an entry point exists for every `tasks_from:` used on a role of this collection, because ansible validates
  arguments only for an entry point named like the tasks_from value (role/__init__.py: _prepend_validation_task).
"""
from __future__ import annotations

import re

import pytest
import yaml

from release_helpers import ROOT, clean_env, private_collection

ROLES = sorted(p.parent.parent.name for p in ROOT.glob("roles/*/meta/argument_specs.yml"))
TYPES = {"str": str, "int": int, "float": (int, float), "bool": bool, "list": list, "dict": dict, "path": str}


def _specs(role: str) -> dict:
    return yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]


def _defaults(role: str) -> dict:
    return yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}


def test_every_role_has_specs():
    assert set(ROLES) == {p.name for p in (ROOT / "roles").iterdir() if p.is_dir()}
    assert {"gpu_server", "nccl_tuning"} <= set(ROLES)


@pytest.mark.parametrize("role", ROLES)
def test_main_entry_point_keys_equal_defaults(role):
    spec = _specs(role)["main"]["options"]
    defaults = _defaults(role)
    assert sorted(set(defaults) - set(spec)) == [], "undocumented defaults"
    assert sorted(set(spec) - set(defaults)) == [], "documented but not in defaults/main.yml"


@pytest.mark.parametrize("role", ROLES)
def test_documented_defaults_equal_defaults(role):
    defaults = _defaults(role)
    for entry, body in _specs(role).items():
        assert body.get("short_description"), (entry, "short_description")
        for name, opt in body["options"].items():
            assert name in defaults, "%s/%s documents %s, which defaults/main.yml lacks" % (role, entry, name)
            assert opt.get("description"), (entry, name, "description")
            actual = defaults[name]
            if opt.get("required"):
                assert "default" not in opt, (entry, name, "required options have no default")
                continue
            assert "default" in opt or actual is None, "%s: %s has no documented default (real: %r)" % (entry, name, actual)
            assert opt.get("default") == actual, "%s: %s documents default %r, defaults/main.yml has %r" % (
                entry, name, opt.get("default"), actual)
            if actual is not None:
                assert isinstance(actual, TYPES[opt["type"]]), (entry, name, opt["type"], actual)
            if "choices" in opt and actual is not None:
                vals = actual if opt["type"] == "list" else [actual]
                assert set(vals) <= set(opt["choices"]), (entry, name, actual, opt["choices"])


def _tasks_from_uses():
    """(role, entry point) for every include_role/import_role with tasks_from in roles/ and playbooks/."""
    out = set()
    for p in list(ROOT.glob("playbooks/*.yml")) + list(ROOT.glob("roles/*/tasks/*.yml")) + list(ROOT.glob("molecule/*/*.yml")):
        text = p.read_text()
        for m in re.finditer(r"name:\s*(?:gpufleet\.serving\.)?(\w+)\s*\n(?:\s+\w+:.*\n)*?\s+tasks_from:\s*(.+)", text):
            value = m.group(2).strip()
            # A templated entry point (the rollout's: rollout_guarded or rollout, one for the whole batch) names each
            # file it may pick as a quoted literal.
            for entry in (re.findall(r"'(\w+)'", value) if "{{" in value else [value]):
                out.add((m.group(1), entry))
    return sorted(out)


def _tasks_from_at(text: str, entry: str) -> int:
    """Where the first tasks_from naming `entry` (literally or as one of a template's choices) is in `text`."""
    m = re.search(r"tasks_from:[^\n]*(?:\b|')%s(?:'|\n)" % re.escape(entry), text)
    assert m, entry
    return m.start()


# The batch bookkeeping of the rollout playbooks (gpu_server tasks/batch_begin.yml, batch_end.yml) takes no role
# variables: it reads the play's batch and gpufleet_rollout_max_fail_percentage, which batch_begin checks itself.
# The capacity guard (tasks/capacity.yml) likewise reads the batch, gpufleet_rollout_min_in_service (checked there)
# and whether each host has balancers.
# The audit's computation of the NCCL layers (nccl_tuning tasks/desired.yml) only reads, and the audit entry point
# validates the definition after it.
READ_ONLY_UNVALIDATED = {("nccl_tuning", "desired"), ("gpu_server", "batch_begin"), ("gpu_server", "batch_end"), ("gpu_server", "capacity")}
# The rollout and rollback playbooks' pre-flight (gpu_server tasks/rollout_check.yml): its action validates the
# definition against gpu_server's preflight entry and nccl_tuning's validate entry itself, in the one task execution
# per host it costs (issue 25); tests/rollout/test_rollout_check.py runs it on bad input.
VALIDATES_ITSELF = {("gpu_server", "rollout_check")}
# The rollout and rollback playbooks' entry into the lifecycle (gpu_server tasks/rollout.yml) comes after their
# pre-tasks validated every host with it: validating again would cost every host a task execution (issue 25). The test
# below checks that order in each playbook.
# rollout_guarded.yml is the same entry with the capacity guard first (with gpufleet_rollout_min_in_service).
VALIDATED_BEFORE = {(role, entry): (("playbooks/rollout.yml", "playbooks/rollback.yml"), "tasks_from: rollout_check")
                    for role, entry in (("gpu_server", "rollout"), ("gpu_server", "rollout_guarded"))}


def test_tasks_from_entry_points_are_validated():
    uses = _tasks_from_uses()
    assert ("gpu_server", "audit") in uses  # playbooks/audit.yml
    assert READ_ONLY_UNVALIDATED | VALIDATES_ITSELF <= set(uses)
    for (role, entry), (playbooks, validation) in VALIDATED_BEFORE.items():
        assert entry not in _specs(role)
        for playbook in playbooks:
            text = (ROOT / playbook).read_text()
            assert validation in text and text.index(validation) < _tasks_from_at(text, entry), (playbook, entry)
        assert _specs(role)["preflight"]["options"] == _specs(role)["main"]["options"]
    for role, entry in uses:
        if (role, entry) in VALIDATED_BEFORE or (role, entry) in VALIDATES_ITSELF:
            assert entry not in _specs(role), entry
            continue
        if (role, entry) in READ_ONLY_UNVALIDATED:
            assert entry not in _specs(role), "%s/%s is validated now: drop it from READ_ONLY_UNVALIDATED" % (role, entry)
            continue
        assert entry in _specs(role), (
            "tasks_from: %s on %s has no argument_specs entry %r, so ansible validates nothing there" % (entry, role, entry))


def test_audit_entry_point_validates_like_main(tmp_path):
    """A real run: tasks_from audit rejects a wrong type before any task runs, naming the variable."""
    from helpers import run_playbook

    pb = tmp_path / "pb.yml"
    pb.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role:\n        name: gpufleet.serving.gpu_server\n        tasks_from: audit\n")
    base = private_collection(tmp_path / "collections")
    r = run_playbook(pb, env=clean_env(ANSIBLE_COLLECTIONS_PATH=str(base)),
                     extra_vars={"gpufleet_server_name": "x", "gpufleet_server_command": ["true"],
                                 "gpufleet_server_kill_grace": "soon"})
    assert r.returncode != 0, r.stdout
    assert "Validating arguments against arg spec 'audit'" in r.stdout, r.stdout[-3000:]
    assert "gpufleet_server_kill_grace" in r.stdout and "float" in r.stdout, r.stdout[-3000:]
