# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Start a per-node lock supervisor and talk to it (see docs/supervisor.md).

``start_supervisor(...)`` copies the supervisor program (daemon.py and the modules it imports)
into the private run directory, starts it detached (new session, second fork, stdio on a log
file, an environment of its own) and waits for its ready or failure message on a pipe. Starts on
one run directory are serialised by the flock of ``start.lock``; the ready message must name the
run and exactly the locks that were asked for. ``SupervisorClient`` speaks the one-line JSON
protocol over the run directory's UNIX socket; ``stop`` escalates (SIGTERM, then SIGKILL) when the
supervisor does not answer. Stdlib only, Python >= 3.9.
"""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import json
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
from ansible_collections.orbite.qualification.plugins.module_utils._common.bytecode import checked_pyc
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import private_dir, read_regular_bytes
from ansible_collections.orbite.qualification.plugins.module_utils._common.waits import backoff
from ansible_collections.orbite.qualification.plugins.module_utils._node import locks as _lock_mod
from ansible_collections.orbite.qualification.plugins.module_utils._node.locks import (
    LockInputError,
    ensure_private_dir,
    probe_path,
    validate_rnic_name,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node.protocol import (
    CONFIG_NAME,
    JOURNAL_NAME,
    LEASE_NAME,
    LEASE_SCHEMA,
    LOG_NAME,
    MAX_LEASE_S,
    MAX_LOCK_TIMEOUT_S,
    PID_NAME,
    PROGRAM_NAME,
    RUN_LOCK_NAME,
    SOCKET_NAME,
    START_LOCK_NAME,
    RequestError,
    check_config,
    number_in_range,
    signal_number,
    socket_address,
    validate_launch_request,
)

LIB_DIR = "lib"


def _program():
    """The supervisor program (daemon.py), imported only where a hung supervisor is ended: a module that only talks
    to a running supervisor (runner, fetch_receipts), and a start, which copies the program without running it,
    never compile it (protocol.py). This import also puts the program into every payload that carries client.py."""
    from ansible_collections.orbite.qualification.plugins.module_utils._node import daemon  # noqa: PLC0415

    return daemon


_MODULE_UTILS = "ansible_collections.orbite.qualification.plugins.module_utils"
# The supervisor program outlives the module's temporary directory, so these modules (and their packages) are
# copied next to it: daemon.py and every module it imports, directly or not
# (tests/unit/plugins/module_utils/_node/test_supervisor_hardening.py and test_module_imports.py check it).
PROGRAM_MODULES = tuple(f"{_MODULE_UTILS}.{name}" for name in (
    "_common.errors", "_common.files", "_common.names", "_common.numbers", "_node.identity", "_node.locks",
    "_node.journal", "_node.pinned", "_node.protocol", "_node.tree", "_node.daemon"))


_START_MARGIN_S = 15.0
LAUNCHER_EXIT_S = 30.0  # how long a start waits for the launcher to exit once the ready pipe spoke
STOP_EXIT_WAIT_S = 10.0  # how long stop() waits for an answered supervisor to exit
# The supervisor's own environment: nothing of the module's (no LD_*, no PYTHON*).
_SUPERVISOR_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
STATUS_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 30.0
TERM_GRACE_S = 5.0
_MAX_LEASE_RECORD = 1 << 16


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
        raise SupervisorInputError(f"run_id {quote(run_id)}: must be {names.NAME_RULE}")
    return run_id


def default_run_dir(root: str, run_id: str) -> str:
    return os.path.join(root, "run", "orbite", "supervisors", validate_run_id(run_id))


def default_lock_dir(root: str) -> str:
    return os.path.join(root, "run", "orbite", "locks")


def _number(field: str, value, low: float, high: float, low_open: bool = False) -> float:
    try:
        num = float(value)  # AWX survey answers arrive as strings
    except (TypeError, ValueError, OverflowError):
        num = None
    if isinstance(value, bool) or not number_in_range(num, low, high, low_open):
        bracket = "(" if low_open else "["
        raise SupervisorInputError(
            f"{field} {quote(value)}: must be a number of seconds in {bracket}{low:g}, {high:g}]")
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


def _flock_held(path: str) -> bool:
    """True when some process holds a flock on path (probed with a shared non-blocking flock)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)
    return False


