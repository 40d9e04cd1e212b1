"""Shared test set-up: make the checkout importable as ansible_collections.orbite.qualification."""

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
COLLECTIONS = REPO_ROOT / ".collections"
_LINK = COLLECTIONS / "ansible_collections" / "orbite" / "qualification"

if not _LINK.exists():
    _LINK.parent.mkdir(parents=True, exist_ok=True)
    os.symlink("../../..", _LINK)
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
# tests/helpers: shared test helpers (e.g. running the simulated runner pair without Ansible)
if str(REPO_ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(REPO_ROOT / "tests"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def ansible_env() -> dict:
    """Environment for ansible-playbook / ansible subprocesses run from the checkout."""
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(REPO_ROOT / "ansible.cfg")
    env["ANSIBLE_COLLECTIONS_PATH"] = str(COLLECTIONS)
    env["ANSIBLE_NOCOLOR"] = "1"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env
