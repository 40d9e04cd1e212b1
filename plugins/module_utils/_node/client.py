# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Start a per-node lock supervisor and talk to it (see docs/supervisor.md).

``start_supervisor(...)`` copies the supervisor program (supervisor_daemon.py with rnic_lock.py and
node_identity.py) into the private run directory, starts it detached (new session, second fork,
stdio on a log file) and waits for its ready or failure message on a pipe. ``SupervisorClient``
speaks the one-line JSON protocol over the run directory's UNIX socket; later modules (runner)
build on it. Stdlib only, Python >= 3.9.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import time
from typing import Dict, List, Optional

from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._common import errors as _errors_mod
from ansible_collections.orbite.qualification.plugins.module_utils._common import names as _names_mod
from ansible_collections.orbite.qualification.plugins.module_utils._common import numbers as _numbers_mod
from ansible_collections.orbite.qualification.plugins.module_utils._node import daemon as _daemon_mod
from ansible_collections.orbite.qualification.plugins.module_utils._node import identity as _identity_mod
from ansible_collections.orbite.qualification.plugins.module_utils._node import locks as _lock_mod
from ansible_collections.orbite.qualification.plugins.module_utils._node.locks import (
    LockInputError,
    ensure_private_dir,
    validate_rnic_name,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node.daemon import (
    CONFIG_NAME,
    JOURNAL_NAME,
    LOG_NAME,
    MAX_LEASE_S,
    PID_NAME,
    SOCKET_NAME,
    RequestError,
    signal_number,
    socket_address,
    validate_launch_request,
)

LIB_DIR = "lib"
# The supervisor program outlives the module's temporary directory, so these modules (and their
# packages) are copied next to it; keep the tuple in step with what daemon.py imports.
_PROGRAM_MODULES = (_errors_mod, _names_mod, _numbers_mod, _identity_mod, _lock_mod, _daemon_mod)
_START_MARGIN_S = 15.0


class SupervisorError(OrbiteError):
    """Base class of supervisor failures; msg is meant for the operator."""

    code = "supervisor.error"


class SupervisorInputError(SupervisorError):
    """An argument breaks a rule (field, value and rule are named)."""


class SupervisorSocketError(SupervisorError):
    """The run directory or control socket is not private to this user."""


class SupervisorNotRunning(SupervisorError):
    """No supervisor answers on the run directory's socket."""


class SupervisorAlreadyRunning(SupervisorError):
    def __init__(self, msg: str, status: Dict):
        super().__init__(msg)
        self.status = status


class SupervisorStartError(SupervisorError):
    """The supervisor refused to start (lock contention, identity mismatch, ...)."""

    def __init__(self, msg: str, code: str, details: Dict):
        super().__init__(msg)
        self.code = code
        self.details = details


class SupervisorRequestError(SupervisorError):
    """The supervisor answered a request with an error (code is stable, see docs)."""

    def __init__(self, msg: str, code: str, response: Dict):
        super().__init__(msg)
        self.code = code
        self.response = response


def validate_run_id(run_id) -> str:
    if not names.is_name(run_id):
        raise SupervisorInputError(f"run_id {names.quote(run_id)}: must be {names.NAME_RULE}")
    return run_id


def default_run_dir(root: str, run_id: str) -> str:
    return os.path.join(root, "run", "orbite", "supervisors", validate_run_id(run_id))


def default_lock_dir(root: str) -> str:
    return os.path.join(root, "run", "orbite", "locks")


def _number(field: str, value, low: float, high: float, low_open: bool = False) -> float:
    try:
        num = float(value)  # AWX survey answers arrive as strings
    except (TypeError, ValueError):
        num = None
    if isinstance(value, bool) or num is None or math.isnan(num) or not low <= num <= high or (low_open and num == low):
        bracket = "(" if low_open else "["
        raise SupervisorInputError(f"{field} {value!r}: must be a number of seconds in {bracket}{low:g}, {high:g}]")
    return num


def check_socket(path: str) -> None:
    """Refuse a control socket that is not ours alone (another user could be listening on it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise SupervisorNotRunning(f"no supervisor socket at {path}") from None
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid() or mode & 0o077:
        raise SupervisorSocketError(
            f"control socket {path}: is {'a socket' if stat.S_ISSOCK(st.st_mode) else 'not a socket'} "
            f"with mode {mode:04o} owned by uid {st.st_uid}; rule: a socket owned by uid {os.geteuid()} "
            "with mode 0600"
        )


class SupervisorClient:
    """One request per connection: status, renew, launch, wait, signal, stop."""

    def __init__(self, run_dir: str, timeout: float = 10.0):
        if not isinstance(run_dir, str) or not run_dir.startswith("/"):
            raise SupervisorInputError(f"run_dir {run_dir!r}: must be an absolute path")
        self.run_dir = os.path.normpath(run_dir)
        self.socket_path = os.path.join(self.run_dir, SOCKET_NAME)
        self.journal_path = os.path.join(self.run_dir, JOURNAL_NAME)
        self.timeout = timeout

    def request(self, payload: Dict, timeout: Optional[float] = None) -> Dict:
        if os.path.lexists(self.run_dir):
            try:
                _lock_mod.check_private_dir(self.run_dir, "run_dir")
            except LockInputError as exc:
                raise SupervisorSocketError(str(exc)) from None
        check_socket(self.socket_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout if timeout is None else timeout)
        try:
            with socket_address(self.socket_path) as addr:
                try:
                    sock.connect(addr)
                except (ConnectionRefusedError, FileNotFoundError):
                    raise SupervisorNotRunning(f"no supervisor answers on {self.socket_path} (stale socket)") from None
            sock.sendall((json.dumps(payload) + "\n").encode())
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            raise SupervisorError(
                f"supervisor at {self.socket_path} did not answer {payload.get('op')} in time"
            ) from None
        except OSError as exc:
            raise SupervisorError(f"supervisor at {self.socket_path}: {exc}") from None
        finally:
            sock.close()
        try:
            resp = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise SupervisorError(
                f"supervisor at {self.socket_path} closed the connection without an answer to "
                f"{payload.get('op')} (it may have exited)"
            ) from None
        if not resp.get("ok"):
            raise SupervisorRequestError(resp.get("msg", "request failed"), resp.get("error", "error"), resp)
        return resp

    def is_running(self) -> bool:
        try:
            self.status()
        except SupervisorNotRunning:
            return False
        return True

    def status(self) -> Dict:
        return self.request({"op": "status"})

    def renew(self, lease: Optional[float] = None) -> Dict:
        req: Dict = {"op": "renew"}
        if lease is not None:
            req["lease"] = _number("lease", lease, 0, MAX_LEASE_S, low_open=True)
        return self.request(req)

    def launch(
        self,
        argv: List[str],
        env: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        ld_preload: Optional[List[str]] = None,
        stdout_path: Optional[str] = None,
        stderr_path: Optional[str] = None,
    ) -> Dict:
        """Start a child; returns {child_id, pid, start_time, ...} (the supervisor's child record)."""
        req = {
            "op": "launch",
            "argv": argv,
            "env": env or {},
            "cwd": cwd,
            "ld_preload": ld_preload or [],
            "stdout_path": stdout_path,
            "stderr_path": stderr_path,
        }
        try:
            validate_launch_request(req)  # same rules as the supervisor: fail before contacting it
        except RequestError as exc:
            raise SupervisorInputError(exc.msg) from None
        resp = self.request(req)
        return dict(resp["child"], env_stripped=resp.get("env_stripped", []))

    def wait(self, child_id: str, timeout: float = 0.0) -> Dict:
        """Child record after it exits or timeout passes (timed_out says which)."""
        timeout = _number("timeout", timeout, 0, 86400)
        resp = self.request({"op": "wait", "child_id": child_id, "timeout": timeout}, timeout=timeout + 10)
        return dict(resp["child"], timed_out=resp["timed_out"])

    def signal(
        self, child_id: str, pid: int, start_time: int, signum=signal.SIGKILL, reap: bool = True, timeout: float = 10.0
    ) -> Dict:
        """Signal one child, identified by child id, pid and start time; reap it unless reap=False."""
        try:
            num = signal_number(int(signum) if isinstance(signum, signal.Signals) else signum)
        except RequestError as exc:
            raise SupervisorInputError(exc.msg) from None
        timeout = _number("timeout", timeout, 0, 86400)
        resp = self.request(
            {
                "op": "signal",
                "child_id": child_id,
                "pid": pid,
                "start_time": start_time,
                "signal": num,
                "reap": reap,
                "timeout": timeout,
            },
            timeout=timeout + 10,
        )
        return resp["child"]

    def stop(self, force: bool = False) -> Dict:
        resp = self.request({"op": "stop", "force": bool(force)}, timeout=60)
        resp.pop("ok", None)
        return resp


def _module_source(mod) -> str:
    loader = getattr(mod, "__loader__", None)
    src = loader.get_source(mod.__name__) if loader is not None and hasattr(loader, "get_source") else None
    if src is None:  # plain file fallback
        with open(mod.__file__, encoding="utf-8") as handle:
            src = handle.read()
    return src


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def install_program(run_dir: str) -> str:
    """Copy the supervisor program into run_dir/lib (it outlives the module's temp dir)."""
    lib = os.path.join(run_dir, LIB_DIR)
    os.makedirs(lib, mode=0o700, exist_ok=True)
    os.chmod(lib, 0o700)
    for mod in _PROGRAM_MODULES:
        parts = mod.__name__.split(".")
        for depth in range(1, len(parts)):
            package_dir = os.path.join(lib, *parts[:depth])
            os.makedirs(package_dir, mode=0o700, exist_ok=True)
            init = os.path.join(package_dir, "__init__.py")
            if not os.path.exists(init):
                _write_private(init, "")
        _write_private(os.path.join(lib, *parts[:-1], parts[-1] + ".py"), _module_source(mod))
    main = os.path.join(lib, "orbite_supervisor.py")
    _write_private(
        main,
        "import sys\n"
        "from ansible_collections.orbite.qualification.plugins.module_utils._node.daemon import main\n"
        "sys.exit(main())\n",
    )
    return main


def _rotate_journal(run_dir: str) -> Optional[str]:
    journal = os.path.join(run_dir, JOURNAL_NAME)
    if not os.path.lexists(journal):
        return None
    n = 1
    while os.path.lexists(os.path.join(run_dir, f"journal.{n}.jsonl")):
        n += 1
    old = os.path.join(run_dir, f"journal.{n}.jsonl")
    os.rename(journal, old)
    return old


def _log_tail(run_dir: str) -> str:
    try:
        with open(os.path.join(run_dir, LOG_NAME), encoding="utf-8", errors="replace") as handle:
            tail = handle.read()[-800:].strip()
    except OSError:
        return ""
    return f"; supervisor log: {tail}" if tail else ""


def _kill_unready(run_dir: str) -> None:
    """SIGKILL a supervisor that never reported ready (only if its pid still runs our program)."""
    try:
        with open(os.path.join(run_dir, PID_NAME), encoding="ascii") as handle:
            pid = int(handle.read().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            if os.path.join(run_dir, LIB_DIR).encode() not in handle.read():
                return  # the pid file is stale and the pid belongs to someone else
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


def check_start_args(run_id, locks, lease, lock_timeout) -> Dict:
    validate_run_id(run_id)
    if not isinstance(locks, list) or not locks:
        raise SupervisorInputError(f"locks {locks!r}: must be a non-empty list of RNIC names")
    for name in locks:
        try:
            validate_rnic_name(name)
        except LockInputError as exc:
            raise SupervisorInputError(f"locks: {exc}") from None
    if len(set(locks)) != len(locks):
        raise SupervisorInputError(f"locks {locks!r}: must not name an RNIC twice")
    return {
        "lease": _number("lease", lease, 0, MAX_LEASE_S, low_open=True),
        "lock_timeout": _number("lock_timeout", lock_timeout, 0, 3600),
    }


def start_supervisor(run_dir: str, run_id: str, locks: List[str], lock_dir: str, **kwargs) -> Dict:
    """Start a detached supervisor; return its ready message or raise a SupervisorError.

    Keyword arguments: root="/", hostname, boot_id (expected; None = as read), controller,
    lease=300, lock_timeout=30, python (default sys.executable). Every argument is checked before
    anything is created; on failure nothing is left held.
    """
    try:
        return _start_supervisor(run_dir, run_id, locks, lock_dir, **kwargs)
    except OSError as exc:  # permissions, full disk, missing interpreter: an error, not a traceback
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        raise SupervisorStartError(f"starting the supervisor in {run_dir}: {exc.strerror or exc}{where}",
                                   "os_error", {}) from None


def _start_supervisor(
    run_dir: str,
    run_id: str,
    locks: List[str],
    lock_dir: str,
    root: str = "/",
    hostname: Optional[str] = None,
    boot_id: Optional[str] = None,
    controller: Optional[str] = None,
    lease: float = 300,
    lock_timeout: float = 30,
    python: Optional[str] = None,
) -> Dict:
    nums = check_start_args(run_id, locks, lease, lock_timeout)
    for field, value in (("root", root), ("run_dir", run_dir), ("lock_dir", lock_dir)):
        if not isinstance(value, str) or not value.startswith("/"):
            raise SupervisorInputError(f"{field} {value!r}: must be an absolute path")
    try:
        lock_dir = ensure_private_dir(lock_dir, "lock_dir")
        run_dir = ensure_private_dir(run_dir, "run_dir")
    except LockInputError as exc:
        raise SupervisorInputError(str(exc)) from None
    client = SupervisorClient(run_dir)
    if os.path.lexists(client.socket_path):
        check_socket(client.socket_path)
        try:
            status = client.status()
        except SupervisorNotRunning:
            os.unlink(client.socket_path)  # its supervisor died; nobody listens
        else:
            raise SupervisorAlreadyRunning(
                f"a supervisor (pid {status['pid']}, run {status['run_id']}) already runs in {run_dir}", status
            )
    previous = _rotate_journal(run_dir)
    main = install_program(run_dir)
    cfg = {
        "run_dir": run_dir,
        "run_id": run_id,
        "locks": list(locks),
        "lock_dir": lock_dir,
        "root": root,
        "hostname": hostname,
        "boot_id": boot_id.lower() if boot_id else None,
        "controller": controller,
        "lease": nums["lease"],
        "lock_timeout": nums["lock_timeout"],
        "previous_journal": previous,
    }
    cfg_path = os.path.join(run_dir, CONFIG_NAME)
    _write_private(cfg_path, json.dumps(cfg, indent=1) + "\n")
    read_fd, write_fd = os.pipe()
    try:
        log_fd = os.open(
            os.path.join(run_dir, LOG_NAME),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
        try:
            first = subprocess.Popen(  # argv list; -E -s: no PYTHON* env, no user site
                [python or sys.executable, "-E", "-s", "-B", main, "--config", cfg_path, "--ready-fd", str(write_fd)],
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                cwd=run_dir,
                pass_fds=(write_fd,),
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(log_fd)
        os.close(write_fd)
        write_fd = -1
        first.wait(30)  # exits right after the second fork
        deadline = time.monotonic() + nums["lock_timeout"] * len(locks) + _START_MARGIN_S
        data = b""
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                _kill_unready(run_dir)
                raise SupervisorStartError(
                    f"supervisor in {run_dir} did not report ready in time{_log_tail(run_dir)}", "start_timeout", {}
                )
            ready = select.select([read_fd], [], [], left)[0]
            if ready:
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    break
                data += chunk
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    try:
        msg = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise SupervisorStartError(
            f"supervisor in {run_dir} exited without a ready message{_log_tail(run_dir)}", "start_crashed", {}
        ) from None
    if not msg.get("ok"):
        raise SupervisorStartError(msg.get("msg", "supervisor failed to start"), msg.get("error", "error"), msg)
    return msg
