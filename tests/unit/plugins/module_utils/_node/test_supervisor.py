"""The per-node lock supervisor: real detached processes, real flock, real children.

Each test breaks one rule of supervisor_daemon.py / supervisor_client.py and sees exactly that
failure; the comment on each test names the code it guards.
"""

import hashlib
import json
import os
import signal
import sys
import threading
import time
from datetime import datetime

import pytest
from helpers.node_root import BOOT, SLEEPER, alive, events, journal, make_root, wait_dead
from ansible_collections.orbite.qualification.plugins.module_utils._node import client as client_mod
from ansible_collections.orbite.qualification.plugins.module_utils._node import locks as rnic_lock
from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (
    SupervisorAlreadyRunning,
    SupervisorClient,
    SupervisorInputError,
    SupervisorNotRunning,
    SupervisorRequestError,
    SupervisorSocketError,
    SupervisorStartError,
    start_supervisor,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node.daemon import proc_start_time

LOCKS = ["mlx5_0", "mlx5_1"]

class Node:
    """A fake host root with helpers; every supervisor it starts is killed (by pid) at teardown."""

    def __init__(self, base):
        self.root = make_root(base / "root")
        self.lock_dir = os.path.join(self.root, "run", "orbite", "locks")
        self.pids = []

    def run_dir(self, run_id):
        return os.path.join(self.root, "run", "orbite", "supervisors", run_id)

    def start(self, run_id="run-1", locks=None, **kw):
        kw.setdefault("lease", 60)
        kw.setdefault("lock_timeout", 2)
        try:
            ready = start_supervisor(self.run_dir(run_id), run_id, list(locks or LOCKS), self.lock_dir,
                                     root=self.root, controller="pytest", **kw)
        finally:
            self._track(run_id)
        return ready, SupervisorClient(self.run_dir(run_id))

    def _track(self, run_id):
        try:
            with open(os.path.join(self.run_dir(run_id), "supervisor.pid")) as handle:
                self.pids.append(int(handle.read()))
        except (OSError, ValueError):
            pass

    def free(self, rnic):
        return rnic_lock.probe(self.lock_dir, rnic)

    def cleanup(self):
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    mine = self.root.encode() in handle.read()
            except OSError:
                continue
            if mine:
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.cleanup()


def test_start_takes_locks_detaches_and_is_private(node):
    ready, client = node.start()
    pid = ready["pid"]
    assert not node.free("mlx5_0") and not node.free("mlx5_1")
    with open(f"/proc/{pid}/stat") as handle:
        ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
    assert ppid != os.getpid()  # second fork: nobody's child but init's (or a subreaper's)
    run_dir = node.run_dir("run-1")
    assert os.stat(run_dir).st_mode & 0o777 == 0o700
    assert os.stat(client.socket_path).st_mode & 0o777 == 0o600
    first = journal(client.journal_path)[0]
    assert (first["schema"], first["version"], first["ev"]) == ("orbite.supervisor-journal", 1, "journal_open")
    owners = {lk["rnic"]: lk["owner"] for lk in client.status()["locks"]}
    assert owners["mlx5_0"]["run_id"] == "run-1" and owners["mlx5_0"]["pid"] == pid
    assert owners["mlx5_0"]["boot_id"] == BOOT and owners["mlx5_0"]["hostname"] == "sim-a"
    assert [e["ok"] for e in events(client.journal_path, "identity_check")] == [True]
    summary = client.stop()
    assert summary["locks_released"] is True
    wait_dead(pid)
    assert node.free("mlx5_0") and node.free("mlx5_1")
    assert journal(client.journal_path)[-1]["ev"] == "journal_close"


def test_sigkill_of_supervisor_frees_locks_kills_child_and_next_journal_notes_stale(node):
    # Guards flock-based holding (kernel release on death), the child's PR_SET_PDEATHSIG and
    # acquire's previous_state "stale" as journaled by the next owner.
    ready, client = node.start("run-1")
    child = client.launch(SLEEPER)
    os.kill(ready["pid"], signal.SIGKILL)
    wait_dead(ready["pid"])
    assert node.free("mlx5_0") and node.free("mlx5_1")
    wait_dead(child["pid"], timeout=5)
    _, client2 = node.start("run-2")
    acquired = events(client2.journal_path, "lock_acquire")
    assert {e["rnic"] for e in acquired} == set(LOCKS)
    for e in acquired:
        assert e["previous_state"] == "stale" and e["previous_owner_gone"] is True
        assert e["previous_owner"]["pid"] == ready["pid"] and e["previous_owner"]["run_id"] == "run-1"
    client2.stop()


def test_lease_expiry_kills_reaps_child_and_releases_locks(node):
    # Guards serve()'s lease check -> _shutdown("lease_expired", force=True).
    ready, client = node.start(lease=1.0)
    child = client.launch(SLEEPER)
    wait_dead(ready["pid"], timeout=10)
    assert not alive(child["pid"])
    assert node.free("mlx5_0") and node.free("mlx5_1")
    j = journal(client.journal_path)
    kinds = [e["ev"] for e in j]
    assert "lease_expired" in kinds
    kill = [e for e in j if e["ev"] == "signal"]
    assert kill and kill[0]["reason"] == "lease_expired" and kill[0]["signal_name"] == "SIGKILL"
    exits = [e for e in j if e["ev"] == "child_exit"]
    assert exits[0]["pid"] == child["pid"] and exits[0]["exit_signal"] == 9
    assert {e["rnic"] for e in j if e["ev"] == "lock_release"} == set(LOCKS)
    stop = next(e for e in j if e["ev"] == "supervisor_stop")
    assert stop["reason"] == "lease_expired" and stop["locks_released"] is True
    with pytest.raises(SupervisorNotRunning):
        client.status()


def test_renewal_keeps_the_supervisor(node):
    # Guards op_renew resetting the lease deadline.
    ready, client = node.start(lease=1.0)
    for _ in range(8):
        time.sleep(0.25)
        client.renew()
    assert alive(ready["pid"]) and client.status()["lease_remaining_s"] > 0.5
    assert len(events(client.journal_path, "lease_renew")) == 8
    client.stop()


def test_signal_only_the_selected_child_and_refuse_mismatches(node):
    # Guards op_signal's pid / start-time / already-reaped checks.
    _, client = node.start()
    one = client.launch(SLEEPER)
    two = client.launch(SLEEPER)
    assert one["start_time"] == proc_start_time(one["pid"])
    killed = client.signal(one["child_id"], one["pid"], one["start_time"], "SIGKILL")
    assert killed["exit_signal"] == 9 and killed["running"] is False
    assert not alive(one["pid"]) and alive(two["pid"])
    with pytest.raises(SupervisorRequestError) as caught:
        client.signal(two["child_id"], two["pid"], two["start_time"] + 1, "SIGKILL")
    assert caught.value.code == "supervisor.signal_refused" and "start time" in str(caught.value)
    with pytest.raises(SupervisorRequestError) as caught:
        client.signal(two["child_id"], one["pid"], two["start_time"], "SIGKILL")
    assert caught.value.code == "supervisor.signal_refused" and "pid" in str(caught.value)
    with pytest.raises(SupervisorRequestError) as caught:
        client.signal(one["child_id"], one["pid"], one["start_time"], "SIGKILL")
    assert caught.value.code == "supervisor.signal_refused" and "already exited" in str(caught.value)
    assert alive(two["pid"])
    status = {c["child_id"]: c for c in client.status()["children"]}
    assert status[two["child_id"]]["running"] is True
    refused = events(client.journal_path, "signal_refused")
    assert len(refused) == 3
    sent = events(client.journal_path, "signal")
    assert [(e["child_id"], e["pid"]) for e in sent] == [(one["child_id"], one["pid"])]
    client.signal(two["child_id"], two["pid"], two["start_time"], "TERM")
    client.stop()


def test_wait_returns_exit_code_or_times_out(node):
    _, client = node.start()
    quick = client.launch([sys.executable, "-c", "raise SystemExit(7)"])
    done = client.wait(quick["child_id"], timeout=10)
    assert done["exit_code"] == 7 and done["timed_out"] is False
    slow = client.launch(SLEEPER)
    t0 = time.monotonic()
    pending = client.wait(slow["child_id"], timeout=0.3)
    assert pending["timed_out"] is True and pending["running"] is True and time.monotonic() - t0 >= 0.3
    client.stop(force=True)


def test_a_locks_release_is_stamped_while_it_is_still_held(node):
    # Guards _release_locks' held_until: journals of two supervisors on one host are compared by time (a fleet's
    # pairs sharing a host: disjoint lock intervals), so lock_release must be stamped before the flock is dropped,
    # no later than the released record the lock file gets while still held; the next holder's lock_acquire,
    # stamped once it holds the lock, is then always later (seen with a second supervisor waiting for the lock).
    ready, client = node.start(locks=["mlx5_0"])
    waiting = {}

    def second():
        waiting["ready"], waiting["client"] = node.start("run-2", locks=["mlx5_0"], lock_timeout=20)

    thread = threading.Thread(target=second)
    thread.start()
    second_journal = os.path.join(node.run_dir("run-2"), "journal.jsonl")
    deadline = time.monotonic() + 20
    while not (os.path.exists(second_journal) and events(second_journal, "supervisor_start")):
        assert time.monotonic() < deadline and thread.is_alive(), "the second supervisor never came to the locks"
        time.sleep(0.01)
    time.sleep(0.2)  # it reads the identity and asks for the lock right after, and waits (waited_s below)
    client.stop()
    thread.join(30)
    (release,) = events(client.journal_path, "lock_release")
    released_at = datetime.fromisoformat(release["owner"]["released_at"].replace("Z", "+00:00")).timestamp()
    # One microsecond of slack: t is rounded to it and released_at truncated, and the two are read well within one
    # microsecond of each other; a stamp taken after the release (file rewrite, flock, close) is tens later.
    assert release["t"] <= released_at + 1e-6, (release["t"], release["owner"]["released_at"])
    (acquire,) = events(waiting["client"].journal_path, "lock_acquire")
    assert acquire["waited_s"] > 0 and release["t"] < acquire["t"], (release["t"], acquire["t"])
    waiting["client"].stop()
    wait_dead(ready["pid"])


def test_stop_refuses_running_children_unless_forced(node):
    # Guards op_stop's children_running refusal and the forced kill-and-reap.
    ready, client = node.start()
    child = client.launch(SLEEPER)
    with pytest.raises(SupervisorRequestError) as caught:
        client.stop()
    assert caught.value.code == "supervisor.children_running" and child["child_id"] in str(caught.value)
    assert not node.free("mlx5_0") and alive(child["pid"])
    summary = client.stop(force=True)
    assert summary["children_killed"] == [child["child_id"]] and summary["locks_released"] is True
    assert not alive(child["pid"])
    wait_dead(ready["pid"])
    assert node.free("mlx5_0")


def _sha(path):
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


# Everything here but ORBITE_X is off the allowlist: LD_AUDIT and LD_LIBRARY_PATH load code that no
# pin covers, GCONV_PATH too (iconv modules), and an LD_PRELOAD of the caller's is not the pinned one.
HOSTILE_ENV = {"ORBITE_X": "1", "RDMAV_ALLOW_DISASSOC_DESTROY": "1", "RDMAV_FORK_SAFE": "1",
               "LD_AUDIT": "/tmp/audit.so", "LD_LIBRARY_PATH": "/tmp/evil", "LD_PRELOAD": "/tmp/evil.so",
               "GCONV_PATH": "/tmp/gconv", "PYTHONPATH": "/tmp/py"}
DROPPED = sorted(set(HOSTILE_ENV) - {"ORBITE_X"})


def test_child_env_is_an_allowlist_and_the_preload_is_the_pinned_copy(node, tmp_path):
    # Guards op_launch: the env allowlist (every LD_*/RDMAV_* dropped and journaled) and LD_PRELOAD
    # naming the supervisor's hash-checked copy of the library, never the library's path.
    lib = os.path.realpath("/lib/x86_64-linux-gnu/libm.so.6")
    if not os.path.isfile(lib):
        pytest.skip("no libm to preload on this machine")
    _, client = node.start()
    out = tmp_path / "env.json"
    # /proc/self/environ is what exec gave the child (Python adds LC_CTYPE to os.environ itself).
    script = ("import hashlib, json, os; p = os.environ.get('LD_PRELOAD', '');"
              "env = dict(e.split('=', 1) for e in open('/proc/self/environ').read().split(chr(0)) if e);"
              "print(json.dumps({'env': env, 'sha': hashlib.sha256(open(p, 'rb').read()).hexdigest()"
              " if p else None, 'maps': open('/proc/self/maps').read()}))")
    child = client.launch([sys.executable, "-c", script], env=dict(HOSTILE_ENV),
                          ld_preload=[{"path": lib, "sha256": _sha(lib)}], stdout_path=str(out), cwd=str(tmp_path))
    assert child["env_stripped"] == DROPPED
    assert client.wait(child["child_id"], timeout=10)["exit_code"] == 0
    seen = json.loads(out.read_text())
    assert set(seen["env"]) == {"ORBITE_X", "LD_PRELOAD"}  # nothing inherited, nothing off the list
    assert seen["env"]["LD_PRELOAD"].startswith("/proc/self/fd/") and seen["sha"] == _sha(lib)
    assert "orbite-pinned" in seen["maps"] and lib not in seen["maps"]  # the sealed copy was mapped
    start = events(client.journal_path, "child_start")[0]
    assert start["env_stripped"] == DROPPED and start["env_keys"] == ["LD_PRELOAD", "ORBITE_X"]
    assert [(p["path"], p["sha256"]) for p in start["ld_preload"]] == [(lib, _sha(lib))]
    assert start["ld_preload"][0]["loaded_as"] == seen["env"]["LD_PRELOAD"]
    assert start["argv"][0] == sys.executable and start["pid"] == child["pid"]
    client.stop()


def test_preload_whose_hash_differs_is_refused_and_nothing_runs(node, tmp_path):
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"\x7fELF not the pinned bytes")
    marker = tmp_path / "ran"
    _, client = node.start()
    with pytest.raises(SupervisorRequestError) as caught:
        client.launch([sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                      ld_preload=[{"path": str(lib), "sha256": "0" * 64}])
    assert caught.value.code == "supervisor.hash_mismatch" and "does not match the pinned" in str(caught.value)
    assert not marker.exists() and client.status()["children"] == []
    assert events(client.journal_path, "child_launch_failed")[0]["error"] == "supervisor.hash_mismatch"
    client.stop()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"argv": "/bin/sh -c true"}, "argv '/bin/sh -c true': must be a non-empty list"),
        ({"argv": ["sh", "-c", "true"]}, "argv[0] 'sh': must be the absolute path"),
        ({"env": {"BAD KEY": "1"}}, "env key 'BAD KEY'"),
        ({"env": {"ORBITE_X\n": "1"}}, "env key 'ORBITE_X\\n'"),  # full match: no trailing newline
        ({"ld_preload": ["/usr/lib/x.so"]}, "must be {path, sha256} (only hash-pinned"),
        ({"ld_preload": [{"path": "relative.so", "sha256": "0" * 64}]},
         "ld_preload[0].path 'relative.so': must be an absolute path"),
        ({"ld_preload": [{"path": "/nonexistent/lib.so", "sha256": "0" * 64}]},
         "ld_preload[0].path '/nonexistent/lib.so': must be an existing regular"),
        ({"ld_preload": [{"path": "/tmp", "sha256": "0" * 64}]}, "ld_preload[0].path '/tmp': must be an existing"),
        ({"ld_preload": [{"path": "/a:b.so", "sha256": "0" * 64}]}, "must not contain spaces or colons"),
        ({"ld_preload": [{"path": "/etc/hostname", "sha256": "0" * 63 + "\n"}]}, "ld_preload[0].sha256"),
        ({"exe_sha256": "A" * 64}, "exe_sha256 'AAAA"),
        ({"cwd": "/nonexistent-dir"}, "cwd '/nonexistent-dir'"),
    ],
)
def test_launch_bad_input_is_refused_by_client_and_supervisor(node, kwargs, needle):
    # Guards validate_launch_request, applied by the client and again by the supervisor.
    _, client = node.start()
    args = {"argv": [sys.executable, "-c", "pass"]}
    args.update(kwargs)
    with pytest.raises(SupervisorInputError) as caught:
        client.launch(**args)
    assert needle in str(caught.value)
    raw = {"op": "launch", "env": {}, "ld_preload": [], "cwd": None, "stdout_path": None, "stderr_path": None,
           "exe_sha256": None}
    raw.update(args)
    with pytest.raises(SupervisorRequestError) as caught:  # bypass the client: the supervisor refuses too
        client.request(raw)
    assert caught.value.code == "supervisor.bad_request" and needle in str(caught.value)
    assert client.status()["children"] == []
    client.stop()