class SupervisorClient:
    """One request per connection: status, renew, launch, wait, signal, stop."""

    def __init__(self, run_dir: str, timeout: float = 10.0):
        if not isinstance(run_dir, str) or not run_dir.startswith("/"):
            raise SupervisorInputError(f"run_dir {quote(run_dir)}: must be an absolute path")
        self.run_dir = os.path.normpath(run_dir)
        self.socket_path = os.path.join(self.run_dir, SOCKET_NAME)
        self.journal_path = os.path.join(self.run_dir, JOURNAL_NAME)
        self.timeout = timeout

    def _check_run_dir(self) -> None:
        if os.path.lexists(self.run_dir):
            try:
                _lock_mod.check_private_dir(self.run_dir, "run_dir")
            except LockInputError as exc:
                raise SupervisorSocketError(str(exc)) from None

    def request(self, payload: Dict, timeout: Optional[float] = None) -> Dict:
        self._check_run_dir()
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
                if len(data) > 64 << 20:
                    raise SupervisorError(f"supervisor at {self.socket_path}: answer larger than 64 MiB")
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
        except (UnicodeDecodeError, ValueError, RecursionError):
            resp = None
        if not isinstance(resp, dict):
            raise SupervisorError(
                f"supervisor at {self.socket_path} closed the connection without an answer to "
                f"{payload.get('op')} (it may have exited)"
            ) from None
        if not resp.get("ok"):
            raise SupervisorRequestError(str(resp.get("msg", "request failed")),
                                         str(resp.get("error", "supervisor.error")), resp)
        return resp

    def alive(self) -> bool:
        """True while a supervisor holds this run directory (its run lock), answering or not."""
        self._check_run_dir()
        return _flock_held(os.path.join(self.run_dir, RUN_LOCK_NAME))

    def is_running(self) -> bool:
        try:
            self.status()
        except SupervisorNotRunning:
            return False
        return True

    def lease(self) -> Optional[Dict]:
        """The live supervisor's lease record (pid, start time, lease end, locks), or None."""
        self._check_run_dir()
        try:
            record = json.loads(read_regular_bytes(os.path.join(self.run_dir, LEASE_NAME), _MAX_LEASE_RECORD,
                                                   follow_symlinks=False).decode("utf-8"))
        except (OSError, OrbiteError, UnicodeDecodeError, ValueError, RecursionError):
            return None
        if not isinstance(record, dict) or record.get("schema") != LEASE_SCHEMA:
            return None
        return record

    def status(self, timeout: Optional[float] = None) -> Dict:
        return self.request({"op": "status"}, timeout=timeout)

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
        ld_preload: Optional[List[Dict[str, str]]] = None,
        stdout_path: Optional[str] = None,
        stderr_path: Optional[str] = None,
        exe_sha256: Optional[str] = None,
        argv_pins: Optional[Dict[int, Optional[str]]] = None,
        env_pins: Optional[Dict[str, Optional[str]]] = None,
        record_json: Optional[List[int]] = None,
    ) -> Dict:
        """Start a child; returns {child_id, pid, start_time, ...} (the supervisor's child record),
        with ``env_stripped`` and ``pinned`` (every pinned file: what, path, sha256, size, loaded_as).

        ``ld_preload`` is a list of {path, sha256}; with ``exe_sha256`` the supervisor also runs
        argv[0] only from a copy whose hash it checked. ``argv_pins`` ({argv index: sha256 or None})
        and ``env_pins`` ({env name: sha256 or None}) pin files the runner reads by name (a zipapp
        run by an interpreter, the case file, a library it loads): the entry becomes the sealed
        copy's ``/proc/self/fd/N``; a sha256 is checked (``hash_mismatch``), None only records the
        hash of what the runner got. Index 0 is argv[0] (exec'd from its copy, like ``exe_sha256``).
        ``record_json`` lists argv indexes pinned by ``argv_pins`` whose copy is a small JSON object
        (the runner's case file): the journal records it whole (``pinned[].json``), so the verifier
        reads what the runner was told from the supervisor, not from the runner's output.
        """
        req = {
            "op": "launch",
            "argv": argv,
            "exe_sha256": exe_sha256,
            "env": env or {},
            "cwd": cwd,
            "ld_preload": ld_preload or [],
            "stdout_path": stdout_path,
            "stderr_path": stderr_path,
        }
        if argv_pins:
            if not isinstance(argv_pins, dict) or not all(isinstance(k, int) and not isinstance(k, bool)
                                                          and k >= 0 for k in argv_pins):
                raise SupervisorInputError(f"argv_pins {quote(argv_pins)}: must map argv indexes (ints >= 0) to a "
                                           "sha256 or None")
            req["argv_pins"] = {str(index): sha for index, sha in argv_pins.items()}  # JSON keys are text
        if env_pins:
            req["env_pins"] = env_pins
        if record_json:
            req["record_json"] = record_json
        try:
            validate_launch_request(req)  # same rules as the supervisor: fail before contacting it
        except RequestError as exc:
            raise SupervisorInputError(exc.msg) from None
        resp = self.request(req)
        return dict(resp["child"], env_stripped=resp.get("env_stripped", []), pinned=resp.get("pinned", []))

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

    def stop(self, force: bool = False, timeout: float = STOP_TIMEOUT_S, escalate: bool = True,
             term_grace: float = TERM_GRACE_S) -> Dict:
        """Ask the supervisor to stop; if it does not answer within ``timeout`` (hung, SIGSTOPped),
        end it: SIGTERM, then SIGKILL after ``term_grace`` (see ``terminate``)."""
        timeout = _number("stop timeout", timeout, 0, 86400, low_open=True)
        try:
            resp = self.request({"op": "stop", "force": bool(force)}, timeout=timeout)
        except (SupervisorRequestError, SupervisorNotRunning, SupervisorSocketError):
            raise
        except SupervisorError as exc:
            if not escalate or not self.alive():
                raise
            return self.terminate(f"no answer to stop: {exc}", term_grace=term_grace)
        resp.pop("ok", None)
        # The answer comes before the process has exited and let go of its run lock: wait for that,
        # so a start right after a stop never finds the run directory still held.
        # It lets go within a millisecond or so: probe again after 0.5 ms, doubling up to 10 ms.
        deadline = time.monotonic() + STOP_EXIT_WAIT_S
        sleeps = backoff(0.0005, 0.01)
        while self.alive() and time.monotonic() < deadline:
            time.sleep(next(sleeps))
        return resp

    def terminate(self, reason: str, term_grace: float = TERM_GRACE_S) -> Dict:
        """End an unresponsive supervisor of this run directory: check pid and start time from its
        lease record, SIGTERM, SIGKILL after ``term_grace``; journal it; return a stop summary."""
        record = self.lease()
        if record is None:
            raise SupervisorError(f"supervisor in {self.run_dir} does not answer and has no readable "
                                  f"{LEASE_NAME}: it cannot be identified, so it is not killed")
        from ansible_collections.orbite.qualification.plugins.module_utils._node.journal import (  # noqa: PLC0415
            last_event,
        )

        end_hung_supervisor = _program().end_hung_supervisor
        outcome = end_hung_supervisor(dict(record, run_dir=self.run_dir), reason, self.journal_path,
                                      by=f"stop (pid {os.getpid()})", signals=(signal.SIGTERM, signal.SIGKILL),
                                      term_wait=term_grace)
        if outcome["why_not"] is not None and self.alive():
            raise SupervisorError(f"supervisor in {self.run_dir} does not answer, and its lease record names "
                                  f"another process ({outcome['why_not']}): not killed")
        locks = [lk for lk in record.get("locks") or [] if isinstance(lk, dict) and isinstance(lk.get("path"), str)]
        released = [{"rnic": lk.get("rnic"), "path": lk["path"]} for lk in locks if probe_path(lk["path"])]
        last = last_event(self.journal_path) or {}
        return {
            "reason": "escalated",
            "escalation": outcome["signals"],
            "pid": record.get("pid"),
            "force": True,
            "children_killed": [],
            "children": [],
            "locks_released": len(released) == len(locks),
            "released": released,
            "journal": self.journal_path,
            "journal_complete": last.get("ev") == "journal_close" or last.get("ev") == "supervisor_killed",
        }


