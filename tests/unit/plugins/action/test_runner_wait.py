"""The runner's polled wait as one task result (plugins/action/runner.py): the action calls the wait again itself
until the runner exited or a call failed, prints each call's progress line, and never needs until/retries (whose
every retry a callback shows as FAILED - RETRYING)."""

from unittest import mock

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

from ansible_collections.orbite.qualification.plugins.action import runner

START = {"state": "started", "supervisor_run_dir": "/run/s", "output_dir": "/out/g1", "timeout": 900.0, "poll": 3.0,
         "label": "read-polling", "role": "requester", "run_id": "r", "profile": {}, "registration_id": "x",
         "runner_argv": ["/usr/bin/python3", "/r.pyz"]}


def _wait(seq, finished, line=None, **extra):
    return {"changed": False, "child": {"child_id": "c1", "running": not finished, "seq": seq}, "finished": finished,
            "progress_line": line or f"case read-polling requester g1 round {seq}/3", **extra}


def _run(args, results, check_mode=False):
    task = mock.Mock(args=args, check_mode=check_mode, async_val=0, delegate_to=None,
                     action="orbite.qualification.runner")
    action = runner.ActionModule(task, mock.MagicMock(), mock.MagicMock(), DataLoader(), Templar(loader=DataLoader()),
                                 None)
    action.run_step = mock.Mock(side_effect=results)
    with mock.patch.object(runner.display, "display") as shown:
        result = action.run(task_vars={"inventory_hostname": "sim-b"})
    return result, action.run_step.call_args_list, [call.args[0] for call in shown.call_args_list]


def test_the_start_waits_until_the_runner_exits_printing_each_poll():
    first = dict(_wait(1, False), changed=True, invocation={"module_args": {"state": "started"}})
    result, calls, lines = _run(START, [first, _wait(2, False), _wait(3, True, ledger="/out/g1/ledger.json")])
    assert result["finished"] is True and result["ledger"] == "/out/g1/ledger.json" and not result.get("failed")
    assert result["changed"] is True and result["invocation"] == {"module_args": {"state": "started"}}
    assert lines == [f"[sim-b] case read-polling requester g1 round {n}/3" for n in (1, 2, 3)]
    # The later calls are the same runner's wait, with the task's wait arguments and no start option.
    assert [call.args[1] for call in calls[1:]] == [
        {"state": "finished", "child_id": "c1", "supervisor_run_dir": "/run/s", "output_dir": "/out/g1",
         "timeout": 900.0, "poll": 3.0, "label": "read-polling"}] * 2


def test_a_failed_poll_ends_the_wait_failed_once():
    timeout = {"failed": True, "code": "timeout", "msg": "runner child c1 (pid 7) still runs after 900.0 s"}
    result, calls, lines = _run(START, [_wait(1, False), _wait(2, False), timeout, _wait(3, True)])
    assert result["failed"] is True and result["code"] == "timeout" and len(calls) == 3
    assert len(lines) == 2


def test_a_wait_without_poll_or_in_check_mode_is_one_call():
    plain = {key: value for key, value in START.items() if key != "poll"}
    for args, check_mode in ((plain, False), (START, True)):
        result, calls, _ = _run(args, [_wait(1, False), _wait(2, True)], check_mode=check_mode)
        assert len(calls) == 1 and result["finished"] is False
