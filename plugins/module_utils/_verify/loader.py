# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Load the receipts of one qualification case for the verifier, never raising on bad input.

The verifier shares no code with any runner: this reader is written from docs/receipts.md alone.
Every file is read through reading.py (a regular file inside the run directory, size- and
depth-capped). A receipt that is missing, unsafe, oversize, too deeply nested, not JSON, of the
wrong schema, truncated (a runner killed before its final write, an observer log without its
summary line) or of the wrong shape becomes a ``ReceiptProblem`` with a stable code; the rules
that need that receipt are then skipped, so that exactly one coded FAIL names the broken receipt.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from operator import itemgetter

from ansible_collections.orbite.qualification.plugins.module_utils._verify.reading import (
    MAX_DOCUMENT_BYTES,
    MAX_LOG_BYTES,
    ReceiptProblem,
    parse_json,
    parse_json_lines,
    problem_at,
    read_bounded,
)

__all__ = ("ObserverLog", "Receipt", "ReceiptProblem", "load_journal", "load_json", "load_ledger",
           "load_observer_log")

LEDGER_SCHEMA = ("orbite.runner-ledger", 1)
OBSERVER_SCHEMA = ("orbite.observer-log", 1)
CASE_SCHEMA = ("orbite.case", 1)
RUN_SCHEMA = ("orbite.run", 1)
INVENTORY_SCHEMA = ("orbite.rdma-inventory", 1)


@dataclass
class Receipt:
    path: str
    data: object = None
    problem: ReceiptProblem | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


@dataclass
class ObserverLog:
    path: str
    header: dict | None = None
    events: list = field(default_factory=list)
    summary: dict | None = None
    problem: ReceiptProblem | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def _root(path, root):
    # Without a run directory, a receipt must at least stay inside its own directory.
    return root if root is not None else os.path.dirname(os.path.abspath(path))


def load_json(path, schema=None, root=None, budget=None) -> Receipt:
    data, problem = read_bounded(path, _root(path, root), MAX_DOCUMENT_BYTES, budget)
    if problem:
        return Receipt(path, problem=problem)
    value, problem = parse_json(path, data, budget)
    if problem:
        return Receipt(path, problem=problem)
    if not isinstance(value, dict):
        return Receipt(path, problem=ReceiptProblem("receipt.malformed", path, "is not a JSON object"))
    if schema and (value.get("schema"), value.get("version")) != schema:
        found = f"{value.get('schema')!r} v{value.get('version')!r}"
        return Receipt(
            path, problem=ReceiptProblem("receipt.schema", path, f"schema {found}, expected {schema[0]!r} v{schema[1]}")
        )
    return Receipt(path, data=value)


# --- shape checking: only the fields the rules read, so that a rule never meets a surprise ------

INT, STR, BOOL, LIST, DICT, NUM = "int", "str", "bool", "list", "dict", "number"
_TYPES = {INT: int, STR: str, BOOL: bool, LIST: list, DICT: dict, NUM: (int, float)}

_COUNTERS = {
    "public": {"bytes": INT, "per_rail": DICT},
    "native": {"bytes": INT, "wrs": INT, "cqes": INT, "per_rail": DICT},
}
_PARENT = {"parent": INT, "rail": INT, "requested_bytes": INT, "completed_bytes": INT, "status": STR}
_WR = {
    "wr_id": INT,
    "parent": INT,
    "slice": INT,
    "rail": INT,
    "lane": INT,
    "qpn": INT,
    "bytes": INT,
    "context": STR,
    "cq": STR,
    "opcode": STR,
    "status": STR,
}
_QP_USAGE = {
    "qpn": INT,
    "rail": INT,
    "lane": INT,
    "created": BOOL,
    "reused": BOOL,
    "wrs_posted": INT,
    "max_inflight_wrs": INT,
    "max_outstanding_parents": INT,
}
_ROUND = {
    "round": INT,
    "input_seed": INT,
    "parents": [_PARENT],
    "wrs": [_WR],
    "qp_usage": [_QP_USAGE],
    "qps_created": INT,
    "qps_reused": INT,
    "counters": _COUNTERS,
    "drain": {"drained": BOOL, "debt_wrs": INT, "debt_bytes": INT, "debt_grants": INT},
    "rendezvous": {"bytes_sent": INT, "bytes_received": INT},
    "data_channel": {"payload_bytes_sent": INT, "payload_bytes_received": INT},
    "errors": LIST,
}
_QP = {"qpn": INT, "context": STR, "rail": INT, "lane": INT, "operation": STR, "max_send_wr": INT, "created_round": INT}
_MR = {"kind": STR, "live": BOOL}
_CONTEXT = {"context": STR, "rail": INT, "mrs": [_MR]}
_RAIL = {"rail": INT, "device": STR, "enabled": BOOL}
LEDGER_SHAPE = {
    "status": STR,
    "role": STR,
    "generation": INT,
    "mode": STR,
    "operation": STR,
    "progress": STR,
    "epoch": INT,
    "registration_id": STR,
    "profile": DICT,
    "rails": [_RAIL],
    "contexts": [_CONTEXT],
    "qps": [_QP],
    "rounds": [_ROUND],
    "errors": LIST,
}


_EXACT = {INT: int, STR: str, BOOL: bool, LIST: list, DICT: dict}


def _fast_check(shape):
    """For a flat object shape, a check that passes the common case in C: fields present, each of
    its exact type (JSON gives no subclasses). None for other shapes; a False asks for the full walk."""
    if not (isinstance(shape, dict) and len(shape) > 1 and all(isinstance(v, str) and v in _EXACT
                                                               for v in shape.values())):
        return None
    fields, expected = itemgetter(*shape), tuple(_EXACT[v] for v in shape.values())

    def check(value):
        try:
            return tuple(map(type, fields(value))) == expected
        except (KeyError, TypeError):
            return False

    return check


