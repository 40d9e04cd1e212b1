"""The supervised_process module, run as Ansible runs it: each action's required options, then the real supervisor.

Its required_if used to be keyed on the action's value instead of the option name "action", so it
never fired and a launch without argv reached the supervisor; these tests fail on that code.
"""

import hashlib
import sys

import pytest
from helpers.modules import run_module as run_helper
from helpers.node_root import supervised_host


BOOT = "0f0e0d0c-0b0a-4998-8776-655443322110"


def run_module(tmp_path, **args):
    return run_helper("supervised_process", tmp_path, args)


@pytest.mark.parametrize(
    ("action", "given", "missing"),
    [
        ("launch", {}, "argv"),
        ("wait", {}, "child_id"),
        ("signal", {}, "child_id, pid, start_time"),
        ("signal", {"child_id": "c1", "pid": 4242}, "start_time"),
    ],
)
def test_each_action_requires_its_options_before_any_supervisor_is_asked(tmp_path, action, given, missing):
    # No supervisor runs there: with the old required_if the message was "no supervisor socket".
    result = run_module(tmp_path, action=action, run_dir=str(tmp_path / "nowhere"), **given)
    assert result["failed"] is True
    assert result["msg"] == f"action is {action} but all of the following are missing: {missing}"


def test_options_of_other_actions_are_not_required(tmp_path):
    # launch does not need child_id, pid or start_time: it gets past argument checking to the socket.
    result = run_module(tmp_path, action="launch", run_dir=str(tmp_path / "nowhere"), argv=["/bin/true"])
    assert result["failed"] is True
    assert result["code"] == "supervisor.error" and result["error"] == "SupervisorNotRunning"
    assert "no supervisor socket" in result["msg"]


@pytest.fixture
def supervisor(tmp_path):
    """A real supervisor on a minimal fake host root; stopped (children killed) afterwards."""
    with supervised_host(tmp_path) as (root, _run_dir):
        yield root


def test_launch_wait_and_signal_through_the_module(tmp_path, supervisor):
    common = {"run_id": "run-1", "root": supervisor}
    launched = run_module(tmp_path, action="launch", argv=[sys.executable, "-c", "import time; time.sleep(60)"],
                          env={"PATH": "/usr/bin:/bin", "RDMAV_ALLOW_DISASSOC_DESTROY": "1"}, **common)
    assert launched["changed"] is True and launched["env_stripped"] == ["RDMAV_ALLOW_DISASSOC_DESTROY"]
    child = launched["child"]
    waited = run_module(tmp_path, action="wait", child_id=child["child_id"], timeout=0.1, **common)
    assert waited["timed_out"] is True and waited["child"]["running"] is True
    # A start time that is not the child's is refused: a reused pid is never signalled.
    refused = run_module(tmp_path, action="signal", child_id=child["child_id"], pid=child["pid"],
                         start_time=child["start_time"] + 1, **common)
    assert refused["failed"] is True and refused["msg"].startswith("supervisor refused signal")
    killed = run_module(tmp_path, action="signal", child_id=child["child_id"], pid=child["pid"],
                        start_time=child["start_time"], **common)
    assert killed["child"]["running"] is False and killed["child"]["exit_signal_name"] == "SIGKILL"


def test_launch_pins_argv_entries_given_as_yaml_text_keys(tmp_path, supervisor):
    common = {"run_id": "run-1", "root": supervisor}
    script = tmp_path / "runner.py"
    script.write_text("import sys\nopen(sys.argv[2], 'w').write(open(sys.argv[1]).read())\n")
    case = tmp_path / "case.json"
    case.write_text('{"role": "source"}')
    out = tmp_path / "out"
    sha = hashlib.sha256(script.read_bytes()).hexdigest()
    launched = run_module(tmp_path, action="launch", argv=[sys.executable, str(script), str(case), str(out)],
                          argv_pins={"1": sha, "2": None}, record_json=[2], **common)
    assert [(p["what"], p.get("json")) for p in launched["pinned"]] == [("argv[1]", None),
                                                                      ("argv[2]", {"role": "source"})]
    assert launched["pinned"][0]["sha256"] == sha and "pinned" not in launched["child"]
    run_module(tmp_path, action="wait", child_id=launched["child"]["child_id"], timeout=20, **common)
    assert out.read_text() == '{"role": "source"}'
    bad = run_module(tmp_path, action="launch", argv=[sys.executable, str(script)], argv_pins={"one": None}, **common)
    assert bad["failed"] is True and "argv_pins key 'one': must be an argv index" in bad["msg"]
    mismatch = run_module(tmp_path, action="launch", argv=[sys.executable, str(script)], argv_pins={"1": "0" * 64},
                          **common)
    assert mismatch["failed"] is True and mismatch["error"] == "supervisor.hash_mismatch"
