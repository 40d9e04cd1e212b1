"""The control relay of installed-interruption (plugins/module_utils/_run/relay.py) and its module.

A fake source (a listening socket answering frames) and a fake requester talk through a real relay
process: every frame is forwarded and journaled except READY of a round after hold_after_round, which is
held; its files are private; stop always leaves no relay running, even a hung one; the lease ends it by
itself; bad options name the field. Binds loopback addresses: run in a network namespace of its own.
"""

import json
import os
import signal
import socket
import stat
import struct
import time

import pytest
from helpers.modules import run_module

from ansible_collections.orbite.qualification.plugins.module_utils._run import relay

LEN = struct.Struct("!I")


def _send(sock, **msg):
    data = json.dumps(msg).encode()
    sock.sendall(LEN.pack(len(data)) + data)


def _recv(sock, timeout=5.0):
    sock.settimeout(timeout)
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            return None
        head += chunk
    (length,) = LEN.unpack(head)
    body = b""
    while len(body) < length:
        body += sock.recv(length - len(body))
    return json.loads(body)


@pytest.fixture
def source():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    yield listener
    listener.close()


def _cfg(tmp_path, source, **over):
    cfg = {"listen": "127.0.0.1:0", "upstream": f"127.0.0.1:{source.getsockname()[1]}",
           "state_dir": str(tmp_path / "relay"), "hold_after_round": 3, "lease_s": 60, "defects": [],
           "run_id": "run-1"}
    cfg.update(over)
    return cfg


@pytest.fixture
def started(tmp_path, source):
    cfg = _cfg(tmp_path, source)
    ready = relay.start_relay(cfg)
    yield cfg, ready
    relay.stop_relay(cfg["state_dir"])


def _connect(ready, source):
    host, port = relay.parse_address("address", ready["address"])
    requester = socket.create_connection((host, port), timeout=5)
    upstream = source.accept()[0]
    return requester, upstream


def test_frames_are_forwarded_both_ways_and_the_later_ready_is_held(started, source):
    cfg, ready = started
    requester, upstream = _connect(ready, source)
    _send(requester, kind="HELLO", epoch=7, peer_epoch=None, generation=1)
    assert _recv(upstream)["kind"] == "HELLO"
    _send(upstream, kind="ROUND_READY", epoch=9, peer_epoch=7, round=3)
    assert _recv(requester)["round"] == 3
    _send(upstream, kind="ROUND_READY", epoch=9, peer_epoch=7, round=4)  # the grant: held
    _send(upstream, kind="RESTART_ACK", epoch=9, peer_epoch=7, generation=1)
    assert _recv(requester)["kind"] == "RESTART_ACK"  # the held READY never came before it
    status = relay.wait_held(cfg["state_dir"], 1, timeout=5)
    assert (status["held"], status["forwarded"], status["leaked"]) == (1, 3, 0)
    requester.close()
    upstream.close()
    relay.stop_relay(cfg["state_dir"])
    journal = relay.read_journal(cfg["state_dir"])
    frames = [(e["dir"], e["kind"], e["round"], e["action"]) for e in journal if e["ev"] == "frame"]
    assert frames == [("to_source", "HELLO", None, "forwarded"), ("to_requester", "ROUND_READY", 3, "forwarded"),
                      ("to_requester", "ROUND_READY", 4, "held"), ("to_requester", "RESTART_ACK", None, "forwarded")]
    assert journal[0]["ev"] == "start" and journal[0]["upstream"] == cfg["upstream"]
    assert journal[-1]["ev"] == "stop" and journal[-1]["counts"]["held"] == 1


def test_the_state_directory_is_private(started):
    cfg, _ready = started
    state_dir = cfg["state_dir"]
    assert stat.S_IMODE(os.stat(state_dir).st_mode) == 0o700
    for name in os.listdir(state_dir):
        mode = stat.S_IMODE(os.lstat(os.path.join(state_dir, name)).st_mode)
        assert mode & 0o077 == 0, (name, oct(mode))


