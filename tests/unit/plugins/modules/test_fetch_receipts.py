"""fetch_receipts with ``supervisor``: the case's supervisor stopped first (locks released, journal closed),
then its journal packed with the receipts, in one module call; a stop that fails still packs, and fails."""

import json
import os
import signal
import tarfile

import pytest
from helpers.modules import run_module
from helpers.node_root import make_root


@pytest.fixture
def root(tmp_path):
    make_root(tmp_path / "host")
    path = str(tmp_path / "host")
    yield path
    for name in os.listdir("/proc"):  # a supervisor a failed assertion left behind, by command line
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as handle:
                    if path.encode() in handle.read():
                        os.kill(int(name), signal.SIGKILL)
            except OSError:
                continue


def _receipts(tmp_path):
    src = tmp_path / "node" / "source"
    (src / "g1").mkdir(parents=True)
    (src / "g1" / "ledger.json").write_text(json.dumps({"status": "complete"}) + "\n")
    return str(src)


def test_the_supervisor_is_stopped_before_its_journal_is_packed(tmp_path, root):
    started = run_module("node_supervisor", tmp_path, {"state": "started", "run_id": "run-1", "locks": ["mlx5_0"],
                                                       "root": root, "lease": 60})
    assert started["running"], started
    args = {"src": _receipts(tmp_path), "dest": str(tmp_path / "dest"), "supervisor": {"run_id": "run-1", "root": root}}
    fetched = run_module("fetch_receipts", tmp_path, args)
    assert not fetched.get("failed") and fetched["stop_failed"] is False, fetched
    assert fetched["stopped"]["running"] is False and fetched["stopped"]["summary"]["locks_released"], fetched
    assert sorted(m["name"] for m in fetched["members"]) == ["g1/ledger.json", "journal.jsonl"]
    with tarfile.open(fetched["archive"]) as archive:
        events = [json.loads(line) for line in archive.extractfile("journal.jsonl").read().splitlines()]
    assert events[-1]["ev"] == "journal_close"  # packed once closed, not while the supervisor ran
    # Again (an always: section after a supervisor that already stopped): a no-op stop, the journal still there.
    again = run_module("fetch_receipts", tmp_path, args)
    assert not again.get("failed") and again["stopped"]["running"] is False and again["stopped"]["journal_exists"]
    assert "journal.jsonl" in [m["name"] for m in again["members"]]


def test_a_stop_that_fails_still_packs_the_receipts_and_fails_the_task(tmp_path, root):
    args = {"src": _receipts(tmp_path), "dest": str(tmp_path / "dest"),
            "supervisor": {"run_id": "bad run id", "root": root}}
    fetched = run_module("fetch_receipts", tmp_path, args)
    assert fetched["failed"] and fetched["stop_failed"] is True, fetched
    assert fetched["msg"].startswith("the supervisor did not stop") and "run_id 'bad run id'" in fetched["msg"]
    assert fetched["archive"] and [m["name"] for m in fetched["members"]] == ["g1/ledger.json"]


def test_the_journal_name_is_the_supervisors_with_supervisor(tmp_path, root):
    args = {"src": _receipts(tmp_path), "dest": str(tmp_path / "dest"), "files": {"journal.jsonl": "/x"},
            "supervisor": {"run_id": "run-1", "root": root}}
    fetched = run_module("fetch_receipts", tmp_path, args)
    assert fetched["failed"] and fetched["code"] == "receipts.invalid" and "files.journal.jsonl" in fetched["msg"]


def test_a_named_file_left_out_is_listed_under_a_name_ansible_does_not_read_as_skipped(tmp_path):
    """A result key ``skipped`` (a non-empty list) made Ansible take the task as skipped: it evaluated no
    failed_when (the runner role's stop check is the fetch task's failed_when) and showed the fetch as skipping."""
    missing = str(tmp_path / "node" / "relay.jsonl")
    fetched = run_module("fetch_receipts", tmp_path, {"src": _receipts(tmp_path), "dest": str(tmp_path / "dest"),
                                                      "files": {"relay.jsonl": missing}})
    assert not fetched.get("failed") and "skipped" not in fetched, fetched
    assert fetched["left_out"] == [{"name": "relay.jsonl", "path": missing, "why": "missing"}]


