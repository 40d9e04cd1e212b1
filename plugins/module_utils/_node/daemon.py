# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The per-node lock supervisor process (see docs/supervisor.md).

The node_supervisor module copies this file, rnic_lock.py and node_identity.py into the private
run directory and starts them there, because the module's own temporary directory is removed when
the module returns while the supervisor must keep running. Stdlib only, Python >= 3.9.

One supervisor per run and node: it takes one flock per RNIC, rechecks the node identity inside
the locks, then serves a UNIX socket (one JSON request line, one JSON response line per
connection) to launch, wait for and signal its children, renew its lease and stop. Everything it
does is appended to a JSON-lines journal, flushed per event.

The shared request rules (validate_launch_request, ...) live here too, so that the client checks
exactly what the supervisor will check.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Dict, List, Optional

from ansible_collections.orbite.qualification.plugins.module_utils._common.numbers import ascii_int
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._node.identity import (
    IdentityError,
    identity_mismatches,
    read_identity,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node.locks import (
    LockError,
    LockTimeout,
    acquire,
    iso_time,
)

JOURNAL_SCHEMA = "orbite.supervisor-journal"
JOURNAL_VERSION = 1
PROTOCOL_VERSION = 1
SOCKET_NAME = "control.sock"
JOURNAL_NAME = "journal.jsonl"
PID_NAME = "supervisor.pid"
LOG_NAME = "supervisor.log"
CONFIG_NAME = "config.json"
# Never passed to a child: it turns a destroy EIO into success and would hide the fault under test.
STRIPPED_ENV = ("RDMAV_ALLOW_DISASSOC_DESTROY",)
MAX_REQUEST_BYTES = 1 << 20
MAX_LEASE_S = 7 * 24 * 3600
KILL_REAP_TIMEOUT_S = 10.0
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CHILD_ID_RE = re.compile(r"^c[1-9][0-9]{0,8}$")
OPS = ("status", "renew", "launch", "wait", "signal", "stop")
_SUN_PATH_MAX = 100  # sockaddr_un.sun_path is 108 bytes; keep a margin


class RequestError(OrbiteError):
    """A control request breaks a rule; code is a stable word, msg names field, value and rule."""

    code = "supervisor.request"

    def __init__(self, code: str, msg: str):
        super().__init__(msg)
        self.code = code
        self.msg = msg


# ---------------------------------------------------------------------------------------------
# Shared helpers (used by the client too)


def proc_start_time(pid: int) -> int:
    """Start time of pid in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        data = handle.read()
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = data[data.rindex(b")") + 2 :].split()
    return int(rest[19])


def signal_number(value) -> int:
    """Accept 9, "9", "KILL" or "SIGKILL"; raise RequestError otherwise."""
    if isinstance(value, bool):
        raise RequestError("bad_request", f"signal {value!r}: must be a signal number or name")
    if isinstance(value, int) or ascii_int(value) is not None:
        num = value if isinstance(value, int) else ascii_int(value)
        valid = {int(s) for s in signal.valid_signals()}
        if num not in valid or num == 0:
            raise RequestError("bad_request", f"signal {value!r}: not a valid signal number")
        return num
    if isinstance(value, str):
        name = value.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        sig = getattr(signal.Signals, name, None) if name in signal.Signals.__members__ else None
        if sig is not None:
            return int(sig)
    raise RequestError("bad_request", f"signal {value!r}: must be a signal number or name such as SIGKILL")


def signal_name(num: Optional[int]) -> Optional[str]:
    if num is None:
        return None
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"SIG{num}"


def _abs_path(field: str, value, must_exist: Optional[str] = None) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        raise RequestError("bad_request", f"{field} {value!r}: must be an absolute path")
    if must_exist == "dir" and not os.path.isdir(value):
        raise RequestError("bad_request", f"{field} {value}: must be an existing directory")
    if must_exist == "parent" and not os.path.isdir(os.path.dirname(value) or "/"):
        raise RequestError("bad_request", f"{field} {value}: its directory must exist")
    return value


def validate_launch_request(req: Dict) -> Dict:
    """Normalise and check a launch request; argv is a list (never a shell string)."""
    argv = req.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise RequestError("bad_request", f"argv {argv!r}: must be a non-empty list of strings")
    for i, arg in enumerate(argv):
        if "\0" in arg:
            raise RequestError("bad_request", f"argv[{i}] {arg!r}: must not contain NUL")
    exe = argv[0]
    if not exe.startswith("/") or not os.path.isfile(exe) or not os.access(exe, os.X_OK):
        raise RequestError("bad_request", f"argv[0] {exe!r}: must be the absolute path of an executable file")
    env = req.get("env") or {}
    if not isinstance(env, dict):
        raise RequestError("bad_request", f"env {env!r}: must be a mapping of names to strings")
    for key, val in env.items():
        if not isinstance(key, str) or not _ENV_KEY_RE.match(key):
            raise RequestError("bad_request", f"env key {key!r}: must match {_ENV_KEY_RE.pattern}")
        if not isinstance(val, str) or "\0" in val:
            raise RequestError("bad_request", f"env[{key}] {val!r}: must be a string without NUL")
        if key == "LD_PRELOAD":
            raise RequestError("bad_request", "env[LD_PRELOAD]: not allowed; use the ld_preload list")
    preload = req.get("ld_preload") or []
    if not isinstance(preload, list):
        raise RequestError("bad_request", f"ld_preload {preload!r}: must be a list of paths")
    for i, lib in enumerate(preload):
        field = f"ld_preload[{i}]"
        _abs_path(field, lib)
        if any(c in lib for c in " \t\n:"):
            raise RequestError("bad_request", f"{field} {lib!r}: must not contain spaces or colons")
        try:
            st = os.lstat(lib)
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            raise RequestError("bad_request", f"{field} {lib}: must be an existing regular file (not a symlink)")
    cwd = req.get("cwd")
    if cwd is not None:
        _abs_path("cwd", cwd, must_exist="dir")
    out = {}
    for field in ("stdout_path", "stderr_path"):
        val = req.get(field)
        if val is not None:
            _abs_path(field, val, must_exist="parent")
        out[field] = val
    return {"argv": list(argv), "env": dict(env), "ld_preload": list(preload), "cwd": cwd, **out}


@contextmanager
def socket_address(path: str):
    """Yield an address for bind/connect; long paths go through /proc/self/fd/<dirfd>/name."""
    if len(path.encode()) <= _SUN_PATH_MAX:
        yield path
        return
    dfd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{dfd}/{os.path.basename(path)}"
    finally:
        os.close(dfd)


# ---------------------------------------------------------------------------------------------
# The supervisor


class Journal:
    """Append-only JSON lines, one flush per event; the first line carries schema and version."""

    def __init__(self, path: str, header: Dict):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.path = path
        self.handle = os.fdopen(fd, "a", encoding="utf-8")
        self.seq = 0
        first = {"schema": JOURNAL_SCHEMA, "version": JOURNAL_VERSION}
        first.update(header)
        self.event("journal_open", **first)

    def event(self, ev: str, **fields) -> Dict:
        now = time.time()
        rec = {"seq": self.seq, "ev": ev, "t": round(now, 6), "time": iso_time(now)}
        rec.update(fields)
        self.seq += 1
        if self.handle is not None:
            self.handle.write(json.dumps(rec, sort_keys=False) + "\n")
            self.handle.flush()
        return rec

    def close(self, **fields) -> None:
        self.event("journal_close", **fields)
        self.handle.close()
        self.handle = None


class Child:
    def __init__(
        self,
        child_id: str,
        popen: subprocess.Popen,
        start_time: int,
        spec: Dict,
        *,
        env_keys: List[str],
        stripped: List[str],
    ):
        self.child_id = child_id
        self.popen = popen
        self.pid = popen.pid
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


def _child_setup():  # runs in the child between fork and exec
    # Die with the supervisor even if it is SIGKILLed (PR_SET_PDEATHSIG = 1).
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError, ImportError):
        pass
    if os.getppid() == 1:
        os._exit(127)


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
        self.locks = []
        self.released: List[Dict] = []
        self.children: Dict[str, Child] = {}
        self.next_child = 1
        self.lease = float(cfg["lease"])
        self.lease_deadline = time.monotonic() + self.lease
        self.pending: List[Pending] = []
        self.buffers: Dict[socket.socket, bytearray] = {}
        self.listener: Optional[socket.socket] = None
        self.sel = selectors.DefaultSelector()
        self.stop_reason: Optional[str] = None
        self.stop_summary: Optional[Dict] = None
        self.identity: Optional[Dict] = None
        self.started_at = iso_time(time.time())
        self.journal = Journal(
            self.journal_path,
            {
                "run_id": cfg["run_id"],
                "controller": cfg.get("controller"),
                "pid": os.getpid(),
                "previous_journal": cfg.get("previous_journal"),
            },
        )

    # -- start-up ------------------------------------------------------------------------------

    def _tell_launcher(self, msg: Dict) -> None:
        if self.ready_fd < 0:
            return
        try:
            os.write(self.ready_fd, (json.dumps(msg) + "\n").encode())
        except OSError:
            pass
        os.close(self.ready_fd)
        self.ready_fd = -1

    def _fail_start(self, code: str, msg: str, **extra) -> int:
        self.journal.event("start_failed", error=code, msg=msg, **extra)
        self._release_locks()
        self.journal.close(reason="start_failed", children=0, locks_released=all(not lk.held for lk in self.locks))
        self._tell_launcher(dict(ok=False, error=code, msg=msg, journal=self.journal_path, **extra))
        return 1

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
            self.journal.event("identity_check", stage="before_locks", ok=False, error=str(exc))
            return self._fail_start("identity_error", str(exc))
        expected = {
            "hostname": cfg.get("hostname") or before["hostname"],
            "boot_id": cfg.get("boot_id") or before["boot_id"],
        }
        owner = {
            "run_id": cfg["run_id"],
            "controller": cfg.get("controller"),
            "pid": os.getpid(),
            "hostname": before["hostname"],
            "boot_id": before["boot_id"],
        }
        # Sorted order: two supervisors wanting overlapping sets cannot deadlock each other.
        for rnic in sorted(cfg["locks"]):
            try:
                lock = acquire(cfg["lock_dir"], rnic, owner, timeout=float(cfg["lock_timeout"]))
            except LockTimeout as exc:
                self.journal.event(
                    "lock_timeout", rnic=rnic, current_owner=exc.owner, waited_s=float(cfg["lock_timeout"])
                )
                return self._fail_start("lock_timeout", str(exc), rnic=rnic, owner=exc.owner)
            except (LockError, OSError) as exc:
                return self._fail_start("lock_error", f"RNIC lock {rnic}: {exc}", rnic=rnic)
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
            self.journal.event("identity_check", stage="inside_locks", ok=False, error=str(exc))
            return self._fail_start("identity_error", str(exc))
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
            return self._fail_start("identity_mismatch", "node identity changed: " + text, mismatch=mismatch)
        self.identity = observed
        try:
            self._listen()
        except OSError as exc:
            return self._fail_start("socket_error", f"control socket {self.socket_path}: {exc}")
        self.journal.event("ready", socket=self.socket_path, pid=os.getpid())
        self._tell_launcher(
            {
                "ok": True,
                "pid": os.getpid(),
                "start_time": proc_start_time(os.getpid()),
                "socket": self.socket_path,
                "journal": self.journal_path,
                "locks": [lk.as_dict() for lk in self.locks],
                "identity": observed,
            }
        )
        return 0

    def _listen(self) -> None:
        if os.path.lexists(self.socket_path):
            os.unlink(self.socket_path)  # the launcher checked nobody answers on it
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
        self.sel.register(wake_r, selectors.EVENT_READ, "wake")
        while self.stop_reason is None:
            now = time.monotonic()
            timeout = min(
                [0.25, max(0.0, self.lease_deadline - now)] + [max(0.0, p.deadline - now) for p in self.pending]
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
            if self.stop_reason is None and time.monotonic() >= self.lease_deadline:
                self.journal.event(
                    "lease_expired", lease_s=self.lease, overdue_s=round(time.monotonic() - self.lease_deadline, 3)
                )
                self._shutdown("lease_expired", force=True)
        return 0

    def _accept(self) -> None:
        try:
            conn = self.listener.accept()[0]
        except (BlockingIOError, InterruptedError):
            return
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        peer_pid, peer_uid, _gid = struct.unpack("3i", creds)
        if peer_uid != os.geteuid():
            self.journal.event("connection_refused", peer_pid=peer_pid, peer_uid=peer_uid)
            msg = f"peer uid {peer_uid} is not the supervisor's uid {os.geteuid()}"
            self._respond(conn, {"ok": False, "error": "forbidden", "msg": msg})
            return
        conn.setblocking(False)
        self.buffers[conn] = bytearray()
        self.sel.register(conn, selectors.EVENT_READ, "conn")

    def _drop(self, conn: socket.socket) -> None:
        if conn in self.buffers:
            del self.buffers[conn]
            self.sel.unregister(conn)

    def _respond(self, conn: socket.socket, resp: Dict) -> None:
        self._drop(conn)
        try:
            conn.setblocking(True)
            conn.settimeout(2.0)
            conn.sendall((json.dumps(resp) + "\n").encode())
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
            self._respond(conn, {"ok": False, "error": "bad_request", "msg": "request larger than 1 MiB"})
            return
        if b"\n" not in buf:
            return
        line = bytes(buf[: buf.index(b"\n")])
        self._drop(conn)
        try:
            req = json.loads(line.decode("utf-8"))
            if not isinstance(req, dict):
                raise ValueError("not an object")
        except (UnicodeDecodeError, ValueError) as exc:
            msg = f"request is not a JSON object: {exc}"
            self._respond(conn, {"ok": False, "error": "bad_request", "msg": msg})
            return
        try:
            resp = self._dispatch(conn, req)
        except RequestError as exc:
            resp = {"ok": False, "error": exc.code, "msg": exc.msg}
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
        }.get(op)
        if handler is None:
            raise RequestError("bad_request", f"op {op!r}: must be one of {', '.join(OPS)}")
        return handler(conn, req)

    # -- operations -----------------------------------------------------------------------------

    def _status(self) -> Dict:
        return {
            "ok": True,
            "protocol": PROTOCOL_VERSION,
            "run_id": self.cfg["run_id"],
            "controller": self.cfg.get("controller"),
            "pid": os.getpid(),
            "started_at": self.started_at,
            "identity": self.identity,
            "locks": [lk.as_dict() for lk in self.locks if lk.held],
            "lease_s": self.lease,
            "lease_remaining_s": round(max(0.0, self.lease_deadline - time.monotonic()), 3),
            "children": [c.public() for c in self.children.values()],
            "journal": self.journal_path,
            "socket": self.socket_path,
        }

    def op_status(self, _conn, _req) -> Dict:
        self._reap()
        return self._status()

    def op_renew(self, _conn, req) -> Dict:
        lease = req.get("lease")
        if lease is not None:
            if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0 < lease <= MAX_LEASE_S:
                raise RequestError("bad_request", f"lease {lease!r}: must be a number of seconds in (0, {MAX_LEASE_S}]")
            self.lease = float(lease)
        self.lease_deadline = time.monotonic() + self.lease
        self.journal.event("lease_renew", lease_s=self.lease)
        return {"ok": True, "lease_s": self.lease, "lease_remaining_s": self.lease}

    def op_launch(self, _conn, req) -> Dict:
        spec = validate_launch_request(req)
        env = dict(spec["env"])
        stripped = [k for k in STRIPPED_ENV if k in env]
        for key in stripped:
            del env[key]
        if spec["ld_preload"]:
            env["LD_PRELOAD"] = " ".join(spec["ld_preload"])
        child_id = f"c{self.next_child}"
        files = []
        try:
            for field in ("stdout_path", "stderr_path"):
                path = spec[field] or os.devnull
                flags = os.O_WRONLY | os.O_CLOEXEC
                if path != os.devnull:
                    flags |= os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                files.append(os.open(path, flags, 0o600))
            popen = subprocess.Popen(  # argv list, never a shell
                spec["argv"],
                env=env,
                cwd=spec["cwd"],
                stdin=subprocess.DEVNULL,
                stdout=files[0],
                stderr=files[1],
                close_fds=True,
                start_new_session=True,
                preexec_fn=_child_setup,  # noqa: PLW1509 - the supervisor never starts threads
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self.journal.event("child_launch_failed", child_id=child_id, argv=spec["argv"], error=str(exc))
            raise RequestError("launch_failed", f"launching {spec['argv']!r} failed: {exc}") from None
        finally:
            for fd in files:
                os.close(fd)
        self.next_child += 1
        try:
            start_time = proc_start_time(popen.pid)
        except (OSError, ValueError, IndexError):
            start_time = -1  # cannot happen for an unreaped child; recorded so it is never signalled
        child = Child(child_id, popen, start_time, spec, env_keys=sorted(env), stripped=stripped)
        self.children[child_id] = child
        self.journal.event(
            "child_start",
            child_id=child_id,
            pid=child.pid,
            start_time=start_time,
            argv=spec["argv"],
            env_keys=child.env_keys,
            env_stripped=stripped,
            ld_preload=spec["ld_preload"],
            cwd=spec["cwd"],
            stdout_path=spec["stdout_path"],
            stderr_path=spec["stderr_path"],
        )
        return {"ok": True, "child": child.public(), "env_stripped": stripped}

    def _child(self, req: Dict) -> Child:
        child_id = req.get("child_id")
        if not isinstance(child_id, str) or not _CHILD_ID_RE.match(child_id):
            raise RequestError("bad_request", f"child_id {child_id!r}: must look like c1, c2, ...")
        child = self.children.get(child_id)
        if child is None:
            raise RequestError("unknown_child", f"child_id {child_id}: no such child of this supervisor")
        return child

    @staticmethod
    def _timeout(req: Dict, default: float) -> float:
        val = req.get("timeout", default)
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 <= val <= 86400:
            raise RequestError("bad_request", f"timeout {val!r}: must be a number of seconds in [0, 86400]")
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
            raise RequestError("bad_request", f"reap {reap!r}: must be true or false")
        want_pid, want_start = req.get("pid"), req.get("start_time")
        self._reap()
        reason = None
        if want_pid != child.pid:
            reason = f"pid {want_pid!r} is not child {child.child_id}'s pid {child.pid}"
        elif want_start != child.start_time:
            reason = (
                f"start time {want_start!r} is not child {child.child_id}'s start time {child.start_time} (pid reused?)"
            )
        elif child.exited:
            reason = f"child {child.child_id} (pid {child.pid}) has already exited and been reaped"
        else:
            try:
                now_start = proc_start_time(child.pid)
            except (OSError, ValueError, IndexError):
                now_start = None
            if now_start != child.start_time:
                reason = f"pid {child.pid} now has start time {now_start!r}, not {child.start_time}"
        if reason is not None:
            self.journal.event(
                "signal_refused",
                child_id=child.child_id,
                pid=want_pid,
                start_time=want_start,
                signal=signum,
                signal_name=signal_name(signum),
                reason=reason,
            )
            raise RequestError("signal_refused", reason)
        os.kill(child.pid, signum)
        self.journal.event(
            "signal",
            child_id=child.child_id,
            pid=child.pid,
            start_time=child.start_time,
            signal=signum,
            signal_name=signal_name(signum),
            reason="request",
        )
        if not reap:
            return {"ok": True, "child": child.public(), "signalled": signum}
        self.pending.append(Pending(conn, child, time.monotonic() + timeout, "signal", {"signalled": signum}))
        return None

    def op_stop(self, conn, req) -> Optional[Dict]:
        force = req.get("force", False)
        if not isinstance(force, bool):
            raise RequestError("bad_request", f"force {force!r}: must be true or false")
        self._reap()
        running = [c for c in self.children.values() if not c.exited]
        if running and not force:
            names = ", ".join(f"{c.child_id} (pid {c.pid})" for c in running)
            self.journal.event("stop_refused", running=[c.child_id for c in running])
            raise RequestError(
                "children_running", f"{len(running)} children still running: {names}; stop with force to kill them"
            )
        summary = self._shutdown("stop", force=force)
        self._respond(conn, dict(summary, ok=True))
        return None

    # -- children, pending requests and shutdown ------------------------------------------------

    def _record_exit(self, child: Child, rc: int) -> None:
        child.exited = True
        if rc < 0:
            child.exit_signal = -rc
        else:
            child.exit_code = rc
        self.journal.event(
            "child_exit",
            child_id=child.child_id,
            pid=child.pid,
            start_time=child.start_time,
            exit_code=child.exit_code,
            exit_signal=child.exit_signal,
            exit_signal_name=signal_name(child.exit_signal),
        )

    def _reap(self) -> None:
        for child in self.children.values():
            if not child.exited:
                rc = child.popen.poll()
                if rc is not None:
                    self._record_exit(child, rc)

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
                            "error": "not_reaped",
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

    def _kill_and_reap(self, reason: str) -> List[str]:
        killed = []
        for child in self.children.values():
            if child.exited:
                continue
            try:
                os.killpg(child.pid, signal.SIGKILL)  # its own session: also takes its descendants
            except ProcessLookupError:
                os.kill(child.pid, signal.SIGKILL)
            self.journal.event(
                "signal",
                child_id=child.child_id,
                pid=child.pid,
                start_time=child.start_time,
                signal=int(signal.SIGKILL),
                signal_name="SIGKILL",
                reason=reason,
            )
            killed.append(child.child_id)
        for child in self.children.values():
            if not child.exited:
                try:
                    rc = child.popen.wait(KILL_REAP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self.journal.event("child_unreaped", child_id=child.child_id, pid=child.pid)
                    continue
                self._record_exit(child, rc)
        return killed

    def _release_locks(self) -> None:
        for lock in reversed(self.locks):
            if lock.held:
                try:
                    record = lock.release()
                except OSError as exc:  # the kernel still drops the flock when we exit
                    self.journal.event("lock_release", rnic=lock.rnic, path=lock.path, ok=False, error=str(exc))
                    continue
                self.released.append({"rnic": lock.rnic, "path": lock.path})
                self.journal.event("lock_release", rnic=lock.rnic, path=lock.path, ok=True, owner=record)

    def _shutdown(self, reason: str, force: bool) -> Dict:
        killed = self._kill_and_reap(reason) if force else []
        self._release_locks()
        self.stop_reason = reason
        for p in self.pending:
            self._respond(
                p.conn,
                {
                    "ok": False,
                    "error": "supervisor_stopped",
                    "child": p.child.public(),
                    "msg": f"supervisor stopped ({reason})",
                },
            )
        self.pending = []
        if self.listener is not None:
            self.sel.unregister(self.listener)
            self.listener.close()
            self.listener = None
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
        all_released = all(not lk.held for lk in self.locks)
        summary = {
            "reason": reason,
            "force": force,
            "children_killed": killed,
            "children": [c.public() for c in self.children.values()],
            "locks_released": all_released,
            "released": self.released,
            "journal": self.journal_path,
        }
        self.journal.event(
            "supervisor_stop",
            reason=reason,
            force=force,
            children_killed=killed,
            locks_released=all_released,
            released=[r["rnic"] for r in self.released],
        )
        self.journal.close(reason=reason, children=len(self.children), locks_released=all_released)
        self.stop_summary = summary
        return summary


def _detach() -> None:
    """Second fork: the launcher reaps the first process; the supervisor is nobody's child."""
    if os.fork() > 0:
        os._exit(0)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="orbite per-node lock supervisor")
    parser.add_argument("--config", required=True)
    parser.add_argument("--ready-fd", type=int, default=-1)
    parser.add_argument("--foreground", action="store_true")
    args = parser.parse_args(argv)
    with open(args.config, encoding="utf-8") as handle:
        cfg = json.load(handle)
    if not args.foreground:
        _detach()
    os.umask(0o077)
    with open(os.path.join(cfg["run_dir"], PID_NAME), "w", encoding="ascii") as handle:
        handle.write(f"{os.getpid()}\n")
    try:
        sup = Supervisor(cfg, args.ready_fd)
    except OSError as exc:  # the journal cannot be opened: say so on the ready pipe
        if args.ready_fd >= 0:
            msg = {"ok": False, "error": "journal_error", "msg": f"cannot open the journal: {exc}"}
            os.write(args.ready_fd, (json.dumps(msg) + "\n").encode())
        os.unlink(os.path.join(cfg["run_dir"], PID_NAME))
        return 1
    try:
        rc = sup.start()
        if rc != 0:
            return rc
        return sup.serve()
    except Exception as exc:  # never leave locks held behind a crash; the journal says why
        if sup.journal.handle is not None:
            sup.journal.event("internal_error", error=f"{type(exc).__name__}: {exc}")
            sup._kill_and_reap("internal_error")
            sup._release_locks()
            sup.journal.close(reason="internal_error", children=len(sup.children),
                              locks_released=all(not lk.held for lk in sup.locks))
        sup._tell_launcher({"ok": False, "error": "internal", "msg": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        try:
            os.unlink(os.path.join(cfg["run_dir"], PID_NAME))
        except OSError:
            pass
