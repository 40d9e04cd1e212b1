# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The engine's rendezvous: setting the connection up and its messages.

A TCP connection carrying length-prefixed JSON control messages (4-byte big-endian length, then
UTF-8 JSON). Every message has ``kind``, the sender's ``epoch`` and the ``peer_epoch`` the sender
believes the receiver has (null before contact). A reader thread counts every message into its
round's traffic and queues the control messages; ``PAYLOAD`` messages (only the
``payload_over_rendezvous`` defect sends them) are counted and dropped. The payload itself never
travels here: the verbs provider moves it between the registered memories of the two processes.
"""

import json
import queue
import socket
import struct
import threading
import time

from .case import format_address
from .errors import EngineError, peer_lost, protocol_error

RV_LEN = struct.Struct("!I")
RV_MAX = 48 << 20

_EOF = object()


def listen(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4)
    return sock


def accept(listener, timeout, what):
    """The next connection on ``listener``, tuned; Timeout (a typed error) after ``timeout`` seconds."""
    listener.settimeout(timeout)
    try:
        sock = listener.accept()[0]
    except socket.timeout:
        raise EngineError("Timeout", "accept", f"no {what} connection within {timeout:g} s") from None
    sock.settimeout(None)
    _tune(sock)
    return sock


def connect(host, port, timeout, what):
    """A tuned connection to ``host:port``, retried until ``timeout`` (the peer may not listen yet)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
            sock.settimeout(None)
            _tune(sock)
            return sock
        except OSError as exc:
            last = exc
            time.sleep(0.05)
    raise EngineError("Timeout", "connect", f"{what} {format_address(host, port)} unreachable "
                      f"within {timeout:g} s ({last})")


def _tune(sock):
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        except OSError:
            pass  # the kernel's limit stays; only throughput suffers


def _shutdown(sock):
    """Wake up a thread blocked reading ``sock``; the socket may already be gone."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def recv_exact_into(sock, view):
    """Fill ``view`` from ``sock``; False on a clean EOF before the first byte, raises on a short read."""
    got = 0
    total = len(view)
    while got < total:
        n = sock.recv_into(view[got:], total - got)
        if n == 0:
            if got == 0:
                return False
            raise ConnectionError(f"connection closed after {got} of {total} bytes")
        got += n
    return True


class Rendezvous:
    def __init__(self, sock, epoch):
        self.sock = sock
        self.epoch = epoch
        self.peer_epoch = None
        self._send_lock = threading.Lock()
        self.control = queue.Queue()
        # Traffic per round (the message's ``round`` field; None = session set-up/teardown), so both
        # peers attribute every message to the same round whatever the timing.
        self._traffic = {}
        self.closed_reason = None
        self._reader = threading.Thread(target=self._read_loop, name="rendezvous-reader", daemon=True)
        self._reader.start()

    def counters(self, round_no=None):
        return dict(self._bucket(round_no))

    def _bucket(self, round_no):
        bucket = self._traffic.get(round_no)
        if bucket is None:
            bucket = {"messages_sent": 0, "messages_received": 0, "bytes_sent": 0, "bytes_received": 0}
            self._traffic[round_no] = bucket
        return bucket

    def send(self, kind, **fields):
        msg = {"kind": kind, "epoch": self.epoch, "peer_epoch": self.peer_epoch}
        msg.update(fields)
        data = json.dumps(msg, separators=(",", ":")).encode()
        frame = RV_LEN.pack(len(data)) + data
        with self._send_lock:
            try:
                self.sock.sendall(frame)
            except OSError as exc:
                raise peer_lost("rendezvous", f"sending {kind}: {exc}") from None
            bucket = self._bucket(fields.get("round"))
            bucket["messages_sent"] += 1
            bucket["bytes_sent"] += len(frame)

    def _take(self, box, timeout, what):
        try:
            msg = box.get(timeout=timeout)
        except queue.Empty:
            raise EngineError("Timeout", "rendezvous", f"no {what} within {timeout:g} s") from None
        if msg is _EOF:
            raise peer_lost("rendezvous", f"peer closed the rendezvous connection ({self.closed_reason})")
        return msg

    def recv(self, timeout, expect):
        """Next control message; its kind must be in ``expect``; epochs are checked."""
        msg = self._take(self.control, timeout, "/".join(expect))
        kind = msg.get("kind")
        if kind == "ERROR":
            raise EngineError(msg.get("error", "ProtocolError"), msg.get("operation", "rendezvous"),
                              "peer reported: " + str(msg.get("message")))
        if kind not in expect:
            raise protocol_error("rendezvous", f"expected {'/'.join(expect)}, got {kind!r}")
        self.check_epochs(msg)
        return msg

    def check_epochs(self, msg):
        if msg.get("peer_epoch") is not None and msg["peer_epoch"] != self.epoch:
            raise EngineError("EpochMismatch", "open_segment",
                              f"peer addressed epoch {msg['peer_epoch']}, this engine is epoch {self.epoch}")
        if self.peer_epoch is not None and msg.get("epoch") != self.peer_epoch:
            raise EngineError("EpochMismatch", "open_segment",
                              f"peer epoch changed from {self.peer_epoch} to {msg.get('epoch')}")

    def _read_loop(self):
        head = bytearray(RV_LEN.size)
        try:
            while True:
                if not recv_exact_into(self.sock, memoryview(head)):
                    self.closed_reason = "EOF"
                    break
                (length,) = RV_LEN.unpack(head)
                if length > RV_MAX:
                    self.closed_reason = f"message of {length} bytes exceeds {RV_MAX}"
                    break
                body = bytearray(length)
                if not recv_exact_into(self.sock, memoryview(body)):
                    self.closed_reason = "EOF inside a message"
                    break
                msg = json.loads(body.decode())
                bucket = self._bucket(msg.get("round"))
                bucket["messages_received"] += 1
                bucket["bytes_received"] += RV_LEN.size + length
                if msg.get("kind") != "PAYLOAD":  # counted above; nobody reads payload from here
                    self.control.put(msg)
        except (OSError, ValueError) as exc:
            self.closed_reason = str(exc)
        self.control.put(_EOF)

    def close(self):
        _shutdown(self.sock)
        self.sock.close()
        self._reader.join(timeout=5)