@pytest.fixture
def fake_source():
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_the_relay_is_stopped_by_request_before_the_supervisor_and_its_journal_packed(tmp_path, root, fake_source):
    from ansible_collections.orbite.qualification.plugins.module_utils._run import relay

    started = run_module("node_supervisor", tmp_path, {"state": "started", "run_id": "run-1", "locks": ["mlx5_0"],
                                                       "root": root, "lease": 60})
    state_dir = str(tmp_path / "relay")
    ready = relay.start_relay({"listen": "127.0.0.1:0", "upstream": fake_source, "state_dir": state_dir,
                               "hold_after_round": 3, "lease_s": 60, "defects": [], "run_id": "run-1",
                               "watch": {"pid": started["supervisor"]["pid"],
                                         "start_time": started["supervisor"]["start_time"]}})
    args = {"src": _receipts(tmp_path), "dest": str(tmp_path / "dest"),
            "files": {"relay.jsonl": os.path.join(state_dir, relay.JOURNAL_NAME)},
            "relay_state_dir": state_dir, "supervisor": {"run_id": "run-1", "root": root}}
    fetched = run_module("fetch_receipts", tmp_path, args)
    assert not fetched.get("failed") and fetched["stop_failed"] is False, fetched
    # Ended by its stop request while the supervisor it watches still ran: no kill, and its journal says so.
    assert fetched["relay"] == {"was_running": True, "stopped": True, "killed": False, "pid": ready["pid"]}, fetched
    assert relay.start_time_of(ready["pid"]) is None
    with tarfile.open(fetched["archive"]) as archive:
        events = [json.loads(line) for line in archive.extractfile("relay.jsonl").read().splitlines()]
    assert events[-1]["ev"] == "stop" and events[-1]["reason"] == "stop", events[-1]  # not watched_process_gone
    # Again (an always: section after a relay that already ended): nothing to stop.
    again = run_module("fetch_receipts", tmp_path, args)
    assert not again.get("failed") and again["relay"]["was_running"] is False, again


def test_a_relay_that_cannot_be_ended_is_a_warning_and_the_supervisor_still_stops(tmp_path, root, monkeypatch):
    # The job in this process, its relay stop failing as relay.stop_relay does when SIGKILL did not end the relay.
    from ansible_collections.orbite.qualification.plugins.module_utils._common.job import JobModule, JobReturned
    from ansible_collections.orbite.qualification.plugins.module_utils._node_steps import fetch_receipts as job
    from ansible_collections.orbite.qualification.plugins.module_utils._run import relay

    run_module("node_supervisor", tmp_path, {"state": "started", "run_id": "run-1", "locks": ["mlx5_0"],
                                             "root": root, "lease": 60})

    def never_ends(state_dir, check_mode=False):
        raise relay.RelayError(f"the relay pid 4242 in {state_dir} did not end")

    monkeypatch.setattr(relay, "stop_relay", never_ends)
    module = JobModule({"src": _receipts(tmp_path), "dest": str(tmp_path / "dest"), "patterns": job.PATTERNS,
                        "files": {}, "relay_state_dir": str(tmp_path / "relay"),
                        "supervisor": {"run_id": "run-1", "run_dir": None, "root": root, "stop_timeout": 30}},
                       check_mode=False)
    with pytest.raises(JobReturned) as returned:
        job.run(module)
    fetched = returned.value.result
    assert not fetched.get("failed") and fetched["stop_failed"] is False, fetched
    assert "did not end" in fetched["relay"]["error"], fetched
    assert module.warnings == [f"relay_state_dir={tmp_path / 'relay'}: the control relay did not stop: "
                               f"the relay pid 4242 in {tmp_path / 'relay'} did not end"]
    assert fetched["stopped"]["summary"]["locks_released"], fetched
