"""What each node module imports when it runs: a module call on a node compiles every module it imports (the AnsiballZ
payload carries sources only), so the modules that only talk to a running supervisor (runner, fetch_receipts) must
not import the supervisor program (daemon.py, the largest) nor the modules only it needs."""

import subprocess
import sys

import pytest
from helpers.paths import REPO

from ansible_collections.orbite.qualification.plugins.module_utils._node import client, daemon, protocol

COLLECTION = "ansible_collections.orbite.qualification.plugins"
PROGRAM_ONLY = ("_node.daemon", "_node.identity", "_node.journal", "_node.tree")


def _imported(module):
    """The collection's module_utils a fresh interpreter holds after importing ``module``."""
    code = (f"import sys; import {COLLECTION}.{module}; "
            f"print('\\n'.join(n for n in sys.modules if n.startswith('{COLLECTION}.module_utils.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(REPO / ".collections")})
    return {name[len(f"{COLLECTION}.module_utils."):] for name in out.stdout.split()}


@pytest.mark.parametrize("module", ["modules.runner", "modules.fetch_receipts", "modules.control_relay"])
def test_a_module_that_talks_to_a_running_supervisor_does_not_import_its_program(module):
    imported = _imported(module)
    assert "_node.client" in imported and "_node.protocol" in imported
    assert not imported & set(PROGRAM_ONLY), sorted(imported & set(PROGRAM_ONLY))


def test_the_program_is_what_a_start_copies():
    """node_supervisor's start imports the program, and copies exactly the modules it then holds."""
    modules = client.program_modules()
    assert daemon in modules and protocol in modules
    imported = _imported("module_utils._node.daemon")
    copied = {mod.__name__[len(f"{COLLECTION}.module_utils."):] for mod in modules}
    assert copied == imported - {"", "_common", "_node"}


def test_client_and_supervisor_check_a_launch_by_the_same_rules():
    assert daemon.validate_launch_request is protocol.validate_launch_request is client.validate_launch_request
    assert daemon.socket_address is client.socket_address and daemon.SOCKET_NAME == client.SOCKET_NAME
