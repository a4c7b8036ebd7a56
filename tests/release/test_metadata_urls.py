# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection names real URLs or none: no placeholder (example.invalid) in galaxy.yml, where Galaxy and
ansible-doc show them, or in the changelog, which the release renders into CHANGELOG.md."""
from __future__ import annotations

import pytest
import yaml

from release_helpers import ROOT

pytestmark = pytest.mark.fast  # reads files only

PLACEHOLDERS = ("example.invalid", "example.com", "example.org")


def test_galaxy_yml_names_no_placeholder_url():
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    for key in ("repository", "documentation", "homepage", "issues"):
        url = galaxy.get(key)
        assert url is None or not any(p in url for p in PLACEHOLDERS), (key, url)


def test_the_changelog_names_no_placeholder_url():
    files = [ROOT / "CHANGELOG.md", ROOT / "changelogs" / "changelog.yaml"]
    files += sorted((ROOT / "changelogs" / "fragments").glob("*.yml"))
    bad = [f.name for f in files if any("https://" + p in f.read_text() for p in PLACEHOLDERS)]
    assert not bad, bad