def _answers(client: SupervisorClient) -> bool:
    """A supervisor that holds no run lock (started by an older release) but still answers."""
    try:
        client.status(timeout=5)
    except SupervisorError:
        return False
    return True


def stop_supervisor(run_dir: str, force: bool = False, timeout: float = STOP_TIMEOUT_S,
                    check_mode: bool = False) -> Dict:
    """Stop the supervisor of ``run_dir`` (node_supervisor's V(stopped)): the result's ``running``, ``journal``,
    ``run_dir`` and ``changed``, with ``summary`` when one was stopped, ``journal_exists`` when none ran (not an
    error: it is what an ``always:`` section needs). Its errors are raised (``stop_failure`` words them)."""
    client = SupervisorClient(run_dir)
    result = {"changed": False, "run_dir": run_dir, "journal": client.journal_path}
    if not client.alive() and not _answers(client):  # never started, or gone
        result.update(running=False, journal_exists=os.path.exists(client.journal_path))
    elif check_mode:
        result.update(changed=True, running=True)
    else:
        result.update(changed=True, running=False, summary=client.stop(force=force, timeout=timeout))
    return result


def stop_failure(exc: SupervisorError) -> Dict:
    """What a failed request (a stop, a renewal) adds to the module's result: ``error`` (the supervisor's code),
    ``running``, and the stop's partial ``summary`` when only its journal could not be closed."""
    if not isinstance(exc, SupervisorRequestError):
        return {"error": type(exc).__name__}
    details = {"error": exc.code, "running": exc.code != "supervisor.journal_error"}
    if exc.code == "supervisor.journal_error":
        details["summary"] = {k: v for k, v in exc.response.items() if k not in ("ok", "error", "msg")}
    return details


