"""runner state=restart_point (installed-restart, docs/restart.md): the controller's kill point is the
runner's own restart-point.json, watched together with the runner's life, never a timer."""

import sys

import pytest
from helpers.modules import run_module as run_helper
from helpers.node_root import supervised_host


# A fake runner: ready.json at once, then what ORBITE_TEST_POINT says after a moment.
FAKE_RUNNER = """#!{python}
import json, os, sys, time
out = sys.argv[sys.argv.index("--output") + 1]
open(os.path.join(out, "ready.json"), "w").write(json.dumps({{"pid": os.getpid(), "service_address": "127.0.0.1:1"}}))
kind = os.environ.get("ORBITE_TEST_POINT", "ok")
time.sleep(0.3)
if kind == "exit":
    sys.exit(3)
if kind in ("ok", "other"):
    pid = os.getpid() if kind == "ok" else 1
    open(os.path.join(out, "restart-point.json"), "w").write(json.dumps(
        {{"schema": "orbite.runner-restart-point", "pid": pid, "generation": 1}}))
time.sleep(60)
"""


@pytest.fixture
def supervisor(tmp_path):
    with supervised_host(tmp_path) as (_root, run_dir):
        yield run_dir


def _started(tmp_path, run_dir, kind):
    runner = tmp_path / "fake-runner"
    runner.write_text(FAKE_RUNNER.format(python=sys.executable))
    runner.chmod(0o755)
    result = run_helper("runner", tmp_path, {
        "state": "started", "supervisor_run_dir": run_dir, "runner_argv": [str(runner)],
        "output_dir": str(tmp_path / "out"), "role": "source", "run_id": "run-1", "profile": {},
        "rails": [{"device": "mlx5_0", "port": 1, "gid_index": 0}], "service_address": "127.0.0.1:0",
        "registration_id": "reg-1", "ready_timeout": 5, "env": {"ORBITE_TEST_POINT": kind}})
    assert result.get("failed") is not True, result
    return result["child"]


def _wait(tmp_path, run_dir, child, timeout=10):
    return run_helper("runner", tmp_path, {
        "state": "restart_point", "supervisor_run_dir": run_dir, "output_dir": str(tmp_path / "out"),
        "child_id": child["child_id"], "pid": child["pid"], "timeout": timeout}, timeout=60)


def test_the_restart_point_of_the_runner_is_returned(tmp_path, supervisor):
    child = _started(tmp_path, supervisor, "ok")
    result = _wait(tmp_path, supervisor, child)
    assert result.get("failed") is not True, result
    assert result["restart_point"]["pid"] == child["pid"]


@pytest.mark.parametrize(("kind", "code", "needle"), [
    ("exit", "runner.exited_before_restart_point", "exited before its restart point (exit code 3"),
    ("other", "runner.restart_point_mismatch", "written by pid 1"),
    ("never", "runner.timeout", "no "),
])
def test_no_restart_point_of_this_runner_is_a_coded_failure(tmp_path, supervisor, kind, code, needle):
    child = _started(tmp_path, supervisor, kind)
    result = _wait(tmp_path, supervisor, child, timeout=2)
    assert result["failed"] is True and result["code"] == code, result
    assert needle in result["msg"]
