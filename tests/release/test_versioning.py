# SPDX-License-Identifier: GPL-3.0-or-later
"""Versioning: a semantic version in galaxy.yml, a changelog managed by antsibull-changelog (fragments lint,
CHANGELOG.md regenerates from changelogs/changelog.yaml unchanged), and meta/runtime.yml's requires_ansible
naming the ansible-core series CI tests (the one pinned in pyproject.toml and installed in the venv)."""
from __future__ import annotations

import re
import shutil

import ansible.release
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from release_helpers import BIN, ROOT, run

try:
    import tomllib
except ImportError:  # pragma: no cover - Python < 3.11
    tomllib = None

SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")


def _galaxy() -> dict:
    return yaml.safe_load((ROOT / "galaxy.yml").read_text())


def _lower_bound(spec: SpecifierSet) -> Version:
    lows = [Version(s.version) for s in spec if s.operator in (">=", "~=", "==")]
    assert len(lows) == 1, "one lower bound expected in %s" % spec
    return lows[0]


def test_galaxy_version_is_semver():
    assert SEMVER.match(str(_galaxy()["version"])), _galaxy()["version"]


def test_antsibull_changelog_lint_passes():
    r = run([str(BIN / "antsibull-changelog"), "lint"])
    assert r.returncode == 0 and r.stdout.strip() == "", r.stdout
    r = run([str(BIN / "antsibull-changelog"), "lint-changelog-yaml", "changelogs/changelog.yaml"])
    assert r.returncode == 0 and r.stdout.strip() == "", r.stdout


def test_changelog_md_is_generated_from_changelog_yaml(tmp_path):
    for name in ("galaxy.yml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "changelogs", tmp_path / "changelogs")
    r = run([str(BIN / "antsibull-changelog"), "generate"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout
    assert (tmp_path / "CHANGELOG.md").read_text() == (ROOT / "CHANGELOG.md").read_text(), (
        "CHANGELOG.md is stale: run `antsibull-changelog generate`")


def test_galaxy_version_is_released_or_has_pending_fragments():
    releases = yaml.safe_load((ROOT / "changelogs" / "changelog.yaml").read_text())["releases"]
    latest = max(Version(v) for v in releases)
    version = Version(str(_galaxy()["version"]))
    assert version >= latest
    fragments = [p for p in (ROOT / "changelogs" / "fragments").iterdir() if p.suffix in (".yml", ".yaml")]
    if version > latest:
        assert fragments, "galaxy.yml is at %s but no fragment describes what changed since %s" % (version, latest)
    assert "## v%s" % str(latest).replace(".", "\\.") in (ROOT / "CHANGELOG.md").read_text()


def test_requires_ansible_is_the_tested_core_series():
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())
    spec = SpecifierSet(runtime["requires_ansible"])
    core = Version(ansible.release.__version__)
    assert core in spec, "installed ansible-core %s does not satisfy requires_ansible %s" % (core, spec)
    low = _lower_bound(spec)
    assert (low.major, low.minor) == (2, 19), "requires_ansible's lower bound must be the oldest core CI tests (2.19)"
    assert (core.major, core.minor) == (low.major, low.minor), "CI runs core %s, not the oldest supported %s" % (core, low)
    # The venv CI installs pins the same series.
    if tomllib is not None:
        deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
        req = next(Requirement(d) for d in deps if Requirement(d).name == "ansible-core")
        assert _lower_bound(req.specifier) == low
    for role in (ROOT / "roles").iterdir():
        meta = yaml.safe_load((role / "meta" / "main.yml").read_text())
        assert Version(str(meta["galaxy_info"]["min_ansible_version"])) == Version("%d.%d" % (low.major, low.minor)), role.name


def test_no_version_added_is_later_than_the_collection_version():
    # ansible-doc prints "added in version X": a version the collection has not reached misleads its users.
    current = Version(_galaxy()["version"])
    found = []
    for path in list((ROOT / "plugins").rglob("*.py")) + list((ROOT / "roles").rglob("argument_specs.yml")):
        for v in re.findall(r"version_added:\s*['\"]?([0-9][0-9.]*)", path.read_text()):
            found.append(v)
            assert Version(v) <= current, "%s: version_added %s > galaxy.yml's %s" % (path.relative_to(ROOT), v, current)
    assert found  # the pattern still finds the modules' version_added
