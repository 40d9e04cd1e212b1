# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""A supervised runner's whole process tree, started and ended as one (see docs/supervisor.md).

The supervisor does not exec a runner itself: it forks a **keeper**, and the keeper forks and
execs the runner. The keeper

- is the leader of a new session, and a child subreaper (PR_SET_CHILD_SUBREAPER): every
  descendant of the runner that loses its parent is re-parented to the keeper, not to init;
- dies-with-the-supervisor as SIGTERM (PR_SET_PDEATHSIG), which it handles by killing the tree;
- when the runner exits (or on that SIGTERM) kills the runner's process group while the runner is
  still an unreaped zombie (so its group id cannot have been reused), then every process
  re-parented to it, round after round, until it has no child left;
- then exits the way the runner did (same exit code, or the same signal), so the supervisor's
  wait status of the keeper is the runner's.

So a grandchild, even one that left the runner's process group with setsid(), never outlives the
runner, the supervisor's stop, or a SIGKILL of the supervisor. The runner itself has
PR_SET_PDEATHSIG = SIGKILL towards the keeper and its own process group.

The helpers that identify a process by pid *and* start time live here too. Node-side, stdlib only,
Python >= 3.9; copied into the supervisor's run directory.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import select
import signal
import time
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
TREE_KILL_TIMEOUT_S = 10.0
REPORT_TIMEOUT_S = 30.0
_TERMINATE = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What subprocess' restore_signals puts back to default before exec (Python ignores them).
_RESTORE = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, *_TERMINATE)


# ---------------------------------------------------------------------------------------------
# Processes by pid and start time


def _stat_fields(pid: int) -> List[bytes]:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        data = handle.read()
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    return data[data.rindex(b")") + 2:].split()


