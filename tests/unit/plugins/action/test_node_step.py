"""The node steps in one lean Python on the node (plugins/plugin_utils/_node_step.py and the action plugins on it).

The lean step runs here as the local connection runs a command (``/bin/sh -c`` with the request on stdin), in an
isolated Python (``-I``: no PYTHONPATH, so the payload alone must carry every module a job imports). Each step's
result is its module's on the same input (the module run as Ansible runs it); a bad argument fails with the
module's message before anything runs on the node; the cases Ansible must run the module itself (async, become
without pipelining, an interpreter not discovered yet, ``orbite_node_steps: module``) go to the module; a node
that answers nothing is a coded failure naming the switch, never a traceback.
"""

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from unittest import mock

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from helpers.interpreters import other_interpreter
from helpers.modules import run_module
from helpers.node_root import make_root

from ansible_collections.orbite.qualification.plugins.action import (
    control_relay,
    deploy_artifacts,
    fetch_receipts,
    node_supervisor,
    runner,
    supervised_process,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node import locks as rnic_lock
from ansible_collections.orbite.qualification.plugins.module_utils._node.client import PROGRAM_MODULES
from ansible_collections.orbite.qualification.plugins.module_utils._node_steps.entry import JOBS
from ansible_collections.orbite.qualification.plugins.plugin_utils import _node_step

ACTIONS = {m.__name__.rsplit(".", 1)[1]: m for m in (control_relay, deploy_artifacts, fetch_receipts, node_supervisor,
                                                     runner, supervised_process)}
NODE_PACKAGES = ("_common", "_node", "_node_steps", "_run")


def sh(command, sudoable=True, in_data=None):
    """What the local connection does with a command: /bin/sh -c, the data on stdin; text back."""
    del sudoable
    done = subprocess.run(["/bin/sh", "-c", command], input=in_data, capture_output=True, timeout=120, check=False)
    return {"rc": done.returncode, "stdout": done.stdout.decode(), "stderr": done.stderr.decode()}


def plugin(name, args, check_mode=False, async_val=0, become=None, has_pipelining=True):
    task = mock.Mock(args=args, check_mode=check_mode, async_val=async_val, delegate_to=None,
                     action=f"orbite.qualification.{name}")
    connection = mock.MagicMock(has_pipelining=has_pipelining, become=become, _remote_is_local=False,
                                has_native_async=False)
    connection.fetch_file.side_effect = shutil.copyfile
    action = ACTIONS[name].ActionModule(task, connection, mock.MagicMock(), DataLoader(), Templar(loader=DataLoader()),
                                        None)
    action._low_level_execute_command = mock.Mock(side_effect=sh)
    action._compute_environment_string = mock.Mock(return_value="")
    action._execute_module = mock.Mock(return_value={"changed": False, "by": "module"})
    action._remove_tmp_path = mock.Mock()
    return action


def act(name, args, check_mode=False, interpreter=sys.executable, **task_vars):
    """(the task's result, the plugin) with the host's interpreter known, as the sim inventory sets it."""
    if interpreter is not None:
        task_vars.setdefault("ansible_python_interpreter", interpreter)
    action = plugin(name, args, check_mode)
    return action.run(task_vars=task_vars), action


def lean(name, args, check_mode=False, **task_vars):
    result, action = act(name, args, check_mode, **task_vars)
    assert not action._execute_module.called, "ran as a module, not as a lean step"
    return result


def module(name, work, args, check_mode=False):
    return run_module(name, work, dict(args, _ansible_check_mode=check_mode,
                                       _ansible_module_name=f"orbite.qualification.{name}"))


def same(name, tmp_path, args, check_mode=False, module_args=None):
    """(module's result, lean step's result) on ``args`` in twin directories (``{d}`` names the twin); equal."""
    results = []
    for side in ("module", "lean"):
        twin = tmp_path / side
        twin.mkdir(exist_ok=True)
        make_root(twin / "host")
        given = json.loads(json.dumps(module_args or args if side == "module" else args).replace("{d}", str(twin)))
        results.append(module(name, twin, given, check_mode) if side == "module" else lean(name, given, check_mode))
    by_module = json.loads(json.dumps(results[0]).replace(str(tmp_path / "module"), str(tmp_path / "lean")))
    by_module.pop("exception", None)
    assert by_module == results[1]
    return results[1]


# ---------------------------------------------------------------- each step is its module


@pytest.mark.parametrize(("args", "check_mode"), [
    ({"state": "status", "run_id": "r1", "root": "{d}/host"}, False),
    ({"state": "started", "run_id": "r1", "locks": ["mlx5_0"], "root": "{d}/host"}, True),
    ({"state": "stopped", "run_id": "r1", "root": "{d}/host"}, False),
    ({"state": "started", "run_id": "r1", "root": "{d}/host"}, False),  # locks required for started
    ({"state": "started", "run_id": "r 1", "locks": ["mlx5_0"], "root": "{d}/host"}, False),  # the run_id's rule
    ({"state": "status", "run_id": "r1", "lease": "long"}, False),
    ({"state": "status", "run_id": "r1", "colour": 1}, False),
])
def test_node_supervisor_step_is_the_module(tmp_path, args, check_mode):
    result = same("node_supervisor", tmp_path, args, check_mode)
    refused = (args.get("state") == "started" and not check_mode) or "lease" in args or "colour" in args
    assert result.get("failed", False) == refused


def test_a_bad_argument_fails_on_the_controller_with_the_modules_message(tmp_path):
    result = same("node_supervisor", tmp_path, {"state": "status", "run_id": "r1", "colour": 1})
    assert result["msg"] == ("Unsupported parameters for (orbite.qualification.node_supervisor) module: colour. "
                             "Supported parameters include: boot_id, controller, deploy, force, hostname, lease, "
                             "lock_dir, lock_timeout, locks, root, run_dir, run_id, state, stop_timeout.")
    _result, action = act("node_supervisor", {"state": "status", "run_id": "r1", "colour": 1})
    assert not action._low_level_execute_command.called  # nothing ran on the node


def test_a_supervisor_started_and_stopped_by_lean_steps_holds_then_releases_its_lock(tmp_path):
    root = make_root(tmp_path / "host")
    locks = os.path.join(root, "run", "orbite", "locks")
    args = {"run_id": "r1", "root": root, "lease": 60}
    started = lean("node_supervisor", dict(args, state="started", locks=["mlx5_0"]))
    try:
        assert started["changed"] and started["running"] and not started.get("failed"), started
        assert [lock["rnic"] for lock in started["supervisor"]["locks"]] == ["mlx5_0"]
        assert not rnic_lock.probe(locks, "mlx5_0")  # held by the supervisor the step left running
        assert lean("node_supervisor", dict(args, state="status"))["supervisor"]["pid"] == started["supervisor"]["pid"]
        # The program was copied with the payload's bytecode beside each module: the supervisor compiled nothing.
        lib = os.path.join(started["run_dir"], "lib")
        for name in PROGRAM_MODULES:
            source = os.path.join(lib, *name.split(".")) + ".py"
            with open(importlib.util.cache_from_source(source), "rb") as handle:
                pyc = handle.read()
            with open(source, "rb") as handle:
                assert pyc[:4] == importlib.util.MAGIC_NUMBER and pyc[8:16] == importlib.util.source_hash(handle.read())
    finally:
        stopped = lean("node_supervisor", dict(args, state="stopped", force=True))
    assert stopped["changed"] and not stopped["running"] and rnic_lock.probe(locks, "mlx5_0")


def test_deploy_step_is_the_module_and_masks_the_content(tmp_path):
    src = tmp_path / "runner.pyz"
    src.write_bytes(b"#!/usr/bin/env python3\nprint('x')\n" * 100)
    digest = __import__("hashlib").sha256(src.read_bytes()).hexdigest()
    files = [{"name": "runner", "src": str(src), "dest": "{d}/node/orbite-sim-runner.pyz", "sha256": digest}]
    content = __import__("base64").b64encode(src.read_bytes()).decode()
    result = same("deploy_artifacts", tmp_path, {"files": files},
                  module_args={"files": [dict(files[0], content=content)]})
    assert result["changed"] and result["files"][0]["sha256"] == digest
    assert content not in json.dumps(result)  # no_log: the bytes never reach the output
    assert (tmp_path / "lean" / "node" / "orbite-sim-runner.pyz").read_bytes() == src.read_bytes()
    mismatch = lean("deploy_artifacts", {"files": [dict(files[0], sha256="0" * 64,
                                                        dest=str(tmp_path / "lean" / "other.pyz"))]})
    assert mismatch["failed"] and mismatch["code"] == "deploy.mismatch", mismatch


def test_a_supervisor_start_deploys_first_in_the_same_step_and_a_mismatch_starts_no_supervisor(tmp_path):
    root = make_root(tmp_path / "host")
    src = tmp_path / "runner.pyz"
    src.write_bytes(b"#!/usr/bin/env python3\nprint('x')\n" * 100)
    digest = __import__("hashlib").sha256(src.read_bytes()).hexdigest()
    dest = tmp_path / "node" / "orbite-sim-runner.pyz"
    files = [{"name": "runner", "src": str(src), "dest": str(dest), "sha256": digest}]
    args = {"state": "started", "run_id": "r1", "root": root, "locks": ["mlx5_0"]}
    status = {"state": "status", "run_id": "r1", "root": root}
    other = tmp_path / "node" / "other.pyz"
    bad = lean("node_supervisor", dict(args, deploy=[dict(files[0], sha256="0" * 64, dest=str(other))]))
    assert bad["failed"] and bad["code"] == "deploy.mismatch" and "supervisor" not in bad, bad
    assert bad["msg"].startswith(f"runner {other} has sha256 {digest}, the run's plan pins {'0' * 64}")
    assert not lean("node_supervisor", status)["running"]  # the files come first: no supervisor started
    started = lean("node_supervisor", dict(args, deploy=files))
    try:
        assert started["running"] and started["changed"], started
        assert started["deployed"] == [{"name": "runner", "dest": str(dest), "sha256": digest, "changed": True}]
        assert dest.read_bytes() == src.read_bytes()
        assert __import__("base64").b64encode(src.read_bytes()).decode() not in json.dumps(started)  # no_log
    finally:
        lean("node_supervisor", dict(status, state="stopped", force=True))


def test_deploy_is_refused_with_any_state_but_started_as_by_the_module(tmp_path):
    result = same("node_supervisor", tmp_path, {"state": "status", "run_id": "r1", "root": "{d}/host", "deploy": []})
    assert result["failed"] and result["code"] == "supervisor.error"
    assert result["msg"] == "deploy: only with state=started, not state=status"


def test_fetch_step_packs_on_the_node_fetches_once_and_removes_the_archive(tmp_path):
    src = tmp_path / "node" / "source"
    src.mkdir(parents=True)
    (src / "ledger.json").write_text("{}\n")
    (src / "runner.stdout").write_text("done\n")
    dest = tmp_path / "controller" / "source"
    result, action = act("fetch_receipts", {"src": str(src), "dest": str(dest)})
    assert not result.get("failed") and not action._execute_module.called, result
    assert sorted(result["fetched"]) == ["ledger.json", "runner.stdout"]
    assert (dest / "runner.stdout").read_text() == "done\n"
    assert action._connection.fetch_file.call_count == 1 and not os.path.exists(result["archive"])


@pytest.mark.parametrize(("args", "check_mode"), [
    ({"action": "launch", "run_dir": "{d}/nowhere"}, False),  # argv required for launch
    ({"action": "signal", "run_dir": "{d}/nowhere", "child_id": "c1", "pid": 4242}, False),  # start_time too
    ({"action": "launch", "run_dir": "{d}/nowhere", "argv": ["/bin/true"]}, False),  # no supervisor there
    ({"action": "wait", "run_id": "r1", "root": "{d}/host", "child_id": "c1", "pid": "x"}, False),
])
def test_supervised_process_step_is_the_module(tmp_path, args, check_mode):
    assert same("supervised_process", tmp_path, args, check_mode)["failed"] is True


def test_a_restart_kill_by_lean_steps_reaps_the_child_dead_of_sigkill(tmp_path):
    """The restart flow's kill (supervised_process signal with reap) as a lean step, against a real supervisor."""
    root = make_root(tmp_path / "host")
    args = {"run_id": "r1", "root": root, "lease": 60}
    started = lean("node_supervisor", dict(args, state="started", locks=["mlx5_0"]))
    try:
        assert started["running"], started
        common = {"run_id": "r1", "root": root}
        launched = lean("supervised_process", dict(common, action="launch",
                                                   argv=[sys.executable, "-c", "import time; time.sleep(60)"]))
        child = launched["child"]
        assert launched["changed"] and child["running"], launched
        killed = lean("supervised_process", dict(common, action="signal", child_id=child["child_id"],
                                                 pid=child["pid"], start_time=child["start_time"], reap=True))
        assert killed["changed"] and not killed["child"]["running"] and killed["child"]["exit_signal"] == 9, killed
        reused = lean("supervised_process", dict(common, action="signal", child_id=child["child_id"],
                                                 pid=child["pid"] + 1, start_time=child["start_time"]))
        assert reused["failed"] and reused["msg"].startswith("supervisor refused signal"), reused
    finally:
        lean("node_supervisor", dict(args, state="stopped", force=True))


@pytest.mark.parametrize("args", [
    {"state": "started", "state_dir": "{d}/relay"},  # listen, upstream, run_id required
    {"state": "started", "state_dir": "{d}/relay", "listen": "127.0.0.1", "upstream": "127.0.0.1:5", "run_id": "r"},
    {"state": "holding", "state_dir": "{d}/relay", "held": -1},
    {"state": "stopped", "state_dir": "{d}/relay"},  # no relay there: nothing to stop
])
def test_control_relay_step_is_the_module(tmp_path, args):
    result = same("control_relay", tmp_path, args)
    assert result.get("failed", False) == (args["state"] != "stopped"), result


def test_a_relay_started_by_a_lean_step_runs_its_program_from_the_payload_and_stops(tmp_path):
    """The relay's program is its module's own source: from the lean step's zip (a memory file), not a file."""
    upstream = __import__("socket").socket()
    upstream.bind(("127.0.0.1", 0))
    upstream.listen(1)
    state_dir = str(tmp_path / "relay")
    try:
        started = lean("control_relay", {"state": "started", "state_dir": state_dir, "listen": "127.0.0.1:0",
                                         "upstream": f"127.0.0.1:{upstream.getsockname()[1]}", "run_id": "r1",
                                         "timeout": 10})
        assert started["changed"] and started["ready"]["pid"] > 0, started
        waited = lean("control_relay", {"state": "holding", "state_dir": state_dir, "held": 0, "timeout": 5})
        assert waited["status"]["held"] == 0, waited
    finally:
        stopped = lean("control_relay", {"state": "stopped", "state_dir": state_dir})
        upstream.close()
    assert (stopped["changed"], stopped["stopped"], stopped["was_running"]) == (True, True, True), stopped


# ---------------------------------------------------------------- where the module runs as Ansible runs it


WHY = {"module": "orbite_node_steps=module", "async": "async", "become_without_pipelining":
       "the become method cannot pipeline", "no_pipelining": "the connection takes no stdin",
       "not_discovered": "the interpreter is discovered by this call"}


@pytest.mark.parametrize("how", sorted(WHY))
def test_the_module_runs_as_a_module_where_a_lean_step_cannot(how, capsys):
    args = {"state": "status", "run_id": "r1"}
    action = plugin("runner" if how == "async" else "node_supervisor",
                    {"state": "finished", "supervisor_run_dir": "/x", "output_dir": "/y", "child_id": "c"}
                    if how == "async" else args,
                    async_val=30 if how == "async" else 0,
                    become=mock.Mock(pipelining=False) if how == "become_without_pipelining" else None,
                    has_pipelining=how != "no_pipelining")
    task_vars = {"orbite_node_steps": "module"} if how == "module" else {}
    if how != "not_discovered":
        task_vars["ansible_python_interpreter"] = sys.executable
    else:
        task_vars["ansible_python_interpreter"] = "auto_silent"  # discovery needed: the module's first call does it
    with mock.patch.object(_node_step.display, "verbosity", 2):
        result = action.run(task_vars=dict(task_vars, inventory_hostname="sim-a"))
    assert result["by"] == "module" and not action._low_level_execute_command.called
    assert action._execute_module.call_args.kwargs["module_name"] == action._task.action
    assert f"<sim-a> {action._task.action}: run as a module ({WHY[how]})" in capsys.readouterr().out


def test_an_unknown_transport_is_refused_by_name():
    result, action = act("node_supervisor", {"state": "status", "run_id": "r1"}, orbite_node_steps="fast")
    assert result["failed"] and result["code"] == "node_step.transport"
    assert result["msg"] == "orbite_node_steps='fast': must be one of lean, module"
    assert not action._low_level_execute_command.called and not action._execute_module.called


def test_a_node_that_answers_nothing_is_a_coded_failure_naming_the_switch(tmp_path):
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'python: cannot start' >&2\nexit 3\n")
    broken.chmod(0o755)
    result, _action = act("node_supervisor", {"state": "status", "run_id": "r1"}, interpreter=str(broken))
    assert result["failed"] and result["code"] == "node_step.no_result" and result["rc"] == 3
    assert result["msg"] == ("orbite.qualification.node_supervisor on the node returned no result (rc=3): "
                             "python: cannot start; orbite_node_steps=module runs it as a module instead")
    assert "Traceback" not in json.dumps(result)


# ---------------------------------------------------------------- the payload and the node's end


def node(request, interpreter=sys.executable):
    """The node's answer to one request line (bytes), the payload after it, in an isolated Python."""
    done = subprocess.run([interpreter, "-I", "-c", _node_step.BOOTSTRAP], input=request + b"\n" + _node_step.PAYLOAD,
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 0 and "Traceback" not in done.stderr.decode(), done.stderr.decode()
    return json.loads(done.stdout.decode().splitlines()[-1])


@pytest.mark.parametrize("version", [None, "3.9", "3.13"])
def test_every_job_imports_from_the_payload_alone(version):
    """Each job's imports are in the payload (no PYTHONPATH under -I); another Python compiles the sources."""
    interpreter = sys.executable if version is None else other_interpreter(version)
    if interpreter is None:
        pytest.skip(f"no other Python {version} here")
    for job in JOBS:
        answer = node(json.dumps({"job": job, "params": {}, "check_mode": False}).encode(), interpreter)
        # The job ran (its first argument is missing: no AnsibleModule defaults here), nothing failed to import.
        assert answer["result"]["code"] == "error.KeyError", (job, answer)


def test_the_payload_holds_node_side_code_only():
    names = zipfile.ZipFile(io.BytesIO(_node_step.PAYLOAD)).namelist()
    prefix = "ansible_collections/orbite/qualification/plugins/module_utils/"
    packages = {name[len(prefix):].split("/")[0] for name in names if name.startswith(prefix) and name.count("/") > 5}
    assert packages <= set(NODE_PACKAGES), packages
    assert all(name.startswith(prefix) or name.endswith("/__init__.py") or name.endswith("/__init__.pyc")
               for name in names), names
    # Checked-hash bytecode beside each source (a node of this Python compiles nothing).
    assert {n[:-1] for n in names if n.endswith(".pyc")} == {n for n in names if n.endswith(".py")}


@pytest.mark.parametrize(("request_line", "message"), [
    (b"not json", "the node step's request is not one JSON object with job, params and check_mode"),
    (b'{"job": "runner"}', "the node step's request is not one JSON object with job, params and check_mode"),
    (b'{"job": "os", "params": {}, "check_mode": false}',
     "job='os': not a node step job (one of control_relay, deploy_artifacts, fetch_receipts, node_supervisor, runner, "
     "supervised_process)"),
])
def test_a_bad_request_is_refused_by_the_node(request_line, message):
    answer = node(request_line)
    assert answer["result"]["failed"] and answer["result"]["code"] == "node_step.request"
    assert answer["result"]["msg"].startswith(message), answer


def test_a_file_the_run_does_not_pin_fails_the_deploy_by_name_before_the_node(tmp_path):
    files = [{"name": "uverbs_fault", "src": None, "dest": None, "sha256": None}]
    result, action = act("deploy_artifacts", {"files": files})
    assert result["failed"] and result["code"] == "deploy.unpinned"
    assert result["msg"].startswith("files[0] (uverbs_fault): the run's artifacts pin no such file")
    assert not action._low_level_execute_command.called and not action._execute_module.called
    started, action = act("node_supervisor", {"state": "started", "run_id": "r1", "locks": ["mlx5_0"], "deploy": files})
    assert started["failed"] and started["code"] == "deploy.unpinned"
    assert started["msg"].startswith("deploy[0] (uverbs_fault): the run's artifacts pin no such file")
    assert not action._low_level_execute_command.called and not action._execute_module.called
