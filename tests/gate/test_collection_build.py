"""`ansible-galaxy collection build`: the tarball ships everything the installed collection runs or documents, and
no development file (checkout tests, benchmarks, scripts, lint and tool configs), venv, cache or build output."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers.paths import REPO

# Everything under these paths ships: what an installed collection (or its ansible-test run) uses.
RUNTIME_TREES = (
    "plugins",
    "roles",
    "playbooks",
    "meta",
    "sim",
    "runners",
    "observers",
    "profiles",
    "schemas",
    "inventories",
    "docs",
    "changelogs",
    "tests/integration",
    "tests/sanity",
)
RUNTIME_FILES = ("README.md", "LICENSE", "CHANGELOG.rst", "tests/config.yml")
# Inside runtime trees, these are build outputs or caches, never sources.
NOT_SOURCES = ("observers/build", "changelogs/.plugin-cache.yaml")
DEV_PATHS = (
    "bench",
    "scripts",
    "extensions",
    ".ci",
    "Makefile",
    "pyproject.toml",
    ".ansible-lint",
    "requirements-dev.txt",
    "execution-environment.yml",
    "tests/unit",
    "tests/gate",
    "tests/fixtures",
    "tests/helpers",
    "tests/conftest.py",
    "changelogs/.plugin-cache.yaml",
)
JUNK_PARTS = {
    ".venv",
    ".collections",
    ".git",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    "target",
    "output",
}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory, ansible_env):
    out = tmp_path_factory.mktemp("tarball")
    galaxy = Path(sys.executable).parent / "ansible-galaxy"
    result = subprocess.run(
        [str(galaxy), "collection", "build", "--output-path", str(out), str(REPO)],
        env=ansible_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (archive,) = out.glob("orbite-qualification-*.tar.gz")
    with tarfile.open(archive) as tar:
        return {member.name for member in tar.getmembers() if member.isfile()}


def _checkout_files(tree):
    for dirpath, dirnames, filenames in os.walk(REPO / tree):
        rel_dir = Path(dirpath).relative_to(REPO)
        dirnames[:] = [d for d in dirnames if d not in JUNK_PARTS and str(rel_dir / d) not in NOT_SOURCES]
        for name in filenames:
            rel = str(rel_dir / name)
            if rel not in NOT_SOURCES and not name.endswith((".pyc", ".so", ".o", ".tar.gz")) and name != ".gitignore":
                yield rel


def test_tarball_ships_every_runtime_file(shipped):
    expected = {rel for tree in RUNTIME_TREES for rel in _checkout_files(tree)}
    expected |= {rel for rel in RUNTIME_FILES if (REPO / rel).is_file()}
    assert {
        "LICENSE",
        "meta/execution-environment.yml",
        "meta/ee-requirements.txt",
        "sim/__main__.py",
        "observers/Makefile",
        "changelogs/changelog.yaml",
        "plugins/modules/profile_info.py",
    } <= expected
    missing = sorted(expected - shipped)
    assert not missing, f"build_ignore in galaxy.yml drops files the installed collection needs: {missing}"
    assert "MANIFEST.json" in shipped and "FILES.json" in shipped


def test_tarball_ships_no_development_file(shipped):
    dev = sorted(n for n in shipped if any(n == p or n.startswith(p + "/") for p in DEV_PATHS))
    assert not dev, f"development files in the tarball (add them to build_ignore in galaxy.yml): {dev}"
    tests = sorted(
        n
        for n in shipped
        if n.startswith("tests/")
        and not n.startswith(("tests/integration/", "tests/sanity/"))
        and n != "tests/config.yml"
    )
    assert not tests, f"only ansible-test's tests/integration, tests/sanity and tests/config.yml ship: {tests}"


def test_tarball_ships_no_venv_cache_or_build_output(shipped):
    leaked = sorted(
        n
        for n in shipped
        if JUNK_PARTS & set(Path(n).parts)
        or n.startswith(("build/", "out/"))
        or n.endswith((".pyc", ".tar.gz", ".so", ".o"))
        or Path(n).name == ".gitignore"
    )
    assert not leaked, leaked