def test_leak_grant_forwards_the_grant_and_says_so(tmp_path, source):
    cfg = _cfg(tmp_path, source, defects=["leak_grant"])
    ready = relay.start_relay(cfg)
    try:
        requester, upstream = _connect(ready, source)
        _send(upstream, kind="ROUND_READY", epoch=9, peer_epoch=7, round=4)
        assert _recv(requester)["round"] == 4
    finally:
        relay.stop_relay(cfg["state_dir"])
    leaked = [e for e in relay.read_journal(cfg["state_dir"]) if e.get("leaked") is True]
    assert [(e["kind"], e["action"]) for e in leaked] == [("ROUND_READY", "forwarded")]


def test_a_dead_source_ends_the_requester_connection(started, source):
    ready = started[1]
    requester, upstream = _connect(ready, source)
    upstream.close()
    assert _recv(requester) is None  # EOF: the requester sees its peer go, as without the relay


def test_stop_reaps_even_a_relay_that_ignores_stop(started):
    cfg, ready = started
    os.kill(ready["pid"], signal.SIGSTOP)  # hung: answers nothing, ignores the stop request
    done = relay.stop_relay(cfg["state_dir"], timeout=0.5)
    assert (done["was_running"], done["stopped"], done["killed"]) == (True, True, True)
    assert relay.start_time_of(ready["pid"]) is None
    assert relay.stop_relay(cfg["state_dir"]) == {"was_running": False, "stopped": False, "killed": False,
                                                  "pid": ready["pid"]}


def test_a_stop_in_check_mode_stops_nothing_and_says_one_runs(started, tmp_path):
    # One check-mode stop for the control_relay module and fetch_receipts' relay_state_dir (relay.stop_relay).
    cfg, ready = started
    assert relay.stop_relay(cfg["state_dir"], check_mode=True) == {"was_running": True, "stopped": False,
                                                                    "killed": False, "pid": ready["pid"]}
    checked = run_module("control_relay", tmp_path, {"state": "stopped", "state_dir": cfg["state_dir"],
                                                      "_ansible_check_mode": True})
    assert (checked["changed"], checked["was_running"], checked["stopped"]) == (True, True, False), checked
    fetched = run_module("fetch_receipts", tmp_path, {"src": str(tmp_path / "none"), "dest": str(tmp_path / "dest"),
                                                      "relay_state_dir": cfg["state_dir"],
                                                      "_ansible_check_mode": True})
    assert fetched["relay"] == {"was_running": True, "stopped": False, "killed": False, "pid": ready["pid"]}, fetched
    assert relay.running(ready)


def test_the_lease_ends_the_relay_by_itself(tmp_path, source):
    cfg = _cfg(tmp_path, source, lease_s=0.5)
    ready = relay.start_relay(cfg)
    deadline = time.monotonic() + 10
    while relay.running(ready) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not relay.running(ready)
    assert relay.read_journal(cfg["state_dir"])[-1]["reason"] == "lease_expired"


def test_a_second_start_in_the_same_directory_is_refused(started, source):
    cfg, _ready = started
    with pytest.raises(relay.RelayError, match="a relay already runs there"):
        relay.start_relay(cfg)


@pytest.mark.parametrize(("change", "needle"), [
    ({"listen": "nowhere"}, "listen = 'nowhere': must be 'host:port'"),
    ({"upstream": "127.0.0.1:0"}, "upstream = '127.0.0.1:0': must name the source's real port"),
    ({"hold_after_round": 0}, "hold_after_round = 0: must be an integer >= 1"),
    ({"hold_after_round": True}, "hold_after_round = True: must be an integer >= 1"),
    ({"lease_s": -1}, "lease_s = -1: must be a number of seconds"),
    ({"defects": ["melt"]}, "defects = ['melt']: must be a list of leak_grant"),
    ({"state_dir": "relative"}, "state_dir = 'relative': must be an absolute path"),
    ({"colour": "red"}, "colour = 'red': is not a relay option"),
    ({"watch": {"pid": 1}}, "watch = {'pid': 1}: must be null or {pid, start_time}"),
])
def test_bad_options_name_the_field(tmp_path, source, change, needle):
    with pytest.raises(relay.RelayError) as caught:
        relay.start_relay(_cfg(tmp_path, source, **change))
    assert needle in str(caught.value)


