"""Shared test set-up: make the checkout importable as ansible_collections.orbite.qualification."""

import functools
import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
COLLECTIONS = REPO_ROOT / ".collections"
_LINK = COLLECTIONS / "ansible_collections" / "orbite" / "qualification"

if not _LINK.exists():
    _LINK.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.symlink("../../..", _LINK)
    except FileExistsError:  # another pytest-xdist worker made it first
        pass
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


# pytest-xdist (`make unit` runs `pytest -n auto`): a scheduler of our own decides what runs together.
# - Tests that start the simulated lab all run on one worker, and start first (they are the longest
#   unit): the lab's runners bind fixed loopback addresses (the sim inventory's 127.0.0.11:7471 and
#   127.0.0.12:7471) and namespaced hosts take probed sshd ports, so two labs at once would collide.
#   A test file that mentions `sim_lab` (the lab's playbook, role and variables) or `mark.lab` is
#   taken to start one.
# - Every other test file runs whole on one worker, so its module and session fixtures (a cargo
#   build, compiled observers) are made once.
# xdist's own `--dist loadgroup` would do the first part with markers, but it silently stops
# grouping on pytest >= 9.2 (pytest-dev/pytest-xdist#1386); the scheduler hook does not depend on it.
LAB_GROUP = "lab"
LAB_MENTIONS = ("sim_lab", "mark.lab")


@functools.cache
def starts_the_lab(path: Path) -> bool:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return any(mention in text for mention in LAB_MENTIONS)


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pytest-xdist absent: tests run in one process, nothing to schedule
    LoadScopeScheduling = None

if LoadScopeScheduling is not None:

    class LabScheduling(LoadScopeScheduling):
        """Whole test files per worker; all the lab's files as one unit, handed out first."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return LAB_GROUP if starts_the_lab(REPO_ROOT / path) else path

        def _assign_work_unit(self, node) -> None:
            if LAB_GROUP in self.workqueue:
                self.workqueue.move_to_end(LAB_GROUP, last=False)
            super()._assign_work_unit(node)

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_xdist_make_scheduler(config, log):
        if config.getvalue("dist") == "each":
            return None
        return LabScheduling(config, log)