def proc_start_time(pid: int) -> int:
    """Start time of pid in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    return int(_stat_fields(pid)[19])


def proc_state(pid: int) -> Optional[str]:
    """The state letter of pid (R, S, T, Z, ...), or None when there is no such process."""
    try:
        return _stat_fields(pid)[0].decode("ascii", "replace")
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """True while pid runs or is stopped; a zombie holds no lock and no descriptor: not alive."""
    return proc_state(pid) not in (None, "Z", "X")


def verify_process(pid, start_time, marker: Optional[bytes] = None) -> Optional[str]:
    """None when ``pid`` is alive, started at ``start_time`` and (if given) has ``marker`` in its
    command line; otherwise why it is not that process (so it must not be signalled)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        return f"pid {pid!r} is not a process id"
    if isinstance(start_time, bool) or not isinstance(start_time, int):
        return f"start time {start_time!r} is not a number of clock ticks"
    if not pid_alive(pid):
        return f"pid {pid} no longer runs"
    try:
        now = proc_start_time(pid)
    except (OSError, ValueError, IndexError):
        return f"pid {pid} no longer runs"
    if now != start_time:
        return f"pid {pid} now has start time {now}, not {start_time} (the pid was reused)"
    if marker is not None:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read()
        except OSError:
            return f"pid {pid} no longer runs"
        if marker not in cmdline:
            return f"pid {pid} does not run {marker.decode(errors='replace')}"
    return None


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait until pid no longer runs (not our child: its parent reaps it); True if it is gone."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def children_of(pid: int) -> List[int]:
    """Direct children of pid (its own and adopted ones)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as handle:
            return [int(x) for x in handle.read().split()]
    except (OSError, ValueError):
        pass
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if int(_stat_fields(int(name))[1]) == pid:
                    found.append(int(name))
            except (OSError, ValueError, IndexError):
                continue
    return found


_LIBC = []


def prctl(option: int, value: int) -> bool:
    try:
        if not _LIBC:
            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        return _LIBC[0].prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# ---------------------------------------------------------------------------------------------
# Spawning


class _KillTree(BaseException):
    """Raised in the keeper by SIGTERM/SIGINT/SIGHUP: end the whole tree now."""


def _raise_kill_tree(_signum, _frame):
    raise _KillTree()


def _close_fds_except(keep: Iterable[int]) -> None:
    keep = set(keep)
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def spawn_tree(
    argv: Sequence[str],
    exe: str,
    env: Dict[str, str],
    cwd: Optional[str],
    stdio: Tuple[int, int, int],
    keep_fds: Sequence[int] = (),
) -> Tuple[int, int]:
    """Start ``argv`` (exec'd from ``exe``) under a keeper; return (keeper pid, runner pid).

    ``stdio`` are descriptors for the runner's 0, 1, 2; ``keep_fds`` stay open in the runner at
    the same numbers (pinned copies named /proc/self/fd/N). Raises OSError when the exec failed.
    """
    report_r, report_w = os.pipe()
    supervisor = os.getpid()
    keeper = os.fork()
    if keeper == 0:  # pragma: no cover - runs in the forked keeper
        try:
            os.close(report_r)
            _keeper(report_w, supervisor, list(argv), exe, dict(env), cwd, stdio, tuple(keep_fds))
        finally:
            os._exit(127)
    os.close(report_w)
    data = b""
    deadline = time.monotonic() + REPORT_TIMEOUT_S
    try:
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([report_r], [], [], left)[0]:
                break
            chunk = os.read(report_r, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(report_r)
    kind, _sep, rest = data.strip().partition(b" ")
    if kind == b"P":
        return keeper, int(rest)
    try:
        os.kill(keeper, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(keeper, 0)
    if kind == b"E":
        code, _sep, text = rest.partition(b" ")
        raise OSError(int(code) if code.isdigit() else errno.EIO, text.decode("utf-8", "replace") or "exec failed")
    raise OSError(errno.EIO, "the runner's keeper exited before it reported the runner")


def _keeper(report_w, supervisor, argv, exe, env, cwd, stdio, keep_fds):  # pragma: no cover - in the keeper
    runner = None
    status = None
    try:
        signal.set_wakeup_fd(-1)  # the supervisor's wake-up pipe is not ours
        for signum in _TERMINATE:
            signal.signal(signum, _raise_kill_tree)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != supervisor:  # the supervisor died before PDEATHSIG was armed
            os._exit(127)
        _close_fds_except({report_w, *stdio, *keep_fds})
        err_r, err_w = os.pipe()  # close-on-exec: EOF means the exec succeeded
        keeper = os.getpid()
        runner = os.fork()
        if runner == 0:
            try:
                _exec_runner(err_w, keeper, argv, exe, env, cwd, stdio, keep_fds)
            finally:
                os._exit(127)
        os.close(err_w)
        failure = b""
        while True:
            chunk = os.read(err_r, 4096)
            if not chunk:
                break
            failure += chunk
        os.close(err_r)
        if failure:
            os.waitpid(runner, 0)
            os.write(report_w, b"E " + failure.replace(b"\n", b" ") + b"\n")
            os._exit(127)
        os.write(report_w, f"P {runner}\n".encode())
        os.close(report_w)
        _wait_for_runner(runner)
    except _KillTree:
        pass
    except BaseException:  # whatever happens, the tree still ends below
        pass
    for signum in _TERMINATE:
        signal.signal(signum, signal.SIG_IGN)
    if runner is None or runner == 0:
        os._exit(127)
    status = _end_tree(runner)
    _exit_like(status)


def _exec_runner(err_w, keeper, argv, exe, env, cwd, stdio, keep_fds):  # pragma: no cover - in the runner
    try:
        for signum in _RESTORE:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != keeper:
            os._exit(127)
        os.setpgid(0, 0)
        if cwd:
            os.chdir(cwd)
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        for fd in keep_fds:
            os.set_inheritable(fd, True)
        _close_fds_except({0, 1, 2, err_w, *keep_fds})
        os.execve(exe, argv, env)
    except OSError as exc:
        os.write(err_w, f"{exc.errno} {exc.strerror or exc}".encode())
    except BaseException:
        os.write(err_w, b"5 the runner could not be started")
    os._exit(127)


def _wait_for_runner(runner: int) -> None:  # pragma: no cover - in the keeper
    """Reap adopted orphans until the runner exits; leave the runner a zombie (its group id stays ours)."""
    while True:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        if info is None:
            continue
        if info.si_pid == runner:
            return
        try:
            os.waitpid(info.si_pid, 0)
        except ChildProcessError:
            pass


def _end_tree(runner: int) -> int:  # pragma: no cover - in the keeper
    """Kill the runner's group and every process re-parented to us; return the runner's wait status."""
    try:
        os.killpg(runner, signal.SIGKILL)  # the runner is alive or an unreaped zombie: the group id is ours
    except OSError:
        pass
    status = None
    me = os.getpid()
    deadline = time.monotonic() + TREE_KILL_TIMEOUT_S
    while True:
        try:
            pid, wstatus = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break  # no child left: the tree is gone
        if pid == runner:
            status = wstatus
        if pid != 0:
            continue
        # Children remain and none has exited: processes re-parented to us (they left the group).
        for pid in children_of(me):
            if pid != runner:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if time.monotonic() >= deadline:
            break
        time.sleep(0.005)
    if status is None:
        try:
            _pid, status = os.waitpid(runner, os.WNOHANG)
        except ChildProcessError:
            status = None
    return status if status is not None else (int(signal.SIGKILL))


def _exit_like(status: int) -> None:  # pragma: no cover - in the keeper
    """Exit with the runner's exit code, or die of the runner's signal."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if signum not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
            os.kill(os.getpid(), signum)
        except (OSError, ValueError):
            pass
        os._exit(128 + signum)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 127)


def exit_code_of(wstatus: int) -> int:
    """Popen's returncode convention: the exit code, or minus the signal number."""
    if os.WIFSIGNALED(wstatus):
        return -os.WTERMSIG(wstatus)
    if os.WIFEXITED(wstatus):
        return os.WEXITSTATUS(wstatus)
    return -int(signal.SIGKILL)