def test_the_module_starts_waits_and_always_stops(tmp_path, source):
    state_dir = str(tmp_path / "mod-relay")
    args = {"state_dir": state_dir, "listen": "127.0.0.1:0", "upstream": f"127.0.0.1:{source.getsockname()[1]}",
            "run_id": "run-1", "timeout": 10}
    started = run_module("control_relay", tmp_path, dict(args, state="started"))
    assert started["changed"] and not started.get("failed"), started
    waited = run_module("control_relay", tmp_path, {"state": "holding", "state_dir": state_dir, "held": 1,
                                                     "timeout": 0.3})
    assert waited["failed"] and "held 0 grant(s), 1 expected" in waited["msg"], waited
    stopped = run_module("control_relay", tmp_path, {"state": "stopped", "state_dir": state_dir})
    assert (stopped["changed"], stopped["stopped"], stopped["was_running"]) == (True, True, True), stopped
    assert relay.start_time_of(started["ready"]["pid"]) is None
    again = run_module("control_relay", tmp_path, {"state": "stopped", "state_dir": state_dir})
    assert (again["changed"], again["was_running"]) == (False, False), again
    gone = run_module("control_relay", tmp_path, {"state": "holding", "state_dir": state_dir, "held": 1})
    assert gone["failed"] and "no relay runs in" in gone["msg"], gone


def test_the_module_names_a_bad_argument(tmp_path, source):
    got = run_module("control_relay", tmp_path, {"state": "started", "state_dir": str(tmp_path / "r"),
                                                  "listen": "127.0.0.1", "upstream": "127.0.0.1:5", "run_id": "r"})
    assert got["failed"] and "listen = '127.0.0.1': must be 'host:port'" in got["msg"], got
    missing = run_module("control_relay", tmp_path, {"state": "started", "state_dir": str(tmp_path / "r")})
    assert missing["failed"] and "listen" in missing["msg"] and "upstream" in missing["msg"], missing


def test_check_mode_starts_nothing(tmp_path, source):
    state_dir = tmp_path / "check-relay"
    got = run_module("control_relay", tmp_path, {"state": "started", "state_dir": str(state_dir),
                                                  "listen": "127.0.0.1:0", "upstream": "127.0.0.1:5",
                                                  "run_id": "r", "_ansible_check_mode": True})
    assert got["changed"] and not state_dir.exists(), got


def test_the_relay_ends_with_the_process_it_watches(tmp_path, source):
    """Started with the supervisor's pid and start time, the relay ends as soon as that process is gone."""
    import subprocess
    import sys

    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        cfg = _cfg(tmp_path, source, watch={"pid": watched.pid, "start_time": relay.start_time_of(watched.pid)})
        ready = relay.start_relay(cfg)
        assert relay.running(ready)
    finally:
        watched.kill()
        watched.wait()
    deadline = time.monotonic() + 10
    while relay.running(ready) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not relay.running(ready)
    assert relay.read_journal(cfg["state_dir"])[-1]["reason"] == "watched_process_gone"


def test_the_relay_starts_from_a_zipped_module(tmp_path, source, monkeypatch):
    """Ansible runs a module from a zip: the relay installs its program from its loader, not from a path."""
    import importlib
    import sys
    import zipfile

    archive = tmp_path / "payload.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.write(relay.__file__, "zipped_relay.py")
    monkeypatch.syspath_prepend(str(archive))
    zipped_relay = importlib.import_module("zipped_relay")
    try:
        assert ".zip" in zipped_relay.__file__
        cfg = _cfg(tmp_path, source)
        ready = zipped_relay.start_relay(cfg)
        assert relay.running(ready)
        assert zipped_relay.stop_relay(cfg["state_dir"])["stopped"]
    finally:
        sys.modules.pop("zipped_relay", None)
