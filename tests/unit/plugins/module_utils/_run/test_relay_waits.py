"""The controller's waits on the control relay (relay.stop_relay, relay.wait_held), on a fake clock: the first
probes come within a millisecond or two (the relay ends, or holds its grant, that fast), growing to the old
period, and every bound, message and result stays as it was."""

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._run import relay

READY = {"schema": relay.READY_SCHEMA, "pid": 4242, "start_time": 7}


class Clock:
    def __init__(self):
        self.now, self.sleeps = 1000.0, []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(relay, "time", fake)
    monkeypatch.setattr(relay, "read_ready", lambda _state_dir: dict(READY))
    return fake


def test_stop_probes_the_relay_again_soon_after_the_stop_request(monkeypatch, clock, tmp_path):
    requests = []
    monkeypatch.setattr(relay, "request", lambda state_dir, op, timeout=5.0: requests.append(op) or {"stopping": True})
    alive = iter([True, True, True, True])  # was_running, then gone after the third sleep
    monkeypatch.setattr(relay, "running", lambda _ready: next(alive, False))
    done = relay.stop_relay(str(tmp_path))
    assert done == {"was_running": True, "stopped": True, "killed": False, "pid": 4242} and requests == ["stop"]
    assert clock.sleeps == [0.0005, 0.001, 0.002]  # was 0.02 from the first


def test_stop_of_a_relay_that_never_ends_is_still_bounded(monkeypatch, clock, tmp_path):
    killed = []
    monkeypatch.setattr(relay, "request", lambda state_dir, op, timeout=5.0: {"stopping": True})
    monkeypatch.setattr(relay, "running", lambda _ready: True)
    monkeypatch.setattr(relay.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    with pytest.raises(relay.RelayError, match=r"the relay pid 4242 in .* did not end"):
        relay.stop_relay(str(tmp_path), timeout=1.0)
    assert killed == [(4242, relay.signal.SIGKILL)] and max(clock.sleeps) == 0.02
    assert 1.0 + 5.0 <= sum(clock.sleeps) < 1.0 + 5.0 + 2 * 0.021  # the stop's timeout, then 5 s after the kill


def test_wait_held_asks_again_soon_and_still_times_out_at_its_bound(monkeypatch, clock, tmp_path):
    monkeypatch.setattr(relay, "running", lambda _ready: True)
    answers = iter([0, 0, 0, 1])
    monkeypatch.setattr(relay, "request", lambda state_dir, op, timeout=5.0: {"held": next(answers), "forwarded": 9,
                                                                              "leaked": 0})
    assert relay.wait_held(str(tmp_path), 1, timeout=5)["held"] == 1
    assert clock.sleeps == [0.001, 0.002, 0.004]  # was 0.05 from the first
    clock.sleeps.clear()
    monkeypatch.setattr(relay, "request", lambda state_dir, op, timeout=5.0: {"held": 0, "forwarded": 9, "leaked": 0})
    with pytest.raises(relay.RelayError, match=r"the relay held 0 grant\(s\), 1 expected within 2 s "
                                               r"\(forwarded 9, leaked 0\)"):
        relay.wait_held(str(tmp_path), 1, timeout=2)
    assert max(clock.sleeps) == 0.05 and 2 <= sum(clock.sleeps) < 2 + 0.051
