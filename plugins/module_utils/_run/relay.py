# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The control relay of installed-interruption (docs/interruption.md), on the source node.

It sits on the rendezvous between the requester and the source: every requester connection gets
one connection of its own to the source's service address, and the relay forwards the rendezvous
frames (4-byte big-endian length, then a JSON object with ``kind`` and, per round, ``round``) both
ways, except READY of a round after ``hold_after_round`` (the source sent it once it had bound
its memory window and posted its completion receive): that grant is held, never forwarded. Payload
never passes here; the verbs provider moves it. The relay journals every frame it forwarded or held
(``relay.jsonl``, a second witness for the verifier beside both ledgers).

The program is this one file (stdlib only, Python >= 3.9): the module ``control_relay`` copies it
into a private state directory (0700; files 0600) and runs it detached. It ends on ``stop`` over
its control socket, on SIGTERM, or by itself when its lease runs out (a controller that died never
leaves it running). ``leak_grant`` is a defect switch for the red checks: the grant is forwarded.
"""

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

SCHEMA = "orbite.relay-journal"
READY_SCHEMA = "orbite.relay-ready"
JOURNAL_NAME = "relay.jsonl"
READY_NAME = "relay-ready.json"
CONTROL_NAME = "control.sock"
CONFIG_FIELDS = ("listen", "upstream", "state_dir", "hold_after_round", "lease_s", "defects", "run_id", "watch")
# The one mode the relay serves (docs/interruption.md), and its own defect switches (red checks).
MODE = "installed-interruption"
DEFECTS = ("leak_grant",)
HELD_KIND = "ROUND_READY"
FRAME_MAX = 48 << 20
LEN = struct.Struct("!I")
UPSTREAM_CONNECT_S = 5.0
MAX_LEASE_S = 86400.0


SUN_PATH_MAX = 107


class _SocketAddress:
    """An address for bind/connect of ``path``; a long path goes through /proc/self/fd/<dirfd>/name
    (as the supervisor's socket does: this file stands alone on the node)."""

    def __init__(self, path):
        self.path = path
        self.dfd = -1

    def __enter__(self):
        if len(self.path.encode()) <= SUN_PATH_MAX:
            return self.path
        self.dfd = os.open(os.path.dirname(self.path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return f"/proc/self/fd/{self.dfd}/{os.path.basename(self.path)}"

    def __exit__(self, *_exc):
        if self.dfd >= 0:
            os.close(self.dfd)


class RelayError(Exception):
    """A relay configuration or start failure; the message names field, value and rule."""


def parse_address(field, text):
    """'host:port' or '[v6]:port' -> (host, port); RelayError naming the field otherwise."""
    if not isinstance(text, str) or ":" not in text:
        raise RelayError(f"{field} = {text!r}: must be 'host:port' (IPv6 as '[addr]:port')")
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
        if ":" in host:
            sep = ""
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise RelayError(f"{field} = {text!r}: must be 'host:port' with a port 0..65535")
    return host, int(port)


def format_address(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_config(cfg):
    """The validated configuration (a dict), or RelayError naming the first wrong field."""
    if not isinstance(cfg, dict):
        raise RelayError(f"config = {cfg!r}: must be an object")
    unknown = sorted(set(cfg) - set(CONFIG_FIELDS))
    if unknown:
        raise RelayError(f"{unknown[0]} = {cfg[unknown[0]]!r}: is not a relay option ({', '.join(CONFIG_FIELDS)})")
    parse_address("listen", cfg.get("listen"))
    port = parse_address("upstream", cfg.get("upstream"))[1]
    if port == 0:
        raise RelayError(f"upstream = {cfg.get('upstream')!r}: must name the source's real port (not 0)")
    state_dir = cfg.get("state_dir")
    if not isinstance(state_dir, str) or not os.path.isabs(state_dir):
        raise RelayError(f"state_dir = {state_dir!r}: must be an absolute path")
    hold = cfg.get("hold_after_round")
    if isinstance(hold, bool) or not isinstance(hold, int) or hold < 1:
        raise RelayError(f"hold_after_round = {hold!r}: must be an integer >= 1 (the rounds before the held one)")
    lease = cfg.get("lease_s")
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0 < lease <= MAX_LEASE_S:
        raise RelayError(f"lease_s = {lease!r}: must be a number of seconds in (0, {MAX_LEASE_S:g}]")
    defects = cfg.get("defects", [])
    if not isinstance(defects, list) or any(d not in DEFECTS for d in defects):
        raise RelayError(f"defects = {defects!r}: must be a list of {', '.join(DEFECTS)}")
    run_id = cfg.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        raise RelayError(f"run_id = {run_id!r}: must be a non-empty string")
    watch = cfg.get("watch")
    if watch is not None and (not isinstance(watch, dict) or sorted(watch) != ["pid", "start_time"] or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in watch.values())):
        raise RelayError(f"watch = {watch!r}: must be null or {{pid, start_time}} of a live process (the supervisor)")
    return dict(cfg, defects=list(defects), watch=watch)


def start_time_of(pid):
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22); None if it is gone
    or a zombie (dead, only not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    if len(fields) <= 19 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


# ----------------------------------------------------------------- the controller's side (module, tests)

PROGRAM_NAME = "relay.py"
CONFIG_NAME = "relay-config.json"
STOP_WAIT_S = 10.0


def _private_dir(path):
    if not isinstance(path, str) or not os.path.isabs(path):
        raise RelayError(f"state_dir = {path!r}: must be an absolute path")
    # This file also runs alone as the relay program (its own source): the collection's helper is imported
    # here, on the module's side only.
    from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (  # noqa: PLC0415 (see above)
        NotPrivateDir,
        private_dir,
    )

    try:
        return private_dir(path, "state_dir")
    except NotPrivateDir as exc:
        raise RelayError(str(exc)) from None


def read_ready(state_dir):
    """The relay's ready record, or None when it never started here."""
    try:
        with open(os.path.join(state_dir, READY_NAME), encoding="utf-8") as handle:
            ready = json.load(handle)
    except (OSError, ValueError):
        return None
    return ready if isinstance(ready, dict) and ready.get("schema") == READY_SCHEMA else None


def running(ready):
    """True while the process the ready record names (pid and start time) is alive."""
    if not ready or ready.get("start_time") is None:
        return False
    return start_time_of(ready.get("pid")) == ready["start_time"]


def request(state_dir, op, timeout=5.0):
    """One control request (status, stop) over the relay's private socket; its JSON answer."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        with _SocketAddress(os.path.join(state_dir, CONTROL_NAME)) as address:
            sock.connect(address)
        sock.sendall(json.dumps({"op": op}).encode())
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    return json.loads(data.decode())


def _own_source():
    """This file's text, also from inside the zip an Ansible module runs from."""
    loader = globals().get("__loader__")
    source = loader.get_source(__name__) if loader is not None and hasattr(loader, "get_source") else None
    if source is None:
        with open(__file__, encoding="utf-8") as handle:
            source = handle.read()
    return source


def start_relay(cfg, python=None, timeout=30.0):
    """Validate ``cfg``, install the program and its configuration privately, start the relay detached;
    its ready record (pid, start time, the address it listens on). RelayError naming the problem."""
    cfg = check_config(cfg)
    state_dir = _private_dir(cfg["state_dir"])
    if running(read_ready(state_dir)):
        raise RelayError(f"state_dir = {state_dir!r}: a relay already runs there (stop it first)")
    for name in (READY_NAME, JOURNAL_NAME):
        if os.path.lexists(os.path.join(state_dir, name)):
            os.unlink(os.path.join(state_dir, name))
    program = _own_source().encode()
    prog_path, cfg_path = os.path.join(state_dir, PROGRAM_NAME), os.path.join(state_dir, CONFIG_NAME)
    for path, data in ((prog_path, program), (cfg_path, json.dumps(cfg).encode())):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(path, 0o600)
    try:
        done = subprocess.run([python or sys.executable, prog_path, "--config", cfg_path], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise RelayError(f"the relay did not listen within {timeout:g} s") from None
    if done.returncode != 0:
        raise RelayError(done.stderr.decode(errors="replace").strip() or f"the relay exited {done.returncode}")
    ready = read_ready(state_dir)
    if not running(ready):
        raise RelayError(f"the relay wrote no ready record in {state_dir} or is gone")
    return ready


def wait_held(state_dir, held, timeout, poll_s=0.05):
    """Wait until the relay holds at least ``held`` grants; its status. RelayError if it is gone or
    ``timeout`` passes (the controller waits on this, never on a timer alone)."""
    deadline = time.monotonic() + timeout
    ready = read_ready(state_dir)
    # The grant is mostly held already, or comes within milliseconds: ask again after 1 ms, doubling up to poll_s
    # (a status round trip costs ~0.17 ms of CPU, client and relay).
    from ansible_collections.orbite.qualification.plugins.module_utils._common.waits import (  # noqa: PLC0415
        backoff,  # the module's side only: this file also runs alone as the relay program
    )

    sleeps = backoff(0.001, poll_s)
    while True:
        if not running(ready):
            raise RelayError(f"no relay runs in {state_dir}")
        status = request(state_dir, "status")
        if status.get("held", 0) >= held:
            return status
        if time.monotonic() > deadline:
            raise RelayError(f"the relay held {status.get('held', 0)} grant(s), {held} expected within {timeout:g} s "
                             f"(forwarded {status.get('forwarded')}, leaked {status.get('leaked')})")
        time.sleep(next(sleeps))


def _await_gone(ready, timeout, poll_s=0.02):
    """Wait up to ``timeout`` until the relay of ``ready`` is gone (stopped or killed). It ends within a few
    milliseconds: probe again after 0.5 ms, doubling up to ``poll_s`` (a probe reads /proc/<pid>/stat, ~20 us of
    CPU)."""
    from ansible_collections.orbite.qualification.plugins.module_utils._common.waits import (  # noqa: PLC0415
        backoff,  # the module's side only: this file also runs alone as the relay program
    )

    deadline = time.monotonic() + timeout
    sleeps = backoff(0.0005, poll_s)
    while running(ready) and time.monotonic() < deadline:
        time.sleep(next(sleeps))


def stop_relay(state_dir, timeout=STOP_WAIT_S, check_mode=False):
    """Stop the relay of ``state_dir`` and make sure it is gone: stop over the control socket, then SIGKILL
    (pid and start time checked) if it did not end in ``timeout``. {"stopped", "killed", "was_running",
    "pid"}; nothing to do when none runs. In check mode nothing is stopped: the result says whether one runs
    (the control_relay module's and fetch_receipts' check mode)."""
    ready = read_ready(state_dir)
    result = {"was_running": running(ready), "stopped": False, "killed": False,
              "pid": ready.get("pid") if ready else None}
    if check_mode:
        return dict(result, stopped=not result["was_running"])
    if not result["was_running"]:
        return result
    try:
        request(state_dir, "stop", timeout=min(timeout, 5.0))
    except (OSError, ValueError):
        pass  # a hung or half-gone relay: the kill below ends it
    _await_gone(ready, timeout)
    if running(ready):
        try:
            os.kill(ready["pid"], signal.SIGKILL)
            result["killed"] = True
        except ProcessLookupError:
            pass
        _await_gone(ready, 5.0)
    result["stopped"] = not running(ready)
    if not result["stopped"]:
        raise RelayError(f"the relay pid {ready['pid']} in {state_dir} did not end")
    return result


def read_journal(state_dir):
    """The relay's journal records (for the controller's fetch and the tests)."""
    with open(os.path.join(state_dir, JOURNAL_NAME), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


class Relay:
    def __init__(self, cfg):
        self.cfg = cfg
        self.state_dir = cfg["state_dir"]
        self.hold_after = cfg["hold_after_round"]
        self.leak = "leak_grant" in cfg["defects"]
        self.deadline = time.monotonic() + float(cfg["lease_s"])
        self.watch = cfg.get("watch")
        self.lock = threading.Lock()
        self.seq = 0
        self.counts = {"connections": 0, "forwarded": 0, "held": 0, "leaked": 0}
        self.pairs = []
        self.stopping = threading.Event()
        self.journal_fd = os.open(os.path.join(self.state_dir, JOURNAL_NAME),
                                  os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        host, port = parse_address("listen", cfg["listen"])
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, port))
        self.listener.listen(8)
        self.address = format_address(host, self.listener.getsockname()[1])
        control = os.path.join(self.state_dir, CONTROL_NAME)
        if os.path.lexists(control):
            os.unlink(control)
        self.control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with _SocketAddress(control) as address:
            self.control.bind(address)  # umask 077: the socket is the owner's only
        self.control.listen(4)

    def log(self, ev, **fields):
        with self.lock:
            self.seq += 1
            record = {"seq": self.seq, "t": time.time(), "ev": ev}
            record.update(fields)
            os.write(self.journal_fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())

    def status(self):
        with self.lock:
            return dict(self.counts, pid=os.getpid(), address=self.address)

    def serve(self):
        self.log("start", schema=SCHEMA, version=1, run_id=self.cfg["run_id"], pid=os.getpid(),
                 start_time=start_time_of(os.getpid()), listen=self.address, upstream=self.cfg["upstream"],
                 hold_after_round=self.hold_after, held_kind=HELD_KIND, defects=self.cfg["defects"],
                 watch=self.watch)
        reason = "stop"
        while not self.stopping.is_set():
            left = self.deadline - time.monotonic()
            if left <= 0:
                reason = "lease_expired"
                break
            if self.watch and start_time_of(self.watch["pid"]) != self.watch["start_time"]:
                reason = "watched_process_gone"  # the node's supervisor ended (its lease, a stop): so does the relay
                break
            ready = select.select([self.listener, self.control], [], [], min(left, 0.5))[0]
            if self.control in ready:
                self._control()
            if self.listener in ready:
                self._accept()
        self._shutdown(reason)

    def _control(self):
        conn = self.control.accept()[0]
        conn.settimeout(5)
        try:
            request = json.loads(conn.recv(4096).decode() or "{}")
            op = request.get("op") if isinstance(request, dict) else None
            if op == "stop":
                self.stopping.set()
                conn.sendall(json.dumps(dict(self.status(), stopping=True)).encode())
            elif op == "status":
                conn.sendall(json.dumps(self.status()).encode())
            else:
                conn.sendall(json.dumps({"error": f"op {op!r}: must be status or stop"}).encode())
        except (OSError, ValueError):
            pass  # a broken control client changes nothing
        finally:
            conn.close()

    def _accept(self):
        down = self.listener.accept()[0]
        with self.lock:
            self.counts["connections"] += 1
            conn_no = self.counts["connections"]
        host, port = parse_address("upstream", self.cfg["upstream"])
        try:
            up = socket.create_connection((host, port), timeout=UPSTREAM_CONNECT_S)
            up.settimeout(None)
        except OSError as exc:
            self.log("upstream_refused", conn=conn_no, error=str(exc))
            down.close()
            return
        for sock in (up, down):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.log("connection", conn=conn_no)
        pair = {"conn": conn_no, "socks": (up, down), "threads": []}
        for src, dst, direction in ((down, up, "to_source"), (up, down, "to_requester")):
            thread = threading.Thread(target=self._pump, args=(pair, src, dst, direction), daemon=True)
            pair["threads"].append(thread)
            thread.start()
        self.pairs.append(pair)

    def _pump(self, pair, src, dst, direction):
        ended = "eof"
        try:
            while True:
                head = _recv_exact(src, LEN.size)
                if head is None:
                    break
                (length,) = LEN.unpack(head)
                if length > FRAME_MAX:
                    ended = f"frame of {length} bytes"
                    break
                body = _recv_exact(src, length)
                if body is None:
                    ended = "eof inside a frame"
                    break
                try:
                    msg = json.loads(body.decode())
                except ValueError:
                    msg = {}
                msg = msg if isinstance(msg, dict) else {}
                kind, round_no = msg.get("kind"), msg.get("round")
                hold = (direction == "to_requester" and kind == HELD_KIND and isinstance(round_no, int)
                        and round_no > self.hold_after)
                action = "held" if hold and not self.leak else "forwarded"
                fields = {"conn": pair["conn"], "dir": direction, "kind": kind, "round": round_no,
                          "epoch": msg.get("epoch"), "peer_epoch": msg.get("peer_epoch"), "bytes": LEN.size + length,
                          "action": action}
                if hold and self.leak:
                    fields["leaked"] = True
                if kind == "HELLO":
                    fields["generation"] = msg.get("generation")
                self.log("frame", **fields)
                with self.lock:
                    self.counts[action] += 1
                    if hold and self.leak:
                        self.counts["leaked"] += 1
                if action == "forwarded":
                    dst.sendall(head + body)
        except OSError as exc:
            ended = str(exc)
        self.log("closed", conn=pair["conn"], dir=direction, reason=ended)
        for sock in pair["socks"]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _shutdown(self, reason):
        for pair in self.pairs:
            for sock in pair["socks"]:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for pair in self.pairs:
            for thread in pair["threads"]:
                thread.join(timeout=5)
            for sock in pair["socks"]:
                sock.close()
        self.listener.close()
        self.control.close()
        try:
            os.unlink(os.path.join(self.state_dir, CONTROL_NAME))
        except OSError:
            pass
        self.log("stop", reason=reason, counts=self.status())
        os.close(self.journal_fd)


def _recv_exact(sock, count):
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _write_private_json(path, obj):
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(obj, handle)
    os.replace(tmp, path)


def main(argv=None):
    """``relay.py --config CFG``: validate, detach, serve. The parent exits 0 once the relay listens
    (its ready file written), or 2 with the reason on stderr."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "--config":
        sys.stderr.write("orbite-relay: usage: relay.py --config CONFIG\n")
        return 2
    os.umask(0o077)
    try:
        with open(argv[1], encoding="utf-8") as handle:
            cfg = check_config(json.load(handle))
    except (OSError, ValueError, RelayError) as exc:
        sys.stderr.write(f"orbite-relay: config {argv[1]}: {exc}\n")
        return 2
    read_fd, write_fd = os.pipe()
    if os.fork():
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            answer = pipe.read().decode(errors="replace")
        if answer.startswith("ok"):
            return 0
        sys.stderr.write(f"orbite-relay: {answer or 'the relay died before it listened'}\n")
        return 2
    os.close(read_fd)
    os.setsid()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        relay = Relay(cfg)
    except OSError as exc:
        os.write(write_fd, f"listen {cfg['listen']}: {exc}".encode())
        os._exit(2)
    signal.signal(signal.SIGTERM, lambda *_args: relay.stopping.set())
    _write_private_json(os.path.join(cfg["state_dir"], READY_NAME), {
        "schema": READY_SCHEMA, "version": 1, "pid": os.getpid(), "start_time": start_time_of(os.getpid()),
        "address": relay.address, "upstream": cfg["upstream"]})
    os.write(write_fd, b"ok")
    os.close(write_fd)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    relay.serve()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
