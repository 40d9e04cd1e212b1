"""The execution environment: `ansible-builder create` makes a build context that installs this collection from its
tarball, and the installed collection declares its controller requirements (offline; no container engine)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from bindep.depends import Depends
from helpers.paths import REPO

BIN = Path(sys.executable).parent
# Dev tools that must never reach an execution environment through the collection's metadata.
DEV_ONLY = {
    "pytest",
    "hypothesis",
    "ruff",
    "ansible-lint",
    "molecule",
    "jsonschema",
    "ansible-builder",
    "antsibull-changelog",
    "ansible-core",
}


def _run(argv, env, cwd=None):
    result = subprocess.run(
        [str(a) for a in argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, f"{argv}: {result.stdout}{result.stderr}"
    return result.stdout + result.stderr


def _requirement_lines(path):
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def _name(requirement):
    return re.split(r"[<>=!~\[;\s]", requirement, maxsplit=1)[0].lower().replace("_", "-")


@pytest.fixture(scope="module")
def context(tmp_path_factory, ansible_env):
    """A copy of the checkout's layout that ansible-builder sees: execution-environment.yml beside build/<tarball>."""
    root = tmp_path_factory.mktemp("ee")
    _run([BIN / "ansible-galaxy", "collection", "build", "--output-path", root / "build", REPO], ansible_env)
    shutil.copy(REPO / "execution-environment.yml", root)
    output = _run(
        [
            BIN / "ansible-builder",
            "create",
            "-f",
            root / "execution-environment.yml",
            "-c",
            root / "ctx",
            "--output-filename",
            "Containerfile",
        ],
        ansible_env,
    )
    return root, output


def test_create_makes_a_build_context_holding_the_collection_tarball(context):
    root, output = context
    # ansible-builder only warns when an additional build file is missing; a missing tarball must fail here.
    assert "No matches" not in output and "does not exist" not in output, f"a build file is missing: {output}"
    (tarball,) = (root / "build").glob("orbite-qualification-*.tar.gz")
    copied = root / "ctx" / "_build" / "collections" / tarball.name
    assert copied.is_file(), (
        f"execution-environment.yml does not copy {tarball.name} (galaxy.yml's version) into the build context; "
        f"update its additional_build_files and galaxy requirement to that version"
    )
    assert copied.read_bytes() == tarball.read_bytes()
    requirements = yaml.safe_load((root / "ctx" / "_build" / "requirements.yml").read_text())
    # ansible-galaxy runs in /build, where the context's _build directory is copied.
    assert requirements == {"collections": [{"name": f"/build/collections/{tarball.name}", "type": "file"}]}


def test_containerfile_installs_the_collection_then_its_declared_requirements(context):
    root, _ = context
    text = (root / "ctx" / "Containerfile").read_text()
    galaxy = text.index("ansible-galaxy collection install")
    introspect = text.index("introspect.py introspect")
    bindep = text.index("install-from-bindep")
    assert galaxy < introspect < bindep, "the collection must be installed before its requirements are introspected"
    assert "COPY _build /build" in text


def test_execution_environment_uses_the_supported_ansible_core_range(context):
    root, _ = context
    refs = re.search(r'^ARG ANSIBLE_INSTALL_REFS="(.*)"$', (root / "ctx" / "Containerfile").read_text(), re.M)
    assert refs, "the Containerfile installs no ansible-core"
    dev = [line for line in _requirement_lines(REPO / "requirements-dev.txt") if _name(line) == "ansible-core"]
    assert dev and dev[0] in refs.group(1).split(), (
        f"execution-environment.yml installs {refs.group(1)!r}; requirements-dev.txt says {dev}: keep them equal"
    )


def test_installed_collection_declares_its_controller_requirements(context, ansible_env):
    """What the image build's introspection step (the context's own script) finds in the installed tarball."""
    root, _ = context
    (tarball,) = (root / "build").glob("orbite-qualification-*.tar.gz")
    installed = root / "installed"
    _run(
        [BIN / "ansible-galaxy", "collection", "install", "--force", "--offline", "-p", installed, tarball], ansible_env
    )
    out = root / "introspected"
    _run(
        [
            sys.executable,
            root / "ctx" / "_build" / "scripts" / "introspect.py",
            "introspect",
            installed,
            "--write-pip",
            out / "requirements.txt",
            "--write-bindep",
            out / "bindep.txt",
        ],
        ansible_env,
    )
    pip = {_name(line) for line in _requirement_lines(out / "requirements.txt")}
    declared = {_name(line) for line in _requirement_lines(REPO / "meta" / "ee-requirements.txt")}
    # ansible-builder drops what ansible-core already brings (PyYAML).
    assert pip == declared - {"pyyaml"}, (pip, declared)
    assert "netaddr" in pip
    bindep = [line.split("#")[0].strip() for line in _requirement_lines(out / "bindep.txt")]
    assert bindep == _requirement_lines(REPO / "meta" / "ee-bindep.txt")


def test_runtime_requirements_hold_no_development_tool():
    runtime = {_name(line) for line in _requirement_lines(REPO / "meta" / "ee-requirements.txt")}
    assert not runtime & DEV_ONLY, runtime & DEV_ONLY
    assert "-r meta/ee-requirements.txt" in _requirement_lines(REPO / "requirements-dev.txt")


@pytest.mark.parametrize(
    ("profiles", "wanted", "unwanted"),
    [
        # What ansible-builder installs on its dnf-based images (the default profile).
        (
            ["platform:rpm", "platform:redhat", "default"],
            {"openssh-clients", "git", "make", "gcc", "rdma-core-devel", "kernel-headers"},
            {"python3-pyverbs", "openssh-client", "libibverbs-dev"},
        ),
        (
            ["platform:dpkg", "default"],
            {"openssh-client", "git", "make", "gcc", "libibverbs-dev"},
            {"python3-pyverbs", "openssh-clients", "rdma-core-devel"},
        ),
        # The verbs cross-check's binding only when asked for (profile "verbs").
        (["platform:rpm", "verbs"], {"python3-pyverbs", "openssh-clients"}, {"libibverbs-dev"}),
    ],
)
def test_bindep_file_selects_packages_per_platform(profiles, wanted, unwanted):
    packages = {rule[0] for rule in Depends((REPO / "meta" / "ee-bindep.txt").read_text()).active_rules(profiles)}
    assert wanted <= packages, wanted - packages
    assert not packages & unwanted, packages & unwanted
