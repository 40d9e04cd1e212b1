"""Issue 13 on the supervisor: each test reproduces one way main could hurt a lab and sees it refused.

- the supervisor checks its own configuration with the name grammar (a lock "mlx5_0\\n" is refused);
- a child's environment is an allowlist (LD_AUDIT, LD_LIBRARY_PATH, RDMAV_* never reach it);
- concurrent starts on one run directory never tell a caller "ready" with other locks than asked;
- a hung (SIGSTOPped) holder whose lease ran out is killed by the next start, and a stop escalates;
- accept errors (descriptors exhausted) never end the supervisor;
- the runner's whole process tree dies with it, even when the supervisor is SIGKILLed;
- the program copied into the run directory is complete.

Real detached supervisors, real flock, real children. The journal/full-disk test is in
test_supervisor_disk.py (it needs a mount namespace).
"""

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from helpers.node_root import SLEEPER, alive, events, journal, make_root, wait_dead
from ansible_collections.orbite.qualification.plugins.module_utils._node import locks as rnic_lock
from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (
    SupervisorAlreadyRunning,
    SupervisorClient,
    SupervisorError,
    SupervisorRequestError,
    SupervisorStartError,
    install_program,
    start_supervisor,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node.daemon import socket_address

def wait_file(path, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) or not open(path).read().strip():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.01)
    return open(path).read().strip()


class Node:
    """A fake host root; every process whose command line names it is SIGKILLed (and continued) at teardown."""

    def __init__(self, base):
        self.root = make_root(base / "root")
        self.lock_dir = os.path.join(self.root, "run", "orbite", "locks")

    def run_dir(self, run_id):
        return os.path.join(self.root, "run", "orbite", "supervisors", run_id)

    def start(self, run_id="run-1", locks=("mlx5_0", "mlx5_1"), **kw):
        kw.setdefault("lease", 60)
        kw.setdefault("lock_timeout", 2)
        ready = start_supervisor(self.run_dir(run_id), run_id, list(locks), self.lock_dir, root=self.root,
                                 controller="pytest", **kw)
        return ready, SupervisorClient(self.run_dir(run_id))

    def free(self, rnic):
        return rnic_lock.probe(self.lock_dir, rnic)

    def cleanup(self):
        mine = self.root.encode()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as handle:
                    if mine not in handle.read():
                        continue
                os.kill(int(name), signal.SIGKILL)
                os.kill(int(name), signal.SIGCONT)
            except OSError:
                continue


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.cleanup()


# ---------------------------------------------------------------------------------------------
# 1. the supervisor's own check of its configuration


def _run_daemon(node, run_id, cfg_changes):
    """Start the copied supervisor program directly (bypassing the client's checks); its ready message."""
    run_dir = rnic_lock.ensure_private_dir(node.run_dir(run_id), "run_dir")
    main = install_program(run_dir)
    cfg = {"run_dir": run_dir, "run_id": run_id, "locks": ["mlx5_0"], "lock_dir": node.lock_dir,
           "root": node.root, "hostname": None, "boot_id": None, "controller": "pytest", "lease": 30.0,
           "lock_timeout": 1.0, "previous_journal": None}
    cfg.update(cfg_changes)
    cfg_path = os.path.join(run_dir, "config.json")
    with open(cfg_path, "w") as handle:
        json.dump(cfg, handle)
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([sys.executable, "-E", "-s", "-B", main, "--config", cfg_path, "--ready-fd",
                             str(write_fd)], pass_fds=(write_fd,), cwd=run_dir)
    os.close(write_fd)
    proc.wait(30)
    with os.fdopen(read_fd, "rb") as handle:
        return json.loads(handle.readline() or b"{}"), run_dir


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"locks": ["mlx5_0\n"]}, "locks[0] 'mlx5_0\\n'"),  # re.match(...$) took it: a second lock file
        ({"locks": [" mlx5_0"]}, "locks[0] ' mlx5_0'"),
        ({"locks": ["mlx5_\uff10"]}, "locks[0] 'mlx5_\uff10'"),  # fullwidth zero
        ({"locks": ["mlx5_0", "mlx5_0"]}, "must not name an RNIC twice"),
        ({"run_id": "r1\n"}, "run_id 'r1\\n'"),
        ({"controller": "ctl\n"}, "controller 'ctl\\n'"),
        ({"lease": "600"}, "lease '600'"),
    ],
)
def test_supervisor_refuses_a_configuration_that_breaks_the_rules(node, changes, needle):
    message, run_dir = _run_daemon(node, "run-1", changes)
    assert message.get("ok") is False and message.get("error") == "supervisor.bad_request", message
    assert needle in message["msg"]
    # Refused before anything: no lock taken, no lock file, no journal.
    assert not os.path.exists(node.lock_dir) or os.listdir(node.lock_dir) == []
    assert not os.path.exists(os.path.join(run_dir, "journal.jsonl"))