def test_symlinked_preload_is_refused(node, tmp_path):
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"\x7fELF")
    link = tmp_path / "link.so"
    link.symlink_to(lib)
    _, client = node.start()
    with pytest.raises(SupervisorInputError, match="not a symlink"):
        client.launch([sys.executable, "-c", "pass"], ld_preload=[{"path": str(link), "sha256": _sha(lib)}])
    client.stop()


def test_lock_contention_at_start_names_owner_and_leaves_nothing_held(node):
    # Guards start()'s LockTimeout path: journal lock_timeout, release of locks already taken.
    first, client_a = node.start("run-a", locks=["mlx5_1"])
    with pytest.raises(SupervisorStartError) as caught:
        node.start("run-b", locks=LOCKS, lock_timeout=0.3)
    err = caught.value
    assert err.code == "supervisor.lock_timeout" and err.details["rnic"] == "mlx5_1"
    assert "run run-a of controller pytest" in str(err) and f"pid {first['pid']}" in str(err)
    assert err.details["owner"]["run_id"] == "run-a"
    assert node.free("mlx5_0")  # run-b had taken mlx5_0 first and gave it back
    jb = journal(os.path.join(node.run_dir("run-b"), "journal.jsonl"))
    assert [e["ev"] for e in jb][-4:] == ["lock_timeout", "start_failed", "lock_release", "journal_close"]
    client_a.stop()


