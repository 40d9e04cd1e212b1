"""The runner module, run as Ansible runs it, against a real supervisor and a fake runner.

On main a ready.json that was not an object was a traceback (AttributeError), a FIFO in its place
hung the module forever, and a run or registration name with a trailing newline was accepted.
Each case here is a coded failure instead.
"""

import json
import os
import re
import sys

import pytest
from helpers.modules import run_module as run_helper
from helpers.node_root import events, supervised_host

from ansible_collections.orbite.qualification.plugins.module_utils._node.client import SupervisorClient

BOOT = "0f0e0d0c-0b0a-4998-8776-655443322110"

# The fake runner: writes what ORBITE_TEST_READY says in place of ready.json, then waits.
FAKE_RUNNER = """#!{python}
import json, os, sys, time
out = sys.argv[sys.argv.index("--output") + 1]
path = os.path.join(out, "ready.json")
kind = os.environ.get("ORBITE_TEST_READY", "ok")
if kind == "list":
    open(path, "w").write("[1, 2, 3]")
elif kind == "string":
    open(path, "w").write('"ready"')
elif kind == "huge":
    open(path, "w").write('{{"pad": "' + "x" * (1 << 20) + '"}}')
elif kind == "fifo":
    os.mkfifo(path)
elif kind == "symlink":
    os.symlink("/etc/hostname", path)
elif kind == "deep":
    open(path, "w").write("[" * 30000 + "]" * 30000)
elif kind == "ok":
    open(path, "w").write(json.dumps({{"pid": os.getpid(), "service_address": "127.0.0.1:1"}}))
time.sleep(60)
"""


def run_module(tmp_path, timeout=60, **args):
    return run_helper("runner", tmp_path, args, timeout=timeout)


@pytest.fixture
def supervisor(tmp_path):
    with supervised_host(tmp_path) as (_root, run_dir):
        yield run_dir


@pytest.fixture
def fake_runner(tmp_path):
    path = tmp_path / "fake-runner"
    path.write_text(FAKE_RUNNER.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


def _source_args(tmp_path, run_dir, runner, **extra):
    args = {
        "state": "started", "supervisor_run_dir": run_dir, "runner_argv": [runner],
        "output_dir": str(tmp_path / "out"), "role": "source", "run_id": "run-1", "profile": {},
        "rails": [{"device": "mlx5_0", "port": 1, "gid_index": 0}], "service_address": "127.0.0.1:0",
        "registration_id": "reg-1", "ready_timeout": 3,
    }
    args.update(extra)
    return args


@pytest.mark.parametrize(
    ("kind", "needle"),
    [
        ("list", "holds [1, 2, 3]; rule: a JSON object"),
        ("string", "holds 'ready'; rule: a JSON object"),
        ("huge", "is larger than 65536 bytes"),
        ("fifo", "is a FIFO, not a regular file"),
        ("symlink", "a symbolic link"),
        ("deep", "nested too deeply"),
    ],
)
def test_a_ready_file_that_is_not_a_small_json_object_is_a_coded_error(tmp_path, supervisor, fake_runner, kind,
                                                                      needle):
    result = run_module(tmp_path, **_source_args(tmp_path, supervisor, fake_runner, env={"ORBITE_TEST_READY": kind}))
    assert result["failed"] is True and result["code"] == "runner.ready_invalid", result
    assert needle in result["msg"]


def test_a_good_ready_file_starts_the_source(tmp_path, supervisor, fake_runner):
    result = run_module(tmp_path, **_source_args(tmp_path, supervisor, fake_runner,
                                                 env={"ORBITE_TEST_READY": "ok", "LD_AUDIT": "/x.so"}))
    assert result.get("failed") is not True, result
    assert result["ready"]["pid"] == result["child"]["pid"]
    assert result["env_stripped"] == ["LD_AUDIT"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("run_id", "run-1\n"),
        ("registration_id", "reg-1\n"),
        ("registration_id", "reg\u20121"),  # a figure dash, not '-'
        ("peer_registration_id", " reg-0"),
        ("rails", [{"device": "mlx5_0\n", "port": 1, "gid_index": 0}]),
    ],
)
def test_names_break_the_grammar_before_anything_is_written(tmp_path, supervisor, fake_runner, field, value):
    result = run_module(tmp_path, **_source_args(tmp_path, supervisor, fake_runner, **{field: value}))
    assert result["failed"] is True and result["code"] == "runner.bad_input", result
    assert "must be 1..64 ASCII letters" in result["msg"]
    assert not (tmp_path / "out").exists() and SupervisorClient(supervisor).status()["children"] == []