# ---------------------------------------------------------------------------------------------
# 2. the child's environment


def test_child_environment_is_an_allowlist_and_the_journal_lists_what_was_dropped(node, tmp_path):
    # On main LD_AUDIT and LD_LIBRARY_PATH reached the child (an unpinned library loaded into it).
    _, client = node.start()
    out = tmp_path / "environ"
    env = {"PATH": "/usr/bin:/bin", "ORBITE_Y": "2", "LD_AUDIT": "/nonexistent/audit.so",
           "LD_LIBRARY_PATH": "/nonexistent/lib", "LD_BIND_NOW": "1", "RDMAV_FORK_SAFE": "1",
           "RDMAV_ALLOW_DISASSOC_DESTROY": "1"}
    child = client.launch([sys.executable, "-c", "import sys; sys.stdout.write(open('/proc/self/environ').read())"],
                          env=env, stdout_path=str(out))
    assert client.wait(child["child_id"], timeout=10)["exit_code"] == 0
    seen = dict(e.split("=", 1) for e in out.read_text().split("\0") if e)
    assert seen == {"PATH": "/usr/bin:/bin", "ORBITE_Y": "2"}
    dropped = ["LD_AUDIT", "LD_BIND_NOW", "LD_LIBRARY_PATH", "RDMAV_ALLOW_DISASSOC_DESTROY", "RDMAV_FORK_SAFE"]
    assert child["env_stripped"] == dropped
    assert events(client.journal_path, "child_start")[0]["env_stripped"] == dropped
    client.stop()


# ---------------------------------------------------------------------------------------------
# 3. one start per run directory


def _start_one(root, run_dir, lock_dir, locks, go, out):
    go.wait()
    try:
        ready = start_supervisor(run_dir, "race", locks, lock_dir, root=root, lease=60, lock_timeout=5)
        out.put(("ready", locks, sorted(lk["rnic"] for lk in ready["locks"]), ready["pid"]))
    except SupervisorAlreadyRunning as exc:
        out.put(("running", locks, sorted(lk["rnic"] for lk in exc.status["locks"]), exc.status["pid"]))
    except SupervisorError as exc:
        out.put(("error", locks, str(exc), None))