def test_identity_change_inside_locks_is_refused(node):
    # Guards start()'s identity recheck inside the locks.
    with pytest.raises(SupervisorStartError) as caught:
        node.start(boot_id="11111111-2222-3333-4444-555555555555")
    assert caught.value.code == "supervisor.identity_mismatch"
    assert "boot_id is '0f0e0d0c" in str(caught.value)
    assert node.free("mlx5_0") and node.free("mlx5_1")
    j = journal(os.path.join(node.run_dir("run-1"), "journal.jsonl"))
    check = next(e for e in j if e["ev"] == "identity_check")
    assert check["stage"] == "inside_locks" and check["ok"] is False and "boot_id" in check["mismatch"]
    # after the locks: the check really ran inside them
    assert [e["ev"] for e in j].index("identity_check") > [e["ev"] for e in j].index("lock_acquire")


def test_second_start_in_same_run_dir_is_refused(node):
    _, client = node.start()
    with pytest.raises(SupervisorAlreadyRunning):
        node.start()
    client.stop()


def test_restart_after_stop_keeps_previous_journal(node):
    _, client = node.start()
    client.stop()
    _, client = node.start()
    first = journal(client.journal_path)[0]
    assert first["previous_journal"].endswith("journal.1.jsonl") and os.path.exists(first["previous_journal"])
    client.stop()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"locks": ["a/b"]}, "RNIC name 'a/b'"),
        ({"locks": ["mlx5_0", "mlx5_0"]}, "must not name an RNIC twice"),
        ({"locks": []}, "must be a non-empty list"),
        ({"lease": "0"}, "lease '0'"),
        ({"lock_timeout": "soon"}, "lock_timeout 'soon'"),
        ({"run_id": "../x"}, "run_id '../x'"),
    ],
)
def test_bad_start_input_fails_before_anything_is_created(node, kwargs, needle):
    run_id = kwargs.pop("run_id", "run-1")
    with pytest.raises(SupervisorInputError) as caught:
        start_supervisor(node.run_dir("run-1"), run_id, kwargs.pop("locks", LOCKS), node.lock_dir,
                         root=node.root, **kwargs)
    assert needle in str(caught.value)
    assert not os.path.exists(node.lock_dir) and not os.path.exists(node.run_dir("run-1"))


