"""The README's user install names the system packages the sim lab builds with, as meta/ee-bindep.txt does."""

import re

from helpers.paths import REPO


def _install_section():
    text = (REPO / "README.md").read_text()
    return text.split("## Installing the collection", 1)[1].split("\n## ", 1)[0]


def _bindep_packages(platform):
    """Package names of meta/ee-bindep.txt for ``platform`` (dpkg or rpm), the optional profiles left out."""
    names = []
    for raw in (REPO / "meta" / "ee-bindep.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, selector = line.partition(" ")
        selectors = re.findall(r"[\w:]+", selector)
        if not selectors or selectors == [f"platform:{platform}"]:
            names.append(name)
    return names


def test_the_install_names_the_sim_labs_build_needs_beside_pip():
    section = _install_section()
    assert "pip install" in section
    apt = next(line for line in section.splitlines() if "apt-get install" in line).split()
    dnf = next(line for line in section.splitlines() if "dnf install" in line).split()
    for needed in ("gcc", "make", "libibverbs-dev"):
        assert needed in apt, needed
    for needed in ("gcc", "make", "rdma-core-devel"):
        assert needed in dnf, needed
    # What the execution environment installs for the controller, a user's install names too (git is for
    # playbooks/build.yml's engine checkout, kernel headers come with the rdma-core headers).
    assert set(_bindep_packages("dpkg")) - set(apt) <= {"git", "linux-libc-dev"}
    assert set(_bindep_packages("rpm")) - set(dnf) <= {"git", "kernel-headers"}
