# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Typed errors of the simulated engine and the exit codes of docs/runner-contract.md section 5."""

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_CASE_ERROR = 2
EXIT_UNAVAILABLE = 3
EXIT_PEER = 4
EXIT_INTERNAL = 70

ERROR_NAMES = (
    "EpochMismatch",
    "BatchBusy",
    "Unquiesced",
    "Unavailable",
    "Timeout",
    "PeerLost",
    "ProtocolError",
    "CheckFailed",
    "InvalidArgument",
    "Internal",
    # A WR of the batch completed in error (installed-inflight-dma: the QP went to ERR part way through its copy).
    "TransferFailed",
)
REMOTE_EFFECTS = ("None", "Unknown", "Applied")


class CaseError(Exception):
    """The case file or the command line is wrong; the message names field, value and rule."""

    exit_code = EXIT_CASE_ERROR


class EngineError(Exception):
    """A typed engine error (docs/receipts.md section 1.7)."""

    exit_code = EXIT_PEER

    def __init__(self, error, operation, message, *, round_no=None, parent=None, remote_effect="None",
                 locally_drained=None, qps_created=0, wrs_posted=0, nbytes=0, expected=False):
        if error not in ERROR_NAMES:
            raise ValueError(f"unknown typed error {error!r}")
        if remote_effect not in REMOTE_EFFECTS:
            raise ValueError(f"unknown remote effect {remote_effect!r}")
        super().__init__(f"{error} in {operation}: {message}")
        self.error = error
        self.operation = operation
        self.message = message
        self.round_no = round_no
        self.parent = parent
        self.remote_effect = remote_effect
        self.locally_drained = locally_drained
        self.qps_created = qps_created
        self.wrs_posted = wrs_posted
        self.nbytes = nbytes
        self.expected = expected
        if error == "Unavailable":
            self.exit_code = EXIT_UNAVAILABLE
        elif error in ("CheckFailed",):
            self.exit_code = EXIT_CHECK_FAILED
        elif error in ("InvalidArgument",):
            self.exit_code = EXIT_CASE_ERROR
        elif error == "Internal":
            self.exit_code = EXIT_INTERNAL

    def as_dict(self):
        return {
            "error": self.error,
            "operation": self.operation,
            "round": self.round_no,
            "parent": self.parent,
            "remote_effect": self.remote_effect,
            "locally_drained": self.locally_drained,
            "qps_created": self.qps_created,
            "wrs_posted": self.wrs_posted,
            "bytes": self.nbytes,
            "expected": self.expected,
            "message": self.message,
        }


def unavailable(operation, message, **kw):
    return EngineError("Unavailable", operation, message, **kw)


def peer_lost(operation, message, **kw):
    return EngineError("PeerLost", operation, message, **kw)


def protocol_error(operation, message, **kw):
    return EngineError("ProtocolError", operation, message, **kw)