def test_lock_dir_with_loose_permissions_is_refused(node):
    # Guards ensure_private_dir(lock_dir) in start_supervisor.
    os.makedirs(node.lock_dir, mode=0o755)
    os.chmod(node.lock_dir, 0o755)
    with pytest.raises(SupervisorInputError) as caught:
        node.start()
    assert f"lock_dir {node.lock_dir}: has mode 0755" in str(caught.value)
    assert os.listdir(node.lock_dir) == []
    assert not os.path.exists(node.run_dir("run-1"))


@pytest.mark.root
def test_socket_owned_by_someone_else_is_refused(node):
    # Guards check_socket: another user's socket is never talked to.
    if os.geteuid() != 0:
        pytest.skip("needs root to chown the socket to another uid")
    ready, client = node.start()
    os.chown(client.socket_path, 65534, 65534)
    with pytest.raises(SupervisorSocketError) as caught:
        client.status()
    assert "owned by uid 65534" in str(caught.value) and client.socket_path in str(caught.value)
    with pytest.raises(SupervisorSocketError):
        node.start()
    os.chown(client.socket_path, 0, 0)
    client.stop()
    wait_dead(ready["pid"])
    assert node.free("mlx5_0") and node.free("mlx5_1")


def test_run_dir_with_loose_permissions_is_refused(node):
    _ready, client = node.start()
    os.chmod(node.run_dir("run-1"), 0o755)
    with pytest.raises(SupervisorSocketError, match=r"run_dir .*mode 0755"):
        client.status()
    os.chmod(node.run_dir("run-1"), 0o700)
    client.stop()


