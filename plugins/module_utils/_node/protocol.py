# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""What both ends of the lock supervisor's control socket share (see docs/supervisor.md): the run directory's
file names, the rules of a launch request and of the start configuration (``validate_launch_request``,
``check_config``: the client checks exactly what the supervisor will check), signal names and the socket's
address.

Apart from daemon.py (the supervisor program, which imports this) so that a module that only talks to a running
supervisor (orbite.qualification.runner, fetch_receipts), and node_supervisor's start, which copies the
program without running it, never import the program: a module call on a node compiles every module it
imports (the AnsiballZ payload carries sources only), and the program is the largest of them. Stdlib only,
Python >= 3.9.
"""

from __future__ import annotations

import math
import os
import re
import signal
import stat
from contextlib import contextmanager
from typing import Dict, List, Optional, Tuple

from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote
from ansible_collections.orbite.qualification.plugins.module_utils._common.numbers import ascii_int
from ansible_collections.orbite.qualification.plugins.module_utils._node.pinned import is_sha256

PROTOCOL_VERSION = 3  # 3: launch pins argv entries and env values (argv_pins, env_pins)
SOCKET_NAME = "control.sock"
JOURNAL_NAME = "journal.jsonl"
PID_NAME = "supervisor.pid"
LOG_NAME = "supervisor.log"
CONFIG_NAME = "config.json"
RUN_LOCK_NAME = "supervisor.lock"  # flocked by the live supervisor, for its whole life
START_LOCK_NAME = "start.lock"  # flocked by a starter, from its first check to the ready message
LEASE_NAME = "lease.json"
LEASE_SCHEMA = "orbite.supervisor-lease"
PROGRAM_NAME = "orbite_supervisor.py"
# The child's environment is an allowlist: these names, and names with these prefixes. Everything
# else (LD_AUDIT, LD_LIBRARY_PATH, an LD_PRELOAD of the caller's, every RDMAV_*, GCONV_PATH,
# PYTHONPATH, ...) is dropped and listed in env_stripped and the journal.
ENV_ALLOWED = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM", "USER", "LOGNAME",
               "RUST_LOG", "RUST_BACKTRACE")
ENV_ALLOWED_PREFIXES = ("ORBITE_", "LC_")
MAX_REQUEST_BYTES = 1 << 20
MAX_LEASE_S = 7 * 24 * 3600
MAX_LOCK_TIMEOUT_S = 3600
MAX_ARGV = 4096
MAX_PINS = 64
MAX_LOCKS = 64
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}", re.ASCII)
_BOOT_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.ASCII)
_SUN_PATH_MAX = 100  # sockaddr_un.sun_path is 108 bytes; keep a margin


class RequestError(OrbiteError):
    """A control request breaks a rule; code is a stable word, msg names field, value and rule."""

    code = "supervisor.request"

    def __init__(self, code: str, msg: str):
        super().__init__(msg)
        self.code = code
        self.msg = msg


def bad_request(msg: str) -> RequestError:
    """The error of a request (or configuration) that breaks a rule: msg names field, value and rule."""
    return RequestError("supervisor.bad_request", msg)


def signal_number(value) -> int:
    """Accept 9, "9", "KILL" or "SIGKILL"; raise RequestError otherwise."""
    if isinstance(value, bool):
        raise bad_request(f"signal {quote(value)}: must be a signal number or name")
    if isinstance(value, int) or ascii_int(value) is not None:
        num = value if isinstance(value, int) else ascii_int(value)
        valid = {int(s) for s in signal.valid_signals()}
        if num not in valid or num == 0:
            raise bad_request(f"signal {quote(value)}: not a valid signal number")
        return num
    if isinstance(value, str) and len(value) <= 16:
        name = value.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        sig = getattr(signal.Signals, name, None) if name in signal.Signals.__members__ else None
        if sig is not None:
            return int(sig)
    raise bad_request(f"signal {quote(value)}: must be a signal number or name such as SIGKILL")


def signal_name(num: Optional[int]) -> Optional[str]:
    if num is None:
        return None
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"SIG{num}"


def _abs_path(field: str, value, must_exist: Optional[str] = None) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value or len(value) > 4096:
        raise bad_request(f"{field} {quote(value)}: must be an absolute path")
    if must_exist == "dir" and not os.path.isdir(value):
        raise bad_request(f"{field} {quote(value)}: must be an existing directory")
    if must_exist == "parent" and not os.path.isdir(os.path.dirname(value) or "/"):
        raise bad_request(f"{field} {quote(value)}: its directory must exist")
    return value


def env_allowed(key: str) -> bool:
    return key in ENV_ALLOWED or key.startswith(ENV_ALLOWED_PREFIXES)


def split_env(env: Dict[str, str]) -> Tuple[Dict[str, str], List[str]]:
    """(the child's environment, the sorted names dropped from the request's env)."""
    kept = {k: v for k, v in env.items() if env_allowed(k)}
    return kept, sorted(k for k in env if k not in kept)


def validate_launch_request(req: Dict) -> Dict:
    """Normalise and check a launch request; argv is a list (never a shell string)."""
    argv = req.get("argv")
    if not isinstance(argv, list) or not argv or len(argv) > MAX_ARGV or not all(isinstance(a, str) for a in argv):
        raise bad_request(f"argv {quote(argv)}: must be a non-empty list of strings")
    for i, arg in enumerate(argv):
        if "\0" in arg:
            raise bad_request(f"argv[{i}] {quote(arg)}: must not contain NUL")
    exe = argv[0]
    if not exe.startswith("/") or not os.path.isfile(exe) or not os.access(exe, os.X_OK):
        raise bad_request(f"argv[0] {quote(exe)}: must be the absolute path of an executable file")
    exe_sha256 = req.get("exe_sha256")
    if exe_sha256 is not None and not is_sha256(exe_sha256):
        raise bad_request(f"exe_sha256 {quote(exe_sha256)}: must be 64 lowercase hex digits")
    env = req.get("env") or {}
    if not isinstance(env, dict):
        raise bad_request(f"env {quote(env)}: must be a mapping of names to strings")
    for key, val in env.items():
        if not isinstance(key, str) or not _ENV_KEY_RE.fullmatch(key):
            raise bad_request(f"env key {quote(key)}: must match {_ENV_KEY_RE.pattern}")
        if not isinstance(val, str) or "\0" in val:
            raise bad_request(f"env[{key}] {quote(val)}: must be a string without NUL")
    argv_pins = _pin_map(req, "argv_pins")
    exe_pinned = exe_sha256 is not None or 0 in argv_pins
    if exe_sha256 is not None and 0 in argv_pins:
        raise bad_request("argv_pins[0]: argv[0] is already pinned by exe_sha256; give one of them")
    exe_sha256 = exe_sha256 if exe_sha256 is not None else argv_pins.pop(0, None)
    for index in argv_pins:
        if index >= len(argv):
            raise bad_request(f"argv_pins[{index}]: argv has {len(argv)} entries")
        _regular_file(f"argv[{index}] (pinned by argv_pins)", argv[index])
    record_json = req.get("record_json") or []
    if not isinstance(record_json, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i in argv_pins for i in record_json):
        raise bad_request(f"record_json {quote(record_json)}: must be a list of argv indexes that "
                          "argv_pins pins (besides 0)")
    env_pins = _pin_map(req, "env_pins")
    for name in env_pins:
        if name not in env or not env_allowed(name):
            raise bad_request(f"env_pins[{name}]: must name a variable of env that the child keeps "
                              "(the allowlist)")
        _regular_file(f"env[{name}] (pinned by env_pins)", env[name])
    preload = req.get("ld_preload") or []
    if not isinstance(preload, list):
        raise bad_request(f"ld_preload {quote(preload)}: must be a list of {{path, sha256}}")
    libraries = []
    for i, entry in enumerate(preload):
        field = f"ld_preload[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"path", "sha256"}:
            raise bad_request(f"{field} {quote(entry)}: must be {{path, sha256}} "
                              "(only hash-pinned libraries are preloaded)")
        lib = _abs_path(f"{field}.path", entry["path"])
        if any(c in lib for c in " \t\n:"):
            raise bad_request(f"{field}.path {quote(lib)}: must not contain spaces or colons")
        if not is_sha256(entry["sha256"]):
            raise bad_request(f"{field}.sha256 {quote(entry['sha256'])}: must be 64 lowercase hex "
                              "digits")
        _regular_file(f"{field}.path", lib)
        libraries.append({"path": lib, "sha256": entry["sha256"]})
    cwd = req.get("cwd")
    if cwd is not None:
        _abs_path("cwd", cwd, must_exist="dir")
    out = {}
    for field in ("stdout_path", "stderr_path"):
        val = req.get(field)
        if val is not None:
            _abs_path(field, val, must_exist="parent")
        out[field] = val
    return {"argv": list(argv), "exe_sha256": exe_sha256, "exe_pinned": exe_pinned, "argv_pins": argv_pins,
            "record_json": sorted(set(record_json)), "env_pins": env_pins, "env": dict(env), "ld_preload": libraries,
            "cwd": cwd, **out}


def _pin_map(req: Dict, field: str) -> Dict:
    """``argv_pins`` ({argv index: sha256 or null}) or ``env_pins`` ({env name: sha256 or null}).

    A sha256 is checked on the pinned copy; null pins without a check (the hash is journaled). The
    keys of argv_pins arrive as decimal text (JSON object keys) and come back as ints.
    """
    pins = req.get(field)
    if pins is None:
        return {}
    if not isinstance(pins, dict) or len(pins) > MAX_PINS:
        raise bad_request(f"{field} {quote(pins)}: must be a mapping of at most {MAX_PINS} entries "
                          "to a sha256 (64 lowercase hex digits) or null")
    out = {}
    for given, sha in pins.items():
        key = given
        if field == "argv_pins":
            key = ascii_int(given) if isinstance(given, str) and given.isascii() and given.isdigit() else None
            if key is None or given != str(key):
                raise bad_request(f"{field} key {quote(given)}: must be an argv index (decimal text)")
        elif not isinstance(key, str) or not _ENV_KEY_RE.fullmatch(key):
            raise bad_request(f"{field} key {quote(key)}: must match {_ENV_KEY_RE.pattern}")
        if sha is not None and not is_sha256(sha):
            raise bad_request(f"{field}[{key}] {quote(sha)}: must be 64 lowercase hex digits or null")
        out[key] = sha
    return out


def _regular_file(field: str, value) -> str:
    path = _abs_path(field, value)
    try:
        st = os.lstat(path)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        raise bad_request(f"{field} {quote(path)}: must be an existing regular file (not a symlink)")
    return path


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


def number_in_range(value, low: float, high: float, low_open: bool = False) -> bool:
    """Whether ``value`` is a number (not a bool, not NaN) in [low, high], or (low, high] with ``low_open``: the one
    range rule of the client's arguments (after their conversion) and the supervisor's configuration and requests."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return False
    return (low < value if low_open else low <= value) and value <= high


