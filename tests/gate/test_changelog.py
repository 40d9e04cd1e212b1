"""Release conventions: antsibull-changelog accepts the fragments and the history, CHANGELOG.rst is the one it
generates, and galaxy.yml's version is the next, unreleased one."""

import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from helpers.paths import REPO

CHANGELOG = Path(sys.executable).parent / "antsibull-changelog"


def _changelog(*args, cwd=REPO):
    result = subprocess.run([str(CHANGELOG), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
    return result.returncode, result.stdout + result.stderr


def _version(text):
    return tuple(int(part) for part in text.split("."))


def test_fragments_lint_clean():
    code, output = _changelog("lint")
    assert code == 0 and not output.strip(), output


def test_changelog_yaml_lints_clean():
    code, output = _changelog("lint-changelog-yaml", "changelogs/changelog.yaml")
    assert code == 0 and not output.strip(), output


def test_changelog_rst_is_generated_from_the_history(tmp_path):
    # generate reads changelog.yaml only (no ansible-doc), so a copy of the metadata is enough.
    shutil.copytree(REPO / "changelogs", tmp_path / "changelogs")
    shutil.copy(REPO / "galaxy.yml", tmp_path)
    code, output = _changelog("generate", cwd=tmp_path)
    assert code == 0, output
    assert (tmp_path / "CHANGELOG.rst").read_text() == (REPO / "CHANGELOG.rst").read_text(), (
        "CHANGELOG.rst differs from what antsibull-changelog generates: run antsibull-changelog generate"
    )
    assert not (REPO / "CHANGELOG.md").exists(), "CHANGELOG.rst is the changelog; a second one would drift"


def test_galaxy_version_is_the_next_release():
    releases = yaml.safe_load((REPO / "changelogs" / "changelog.yaml").read_text())["releases"]
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    assert "0.1.0" in releases
    assert all(_version(version) > _version(released) for released in releases), (
        f"galaxy.yml version {version} must be newer than every release in changelog.yaml ({sorted(releases)})"
    )