def _module_source(name: str) -> str:
    """A program module's source, read where this module was loaded from (the AnsiballZ payload, or files), without
    importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise SupervisorError(f"the supervisor program's module {name} is not where {__name__} was loaded from")
    src = spec.loader.get_source(name) if hasattr(spec.loader, "get_source") else None
    if src is None:  # plain file fallback
        with open(spec.origin, encoding="utf-8") as handle:
            src = handle.read()
    return src


def _write_private(path: str, data) -> None:
    """Write ``data`` (text as UTF-8, or bytes) into a new private file (0600) at ``path``, never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def _module_bytecode(name: str, src: str) -> Optional[bytes]:
    """Checked-hash bytecode of a program module for this interpreter, from the code its loader holds (the lean node
    step's zip carries it: nothing is compiled here), or None when the loader has none to give."""
    spec = importlib.util.find_spec(name)
    get_code = getattr(spec.loader, "get_code", None) if spec is not None else None
    try:
        code = get_code(name) if get_code is not None else None
    except (ImportError, SyntaxError, OSError):
        return None
    return None if code is None else checked_pyc(src.encode("utf-8"), code)


def install_program(run_dir: str) -> str:
    """Copy the supervisor program into run_dir/lib (it outlives the module's temp dir), each module with its
    checked-hash bytecode in __pycache__ where its loader holds the code (the supervisor, this interpreter, then
    compiles nothing at its start; another interpreter or a changed source compiles as before)."""
    lib = os.path.join(run_dir, LIB_DIR)
    private_dir(lib, "the supervisor's program directory")
    for name in PROGRAM_MODULES:
        parts = name.split(".")
        for depth in range(1, len(parts)):
            package_dir = os.path.join(lib, *parts[:depth])
            os.makedirs(package_dir, mode=0o700, exist_ok=True)
            init = os.path.join(package_dir, "__init__.py")
            if not os.path.exists(init):
                _write_private(init, "")
        path = os.path.join(lib, *parts[:-1], parts[-1] + ".py")
        src = _module_source(name)
        _write_private(path, src)
        pyc = _module_bytecode(name, src)
        if pyc is not None:
            cached = importlib.util.cache_from_source(path)
            os.makedirs(os.path.dirname(cached), mode=0o700, exist_ok=True)
            _write_private(cached, pyc)
    main = os.path.join(lib, PROGRAM_NAME)
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
        raise SupervisorInputError(f"locks {quote(locks)}: must be a non-empty list of RNIC names")
    for name in locks:
        try:
            validate_rnic_name(name)
        except LockInputError as exc:
            raise SupervisorInputError(f"locks: {exc}") from None
    if len(set(locks)) != len(locks):
        raise SupervisorInputError(f"locks {quote(locks)}: must not name an RNIC twice")
    return {
        "lease": _number("lease", lease, 0, MAX_LEASE_S, low_open=True),
        "lock_timeout": _number("lock_timeout", lock_timeout, 0, MAX_LOCK_TIMEOUT_S),
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
                                   "supervisor.os_error", {}) from None


