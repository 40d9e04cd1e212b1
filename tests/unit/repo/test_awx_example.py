"""The AWX example's collection requirement installs the collection's own version, as ansible-galaxy reads it."""

import yaml
from ansible.galaxy.dependency_resolution.versioning import meets_requirements
from helpers.paths import REPO

EXAMPLE = REPO / "docs" / "examples" / "awx" / "collections" / "requirements.yml"


def _requirement():
    (entry,) = [c for c in yaml.safe_load(EXAMPLE.read_text())["collections"] if c["name"] == "orbite.qualification"]
    return entry["version"]


def test_the_requirement_range_holds_galaxy_yml_version():
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    assert meets_requirements(version, _requirement()), f"{EXAMPLE.name}: {_requirement()} excludes {version}"


def test_the_range_pins_the_minor_series():
    """A pin, not an open range: the next minor (which may break the example's variables) is left out."""
    major, minor, _ = (int(part) for part in yaml.safe_load((REPO / "galaxy.yml").read_text())["version"].split("."))
    assert not meets_requirements(f"{major}.{minor + 1}.0", _requirement())


def test_the_check_reads_ranges_as_ansible_galaxy_does():
    assert not meets_requirements("0.2.0", ">=0.1.0,<0.2.0")  # the range the example had
