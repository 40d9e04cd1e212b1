"""scripts/galaxy_import.py: which galaxy-importer warnings are known (each with the reason it stays) and how the
release step names the repository. The importer itself runs in `make galaxy-import` (its own venv); these tests
read the script's rules without it."""

import importlib.util
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from helpers.paths import REPO

W503 = "plugins/module_utils/_verify/rules/mrs.py:25:17: W503 line break before binary operator"
E999 = "plugins/filter/gid_to_ip.yml:6:61: E999 SyntaxError: invalid decimal literal"
LINT = "ERROR    Failed to find orbite.qualification.rail_accounting playbook."
IGNORES = "Ignore files skip ansible-test sanity tests, found ignore-2.19.txt with 22 statement(s)"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("galaxy_import", REPO / "scripts" / "galaxy_import.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_known_warning_is_counted_under_its_reason(script):
    counts, unexplained = script.classify([W503, W503, E999, LINT, IGNORES], {"rail_accounting"})
    assert unexplained == []
    assert counts == {"flake8 W503": 2, "flake8 E999 on filter docs": 1, "ansible-lint cannot find an own playbook": 1,
                      "sanity ignore files": 1}
    assert all(known.reason for known in script.KNOWN)


@pytest.mark.parametrize("warning", [
    # fixed in our code: slices written without the space before ':'; conditions that break after an operator
    "plugins/module_utils/_sim/hosts.py:210:48: E203 whitespace before ':'",
    "plugins/module_utils/_run/plan.py:102:85: W504 line break after binary operator",
    # E999 is known for the filters' YAML docs only: in Python it is a real syntax error
    "plugins/modules/runner.py:3:1: E999 SyntaxError: invalid syntax",
    "syntax-check[unknown-module]: couldn't resolve module/action 'orbite.qualification.nope'",
])
def test_any_other_warning_is_unexplained(script, warning):
    assert script.classify([W503, warning], {"rail_accounting"}) == ({"flake8 W503": 1}, [warning])


def test_a_missing_playbook_is_unexplained_even_in_the_known_form(script):
    missing = "ERROR    Failed to find orbite.qualification.rail_acounting playbook."
    assert script.classify([missing], {"rail_accounting"}) == ({}, [missing])


def test_the_playbooks_are_read_from_the_tarball(script, tmp_path):
    tarball = tmp_path / "orbite-qualification-0.2.0.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        names = ("playbooks/rail_accounting.yml", "playbooks/vars/rail_accounting.yml", "docs/examples/awx/survey.json")
        for name in names:
            info = tarfile.TarInfo(name)
            archive.addfile(info, io.BytesIO(b""))
    assert script.tarball_playbooks(tarball) == {"rail_accounting"}


def test_the_sanity_ignore_files_hold_the_license_statement_only(script):
    """What the known 'sanity ignore files' warning's reason says: one GPLv3-header statement per module."""
    plugins = {path.relative_to(REPO).as_posix() for path in (REPO / "plugins").glob("*/*.py")
               if path.parent.name in ("modules", "lookup") and path.name != "__init__.py"}
    files = sorted((REPO / "tests" / "sanity").glob("ignore-2.*.txt"))
    assert files
    for path in files:
        statements = [line.split(" # ")[0].split() for line in path.read_text().splitlines() if line.strip()]
        assert {code for _, code in statements} == {"validate-modules:missing-gplv3-license"}, path.name
        assert {name for name, _ in statements} <= plugins, path.name


def test_the_release_names_the_repository_in_galaxy_yml(script):
    galaxy_yml = (REPO / "galaxy.yml").read_text()
    assert "repository" not in yaml.safe_load(galaxy_yml), "galaxy.yml names a repository: drop the release input"
    released = yaml.safe_load(script.release_galaxy_yml(galaxy_yml, "https://github.com/orbite/qualification"))
    assert released == {**yaml.safe_load(galaxy_yml), "repository": "https://github.com/orbite/qualification"}


@pytest.mark.parametrize("url", ["", "github.com/orbite/qualification", "http://github.com/orbite/q",
                                 "https://github.com", "https://git hub.com/o/q"])
def test_the_release_refuses_a_repository_that_is_no_https_url(script, url):
    with pytest.raises(ValueError, match=r"^repository='.*': must be the collection's https:// URL"):
        script.release_galaxy_yml((REPO / "galaxy.yml").read_text(), url)


def test_the_release_refuses_a_second_repository(script):
    with pytest.raises(ValueError, match="names a repository already"):
        script.release_galaxy_yml("namespace: orbite\nrepository: https://a.example/o/q\n", "https://b.example/o/q")


def test_the_release_rebuilds_the_tested_files_naming_the_repository(script, tmp_path):
    """The release tarball holds exactly the built tarball's files; only MANIFEST.json gains the repository."""
    source = tmp_path / "src"
    (source / "plugins" / "modules").mkdir(parents=True)
    (source / "plugins" / "modules" / "thing.py").write_text("# a module\n")
    (source / "README.md").write_text("# demo\n")
    galaxy_yml = "namespace: demo\nname: coll\nversion: 1.2.3\nreadme: README.md\nauthors: [someone]\n"
    (source / "galaxy.yml").write_text(galaxy_yml)
    built = tmp_path / "built"
    subprocess.run([Path(sys.executable).parent / "ansible-galaxy", "collection", "build", "--output-path",
                    str(built), str(source)], check=True, stdout=subprocess.DEVNULL)
    (source / "plugins" / "modules" / "later.py").write_text("# not in the tested tarball\n")
    tarball = built / "demo-coll-1.2.3.tar.gz"
    released = script.release_build("https://example.invalid/demo/coll", tarball, tmp_path / "release",
                                     source / "galaxy.yml")
    assert released == tmp_path / "release" / "demo-coll-1.2.3.tar.gz"
    with tarfile.open(tarball) as before, tarfile.open(released) as after:
        assert sorted(before.getnames()) == sorted(after.getnames())
        manifest = json.load(after.extractfile("MANIFEST.json"))
        assert json.load(before.extractfile("MANIFEST.json"))["collection_info"]["repository"] is None
    assert manifest["collection_info"]["repository"] == "https://example.invalid/demo/coll"
    assert (source / "galaxy.yml").read_text() == galaxy_yml  # the checkout's galaxy.yml is left as it was
