"""The runner module's waits for ready.json and restart-point.json (launch._await_json), on a fake clock: a file
written between two polls is found at the next read of the file, FILE_POLL_S later at most, while the supervisor
is asked whether the child exited no more often than before (every READY_POLL_S, RESTART_POLL_S)."""

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._run import launch

WRITTEN_AT = 0.521  # seconds after the wait began: between two polls of any period tried here


class FakeTime:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class FakeSupervisor:
    """The supervisor's side of a wait: the child runs until exit_at (seconds after the wait began)."""

    def __init__(self, clock, exit_at=None):
        self.clock, self.start, self.exit_at = clock, clock.now, exit_at
        self.waits = 0

    def __call__(self, _run_dir):  # stands in for SupervisorClient(run_dir)
        return self

    def status(self):
        return {"lease_s": 60}

    def renew(self):
        return {"ok": True}

    def wait(self, child_id, timeout=0.0):
        assert timeout == 0
        self.waits += 1
        exited = self.exit_at is not None and self.clock.now - self.start >= self.exit_at
        return {"child_id": child_id, "pid": 42, "timed_out": not exited, "exit_code": 3 if exited else None,
                "exit_signal_name": None}


@pytest.fixture
def clock(monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(launch, "time", fake)
    return fake


def _file_written_at(monkeypatch, clock, name, at):
    """read_ready finds the file (name) once ``at`` seconds have passed; returns the times it was read."""
    start, reads = clock.now, []

    def read_ready(path):
        assert path.endswith(name)
        reads.append(clock.now - start)
        return {"pid": 42} if clock.now - start >= at else None

    monkeypatch.setattr(launch, "read_ready", read_ready)
    return reads


def test_a_restart_point_written_between_polls_is_found_at_the_next_read(monkeypatch, clock, tmp_path):
    supervisor = FakeSupervisor(clock)
    monkeypatch.setattr(launch, "SupervisorClient", supervisor)
    reads = _file_written_at(monkeypatch, clock, launch.RESTART_POINT_NAME, WRITTEN_AT)
    result = launch.wait_restart_point({"supervisor_run_dir": str(tmp_path), "output_dir": str(tmp_path),
                                        "child_id": "c1", "pid": 42, "timeout": 10})
    assert result["restart_point"] == {"pid": 42}
    lag = reads[-1] - WRITTEN_AT
    assert 0 <= lag <= launch.FILE_POLL_S + 1e-9, reads  # was up to 0.1 s (READY_POLL_S * 5)
    assert supervisor.waits <= WRITTEN_AT / launch.RESTART_POLL_S + 2  # the supervisor is asked no more often


def test_a_ready_file_written_between_polls_is_found_at_the_next_read(monkeypatch, clock, tmp_path):
    supervisor = FakeSupervisor(clock)
    reads = _file_written_at(monkeypatch, clock, launch.READY_NAME, WRITTEN_AT)
    ready = launch.wait_ready(supervisor, {"child_id": "c1", "pid": 42}, str(tmp_path), 10)
    assert ready == {"pid": 42}
    assert 0 <= reads[-1] - WRITTEN_AT <= launch.FILE_POLL_S + 1e-9, reads
    assert supervisor.waits <= WRITTEN_AT / launch.READY_POLL_S + 2


@pytest.mark.parametrize(("which", "period"), [("ready", "READY_POLL_S"), ("restart", "RESTART_POLL_S")])
def test_a_child_that_exits_first_is_seen_within_a_check_period(monkeypatch, clock, tmp_path, which, period):
    supervisor = FakeSupervisor(clock, exit_at=WRITTEN_AT)
    monkeypatch.setattr(launch, "SupervisorClient", supervisor)
    _file_written_at(monkeypatch, clock, launch.READY_NAME if which == "ready" else launch.RESTART_POINT_NAME,
                     1e9)
    with pytest.raises(launch.RunnerError) as caught:
        if which == "ready":
            launch.wait_ready(supervisor, {"child_id": "c1", "pid": 42}, str(tmp_path), 10)
        else:
            launch.wait_restart_point({"supervisor_run_dir": str(tmp_path), "output_dir": str(tmp_path),
                                       "child_id": "c1", "pid": 42, "timeout": 10})
    assert caught.value.code == ("runner.exited_before_ready" if which == "ready"
                                 else "runner.exited_before_restart_point")
    seen = clock.now - 1000.0
    assert WRITTEN_AT <= seen <= WRITTEN_AT + getattr(launch, period) + launch.FILE_POLL_S + 1e-9


def test_a_timeout_is_reported_only_after_the_supervisor_was_asked_past_the_deadline(monkeypatch, clock, tmp_path):
    asked = []
    supervisor = FakeSupervisor(clock)
    real_wait = supervisor.wait

    def wait(child_id, timeout=0.0):
        asked.append(clock.now - 1000.0)
        return real_wait(child_id, timeout)

    supervisor.wait = wait
    monkeypatch.setattr(launch, "SupervisorClient", supervisor)
    _file_written_at(monkeypatch, clock, launch.RESTART_POINT_NAME, 1e9)
    with pytest.raises(launch.RunnerError) as caught:
        launch.wait_restart_point({"supervisor_run_dir": str(tmp_path), "output_dir": str(tmp_path),
                                   "child_id": "c1", "pid": 42, "timeout": 1.05})
    assert caught.value.code == "runner.timeout"
    assert asked[-1] > 1.05 and asked[-1] - asked[-2] <= launch.RESTART_POLL_S + 1e-9


@pytest.mark.parametrize("which", ["ready", "restart"])
def test_a_file_written_just_before_the_child_exits_is_still_found(monkeypatch, clock, tmp_path, which):
    # The runner writes its file and exits between the wait's read of the file and its question to the supervisor:
    # the supervisor says exited, and the file (complete) is the answer, not "exited before ready".
    written = []
    supervisor = FakeSupervisor(clock, exit_at=WRITTEN_AT)
    real_wait = supervisor.wait

    def wait(child_id, timeout=0.0):
        state = real_wait(child_id, timeout)
        if not state["timed_out"]:
            written.append(clock.now)  # written, then exited, since the last read
        return state

    supervisor.wait = wait
    monkeypatch.setattr(launch, "SupervisorClient", supervisor)
    monkeypatch.setattr(launch, "read_ready", lambda path: {"pid": 42} if written else None)
    if which == "ready":
        assert launch.wait_ready(supervisor, {"child_id": "c1", "pid": 42}, str(tmp_path), 10) == {"pid": 42}
    else:
        result = launch.wait_restart_point({"supervisor_run_dir": str(tmp_path), "output_dir": str(tmp_path),
                                            "child_id": "c1", "pid": 42, "timeout": 10})
        assert result == {"changed": False, "restart_point": {"pid": 42}}
    assert written
