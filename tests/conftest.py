"""Shared test set-up: make the checkout importable as ansible_collections.orbite.qualification."""

import ctypes
import functools
import os
import shutil
import subprocess
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
# - Tests that start the simulated lab start first (they are the longest units). The lab's runners
#   bind fixed loopback addresses (the sim inventory's 127.0.0.11:7471 and 127.0.0.12:7471) and
#   namespaced hosts take probed sshd ports, so two labs in one network namespace would collide:
#   where network namespaces can be made (root), each worker enters one of its own and the lab's
#   files spread over the workers; elsewhere they all run on one worker. A test file that mentions
#   `sim_lab` (the lab's playbook, role and variables) or `mark.lab` is taken to start one.
# - Every other test file runs whole on one worker, so its module and session fixtures (a cargo
#   build, compiled observers) are made once.
# xdist's own `--dist loadgroup` would do the first part with markers, but it silently stops
# grouping on pytest >= 9.2 (pytest-dev/pytest-xdist#1386); the scheduler hook does not depend on it.
LAB_GROUP = "lab"
LAB_MENTIONS = ("sim_lab", "mark.lab")
CLONE_NEWNET = 0x40000000


@functools.cache
def workers_get_own_network():
    """Whether each xdist worker can have a network namespace of its own (root, `unshare -n` allowed,
    `ip` present); ORBITE_TEST_SHARED_NETWORK=1 keeps every lab file on one worker instead."""
    if os.environ.get("ORBITE_TEST_SHARED_NETWORK") == "1" or os.geteuid() != 0 or not shutil.which("ip"):
        return False
    probe = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, check=False)
    return probe.returncode == 0


def _enter_own_network():
    """This worker's own network namespace, loopback up (the thread that runs the tests and spawns the
    labs: a namespace belongs to a thread, and children inherit it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        raise pytest.UsageError(f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())}")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER") and workers_get_own_network():
        _enter_own_network()


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
            if not starts_the_lab(REPO_ROOT / path):
                return path
            return f"{LAB_GROUP}:{path}" if workers_get_own_network() else LAB_GROUP

        def _assign_work_unit(self, node) -> None:
            for scope in [s for s in self.workqueue if s == LAB_GROUP or s.startswith(f"{LAB_GROUP}:")]:
                self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_xdist_make_scheduler(config, log):
        if config.getvalue("dist") == "each":
            return None
        return LabScheduling(config, log)