@pytest.mark.slow
def test_concurrent_starts_on_one_run_dir_never_report_ready_with_other_locks(node):
    # On main both callers wrote config.json: one asking for mlx5_1 was told "ready" holding mlx5_0.
    ctx = multiprocessing.get_context("fork")
    run_dir = node.run_dir("race")
    for _trial in range(20):
        go, out = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_start_one, args=(node.root, run_dir, node.lock_dir, [rnic], go, out))
                 for rnic in ("mlx5_0", "mlx5_1")]
        for proc in procs:
            proc.start()
        go.set()
        results = [out.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(30)
        readies = [r for r in results if r[0] == "ready"]
        for kind, asked, held, _pid in results:
            assert kind in ("ready", "running"), results
            if kind == "ready":
                assert held == asked, f"told ready holding {held} after asking {asked}"
        assert len(readies) == 1, results
        other = next(r for r in results if r[0] == "running")
        assert other[2] == readies[0][1] and other[3] == readies[0][3]  # it names the one that runs
        SupervisorClient(run_dir).stop(force=True)
        wait_dead(readies[0][3])
    assert node.free("mlx5_0") and node.free("mlx5_1")


# ---------------------------------------------------------------------------------------------
# 4. a hung holder


def test_hung_holder_whose_lease_ran_out_is_killed_by_the_next_start(node, tmp_path):
    # On main a SIGSTOPped supervisor kept its locks forever: the next start timed out.
    ready_a, client_a = node.start("run-a", locks=["mlx5_0"], lease=1.0)
    child = client_a.launch(SLEEPER)
    os.kill(ready_a["pid"], signal.SIGSTOP)
    try:
        _ready_b, client_b = node.start("run-b", locks=["mlx5_0"], lock_timeout=20)
    finally:
        if alive(ready_a["pid"]):
            os.kill(ready_a["pid"], signal.SIGCONT)
    wait_dead(ready_a["pid"])
    wait_dead(child["pid"])  # its runner went with it
    (enforced,) = events(client_b.journal_path, "lease_enforced")
    assert enforced["holder"]["pid"] == ready_a["pid"] and enforced["holder"]["run_id"] == "run-a"
    assert enforced["signals"] == ["SIGKILL"] and enforced["killed"] is True and enforced["overdue_s"] > 1
    acquired = events(client_b.journal_path, "lock_acquire")[0]
    assert acquired["previous_state"] == "stale" and acquired["previous_owner"]["pid"] == ready_a["pid"]
    # Taken once the lease was enforced, not by outwaiting the holder: no lock timed out on the way.
    assert enforced["seq"] < acquired["seq"] and not events(client_b.journal_path, "lock_timeout")
    last = journal(client_a.journal_path)[-1]  # the hung one's own journal says who ended it, and why
    assert last["ev"] == "supervisor_killed" and last["pid"] == ready_a["pid"] and "run run-b" in last["by"]
    assert last["seq"] == journal(client_a.journal_path)[-2]["seq"] + 1
    client_b.stop()


def test_hung_holder_whose_lease_still_runs_is_left_alone(node):
    ready_a, client_a = node.start("run-a", locks=["mlx5_0"], lease=60)
    os.kill(ready_a["pid"], signal.SIGSTOP)
    try:
        with pytest.raises(SupervisorStartError) as caught:
            node.start("run-b", locks=["mlx5_0"], lock_timeout=1)
        assert caught.value.code == "supervisor.lock_timeout"
        assert alive(ready_a["pid"]) and not node.free("mlx5_0")
    finally:
        os.kill(ready_a["pid"], signal.SIGCONT)
    client_a.stop()


@pytest.mark.slow
def test_start_on_the_run_dir_of_a_hung_supervisor_takes_over_once_its_lease_ran_out(node):
    ready_a, client = node.start("run-1", locks=["mlx5_0"], lease=6.0)
    t0 = time.monotonic()
    os.kill(ready_a["pid"], signal.SIGSTOP)
    try:
        with pytest.raises(SupervisorStartError) as caught:  # its lease still runs: refused, not killed
            node.start("run-1", locks=["mlx5_0"])
        assert caught.value.code == "supervisor.unresponsive" and "does not answer" in str(caught.value)
        assert alive(ready_a["pid"])
        time.sleep(max(0.0, 6.0 + 3.5 - (time.monotonic() - t0)))  # lease + grace
        ready_b, client = node.start("run-1", locks=["mlx5_0"])
    finally:
        if alive(ready_a["pid"]):
            os.kill(ready_a["pid"], signal.SIGCONT)
    assert not alive(ready_a["pid"]) and ready_b["pid"] != ready_a["pid"]
    previous = journal(journal(client.journal_path)[0]["previous_journal"])
    assert previous[-1]["ev"] == "supervisor_killed" and previous[-1]["pid"] == ready_a["pid"]
    client.stop()


def _tree_script(pid_dir, then="time.sleep(120)\n"):
    """A runner that leaves a grandchild in its group and one that escaped it with setsid(), then ``then``."""
    return (
        "import os, pathlib, time\n"
        f"d = {str(pid_dir)!r}\n"
        "for name, escape in (('same_group', False), ('own_session', True)):\n"
        "    if os.fork() == 0:\n"
        "        if escape:\n"
        "            os.setsid()\n"
        "        open(os.path.join(d, name + '.tmp'), 'w').write(str(os.getpid()))\n"
        "        os.rename(os.path.join(d, name + '.tmp'), os.path.join(d, name))\n"
        "        time.sleep(120)\n"
        "        os._exit(0)\n"
        "while not all(pathlib.Path(d, n).exists() for n in ('same_group', 'own_session')):\n"
        "    time.sleep(0.01)\n"
        + then
    )


def test_stop_of_a_hung_supervisor_escalates_term_then_kill(node, tmp_path):
    # On main `state: stopped` of a SIGSTOPped supervisor never got an answer and never escalated.
    ready, client = node.start(lease=60)
    child = client.launch([sys.executable, "-c", _tree_script(tmp_path)])
    grandchildren = [int(wait_file(tmp_path / name)) for name in ("same_group", "own_session")]
    os.kill(ready["pid"], signal.SIGSTOP)
    try:
        summary = client.stop(force=True, timeout=1, term_grace=1)
    finally:
        if alive(ready["pid"]):
            os.kill(ready["pid"], signal.SIGCONT)
    assert summary["reason"] == "escalated" and summary["escalation"] == ["SIGTERM", "SIGKILL"]
    assert summary["locks_released"] is True and node.free("mlx5_0") and node.free("mlx5_1")
    for pid in [ready["pid"], child["pid"], *grandchildren]:
        wait_dead(pid, timeout=10)
    last = journal(client.journal_path)[-1]
    assert last["ev"] == "supervisor_killed" and last["signals"] == ["SIGTERM", "SIGKILL"]
    assert last["pid"] == ready["pid"] and last["start_time"] == ready["start_time"]


# ---------------------------------------------------------------------------------------------
# 5. accept errors


def _answers_while_idle(client, pid, child, idle):
    """While the ``idle`` connections hang, the same supervisor answers and it and its child live; then they close."""
    try:
        assert _status_eventually(client)["pid"] == pid
        assert alive(pid) and alive(child["pid"])
    finally:
        for sock in idle:
            sock.close()


def _connect_idle(path, n):
    """n connections that never send a request (as many as the backlog takes)."""
    socks = []
    with socket_address(path) as address:  # pytest's tmp paths can exceed sun_path
        for _ in range(n):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(2)
            try:
                sock.connect(address)
            except OSError:
                sock.close()
                continue
            socks.append(sock)
    return socks


def _status_eventually(client, timeout=15.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.status()
        except SupervisorRequestError as exc:
            assert exc.code == "supervisor.busy", exc
        except SupervisorError:
            pass
        assert time.monotonic() < deadline, "the supervisor stopped answering"
        time.sleep(0.05)


def _fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_accept_errors_never_end_the_supervisor(node):
    # On main 70 idle connections under an open-file limit of 64 made accept() fail with EMFILE and
    # the supervisor exit, killing its child.
    import resource

    ready, client = node.start()
    pid = ready["pid"]
    child = client.launch(SLEEPER)
    baseline = _fd_count(pid)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (64, 64))
    idle = _connect_idle(client.socket_path, 70)
    assert len(idle) > 64
    _answers_while_idle(client, pid, child, idle)
    deadline = time.monotonic() + 10
    while _fd_count(pid) > baseline and time.monotonic() < deadline:
        time.sleep(0.02)
    # Now leave it room for only a few connections: accept() itself fails with EMFILE.
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (baseline + 3, baseline + 3))
    idle = _connect_idle(client.socket_path, 20)
    assert len(idle) == 20
    _answers_while_idle(client, pid, child, idle)
    assert _status_eventually(client)["children"][0]["running"] is True
    assert events(client.journal_path, "accept_error")  # seen, journaled, survived
    client.stop(force=True)
    wait_dead(pid)