def _sha256(path):
    import hashlib

    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_the_runner_script_and_the_case_file_are_pinned_and_journaled(tmp_path, supervisor, fake_runner):
    """runner_sha256 pins the last element of runner_argv (here the script an interpreter runs, as the
    simulated runner's zipapp is); the case file is handed over pinned too and journaled whole, with the
    verbs library it names."""
    library = tmp_path / "libibverbs.so.1"
    library.write_bytes(b"\x7fELF not really")
    args = _source_args(tmp_path, supervisor, fake_runner, runner_argv=[sys.executable, fake_runner],
                        runner_sha256=_sha256(fake_runner), env={"ORBITE_TEST_READY": "ok"},
                        verbs_library={"path": str(library), "sha256": _sha256(library)})
    result = run_module(tmp_path, **args)
    assert result.get("failed") is not True, result
    pinned = {p["what"]: p for p in result["child"]["pinned"]}
    assert pinned["argv[1]"]["sha256"] == _sha256(fake_runner)
    assert pinned["argv[3]"]["json"]["verbs_library"] == {"path": str(library), "sha256": _sha256(library)}
    case = (tmp_path / "out" / "case.json").read_text()
    assert '"verbs_library"' in case


@pytest.mark.parametrize("what", ["runner", "verbs_library"])
def test_a_runner_or_verbs_library_that_is_not_its_pin_never_runs(tmp_path, supervisor, fake_runner, what):
    library = tmp_path / "libibverbs.so.1"
    library.write_bytes(b"\x7fELF not really")
    wrong = "0" * 64
    args = _source_args(tmp_path, supervisor, fake_runner, runner_argv=[sys.executable, fake_runner],
                        runner_sha256=wrong if what == "runner" else _sha256(fake_runner),
                        verbs_library={"path": str(library), "sha256": wrong if what == "verbs_library"
                                       else _sha256(library)})
    result = run_module(tmp_path, **args)
    assert result["failed"] is True and result["code"] == "runner.hash_mismatch", result
    assert SupervisorClient(supervisor).status()["children"] == []


def test_the_polled_wait_shows_progress_renews_the_lease_and_keeps_the_overall_timeout(tmp_path, supervisor,
                                                                                       fake_runner):
    started = run_module(tmp_path, **_source_args(tmp_path, supervisor, fake_runner, env={"ORBITE_TEST_READY": "ok"}))
    child = started["child"]
    out = tmp_path / "out"
    wait = {"state": "finished", "supervisor_run_dir": supervisor, "output_dir": str(out),
            "child_id": child["child_id"], "timeout": 60, "poll": 0.3, "label": "read-polling"}
    journal = os.path.join(supervisor, "journal.jsonl")

    before = len(events(journal, "lease_renew"))
    nothing = run_helper("runner", tmp_path, wait)
    assert nothing["finished"] is False and nothing["progress"] is None, nothing
    assert re.fullmatch(r"case read-polling: no progress reported yet \(\d+\.\d s\)", nothing["progress_line"])
    assert len(events(journal, "lease_renew")) > before  # every call renews the lease

    (out / "progress.json").write_text(json.dumps({
        "schema": "orbite.runner-progress", "version": 1, "pid": child["pid"], "role": "requester", "generation": 1,
        "round": 2, "rounds": 3, "phase": "transfer", "wrs_done": 43, "wrs_posted": 51, "wrs_total": 64,
        "updated_at": 0}))
    polled = run_helper("runner", tmp_path, wait)
    assert polled["finished"] is False and polled["child"]["running"] is True
    assert re.fullmatch(r"case read-polling requester g1 round 2/3, 51 posted, 43 completed of 64 WRs \(\d+\.\d s\)",
                        polled["progress_line"])

    (out / "progress.json").write_text("[1, 2")  # being replaced, or not one: never fails the wait
    assert run_helper("runner", tmp_path, wait)["progress"] is None

    # The overall limit counts from the child's start, however many polls it took.
    late = run_helper("runner", tmp_path, dict(wait, timeout=0.5))
    assert late["failed"] and late["code"] == "runner.timeout" and "still runs after 0.5 s" in late["msg"]

    SupervisorClient(supervisor).signal(child["child_id"], child["pid"], child["start_time"])
    done = run_helper("runner", tmp_path, wait)
    assert done["finished"] is True and done["child"]["exit_signal_name"] == "SIGKILL", done
    assert done["ledger"] == str(out / "ledger.json")


def test_under_a_short_lease_the_polled_wait_waits_in_one_call(tmp_path, supervisor, fake_runner):
    """The pause between two polls (module transfer and start) must never outlast the lease: under a lease
    shorter than 30 s one call waits, renewing as it goes, up to the overall limit."""
    import threading

    started = run_module(tmp_path, **_source_args(tmp_path, supervisor, fake_runner, env={"ORBITE_TEST_READY": "ok"}))
    child = started["child"]
    client = SupervisorClient(supervisor)
    client.renew(lease=6)
    killer = threading.Timer(2.5, client.signal, (child["child_id"], child["pid"], child["start_time"]))
    killer.start()
    try:
        done = run_helper("runner", tmp_path, {"state": "finished", "supervisor_run_dir": supervisor,
                                               "output_dir": str(tmp_path / "out"), "child_id": child["child_id"],
                                               "timeout": 60, "poll": 0.3, "label": "short"})
    finally:
        killer.join()
    assert done["finished"] is True and done["child"]["exit_signal_name"] == "SIGKILL", done
    assert done["progress_line"].startswith("case short: no progress reported yet")