class _StartLock:
    """The run directory's start flock: one starter at a time, from its first check to the ready message."""

    def __init__(self, run_dir: str, timeout: float):
        self.path = os.path.join(run_dir, START_LOCK_NAME)
        self.timeout = timeout
        self.fd = -1

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            if time.monotonic() >= deadline:
                os.close(self.fd)
                self.fd = -1
                raise SupervisorStartError(f"another start in {os.path.dirname(self.path)} did not finish within "
                                           f"{self.timeout:.0f} s", "supervisor.start_busy", {})
            time.sleep(0.01)

    def __exit__(self, *_exc):
        if self.fd >= 0:
            os.close(self.fd)  # drops the flock
            self.fd = -1


def _check_running(client: SupervisorClient, root: str) -> None:
    """Under the start lock: raise AlreadyRunning if a supervisor serves this run directory; end a
    hung one whose lease ran out (plus grace); refuse to start over one whose lease still runs."""
    if not client.alive():
        return
    from ansible_collections.orbite.qualification.plugins.module_utils._node.identity import (  # noqa: PLC0415
        IdentityError,
        read_identity,
    )

    daemon = _program()
    record = client.lease()
    try:
        boot_id = read_identity(root)["boot_id"]
    except IdentityError:
        boot_id = None
    # A supervisor ends itself when its lease runs out; one that still holds the run directory a
    # grace period later is hung, whether it would answer or not.
    if daemon.lease_overdue(record, boot_id) is None:
        try:
            status = client.status(timeout=STATUS_TIMEOUT_S)
        except SupervisorSocketError:
            raise
        except SupervisorError:  # no answer, no socket, a broken answer: it holds the run but does not serve
            status = None
        if status is not None:
            raise SupervisorAlreadyRunning(
                f"a supervisor (pid {status.get('pid')}, run {status.get('run_id')}) already runs in "
                f"{client.run_dir}", status,
            )
        left = ""
        if record is not None and isinstance(record.get("lease_expires"), (int, float)):
            left = f"; its lease ends in {max(0.0, record['lease_expires'] - daemon.boottime()):.0f} s"
        raise SupervisorStartError(f"a supervisor holds {client.run_dir} but does not answer{left}; it is killed "
                                   "once its lease has run out", "supervisor.unresponsive", {"lease": record})
    if daemon.supervisor_answers(client.run_dir):  # serving after all: its lease record is stale, it is not hung
        status = client.status(timeout=STATUS_TIMEOUT_S)
        raise SupervisorAlreadyRunning(
            f"a supervisor (pid {status.get('pid')}, run {status.get('run_id')}) already runs in {client.run_dir}",
            status,
        )
    outcome = daemon.end_hung_supervisor(dict(record, run_dir=client.run_dir),
                                         "lease expired; a new start took over", client.journal_path,
                                         by=f"start (pid {os.getpid()})")
    if client.alive():
        raise SupervisorStartError(f"the hung supervisor of {client.run_dir} could not be ended "
                                   f"({outcome['why_not'] or 'still alive'})", "supervisor.unresponsive",
                                   {"lease": record})


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
            raise SupervisorInputError(f"{field} {quote(value)}: must be an absolute path")
    cfg = {
        "run_dir": os.path.normpath(run_dir),
        "run_id": run_id,
        "locks": list(locks),
        "lock_dir": os.path.normpath(lock_dir),
        "root": root,
        "hostname": hostname,
        "boot_id": boot_id.lower() if isinstance(boot_id, str) and boot_id else None,
        "controller": controller,
        "lease": nums["lease"],
        "lock_timeout": nums["lock_timeout"],
        "previous_journal": None,
    }
    problem = check_config(cfg)  # the rules the supervisor applies to its configuration
    if problem is not None:
        raise SupervisorInputError(problem)
    try:
        lock_dir = ensure_private_dir(lock_dir, "lock_dir")
        run_dir = ensure_private_dir(run_dir, "run_dir")
    except LockInputError as exc:
        raise SupervisorInputError(str(exc)) from None
    client = SupervisorClient(run_dir)
    start_window = nums["lock_timeout"] * len(locks) + _START_MARGIN_S
    with _StartLock(run_dir, start_window + STATUS_TIMEOUT_S):
        _check_running(client, root)
        if os.path.lexists(client.socket_path):
            check_socket(client.socket_path)
            os.unlink(client.socket_path)  # nobody holds the run lock: its supervisor died
        cfg["previous_journal"] = _rotate_journal(run_dir)
        main = install_program(run_dir)
        cfg_path = os.path.join(run_dir, CONFIG_NAME)
        _write_private(cfg_path, json.dumps(cfg, indent=1) + "\n")
        msg = _spawn_and_wait(run_dir, cfg_path, main, python, start_window)
    if not msg.get("ok"):
        raise SupervisorStartError(str(msg.get("msg", "supervisor failed to start")),
                                   str(msg.get("error", "supervisor.error")),
                                   msg)
    got = sorted(lk.get("rnic") for lk in msg.get("locks") or [] if isinstance(lk, dict))
    if msg.get("run_id") != run_id or got != sorted(locks):
        # Cannot happen with the start lock and the run lock; never report "ready" for other locks.
        raise SupervisorStartError(f"the supervisor in {run_dir} reported ready for run {quote(msg.get('run_id'))} "
                                   f"holding {got}, not run {run_id} holding {sorted(locks)}",
                                   "supervisor.ready_mismatch", msg)
    return msg