_FAST = {}


def shape_errors(value, shape, where="$", limit=5):
    """Paths where ``value`` lacks a field of ``shape`` or has the wrong type (first ``limit``)."""
    key = id(shape)
    if key not in _FAST:
        _FAST[key] = (shape, _fast_check(shape))  # the shape itself kept alive, so its id stays its own
    fast = _FAST[key][1]
    if fast is not None and fast(value):
        return []
    found = []
    _walk(value, shape, where, found, limit)
    return found


def _walk(value, shape, where, found, limit):
    if len(found) >= limit:
        return
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            found.append(f"{where}: expected an object, found {type(value).__name__}")
            return
        for key, sub in shape.items():
            if key not in value:
                found.append(f"{where}.{key}: missing")
            elif value[key] is not None or not isinstance(sub, str):
                _walk(value[key], sub, f"{where}.{key}", found, limit)
    elif isinstance(shape, list):
        if not isinstance(value, list):
            found.append(f"{where}: expected a list, found {type(value).__name__}")
            return
        fast = _fast_check(shape[0])
        for index, item in enumerate(value):
            if fast is None or not fast(item):  # a long list of flat objects (a ledger's WRs) checked in C
                _walk(item, shape[0], f"{where}[{index}]", found, limit)
                if len(found) >= limit:
                    return
    else:
        expected = _TYPES[shape]
        wrong_bool = isinstance(value, bool) and shape in (INT, NUM)
        if wrong_bool or not isinstance(value, expected):
            found.append(f"{where}: expected {shape}, found {type(value).__name__}")


def load_ledger(path, root=None, budget=None) -> Receipt:
    receipt = load_json(path, LEDGER_SCHEMA, root, budget)
    if not receipt.ok:
        return receipt
    problems = shape_errors(receipt.data, LEDGER_SHAPE)
    if problems:
        receipt.problem = ReceiptProblem("receipt.shape", path, "; ".join(problems))
        receipt.data = None
        return receipt
    if receipt.data["status"] == "running":
        receipt.problem = ReceiptProblem(
            "receipt.truncated",
            path,
            f"ledger is a checkpoint (status 'running', {len(receipt.data['rounds'])} round(s)): "
            "the runner never wrote its final ledger",
        )
    return receipt


_OBS_LINE = {
    "wr": {"ctx": STR, "cq": STR, "qpn": INT, "wr_id": INT, "opcode": STR, "bytes": INT, "dev": STR},
    "cqe": {"ctx": STR, "cq": STR, "qpn": INT, "wr_id": INT, "status": INT},
    "withheld": {"ctx": STR, "cq": STR, "qpn": INT, "wr_id": INT},
    "destroy": {"kind": STR, "errno": INT, "injected": BOOL, "retry": BOOL},
    "summary": {"accepted_wrs": INT, "joined": INT, "unjoined": INT, "max_inflight_per_qp": DICT},
}


def _json_lines(path, root, budget):
    """(records as (line number, dict), None) or (None, ReceiptProblem)."""
    data, problem = read_bounded(path, _root(path, root), MAX_LOG_BYTES, budget)
    if problem:
        return None, problem
    return parse_json_lines(path, data, budget)


_OBS_FAST = {kind: _fast_check(shape) for kind, shape in _OBS_LINE.items()}


def load_observer_log(path, root=None, budget=None) -> ObserverLog:
    log = ObserverLog(path)
    records, log.problem = _json_lines(path, root, budget)
    if log.problem:
        return log
    events = log.events
    for number, record in records:
        if log.header is None:
            if (record.get("schema"), record.get("version")) != OBSERVER_SCHEMA:
                log.problem = problem_at(
                    "receipt.schema",
                    path,
                    number,
                    f"header schema {record.get('schema')!r} v{record.get('version')!r}, "
                    f"expected {OBSERVER_SCHEMA[0]!r} v{OBSERVER_SCHEMA[1]}",
                )
                return log
            log.header = record
            continue
        kind = record.get("ev")
        fast = _OBS_FAST.get(kind) if isinstance(kind, str) else None
        if fast is None:
            log.problem = problem_at("receipt.shape", path, number, f"unknown event {kind!r}")
            return log
        if not fast(record):  # the common case passes in C; the walk names what is wrong (or allows a None)
            errors = shape_errors(record, _OBS_LINE[kind], where=f"line {number}")
            if errors:
                log.problem = ReceiptProblem("receipt.shape", path, "; ".join(errors))
                return log
        if log.summary is not None:
            log.problem = problem_at("receipt.shape", path, number, "event after the summary line")
            return log
        if kind == "summary":
            log.summary = record
        else:
            events.append(record)
    if log.header is None:
        log.problem = ReceiptProblem("receipt.malformed", path, "observer log has no header line")
    elif log.summary is None:
        log.problem = ReceiptProblem(
            "receipt.truncated", path, "observer log has no summary line (the process never closed it)"
        )
    return log


def load_journal(path, root=None, budget=None) -> Receipt:
    """A supervisor journal: JSON lines; returned as {"header": first line, "events": [...]}."""
    records, problem = _json_lines(path, root, budget)
    if problem:
        return Receipt(path, problem=problem)
    if not records:
        return Receipt(path, problem=ReceiptProblem("receipt.malformed", path, "journal is empty"))
    events = [record for _line, record in records]
    return Receipt(path, data={"header": events[0], "events": events[1:]})