def check_config(cfg) -> Optional[str]:
    """None when the supervisor's start configuration is valid, else the first rule it breaks.

    The client checks its arguments with the same rules before it writes the configuration; the
    supervisor checks the file again, so a configuration nobody checked is never acted upon.
    """
    if not isinstance(cfg, dict):
        return f"configuration {quote(cfg)}: must be a JSON object"
    if not names.is_name(cfg.get("run_id")):
        return f"run_id {quote(cfg.get('run_id'))}: must be {names.NAME_RULE}"
    locks = cfg.get("locks")
    if not isinstance(locks, list) or not 0 < len(locks) <= MAX_LOCKS:
        return f"locks {quote(locks)}: must be a list of 1..{MAX_LOCKS} RNIC names"
    for index, name in enumerate(locks):
        if not names.is_name(name):
            return f"locks[{index}] {quote(name)}: must be {names.NAME_RULE}"
    if len(set(locks)) != len(locks):
        return f"locks {quote(locks)}: must not name an RNIC twice"
    for field in ("run_dir", "lock_dir", "root"):
        value = cfg.get(field)
        if not isinstance(value, str) or not value.startswith("/") or "\0" in value or len(value) > 4096:
            return f"{field} {quote(value)}: must be an absolute path"
    if not number_in_range(cfg.get("lease"), 0, MAX_LEASE_S, low_open=True):
        return f"lease {quote(cfg.get('lease'))}: must be a number of seconds in (0, {MAX_LEASE_S}]"
    if not number_in_range(cfg.get("lock_timeout"), 0, MAX_LOCK_TIMEOUT_S):
        return (f"lock_timeout {quote(cfg.get('lock_timeout'))}: must be a number of seconds in "
                f"[0, {MAX_LOCK_TIMEOUT_S}]")
    hostname = cfg.get("hostname")
    if hostname is not None and not names.is_hostname(hostname):
        return f"hostname {quote(hostname)}: must be {names.HOSTNAME_RULE}"
    boot_id = cfg.get("boot_id")
    if boot_id is not None and not (isinstance(boot_id, str) and _BOOT_ID_RE.fullmatch(boot_id)):
        return f"boot_id {quote(boot_id)}: must be a lower-case UUID"
    controller = cfg.get("controller")
    if controller is not None and not (names.is_name(controller) or names.is_hostname(controller)):
        return f"controller {quote(controller)}: must be {names.NAME_RULE}, or a host name"
    previous = cfg.get("previous_journal")
    if previous is not None and not (isinstance(previous, str) and previous.startswith("/")):
        return f"previous_journal {quote(previous)}: must be an absolute path or null"
    return None
