# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The per-node lock supervisor process (see docs/supervisor.md and docs/security.md).

The node_supervisor module copies this package's modules into the private run directory and
starts them there, because the module's own temporary directory is removed when the module
returns while the supervisor must keep running. Stdlib only, Python >= 3.9.

One supervisor per run directory (it holds the flock of ``supervisor.lock`` for its whole life)
and node: it checks its configuration with the same rules as the client, takes one flock per
RNIC, rechecks the node identity inside the locks, then serves a UNIX socket (one JSON request
line, one JSON response line per connection) to launch, wait for and signal its children, renew
its lease and stop. Everything it does is appended to a JSON-lines journal (journal.py).

The shared request rules (protocol.py's validate_launch_request and check_config) are the client's
too, so that the client checks exactly what the supervisor will check.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import re
import selectors
import signal
import socket
import stat
import struct
import sys
import time
from typing import Dict, List, Optional

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import quote
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import atomic_write_json
from ansible_collections.orbite.qualification.plugins.module_utils._node.identity import (
    IdentityError,
    identity_mismatches,
    read_identity,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node.journal import (
    Journal,
    JournalError,
    append_event,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node.locks import (
    LockError,
    LockTimeout,
    acquire,
    iso_time,
    read_owner,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node.pinned import (
    PinError,
    PinMismatch,
    pin_file,
)
# The shared rules and names (protocol.py); validate_launch_request, check_config, signal_number and socket_address
# are still importable from here.
from ansible_collections.orbite.qualification.plugins.module_utils._node.protocol import (
    JOURNAL_NAME,
    LEASE_NAME,
    LEASE_SCHEMA,
    MAX_LEASE_S,
    MAX_REQUEST_BYTES,
    PID_NAME,
    PROGRAM_NAME,
    PROTOCOL_VERSION,
    RUN_LOCK_NAME,
    SOCKET_NAME,
    RequestError,
    bad_request,
    check_config,
    number_in_range,
    signal_name,
    signal_number,
    socket_address,
    split_env,
    validate_launch_request,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node.tree import (
    exit_code_of,
    pid_alive,
    proc_start_time,
    spawn_tree,
    verify_process,
    wait_gone,
)

__all__ = ("main", "proc_start_time", "signal_number", "validate_launch_request")

MAX_RECORDED_JSON = 256 * 1024  # a runner case file is a few kB
KILL_REAP_TIMEOUT_S = 10.0
# A holder whose lease ran out this long ago without releasing is hung: the next start kills it.
LEASE_GRACE_S = 3.0
ENFORCE_POLL_S = 0.1
ANSWER_PROBE_S = 2.0
IDLE_CONNECTION_S = 10.0
MAX_IDLE_CONNECTIONS = 32
ACCEPT_PAUSE_S = 0.1
_CHILD_ID_RE = re.compile(r"c[1-9][0-9]{0,8}", re.ASCII)
OPS = ("status", "renew", "launch", "wait", "signal", "stop")


# ---------------------------------------------------------------------------------------------
# Helpers that a start and an escalated stop use too (client.py imports them only then)


def boottime() -> float:
    """Seconds since boot, suspend included: the clock of leases (comparable across processes)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def read_pinned_json(fd: int, what: str):
    """The JSON object in a pinned copy (read from its start), for the journal; raises PinError."""
    data = os.pread(fd, MAX_RECORDED_JSON + 1, 0)
    if len(data) > MAX_RECORDED_JSON:
        raise PinError(f"{what}: more than {MAX_RECORDED_JSON} bytes; record_json journals small JSON files only")
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PinError(f"{what}: is not a JSON document ({quote(str(exc))}), so it cannot be journaled") from None
    if not isinstance(value, dict):
        raise PinError(f"{what}: holds {quote(value)}, not a JSON object, so it cannot be journaled")
    return value


def _without(record: Optional[Dict], key: str) -> Optional[Dict]:
    return None if record is None else {k: v for k, v in record.items() if k != key}


def lease_overdue(record, boot_id: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """Seconds past lease end + grace for a lock owner or lease record of this boot; None otherwise."""
    if not isinstance(record, dict) or record.get("state", "held") != "held":
        return None
    expires = record.get("lease_expires")
    if isinstance(expires, bool) or not isinstance(expires, (int, float)):
        return None
    if boot_id is not None and record.get("boot_id") != boot_id:
        return None  # another boot's record: its boottime clock is not ours
    overdue = (boottime() if now is None else now) - (expires + LEASE_GRACE_S)
    return overdue if overdue > 0 else None


def supervisor_answers(run_dir, timeout: float = ANSWER_PROBE_S) -> bool:
    """True when a supervisor answers a status request on run_dir's socket within ``timeout``.

    Before a holder is killed for an overdue lease it gets this last chance: a supervisor that
    answers is alive and serving (its lease record may be stale because a disk was full).
    """
    if not isinstance(run_dir, str) or not run_dir.startswith("/"):
        return False
    path = os.path.join(run_dir, SOCKET_NAME)
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
        return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        with socket_address(path) as address:
            sock.connect(address)
        sock.sendall(b'{"op": "status"}\n')
        data = b""
        while not data.endswith(b"\n") and len(data) < MAX_REQUEST_BYTES:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        answer = json.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    finally:
        sock.close()
    return isinstance(answer, dict) and answer.get("ok") is True


def program_marker(run_dir: str) -> bytes:
    """What a supervisor of ``run_dir`` has in its command line (its copied program's path)."""
    return os.path.join(run_dir, "lib", PROGRAM_NAME).encode()


def end_hung_supervisor(record: Dict, reason: str, journal_path: Optional[str], by: str,
                        signals=(signal.SIGKILL,), term_wait: float = 0.0) -> Dict:
    """Kill a supervisor named by a lock owner or lease record, after checking pid, start time and
    program; append what was done to its journal. Returns {"killed", "signals", "why_not", "event"}."""
    pid, start, run_dir = record.get("pid"), record.get("start_time"), record.get("run_dir")
    marker = program_marker(run_dir) if isinstance(run_dir, str) else PROGRAM_NAME.encode()
    why_not = verify_process(pid, start, marker)
    sent: List[str] = []
    if why_not is None:
        for index, signum in enumerate(signals):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                break
            sent.append(signal_name(int(signum)))
            last = index == len(signals) - 1
            if wait_gone(pid, KILL_REAP_TIMEOUT_S if last else term_wait):
                break
    event = None
    if sent and journal_path and os.path.isfile(journal_path):
        try:
            event = append_event(journal_path, "supervisor_killed", pid=pid, start_time=start, signals=sent,
                                 reason=reason, by=by, run_id=record.get("run_id"))
        except (OSError, JournalError):
            event = None
    return {"killed": bool(sent) and not pid_alive(pid), "signals": sent, "why_not": why_not, "event": event}


# ---------------------------------------------------------------------------------------------
# The supervisor


class Child:
    def __init__(self, child_id: str, keeper: int, pid: int, start_time: int, spec: Dict, *,
                 env_keys: List[str], stripped: List[str]):
        self.child_id = child_id
        self.keeper = keeper  # the tree's keeper (our direct child); its exit status is the runner's
        self.pid = pid  # the runner
        self.start_time = start_time
        self.spec = spec
        self.env_keys = env_keys
        self.stripped = stripped
        self.started_at = iso_time(time.time())
        self.exit_code: Optional[int] = None
        self.exit_signal: Optional[int] = None
        self.exited = False

    def public(self) -> Dict:
        return {
            "child_id": self.child_id,
            "pid": self.pid,
            "start_time": self.start_time,
            "argv": self.spec["argv"],
            "running": not self.exited,
            "exit_code": self.exit_code,
            "exit_signal": self.exit_signal,
            "exit_signal_name": signal_name(self.exit_signal),
            "started_at": self.started_at,
        }


class Pending:
    def __init__(self, conn: socket.socket, child: Child, deadline: float, op: str, extra: Dict):
        self.conn = conn
        self.child = child
        self.deadline = deadline
        self.op = op
        self.extra = extra


class Supervisor:
    def __init__(self, cfg: Dict, ready_fd: int):
        self.cfg = cfg
        self.ready_fd = ready_fd
        self.run_dir = cfg["run_dir"]
        self.socket_path = os.path.join(self.run_dir, SOCKET_NAME)
        self.journal_path = os.path.join(self.run_dir, JOURNAL_NAME)
        self.lease_path = os.path.join(self.run_dir, LEASE_NAME)
        self.locks = []
        self.released: List[Dict] = []
        self.children: Dict[str, Child] = {}
        self.next_child = 1
        self.lease = float(cfg["lease"])
        self.lease_deadline = boottime() + self.lease
        self.pending: List[Pending] = []
        self.buffers: Dict[socket.socket, bytearray] = {}
        self.accepted_at: Dict[socket.socket, float] = {}
        self.listener: Optional[socket.socket] = None
        self.accept_paused_until = 0.0
        self.accept_errors = 0
        self.sel = selectors.DefaultSelector()
        self.stop_reason: Optional[str] = None
        self.stop_summary: Optional[Dict] = None
        self.identity: Optional[Dict] = None
        self.boot_id: Optional[str] = None
        self.pid = os.getpid()
        self.start_time = proc_start_time(self.pid)
        self.started_at = iso_time(time.time())
        self.next_enforce_check = 0.0
        self.journal = Journal(
            self.journal_path,
            {
                "run_id": cfg["run_id"],
                "controller": cfg.get("controller"),
                "pid": self.pid,
                "previous_journal": cfg.get("previous_journal"),
            },
        )

    # -- start-up ------------------------------------------------------------------------------

    def _tell_launcher(self, msg: Dict) -> None:
        _tell(self.ready_fd, msg)
        self.ready_fd = -1

    def _fail_start(self, code: str, msg: str, **extra) -> int:
        self.journal.note("start_failed", error=code, msg=msg, **extra)
        self._release_locks()
        self.journal.close(reason="start_failed", children=0, locks_released=all(not lk.held for lk in self.locks))
        self._tell_launcher(dict(ok=False, error=code, msg=msg, journal=self.journal_path, **extra))
        return 1

    def _lease_fields(self) -> Dict:
        return {
            "lease_s": self.lease,
            "lease_expires": round(self.lease_deadline, 3),
            "lease_expires_at": iso_time(time.time() + max(0.0, self.lease_deadline - boottime())),
        }

    def _publish_lease(self) -> None:
        """The lease end in every lock record and in lease.json: what the next start or stop trusts."""
        fields = self._lease_fields()
        for lock in self.locks:
            if lock.held:
                lock.update(**fields)
        record = {
            "schema": LEASE_SCHEMA, "version": 1, "pid": self.pid, "start_time": self.start_time,
            "run_id": self.cfg["run_id"], "run_dir": self.run_dir, "boot_id": self.boot_id,
            "locks": [{"rnic": lk.rnic, "path": lk.path} for lk in self.locks if lk.held], **fields,
        }
        atomic_write_json(self.lease_path, record)

    def start(self) -> int:
        cfg = self.cfg
        self.journal.event(
            "supervisor_start",
            run_id=cfg["run_id"],
            controller=cfg.get("controller"),
            locks=cfg["locks"],
            lock_dir=cfg["lock_dir"],
            root=cfg["root"],
            lease_s=self.lease,
            lock_timeout_s=cfg["lock_timeout"],
            expected={"hostname": cfg.get("hostname"), "boot_id": cfg.get("boot_id")},
            python=sys.executable,
        )
        # Identity before the locks names the owner in the lock files; it is checked again inside.
        try:
            before = read_identity(cfg["root"])
        except IdentityError as exc:
            self.journal.note("identity_check", stage="before_locks", ok=False, error=str(exc))
            return self._fail_start("supervisor.identity_error", str(exc))
        self.boot_id = before["boot_id"]
        expected = {
            "hostname": cfg.get("hostname") or before["hostname"],
            "boot_id": cfg.get("boot_id") or before["boot_id"],
        }
        owner = {
            "run_id": cfg["run_id"],
            "controller": cfg.get("controller"),
            "pid": self.pid,
            "start_time": self.start_time,
            "run_dir": self.run_dir,
            "hostname": before["hostname"],
            "boot_id": before["boot_id"],
            **self._lease_fields(),
        }
        # Sorted order: two supervisors wanting overlapping sets cannot deadlock each other.
        for rnic in sorted(cfg["locks"]):
            try:
                lock = acquire(cfg["lock_dir"], rnic, owner, timeout=float(cfg["lock_timeout"]),
                               on_busy=lambda path, rnic=rnic: self._enforce_lease(rnic, path))
            except LockTimeout as exc:
                self.journal.note(
                    "lock_timeout", rnic=rnic, current_owner=exc.owner, waited_s=float(cfg["lock_timeout"])
                )
                return self._fail_start("supervisor.lock_timeout", str(exc), rnic=rnic, owner=exc.owner)
            except (LockError, OSError) as exc:
                return self._fail_start("supervisor.lock_error", f"RNIC lock {rnic}: {exc}", rnic=rnic)
            self.locks.append(lock)
            self.journal.event(
                "lock_acquire",
                rnic=rnic,
                path=lock.path,
                owner=lock.owner,
                waited_s=round(lock.waited_s, 6),
                previous_state=lock.previous_state,
                previous_owner=lock.previous_owner,
                previous_owner_gone=lock.previous_state == "stale",
            )
        # Recheck identity inside the locks: the node we locked is the node we were told about.
        try:
            observed = read_identity(cfg["root"])
        except IdentityError as exc:
            self.journal.note("identity_check", stage="inside_locks", ok=False, error=str(exc))
            return self._fail_start("supervisor.identity_error", str(exc))
        mismatch = identity_mismatches(expected, observed)
        self.journal.event(
            "identity_check",
            stage="inside_locks",
            ok=not mismatch,
            expected=expected,
            observed={"hostname": observed["hostname"], "boot_id": observed["boot_id"]},
            mismatch=mismatch,
        )
        if mismatch:
            text = "; ".join(
                f"{k} is {v['observed']!r}, expected {v['expected']!r}" for k, v in sorted(mismatch.items())
            )
            return self._fail_start("supervisor.identity_mismatch", "node identity changed: " + text, mismatch=mismatch)
        self.identity = observed
        try:
            self._publish_lease()
        except OSError as exc:
            return self._fail_start("supervisor.os_error", f"lease record {self.lease_path}: {exc.strerror or exc}")
        try:
            self._listen()
        except OSError as exc:
            return self._fail_start("supervisor.socket_error", f"control socket {self.socket_path}: {exc}")
        self.journal.event("ready", socket=self.socket_path, pid=self.pid)
        self.journal.sync()
        self._tell_launcher(
            {
                "ok": True,
                "pid": self.pid,
                "start_time": self.start_time,
                "run_id": cfg["run_id"],
                "socket": self.socket_path,
                "journal": self.journal_path,
                "locks": [lk.as_dict() for lk in self.locks],
                "identity": observed,
            }
        )
        return 0

    def _enforce_lease(self, rnic: str, path: str) -> None:
        """A lock stays busy: if its holder's lease ran out (plus grace) and it is still there, it is
        hung (SIGSTOPped, wedged): kill it after checking pid and start time, journal it, take over."""
        now = time.monotonic()
        if now < self.next_enforce_check:
            return
        self.next_enforce_check = now + ENFORCE_POLL_S
        owner = read_owner(path)
        overdue = lease_overdue(owner, self.boot_id)
        if overdue is None or owner.get("pid") == self.pid:
            return
        if supervisor_answers(owner.get("run_dir")):
            return  # alive and serving: its record is stale (a full disk, say), it is not hung
        holder_journal = (os.path.join(owner["run_dir"], JOURNAL_NAME)
                          if isinstance(owner.get("run_dir"), str) else None)
        outcome = end_hung_supervisor(owner, f"lease expired {overdue + LEASE_GRACE_S:.1f} s ago; RNIC {rnic} "
                                             f"wanted by run {self.cfg['run_id']}", holder_journal,
                                      by=f"run {self.cfg['run_id']} (pid {self.pid})")
        if outcome["signals"]:
            self.journal.event(
                "lease_enforced", rnic=rnic, path=path, holder={k: owner.get(k) for k in (
                    "run_id", "controller", "pid", "start_time", "run_dir", "lease_expires_at")},
                overdue_s=round(overdue + LEASE_GRACE_S, 3), signals=outcome["signals"], killed=outcome["killed"],
                holder_journal=holder_journal if outcome["event"] else None,
            )

    def _listen(self) -> None:
        if os.path.lexists(self.socket_path):
            os.unlink(self.socket_path)  # we hold the run lock: nobody else serves this run directory
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            with socket_address(self.socket_path) as addr:
                sock.bind(addr)
        finally:
            os.umask(old)
        os.chmod(self.socket_path, 0o600)
        sock.listen(64)
        sock.setblocking(False)
        self.listener = sock
        self.sel.register(sock, selectors.EVENT_READ, "listen")

    # -- main loop ------------------------------------------------------------------------------

    def serve(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        received: List[int] = []
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda s, _f: received.append(s))
        signal.signal(signal.SIGCHLD, lambda _s, _f: None)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.sel.register(wake_r, selectors.EVENT_READ, "wake")
        while self.stop_reason is None:
            now = time.monotonic()
            self._resume_accepting(now)
            timeout = min(
                [0.25, max(0.0, self.lease_deadline - boottime())]
                + [max(0.0, p.deadline - now) for p in self.pending]
            )
            for key, _mask in self.sel.select(timeout):
                if key.data == "wake":
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                elif key.data == "listen":
                    self._accept()
                else:
                    self._read_conn(key.fileobj)
                if self.stop_reason is not None:
                    break
            if received and self.stop_reason is None:
                self._shutdown(f"signal {signal_name(received[0])}", force=True)
                break
            self._reap()
            self._resolve_pending()
            self._close_idle(time.monotonic())
            if self.stop_reason is None and boottime() >= self.lease_deadline:
                self.journal.note(
                    "lease_expired", lease_s=self.lease, overdue_s=round(boottime() - self.lease_deadline, 3)
                )
                self._shutdown("lease_expired", force=True)
        return 0

    def _resume_accepting(self, now: float) -> None:
        if self.accept_paused_until and now >= self.accept_paused_until and self.listener is not None:
            self.accept_paused_until = 0.0
            self.sel.register(self.listener, selectors.EVENT_READ, "listen")

    def _accept(self) -> None:
        try:
            conn = self.listener.accept()[0]
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            # EMFILE/ENFILE (descriptors exhausted), ENOBUFS, ENOMEM, ...: never the end of the
            # supervisor. Make room by closing the oldest idle connection; when there is none,
            # stop polling the listener briefly (it stays readable: polling would spin).
            self.accept_errors += 1
            if self.accept_errors == 1 or self.accept_errors % 100 == 0:
                self.journal.note("accept_error", errno=exc.errno, error=os.strerror(exc.errno or 0),
                                  count=self.accept_errors, idle_connections=len(self.buffers))
            if not self._shed_oldest_idle():
                self.sel.unregister(self.listener)
                self.accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S
            return
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            conn.close()
            return
        peer_pid, peer_uid, _gid = struct.unpack("3i", creds)
        if peer_uid != os.geteuid():
            self.journal.note("connection_refused", peer_pid=peer_pid, peer_uid=peer_uid)
            msg = f"peer uid {peer_uid} is not the supervisor's uid {os.geteuid()}"
            self._respond(conn, {"ok": False, "error": "supervisor.forbidden", "msg": msg})
            return
        if len(self.buffers) >= MAX_IDLE_CONNECTIONS:
            self._shed_oldest_idle()
        conn.setblocking(False)
        self.buffers[conn] = bytearray()
        self.accepted_at[conn] = time.monotonic()
        self.sel.register(conn, selectors.EVENT_READ, "conn")

    def _shed_oldest_idle(self) -> bool:
        if not self.accepted_at:
            return False
        oldest = min(self.accepted_at, key=self.accepted_at.get)
        self._respond(oldest, {"ok": False, "error": "supervisor.busy",
                               "msg": "too many idle connections; this one was closed before it sent a request"},
                      wait=False)
        return True

    def _close_idle(self, now: float) -> None:
        for conn, since in list(self.accepted_at.items()):
            if now - since > IDLE_CONNECTION_S:
                self._respond(conn, {"ok": False, "error": "supervisor.bad_request",
                                     "msg": f"no request line within {IDLE_CONNECTION_S:g} s"}, wait=False)

    def _drop(self, conn: socket.socket) -> None:
        self.accepted_at.pop(conn, None)
        if conn in self.buffers:
            del self.buffers[conn]
            self.sel.unregister(conn)

    def _respond(self, conn: socket.socket, resp: Dict, wait: bool = True) -> None:
        self._drop(conn)
        try:
            if wait:
                conn.setblocking(True)
                conn.settimeout(2.0)
                conn.sendall((json.dumps(resp) + "\n").encode())
            else:
                conn.send((json.dumps(resp) + "\n").encode())
        except OSError:
            pass  # the client went away; the journal has the facts
        finally:
            conn.close()

    def _read_conn(self, conn: socket.socket) -> None:
        buf = self.buffers.get(conn)
        if buf is None:
            return
        try:
            data = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            conn.close()
            return
        buf.extend(data)
        if len(buf) > MAX_REQUEST_BYTES:
            self._respond(conn, {"ok": False, "error": "supervisor.bad_request", "msg": "request larger than 1 MiB"})
            return
        if b"\n" not in buf:
            return
        line = bytes(buf[: buf.index(b"\n")])
        self._drop(conn)
        try:
            req = json.loads(line.decode("utf-8"))
            if not isinstance(req, dict):
                raise ValueError("not an object")
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            msg = f"request is not a JSON object: {quote(str(exc))}"
            self._respond(conn, {"ok": False, "error": "supervisor.bad_request", "msg": msg})
            return
        try:
            resp = self._dispatch(conn, req)
        except RequestError as exc:
            resp = {"ok": False, "error": exc.code, "msg": exc.msg}
        except JournalError as exc:
            resp = {"ok": False, "error": "supervisor.journal_error", "msg": str(exc)}
        if resp is not None:
            self._respond(conn, resp)

    def _dispatch(self, conn: socket.socket, req: Dict) -> Optional[Dict]:
        op = req.get("op")
        handler = {
            "status": self.op_status,
            "renew": self.op_renew,
            "launch": self.op_launch,
            "wait": self.op_wait,
            "signal": self.op_signal,
            "stop": self.op_stop,
        }.get(op) if isinstance(op, str) else None
        if handler is None:
            raise bad_request(f"op {quote(op)}: must be one of {', '.join(OPS)}")
        return handler(conn, req)

    # -- operations -----------------------------------------------------------------------------

    def _status(self) -> Dict:
        return {
            "ok": True,
            "protocol": PROTOCOL_VERSION,
            "run_id": self.cfg["run_id"],
            "controller": self.cfg.get("controller"),
            "pid": self.pid,
            "start_time": self.start_time,
            "started_at": self.started_at,
            "identity": self.identity,
            "locks": [lk.as_dict() for lk in self.locks if lk.held],
            "lease_s": self.lease,
            "lease_remaining_s": round(max(0.0, self.lease_deadline - boottime()), 3),
            "children": [c.public() for c in self.children.values()],
            "journal": self.journal_path,
            "journal_error": self.journal.error,
            "socket": self.socket_path,
        }

    def op_status(self, _conn, _req) -> Dict:
        self._reap()
        return self._status()

    def op_renew(self, _conn, req) -> Dict:
        lease = req.get("lease", self.lease)
        if not number_in_range(lease, 0, MAX_LEASE_S, low_open=True):
            raise bad_request(
                f"lease {quote(lease)}: must be a number of seconds in (0, {MAX_LEASE_S}]")
        self.journal.event("lease_renew", lease_s=float(lease))  # a renewal that cannot be journaled is not made
        self.lease = float(lease)
        self.lease_deadline = boottime() + self.lease
        try:
            self._publish_lease()
        except OSError as exc:
            raise RequestError("supervisor.os_error", f"lease renewed but not recorded in {self.lease_path} or "
                                                      f"the lock files: {exc.strerror or exc}") from None
        return {"ok": True, "lease_s": self.lease, "lease_remaining_s": self.lease}

    def op_launch(self, _conn, req) -> Dict:
        spec = validate_launch_request(req)
        env, stripped = split_env(spec["env"])
        child_id = f"c{self.next_child}"
        argv = list(spec["argv"])
        pins, files = [], []  # pins: (what, Pinned), in the order journaled
        recorded = {}  # what -> the JSON object of a record_json file
        try:
            try:
                exe = argv[0]
                if spec["exe_pinned"]:
                    pins.append(("argv[0]", pin_file(exe, spec["exe_sha256"], "argv[0]")))
                    exe = pins[-1][1].proc_path
                # Files the runner reads by the name it is given (a zipapp, a case file, a library it
                # dlopens): it is given the sealed copy's name, so what it reads is what was hashed.
                for index, sha in sorted(spec["argv_pins"].items()):
                    pins.append((f"argv[{index}]", pin_file(argv[index], sha, f"argv[{index}]", executable=False)))
                    argv[index] = pins[-1][1].proc_path
                    if index in spec["record_json"]:  # what the runner was told, in the journal itself
                        recorded[f"argv[{index}]"] = read_pinned_json(pins[-1][1].fd, f"argv[{index}]")
                for name, sha in sorted(spec["env_pins"].items()):
                    pins.append((f"env[{name}]", pin_file(env[name], sha, f"env[{name}]", executable=False)))
                    env[name] = pins[-1][1].proc_path
                preload = []
                for index, lib in enumerate(spec["ld_preload"]):
                    what = f"ld_preload[{index}]"
                    pins.append((what, pin_file(lib["path"], lib["sha256"], what, executable=False)))
                    preload.append(pins[-1][1])
            except PinError as exc:
                code = "supervisor.hash_mismatch" if isinstance(exc, PinMismatch) else "supervisor.pin_failed"
                self.journal.note("child_launch_failed", child_id=child_id, argv=spec["argv"], error=code,
                                  msg=str(exc))
                raise RequestError(code, str(exc)) from None
            if preload:
                env["LD_PRELOAD"] = " ".join(p.proc_path for p in preload)
            try:
                files.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
                for field in ("stdout_path", "stderr_path"):
                    path = spec[field] or os.devnull
                    flags = os.O_WRONLY | os.O_CLOEXEC
                    if path != os.devnull:
                        flags |= os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                    files.append(os.open(path, flags, 0o600))
                keeper, pid = spawn_tree(argv, exe, env, spec["cwd"], tuple(files), [p.fd for _what, p in pins])
            except OSError as exc:
                self.journal.note("child_launch_failed", child_id=child_id, argv=spec["argv"], error=str(exc))
                raise RequestError("supervisor.launch_failed", f"launching {quote(spec['argv'])} failed: "
                                   f"{exc.strerror or exc}") from None
        finally:
            for fd in files:
                os.close(fd)
            # Recorded before the copies are closed: loaded_as names the descriptor the runner has.
            pinned = [dict(p.as_dict(), what=what, loaded_as=p.proc_path,
                           **({"json": recorded[what]} if what in recorded else {})) for what, p in pins]
            for _what, p in pins:
                p.close()
        self.next_child += 1
        try:
            start_time = proc_start_time(pid)
        except (OSError, ValueError, IndexError):
            start_time = -1  # the runner already ended and was reaped: recorded so it is never signalled
        child = Child(child_id, keeper, pid, start_time, spec, env_keys=sorted(env), stripped=stripped)
        self.children[child_id] = child
        exe_pin = pinned[0] if spec["exe_pinned"] else None
        libraries = [p for p in pinned if p["what"].startswith("ld_preload[")]
        try:
            self.journal.event(
                "child_start",
                child_id=child_id,
                pid=pid,
                start_time=start_time,
                keeper_pid=keeper,
                argv=spec["argv"],
                exe=_without(exe_pin, "what"),
                # Every file pinned for this child (argv[0], argv entries, env values, preloads):
                # path, sha256, size and copy kind of the bytes it was given, and the name it got.
                pinned=pinned,
                env_keys=child.env_keys,
                env_stripped=stripped,
                ld_preload=[_without(lib, "what") for lib in libraries],
                cwd=spec["cwd"],
                stdout_path=spec["stdout_path"],
                stderr_path=spec["stderr_path"],
            )
        except JournalError as exc:
            # A child the journal does not know of must not run: the verifier could not account for it.
            self._kill_tree(child, "journal_error")
            self._wait_keepers([child], KILL_REAP_TIMEOUT_S)
            raise JournalError(f"{exc}; child {child_id} was killed") from None
        return {"ok": True, "child": child.public(), "env_stripped": stripped, "pinned": pinned}

    def _child(self, req: Dict) -> Child:
        child_id = req.get("child_id")
        if not isinstance(child_id, str) or not _CHILD_ID_RE.fullmatch(child_id):
            raise bad_request(f"child_id {quote(child_id)}: must look like c1, c2, ...")
        child = self.children.get(child_id)
        if child is None:
            raise RequestError("supervisor.unknown_child", f"child_id {child_id}: no such child of this supervisor")
        return child

    @staticmethod
    def _timeout(req: Dict, default: float) -> float:
        val = req.get("timeout", default)
        if not number_in_range(val, 0, 86400):
            raise bad_request(f"timeout {quote(val)}: must be a number of seconds in [0, 86400]")
        return float(val)

    def op_wait(self, conn, req) -> Optional[Dict]:
        child = self._child(req)
        timeout = self._timeout(req, 0.0)
        self._reap()
        if child.exited or timeout == 0:
            return {"ok": True, "child": child.public(), "timed_out": not child.exited}
        self.pending.append(Pending(conn, child, time.monotonic() + timeout, "wait", {}))
        return None

    def op_signal(self, conn, req) -> Optional[Dict]:
        child = self._child(req)
        signum = signal_number(req.get("signal"))
        timeout = self._timeout(req, KILL_REAP_TIMEOUT_S)
        reap = req.get("reap", True)
        if not isinstance(reap, bool):
            raise bad_request(f"reap {quote(reap)}: must be true or false")
        want_pid, want_start = req.get("pid"), req.get("start_time")
        self._reap()
        reason = None
        if want_pid != child.pid or isinstance(want_pid, bool):
            reason = f"pid {quote(want_pid)} is not child {child.child_id}'s pid {child.pid}"
        elif want_start != child.start_time or isinstance(want_start, bool):
            reason = (
                f"start time {quote(want_start)} is not child {child.child_id}'s start time {child.start_time} "
                "(pid reused?)"
            )
        elif child.exited:
            reason = f"child {child.child_id} (pid {child.pid}) has already exited and been reaped"
        else:
            reason = verify_process(child.pid, child.start_time)
        if reason is not None:
            self.journal.note(
                "signal_refused",
                child_id=child.child_id,
                pid=want_pid,
                start_time=want_start,
                signal=signum,
                signal_name=signal_name(signum),
                reason=reason,
            )
            raise RequestError("supervisor.signal_refused", reason)
        self.journal.event(
            "signal",
            child_id=child.child_id,
            pid=child.pid,
            start_time=child.start_time,
            signal=signum,
            signal_name=signal_name(signum),
            reason="request",
        )
        os.kill(child.pid, signum)
        if not reap:
            return {"ok": True, "child": child.public(), "signalled": signum}
        self.pending.append(Pending(conn, child, time.monotonic() + timeout, "signal", {"signalled": signum}))
        return None

    def op_stop(self, conn, req) -> Optional[Dict]:
        force = req.get("force", False)
        if not isinstance(force, bool):
            raise bad_request(f"force {quote(force)}: must be true or false")
        self._reap()
        running = [c for c in self.children.values() if not c.exited]
        if running and not force:
            listed = ", ".join(f"{c.child_id} (pid {c.pid})" for c in running)
            self.journal.note("stop_refused", running=[c.child_id for c in running])
            raise RequestError(
                "supervisor.children_running",
                f"{len(running)} children still running: {listed}; stop with force to kill them",
            )
        summary = self._shutdown("stop", force=force)
        if summary["journal_error"]:
            answer = dict(summary, ok=False, error="supervisor.journal_error",
                          msg=f"stopped and {'released every lock' if summary['locks_released'] else 'exited'}, "
                              f"but the journal is incomplete: {summary['journal_error']}")
        else:
            answer = dict(summary, ok=True)
        self._respond(conn, answer)
        return None

    # -- children, pending requests and shutdown ------------------------------------------------

    def _record_exit(self, child: Child, rc: int) -> None:
        child.exited = True
        if rc < 0:
            child.exit_signal = -rc
        else:
            child.exit_code = rc
        self.journal.note(
            "child_exit",
            child_id=child.child_id,
            pid=child.pid,
            start_time=child.start_time,
            exit_code=child.exit_code,
            exit_signal=child.exit_signal,
            exit_signal_name=signal_name(child.exit_signal),
        )
        self.journal.sync()  # the end of a runner: its events are on disk

    def _poll_keeper(self, child: Child) -> bool:
        try:
            pid, status = os.waitpid(child.keeper, os.WNOHANG)
        except ChildProcessError:
            pid, status = child.keeper, int(signal.SIGKILL)
        if pid == 0:
            return False
        self._record_exit(child, exit_code_of(status))
        return True

    def _reap(self) -> None:
        for child in self.children.values():
            if not child.exited:
                self._poll_keeper(child)

    def _resolve_pending(self) -> None:
        now = time.monotonic()
        keep = []
        for p in self.pending:
            if p.child.exited:
                resp = {"ok": True, "child": p.child.public(), "timed_out": False}
                self._respond(p.conn, dict(resp, **p.extra))
            elif now >= p.deadline:
                if p.op == "signal":
                    self._respond(
                        p.conn,
                        {
                            "ok": False,
                            "error": "supervisor.not_reaped",
                            "child": p.child.public(),
                            "msg": f"child {p.child.child_id} (pid {p.child.pid}) still running "
                            "after the signal and the timeout",
                        },
                    )
                else:
                    self._respond(p.conn, {"ok": True, "child": p.child.public(), "timed_out": True})
            else:
                keep.append(p)
        self.pending = keep

    def _kill_tree(self, child: Child, reason: str) -> bool:
        """SIGKILL the runner's process group (its keeper then ends the rest of the tree)."""
        if verify_process(child.pid, child.start_time) is None:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            try:
                os.kill(child.keeper, signal.SIGTERM)  # the runner is gone: the keeper ends what is left
            except ProcessLookupError:
                pass
        self.journal.note(
            "signal",
            child_id=child.child_id,
            pid=child.pid,
            start_time=child.start_time,
            signal=int(signal.SIGKILL),
            signal_name="SIGKILL",
            reason=reason,
        )
        return True

    def _wait_keepers(self, children: List[Child], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = [c for c in children if not c.exited]
        while waiting:
            waiting = [c for c in waiting if not self._poll_keeper(c)]
            if not waiting:
                break
            if time.monotonic() >= deadline:
                for child in waiting:
                    self.journal.note("child_unreaped", child_id=child.child_id, pid=child.pid)
                break
            time.sleep(0.005)

    def _kill_and_reap(self, reason: str) -> List[str]:
        running = [c for c in self.children.values() if not c.exited]
        for child in running:
            self._kill_tree(child, reason)
        self._wait_keepers(running, KILL_REAP_TIMEOUT_S)
        return [c.child_id for c in running]

    def _release_locks(self) -> None:
        for lock in reversed(self.locks):
            if lock.held:
                # Stamped while still held: the next holder's lock_acquire, stamped once it holds the lock, is
                # then always later, so journals of two supervisors show their hold intervals in true order.
                held_until = time.time()
                try:
                    record = lock.release()
                except OSError as exc:  # the kernel still drops the flock when we exit
                    self.journal.note("lock_release", at=held_until, rnic=lock.rnic, path=lock.path, ok=False,
                                      error=str(exc))
                    continue
                self.released.append({"rnic": lock.rnic, "path": lock.path})
                self.journal.note("lock_release", at=held_until, rnic=lock.rnic, path=lock.path, ok=True,
                                  owner=record)

    def _shutdown(self, reason: str, force: bool) -> Dict:
        """Kill (if forced), release, close: every step runs even when the journal cannot be written."""
        killed = self._kill_and_reap(reason) if force else []
        self._release_locks()
        self.stop_reason = reason
        for p in self.pending:
            self._respond(
                p.conn,
                {
                    "ok": False,
                    "error": "supervisor.supervisor_stopped",
                    "child": p.child.public(),
                    "msg": f"supervisor stopped ({reason})",
                },
            )
        self.pending = []
        if self.listener is not None:
            if not self.accept_paused_until:
                self.sel.unregister(self.listener)
            self.listener.close()
            self.listener = None
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
        try:
            os.unlink(self.lease_path)
        except OSError:
            pass
        all_released = all(not lk.held for lk in self.locks)
        self.journal.note(
            "supervisor_stop",
            reason=reason,
            force=force,
            children_killed=killed,
            locks_released=all_released,
            released=[r["rnic"] for r in self.released],
        )
        self.journal.close(reason=reason, children=len(self.children), locks_released=all_released)
        summary = {
            "reason": reason,
            "force": force,
            "children_killed": killed,
            "children": [c.public() for c in self.children.values()],
            "locks_released": all_released,
            "released": self.released,
            "journal": self.journal_path,
            "journal_error": self.journal.error,
        }
        self.stop_summary = summary
        return summary


def _tell(fd: int, msg: Dict) -> None:
    """The one message of the ready pipe (then closed)."""
    if fd < 0:
        return
    try:
        os.write(fd, (json.dumps(msg) + "\n").encode())
    except OSError:
        pass
    try:
        os.close(fd)
    except OSError:
        pass


def _detach() -> None:
    """Second fork: the launcher reaps the first process; the supervisor is nobody's child."""
    if os.fork() > 0:
        os._exit(0)


def _take_run_lock(run_dir: str) -> Optional[int]:
    """The run directory's flock, held for the supervisor's life; None when another process has it."""
    fd = os.open(os.path.join(run_dir, RUN_LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + 0.5  # a concurrent probe (lock_held) holds it for microseconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.01)


def _load_config(path: str):
    with open(path, "rb") as handle:
        data = handle.read(MAX_REQUEST_BYTES + 1)
    if len(data) > MAX_REQUEST_BYTES:
        raise ValueError("larger than 1 MiB")
    return json.loads(data.decode("utf-8"))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="orbite per-node lock supervisor")
    parser.add_argument("--config", required=True)
    parser.add_argument("--ready-fd", type=int, default=-1)
    parser.add_argument("--foreground", action="store_true")
    args = parser.parse_args(argv)
    try:
        cfg = _load_config(args.config)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        _tell(args.ready_fd, {"ok": False, "error": "supervisor.bad_request",
                              "msg": f"configuration {args.config}: {exc}"})
        return 2
    problem = check_config(cfg)
    if problem is not None:  # the supervisor's own check: nothing is created, locked or journaled
        _tell(args.ready_fd, {"ok": False, "error": "supervisor.bad_request", "msg": problem})
        return 2
    if not args.foreground:
        _detach()
    os.umask(0o077)
    run_dir = cfg["run_dir"]
    pid_path = os.path.join(run_dir, PID_NAME)
    try:
        run_lock = _take_run_lock(run_dir)
    except OSError as exc:
        _tell(args.ready_fd, {"ok": False, "error": "supervisor.os_error",
                              "msg": f"run lock in {run_dir}: {exc.strerror}"})
        return 1
    if run_lock is None:
        _tell(args.ready_fd, {"ok": False, "error": "supervisor.already_running",
                              "msg": f"another supervisor holds {os.path.join(run_dir, RUN_LOCK_NAME)}"})
        return 1
    try:
        fd = os.open(pid_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if os.write(fd, f"{os.getpid()}\n".encode()) == 0:
                raise OSError(errno.ENOSPC, "nothing written")
        finally:
            os.close(fd)
        sup = Supervisor(cfg, args.ready_fd)
    except (OSError, JournalError) as exc:  # a full disk, say: say so on the ready pipe
        code = "supervisor.journal_error" if isinstance(exc, JournalError) else "supervisor.os_error"
        text = str(exc) if isinstance(exc, JournalError) else (exc.strerror or str(exc))
        _tell(args.ready_fd, {"ok": False, "error": code, "msg": f"cannot start in {run_dir}: {text}"})
        try:
            os.unlink(pid_path)
        except OSError:
            pass
        return 1
    try:
        try:
            rc = sup.start()
        except JournalError as exc:  # the disk filled up during the start: a coded failure, nothing held
            rc = sup._fail_start("supervisor.journal_error", str(exc))
        if rc != 0:
            return rc
        return sup.serve()
    except Exception as exc:  # never leave locks held behind a crash; the journal says why
        sup.journal.note("internal_error", error=f"{type(exc).__name__}: {exc}")
        sup._kill_and_reap("internal_error")
        sup._release_locks()
        sup.journal.close(reason="internal_error", children=len(sup.children),
                          locks_released=all(not lk.held for lk in sup.locks))
        sup._tell_launcher({"ok": False, "error": "supervisor.internal", "msg": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        try:
            os.unlink(pid_path)
        except OSError:
            pass
        os.close(run_lock)