# ---------------------------------------------------------------------------------------------
# 6. the runner's process tree


def test_grandchildren_die_with_a_sigkilled_supervisor(node, tmp_path):
    # On main PR_SET_PDEATHSIG killed the runner only: its grandchild survived the supervisor.
    ready, client = node.start()
    child = client.launch([sys.executable, "-c", _tree_script(tmp_path)])
    grandchildren = [int(wait_file(tmp_path / name)) for name in ("same_group", "own_session")]
    os.kill(ready["pid"], signal.SIGKILL)
    for pid in [ready["pid"], child["pid"], *grandchildren]:
        wait_dead(pid, timeout=10)
    assert node.free("mlx5_0") and node.free("mlx5_1")


def test_tree_ends_with_the_runner_and_its_exit_status_is_the_runners(node, tmp_path):
    _, client = node.start()
    child = client.launch([sys.executable, "-c", _tree_script(tmp_path, then="raise SystemExit(7)\n")])
    done = client.wait(child["child_id"], timeout=20)
    assert done["exit_code"] == 7 and done["exit_signal"] is None
    for name in ("same_group", "own_session"):
        wait_dead(int(wait_file(tmp_path / name)), timeout=10)
    term = client.launch(SLEEPER)
    killed = client.signal(term["child_id"], term["pid"], term["start_time"], "SIGTERM")
    assert killed["exit_signal_name"] == "SIGTERM" and killed["exit_code"] is None
    client.stop()


# ---------------------------------------------------------------------------------------------
# 7. the copied program


def test_copied_program_imports_with_nothing_but_its_run_directory(tmp_path):
    # _PROGRAM_MODULES must hold every module daemon.py needs, directly or not.
    lib = os.path.dirname(install_program(str(tmp_path)))
    code = ("import sys; sys.path.insert(0, sys.argv[1]);"
            "import ansible_collections.orbite.qualification.plugins.module_utils._node.daemon as d;"
            "print('\\n'.join(m.__file__ for n, m in sys.modules.items() if n.startswith('ansible_collections')"
            " and getattr(m, '__file__', None)))")
    run = subprocess.run([sys.executable, "-S", "-E", "-s", "-B", "-c", code, lib], capture_output=True, text=True,
                         cwd="/", check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() and all(path.startswith(lib) for path in run.stdout.split())