def _reap_launcher(first: subprocess.Popen, wait_s: float) -> None:
    """Reap the launcher (the first process of the double fork): no zombie is left. It has exited, or is exiting,
    once the ready pipe holds a message or is at EOF; one still running after ``wait_s`` (it never forked: a
    start that timed out or failed waits 0 s for it) is killed, never left behind."""
    try:
        first.wait(wait_s)
    except subprocess.TimeoutExpired:
        first.kill()
        first.wait()


def _spawn_and_wait(run_dir: str, cfg_path: str, main: str, python: Optional[str], window: float) -> Dict:
    read_fd, write_fd = os.pipe()
    try:
        log_fd = os.open(
            os.path.join(run_dir, LOG_NAME),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
        try:
            first = subprocess.Popen(  # argv list; -E -s: no PYTHON* env, no user site; an env of its own
                [python or sys.executable, "-E", "-s", "-B", main, "--config", cfg_path, "--ready-fd", str(write_fd)],
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                cwd=run_dir,
                env=dict(_SUPERVISOR_ENV),
                pass_fds=(write_fd,),
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(log_fd)
        os.close(write_fd)
        write_fd = -1
        # The message first, then the launcher: it exits right after the second fork (before ready is written) or
        # after its own failure message, so it is reaped at once below. Reaping it first cost Popen.wait(timeout)'s
        # sleeps (up to 50 ms each) on every start.
        deadline = time.monotonic() + window
        data = b""
        spoke = False  # a whole message or EOF: the launcher has exited or is exiting
        try:
            while not data.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0:
                    _kill_unready(run_dir)
                    raise SupervisorStartError(
                        f"supervisor in {run_dir} did not report ready in time{_log_tail(run_dir)}",
                        "supervisor.start_timeout", {}
                    )
                ready = select.select([read_fd], [], [], left)[0]
                if ready:
                    chunk = os.read(read_fd, 65536)
                    if not chunk:
                        break
                    data += chunk
            spoke = True
        finally:
            _reap_launcher(first, LAUNCHER_EXIT_S if spoke else 0.0)
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    try:
        msg = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        msg = None
    if not isinstance(msg, dict):
        raise SupervisorStartError(
            f"supervisor in {run_dir} exited without a ready message{_log_tail(run_dir)}",
            "supervisor.start_crashed", {}
        )
    return msg


__all__ = (
    "SupervisorAlreadyRunning",
    "SupervisorClient",
    "SupervisorError",
    "SupervisorInputError",
    "SupervisorNotRunning",
    "SupervisorRequestError",
    "SupervisorSocketError",
    "SupervisorStartError",
    "check_start_args",
    "default_lock_dir",
    "default_run_dir",
    "start_supervisor",
)
