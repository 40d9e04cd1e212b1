"""What each node module imports when it runs: a module call on a node compiles every module it imports (the AnsiballZ
payload carries sources only), so the modules that only talk to a running supervisor (runner, fetch_receipts) and a
supervisor's start (which copies the program, then the program compiles itself) must not import the supervisor
program (daemon.py, the largest) nor the modules only it needs."""

import os
import subprocess
import sys

import pytest
from helpers.node_root import make_root
from helpers.paths import REPO

from ansible_collections.orbite.qualification.plugins.module_utils._node import client, daemon, protocol

COLLECTION = "ansible_collections.orbite.qualification.plugins"
PROGRAM_ONLY = ("_node.daemon", "_node.identity", "_node.journal", "_node.tree")


def _imported(module, then="", *args):
    """The collection's module_utils a fresh interpreter holds after importing ``module`` (and running ``then``)."""
    code = (f"import sys; import {COLLECTION}.{module} as m; {then + '; ' if then else ''}"
            f"print('\\n'.join(n for n in sys.modules if n.startswith('{COLLECTION}.module_utils.')))")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(REPO / ".collections"), "PATH": os.environ["PATH"]})
    return {name[len(f"{COLLECTION}.module_utils."):] for name in out.stdout.split()}


@pytest.mark.parametrize("module", ["modules.runner", "modules.fetch_receipts", "modules.control_relay",
                                    "modules.node_supervisor"])
def test_a_module_that_talks_to_a_running_supervisor_does_not_import_its_program(module):
    imported = _imported(module)
    assert "_node.client" in imported and "_node.protocol" in imported
    assert not imported & set(PROGRAM_ONLY), sorted(imported & set(PROGRAM_ONLY))


def test_a_start_copies_the_program_without_importing_it(tmp_path):
    """A real start and stop in a fresh interpreter: the program runs in the supervisor, not in the module."""
    root = make_root(tmp_path / "root")
    start = ("run_dir = m.default_run_dir(sys.argv[1], 'imports-1'); "
             "m.start_supervisor(run_dir, 'imports-1', ['mlx5_0'], m.default_lock_dir(sys.argv[1]), root=sys.argv[1], "
             "lease=30, lock_timeout=2); m.stop_supervisor(run_dir, force=True)")
    imported = _imported("module_utils._node.client", start, root)
    assert "_node.protocol" in imported and not imported & set(PROGRAM_ONLY), sorted(imported & set(PROGRAM_ONLY))


def test_the_program_is_daemon_and_what_it_imports():
    copied = {name[len(f"{COLLECTION}.module_utils."):] for name in client.PROGRAM_MODULES}
    assert copied == _imported("module_utils._node.daemon") - {"", "_common", "_node"}


def test_client_and_supervisor_check_a_launch_by_the_same_rules():
    assert daemon.validate_launch_request is protocol.validate_launch_request is client.validate_launch_request
    assert daemon.socket_address is client.socket_address and daemon.SOCKET_NAME == client.SOCKET_NAME