def test_long_run_dir_path_works(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    n = Node(deep)
    try:
        assert len(n.run_dir("run-1")) > 108
        _, client = n.start()
        assert client.status()["run_id"] == "run-1"
        client.stop()
    finally:
        n.cleanup()


def test_unknown_op_and_garbage_request(node):
    _, client = node.start()
    with pytest.raises(SupervisorRequestError, match="op 'explode'"):
        client.request({"op": "explode"})
    with pytest.raises(SupervisorRequestError, match="child_id 'c0'"):
        client.wait("c0")
    with pytest.raises(SupervisorRequestError) as caught:
        client.wait("c9")
    assert caught.value.code == "supervisor.unknown_child"
    client.stop()


def test_sigterm_to_supervisor_cleans_up(node):
    ready, client = node.start()
    child = client.launch(SLEEPER)
    os.kill(ready["pid"], signal.SIGTERM)
    wait_dead(ready["pid"])
    assert not alive(child["pid"]) and node.free("mlx5_0")
    assert events(client.journal_path, "supervisor_stop")[0]["reason"] == "signal SIGTERM"


def test_missing_interpreter_is_an_error_not_a_traceback(node):
    with pytest.raises(SupervisorStartError) as caught:
        node.start(python="/nonexistent/python3")
    assert caught.value.code == "supervisor.os_error" and "/nonexistent/python3" in str(caught.value)
    assert node.free("mlx5_0")


def test_supervisor_that_dies_before_ready_is_reported(node):
    # Guards the EOF-without-message path of start_supervisor (start_crashed).
    with pytest.raises(SupervisorStartError) as caught:
        node.start(python="/bin/true")
    assert caught.value.code == "supervisor.start_crashed"
    assert node.free("mlx5_0")


# A stand-in for the interpreter that runs the supervisor program: it writes one message on the ready pipe and exits
# only once the starter has read it (the pipe is empty again), as a launcher that is slow to exit would; "hang"
# writes nothing and never exits. Its pid goes to the file named by ORBITE_TEST_LAUNCHER_PID (next to the script).
FAKE_LAUNCHER = """#!{python}
import fcntl, json, os, struct, sys, termios, time
with open(os.path.join(os.path.dirname(sys.argv[0]), "launcher.pid"), "w") as handle:
    handle.write(str(os.getpid()))
args = sys.argv[1:]
with open(args[args.index("--config") + 1]) as handle:
    cfg = json.load(handle)
fd = int(args[args.index("--ready-fd") + 1])
kind = {kind!r}
if kind == "hang":
    time.sleep(120)
if kind == "ready":
    msg = {{"ok": True, "run_id": cfg["run_id"], "locks": [{{"rnic": r}} for r in cfg["locks"]]}}
else:
    msg = {{"ok": False, "error": "supervisor.bad_request", "msg": "the launcher's own check failed"}}
os.write(fd, (json.dumps(msg) + "\\n").encode())
# A starter that waits for this process before it reads the pipe never lets it go: after a bound, it spoils
# the message with a second line instead (so such a starter fails instead of hanging).
deadline = time.monotonic() + 20
while struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\\0" * 4))[0]:
    if time.monotonic() >= deadline:
        os.write(fd, b"late\\n")
        break
    time.sleep(0.01)
sys.exit(0 if kind == "ready" else 2)
"""


def _fake_launcher(tmp_path, kind):
    path = tmp_path / "launcher" / "python"
    path.parent.mkdir()
    path.write_text(FAKE_LAUNCHER.format(python=sys.executable, kind=kind))
    path.chmod(0o755)
    return str(path), path.parent / "launcher.pid"


def _reaped(pid_file):
    """True once the launcher is gone, zombie included: the starter reaped it."""
    return not os.path.exists(f"/proc/{int(pid_file.read_text())}")


def test_ready_is_read_before_the_launcher_exits(node, tmp_path):
    # Guards _spawn_and_wait's order: the ready message is read first, then the launcher is reaped (it used to be
    # reaped first, which cost Popen.wait's polling sleeps on every start).
    python, pid_file = _fake_launcher(tmp_path, "ready")
    ready, _client = node.start(python=python)
    assert ready["ok"] is True and ready["run_id"] == "run-1"
    assert _reaped(pid_file)


def test_a_launcher_that_fails_its_own_check_gives_its_error(node, tmp_path):
    # Guards the same order on the failure path: the launcher's message (the supervisor's check of its
    # configuration, before the fork) is the error, and the launcher is reaped.
    python, pid_file = _fake_launcher(tmp_path, "fail")
    with pytest.raises(SupervisorStartError) as caught:
        node.start(python=python)
    assert caught.value.code == "supervisor.bad_request" and "own check failed" in str(caught.value)
    assert _reaped(pid_file) and node.free("mlx5_0")


def test_a_launcher_that_never_reports_is_killed_at_the_start_timeout(node, tmp_path, monkeypatch):
    # Guards _reap_launcher: a launcher still running when the start window ends is killed and reaped.
    monkeypatch.setattr(client_mod, "_START_MARGIN_S", 1.0)
    python, pid_file = _fake_launcher(tmp_path, "hang")
    with pytest.raises(SupervisorStartError) as caught:
        node.start(python=python, lock_timeout=0)
    assert caught.value.code == "supervisor.start_timeout"
    assert _reaped(pid_file)


def _connect_as(uid, dir_fd, out_w):
    """Child: become uid, connect through the inherited run-dir fd, report the answer."""
    import ctypes
    import socket

    os.setgid(uid)
    os.setuid(uid)
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: keep /proc/self/fd usable after setuid
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(f"/proc/self/fd/{dir_fd}/control.sock")
        try:
            sock.sendall(b'{"op": "status"}\n')
        except BrokenPipeError:
            pass  # refused peers are answered at once and disconnected
        answer = sock.recv(65536)
    except OSError as exc:
        answer = json.dumps({"oserror": str(exc)}).encode()
    os.write(out_w, answer)
    os._exit(0)


@pytest.mark.root
def test_peer_of_another_uid_is_refused(node):
    # Guards _accept's SO_PEERCRED uid check (the socket is opened up on purpose to reach it).
    if os.geteuid() != 0:
        pytest.skip("needs root to connect as another uid")
    _, client = node.start()
    os.chmod(client.socket_path, 0o666)
    os.chmod(node.run_dir("run-1"), 0o711)
    dir_fd = os.open(node.run_dir("run-1"), os.O_RDONLY | os.O_DIRECTORY)
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _connect_as(65534, dir_fd, out_w)
    os.close(out_w)
    os.waitpid(pid, 0)
    answer = json.loads(os.read(out_r, 65536) or b"{}")
    os.close(out_r)
    os.close(dir_fd)
    assert answer.get("error") == "supervisor.forbidden" and "peer uid 65534" in answer.get("msg", ""), answer
    assert events(client.journal_path, "connection_refused")[0]["peer_uid"] == 65534
    os.chmod(client.socket_path, 0o600)
    os.chmod(node.run_dir("run-1"), 0o700)
    client.stop()


@pytest.mark.parametrize("sig", ["SIGFOO", "0", -1, 999, True])
def test_bad_signal_is_refused_before_anything_is_sent(node, sig):
    _, client = node.start()
    child = client.launch(SLEEPER)
    with pytest.raises(SupervisorInputError, match="signal"):
        client.signal(child["child_id"], child["pid"], child["start_time"], sig)
    assert alive(child["pid"]) and events(client.journal_path, "signal") == []
    client.stop(force=True)


def test_stop_probes_the_run_lock_again_soon_after_the_answer(monkeypatch, tmp_path):
    # Guards stop()'s wait for the answered supervisor to let go of its run lock: the first probes come within a
    # millisecond (it lets go that fast), growing to 10 ms, and the wait still ends at STOP_EXIT_WAIT_S.
    class Clock:
        now = 0.0
        sleeps = []

        def monotonic(self):
            return self.now

        def sleep(self, seconds):
            self.sleeps.append(seconds)
            self.now += seconds

    clock = Clock()
    monkeypatch.setattr(client_mod, "time", clock)
    probes = iter([True, True, True])
    monkeypatch.setattr(SupervisorClient, "request", lambda self, payload, timeout=None: {"ok": True, "reason": "stop"})
    monkeypatch.setattr(SupervisorClient, "alive", lambda self: next(probes, False))
    assert SupervisorClient(str(tmp_path)).stop(force=True) == {"reason": "stop"}
    assert clock.sleeps == [0.0005, 0.001, 0.002]
    clock.sleeps.clear()
    monkeypatch.setattr(SupervisorClient, "alive", lambda self: True)  # never lets go: bounded
    SupervisorClient(str(tmp_path)).stop(force=True)
    assert max(clock.sleeps) == 0.01 and client_mod.STOP_EXIT_WAIT_S <= sum(clock.sleeps) < \
        client_mod.STOP_EXIT_WAIT_S + 0.011
