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
import re
from array import array
from dataclasses import dataclass, field
from itertools import accumulate, compress, repeat
from operator import eq, is_not, itemgetter, methodcaller

from ansible_collections.orbite.qualification.plugins.module_utils._verify.reading import (
    MAX_DOCUMENT_BYTES,
    MAX_LOG_BYTES,
    ReceiptProblem,
    no_gc,
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


def _root(path, root):
    # Without a run directory, a receipt must at least stay inside its own directory.
    return root if root is not None else os.path.dirname(os.path.abspath(path))


def load_json(path, schema=None, root=None, budget=None) -> Receipt:
    return _load_json(path, schema, root, budget)[0]


def _load_json(path, schema, root, budget):
    """(Receipt, the bytes it was parsed from, or None)."""
    data, problem = read_bounded(path, _root(path, root), MAX_DOCUMENT_BYTES, budget)
    if problem:
        return Receipt(path, problem=problem), None
    value, problem = parse_json(path, data, budget)
    if problem:
        return Receipt(path, problem=problem), None
    if not isinstance(value, dict):
        return Receipt(path, problem=ReceiptProblem("receipt.malformed", path, "is not a JSON object")), None
    if schema and (value.get("schema"), value.get("version")) != schema:
        found = f"{value.get('schema')!r} v{value.get('version')!r}"
        return Receipt(
            path, problem=ReceiptProblem("receipt.schema", path, f"schema {found}, expected {schema[0]!r} v{schema[1]}")
        ), None
    return Receipt(path, data=value), data


# --- shape checking: only the fields the rules read, so that a rule never meets a surprise ------

INT, STR, BOOL, LIST, DICT, NUM = "int", "str", "bool", "list", "dict", "number"
_TYPES = {INT: int, STR: str, BOOL: bool, LIST: list, DICT: dict, NUM: (int, float)}

_COUNTERS = {
    "public": {"bytes": INT, "per_rail": DICT},
    "native": {"bytes": INT, "wrs": INT, "cqes": INT, "per_rail": DICT},
}
_PARENT = {"parent": INT, "rail": INT, "requested_bytes": INT, "completed_bytes": INT, "status": STR}
# The WR list of a round is columnar (docs/receipts.md 1.6): {column: [value of each WR]}, every
# documented column present, none other, all of one length. Type of each column's values.
WR_COLUMNS = {
    "wr_id": INT,
    "parent": INT,
    "slice": INT,
    "rail": INT,
    "lane": INT,
    "qpn": INT,
    "context": STR,
    "cq": STR,
    "opcode": STR,
    "bytes": INT,
    "local_offset": INT,
    "remote_offset": INT,
    "status": STR,
    "posted_seq": INT,
    "completed_seq": INT,  # or null: no completion reaped
}
_NULLABLE_COLUMNS = {"completed_seq"}
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
    "wrs": DICT,  # columns: checked by wr_columns_problem
    "qp_usage": [_QP_USAGE],
    "qps_created": INT,
    "qps_reused": INT,
    "counters": _COUNTERS,
    "drain": {"drained": BOOL, "debt_wrs": INT, "debt_bytes": INT, "debt_grants": INT},
    "rendezvous": {"bytes_sent": INT, "bytes_received": INT},
    "provider": {"read_bytes_landed": INT, "read_bytes_served": INT, "write_bytes_sent": INT,
                 "write_bytes_landed": INT},
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


_COLUMN_TYPES = {name: ({int, type(None)} if name in _NULLABLE_COLUMNS else {_EXACT[kind]})
                 for name, kind in WR_COLUMNS.items()}


def _plain_column(column, kind, bools):
    """True when every value of ``column`` is of ``kind`` (INT: an int >= 0 below 2**64; STR: a str), found in
    C: an unsigned array refuses what is not an int, negatives and larger ones, a join what is not a str.
    An array takes bools too: with ``bools`` (the document may hold one here), their absence is checked
    a value at a time. False asks for the exact check (which names the first offender, or passes)."""
    try:
        if kind == STR:
            "".join(column)
            return True
        array("Q", column)
    except (TypeError, OverflowError):
        return False
    return not bools or bool not in set(map(type, column))


def wr_columns_problem(columns, where, bools=True):
    """Why a round's ``wrs`` is not the documented columns, or None: exactly the columns of
    ``WR_COLUMNS``, each a list, all of one length, each value of its column's type (an int >= 0,
    no bool; ``completed_seq`` also null). Checked a whole column at a time (in C). ``bools``: False
    when the document is known to hold no bool in its WR columns (``_bools_outside``)."""
    if not isinstance(columns, dict):
        return f"{where}: expected the WR columns (an object), found {type(columns).__name__}"
    unknown = sorted(set(columns) - WR_COLUMNS.keys())
    missing = [name for name in WR_COLUMNS if name not in columns]
    if unknown or missing:
        return (f"{where}: columns {missing} missing, {unknown} unknown (a round's WRs are the columns "
                f"{list(WR_COLUMNS)}, docs/receipts.md 1.6)")
    lists = [name for name in WR_COLUMNS if not isinstance(columns[name], list)]
    if lists:
        return f"{where}.{lists[0]}: expected a list (one value per WR), found {type(columns[lists[0]]).__name__}"
    lengths = {name: len(columns[name]) for name in WR_COLUMNS}
    if len(set(lengths.values())) > 1:
        return f"{where}: columns of different lengths {lengths} (one value per WR in every column)"
    for name, allowed in _COLUMN_TYPES.items():
        column = columns[name]
        if _plain_column(column, WR_COLUMNS[name], bools):
            continue
        numbers = column if name not in _NULLABLE_COLUMNS else compress(column, map(is_not, column, repeat(None)))
        if not set(map(type, column)) <= allowed or (WR_COLUMNS[name] == INT and min(numbers, default=0) < 0):
            index, value = next((i, v) for i, v in enumerate(column)
                                if type(v) not in allowed or (isinstance(v, int) and v < 0))
            want = WR_COLUMNS[name] + (" or null" if name in _NULLABLE_COLUMNS else "") + (
                " >= 0" if WR_COLUMNS[name] == INT else "")
            return f"{where}.{name}[{index}]: {value!r} is not {want} (WR {index} of the round)"
    return None


def _bools_outside(ledger, text):
    """Whether a bool may sit in the ledger's WR columns: the JSON ``text`` spells each bool of the
    document as a literal ``true``/``false`` (counted in C, strings included, so never fewer than the
    bools); when the values outside the rounds' WR columns (walked, small) hold as many, none is left
    for the columns, and their type checks need not look for one."""
    tokens = text.count(b"true") + text.count(b"false")
    stack = [value for key, value in ledger.items() if key != "rounds"]
    stack += [value for rnd in ledger["rounds"] for key, value in rnd.items() if key != "wrs"]
    found = 0
    while stack:
        value = stack.pop()
        if value is True or value is False:
            found += 1
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return tokens > found


def load_ledger(path, root=None, budget=None) -> Receipt:
    receipt, text = _load_json(path, LEDGER_SCHEMA, root, budget)
    if not receipt.ok:
        return receipt
    problems = shape_errors(receipt.data, LEDGER_SHAPE)
    if not problems:
        bools = _bools_outside(receipt.data, text)
        problems = [why for index, rnd in enumerate(receipt.data["rounds"])
                    for why in [wr_columns_problem(rnd["wrs"], f"$.rounds[{index}].wrs", bools)] if why][:1]
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


def _json_lines(path, root, budget):
    """(records as (line number, dict), None) or (None, ReceiptProblem)."""
    data, problem = read_bounded(path, _root(path, root), MAX_LOG_BYTES, budget)
    if problem:
        return None, problem
    return parse_json_lines(path, data, budget)


# --- observer log (docs/receipts.md section 2): JSON lines or binary records, read into columns --

WR, CQE, WITHHELD, DATA, TEXT = 1, 2, 3, 4, 5
RECORD_BYTES = 80
_TEXT_CHUNK = RECORD_BYTES - 4
OPCODES = {"RDMA_READ": 1, "RDMA_WRITE": 2}
OPCODE_NAMES = {code: name for name, code in OPCODES.items()}
NOT_HASHED = 4 | 8  # data flags: the lkey named no MR / the range is outside its MR
_KIND_NAMES = {"wr": WR, "cqe": CQE, "withheld": WITHHELD, "data": DATA}
# One mask table per kind: kinds.translate(table) is 1 where the record is of that kind (C speed).
_MASK = {kind: bytes(1 if byte == kind else 0 for byte in range(256)) for kind in (WR, CQE, WITHHELD, DATA, TEXT)}
_HEX = re.compile(r"[0-9a-f]{64}", re.ASCII)
# Text events other than summary and dev (binary only), and the JSON-lines events, by field types.
_OBS_LINE = {
    "wr": {"ctx": STR, "dev": STR, "cq": STR, "qpn": INT, "wr_id": INT, "opcode": STR, "bytes": INT},
    "cqe": {"ctx": STR, "cq": STR, "qpn": INT, "wr_id": INT, "status": INT},
    "withheld": {"ctx": STR, "cq": STR, "qpn": INT, "wr_id": INT},
    "data": {"qpn": INT, "wr_id": INT, "sge": INT, "off": INT, "len": INT, "mr_len": INT, "flags": INT},
    "destroy": {"kind": STR, "errno": INT, "injected": BOOL, "retry": BOOL},
    "not_armed": {"reason": STR},  # uverbs_fault, inflight_fault: why it refused to arm (docs/observers.md)
    # inflight_fault (docs/inflight_dma.md): the interrupted WR, its error completion, its QP's destroy.
    "inflight_fault": {"ctx": STR, "cq": STR, "qpn": INT, "wr_id": INT, "opcode": STR, "bytes": INT,
                       "stall_bytes": INT, "stalled": INT, "landed_local": INT, "modify_qp": INT, "state_before": INT,
                       "state_after": INT, "port_state_before": INT, "port_state_after": INT, "post_ret": INT},
    "inflight_cqe": {"ctx": STR, "cq": STR, "qpn": INT, "wr_id": INT, "status": INT, "status_name": STR,
                     "byte_len": INT},
    "inflight_destroy": {"qpn": INT, "ret": INT, "after_cqe": INT},
    "context_close": {"dev": STR},  # uverbs_fault: an observed context was closed (docs/cleanup_failure.md)
    "summary": {"accepted_wrs": INT, "joined": INT, "unjoined": INT, "max_inflight_per_qp": DICT},
}
_OBS_FAST = {kind: _fast_check(shape) for kind, shape in _OBS_LINE.items()}
_VALUES_PER_RECORD = 9  # what one binary record takes of the JSON-values budget (its columns)


def pointer_text(value):
    """A context or CQ as the JSON format writes it (glibc %p): binary logs hold the pointer itself."""
    if isinstance(value, int):
        return hex(value) if value else "(nil)"
    return value


# Per kind, its columns and their JSON field names (docs/receipts.md 2.1).
_FIELDS = {
    WR: (("qpn", "qpn"), ("wr_id", "wr_id"), ("ctx", "ctx"), ("cq", "cq"), ("bytes", "bytes"), ("opcode", "opcode"),
         ("dev", "dev")),
    CQE: (("qpn", "qpn"), ("wr_id", "wr_id"), ("ctx", "ctx"), ("cq", "cq"), ("status", "status")),
    WITHHELD: (("qpn", "qpn"), ("wr_id", "wr_id"), ("ctx", "ctx"), ("cq", "cq")),
    DATA: (("qpn", "qpn"), ("wr_id", "wr_id"), ("sge", "sge"), ("off", "off"), ("len", "len"), ("mr_len", "mr_len"),
           ("flags", "flags")),
}
_INTS = {"qpn", "wr_id", "bytes", "status", "sge", "off", "len", "mr_len", "flags"}
# Binary record: where each column of a kind is (docs/receipts.md 2.2): (cast, word index).
_SLOTS = {"type": ("B", 0), "a": ("B", 1), "b": ("H", 1), "qpn": ("I", 1), "wr_id": ("Q", 1), "c": ("Q", 2),
          "d": ("Q", 3), "e": ("Q", 4)}
_BINARY = {
    WR: {"qpn": "qpn", "wr_id": "wr_id", "ctx": "c", "cq": "d", "bytes": "e", "opcode": "a", "dev": "b"},
    CQE: {"qpn": "qpn", "wr_id": "wr_id", "ctx": "c", "cq": "d", "status": "a"},
    WITHHELD: {"qpn": "qpn", "wr_id": "wr_id", "ctx": "c", "cq": "d"},
    DATA: {"qpn": "qpn", "wr_id": "wr_id", "sge": "b", "off": "c", "len": "e", "mr_len": "d", "flags": "a"},
}
_FLOW = bytes(1 if byte in (WR, CQE, WITHHELD) else 0 for byte in range(256))
_STEP = [1 if kind == WR else -1 if kind in (CQE, WITHHELD) else 0 for kind in range(256)]  # in-flight change


def _only(value):
    """A translate table that maps ``value`` to 1 and every other byte to 0 (made when asked, not 256 at import)."""
    table = bytearray(256)
    table[value] = 1
    return bytes(table)


@dataclass
class ObserverLog:
    """One observer log: ``kinds`` (bytes, one entry per record in log order: WR, CQE, WITHHELD, DATA,
    TEXT; the header left out, and in the JSON format the summary), ``header``, ``summary``, ``texts``
    (text events other than summary and dev, by the position of their first record), ``devices``, and
    columns read a kind at a time: ``table(kind)`` (``wrs()``, ``data()``), ``flow()`` (WRs and
    completions in log order) and ``digests()``. Built by the loader from either format; the binary
    format keeps its records and takes a column with one strided view (docs/receipts.md 2.2).
    """

    path: str
    header: dict | None = None
    summary: dict | None = None
    problem: ReceiptProblem | None = None
    kinds: bytes = b""
    devices: list = field(default_factory=list)  # device name by index
    texts: dict = field(default_factory=dict)  # position -> text event (other than summary and dev)
    _body: bytes | None = None  # the binary records
    _slots: dict = field(default_factory=dict)  # binary: slot name -> column over every record
    _cache: dict = field(default_factory=dict)  # JSON: filled by the loader; binary: on first use

    @property
    def ok(self) -> bool:
        return self.problem is None

    def count(self, kind):
        return self.kinds.count(kind)

    def text_events(self, ev):
        """The text events named ``ev`` (``{"ev": ev, ...}``) in log order."""
        return [event for _pos, event in sorted(self.texts.items()) if event.get("ev") == ev]

    def select(self, kind, column):
        """The values of ``column`` (a list or bytes over every record) at the records of ``kind``."""
        return list(compress(column, self.kinds.translate(_MASK[kind])))

    def positions(self, kind):
        return self.select(kind, range(len(self.kinds)))

    def table(self, kind):
        """{column: values} of the records of ``kind`` in log order (ctx and cq: the pointer, binary, or its
        text, JSON; opcode: 1 READ, 2 WRITE; dev: index into ``devices``), and their positions."""
        key = ("table", kind)
        if key not in self._cache:
            self._cache[key] = {name: self.column(kind, name) for name in (*_BINARY[kind], "position")}
        return self._cache[key]

    def column(self, kind, name):
        """One column of ``table(kind)``, taken alone (a rule reading one column of a kind takes one pass)."""
        if ("table", kind) in self._cache:
            return self._cache[("table", kind)][name]
        key = ("column", kind, name)
        if key not in self._cache:
            self._cache[key] = self.positions(kind) if name == "position" else self.select(
                kind, self._slots[_BINARY[kind][name]])
        return self._cache[key]

    def wrs(self):
        """Columns of the accepted payload WRs: ctx, cq, qpn, wr_id, dev (name), opcode (name), bytes."""
        if "wrs" not in self._cache:
            table = {name: self.column(WR, name) for name in _BINARY[WR]}
            table["dev"] = list(map(self.devices.__getitem__, table["dev"]))
            table["opcode"] = list(map(OPCODE_NAMES.__getitem__, table["opcode"]))
            self._cache["wrs"] = table
        return self._cache["wrs"]

    def data(self):
        """Columns of the data events: qpn, wr_id, sge, off, len, mr_len, flags, position (``digests()``: theirs)."""
        return self.table(DATA)

    def flow(self):
        """The WRs and completions in log order: kind (bytes), qpn, wr_id, ctx, cq."""
        if "flow" not in self._cache:
            mask = self.kinds.translate(_FLOW)
            self._cache["flow"] = {"kind": bytes(compress(self.kinds, mask)),
                                   **{name: list(compress(self._slots[slot], mask)) for name, slot in (
                                       ("qpn", "qpn"), ("wr_id", "wr_id"), ("ctx", "c"), ("cq", "d"))}}
        return self._cache["flow"]

    def qp_masks(self):
        """{qpn: mask (bytes, 1 at that QP's events) over ``flow()``}, made once (the replay and the in-flight
        plot both split the flow by QP); a log of one QP gets None (every event is its). Each QPN is
        numbered once into a byte per event, its mask a translate of those bytes (in C)."""
        if "qp_masks" not in self._cache:
            qpns = self.flow()["qpn"]
            distinct = dict.fromkeys(qpns)
            if len(distinct) == 1:
                masks = dict.fromkeys(distinct)
            elif len(distinct) <= 256:
                number = {qpn: index for index, qpn in enumerate(distinct)}
                numbered = bytes(map(number.__getitem__, qpns))
                masks = {qpn: numbered.translate(_only(index)) for qpn, index in number.items()}
            else:  # more QPs than a byte numbers: a pass a QP
                masks = {qpn: bytes(map(eq, qpns, repeat(qpn))) for qpn in distinct}
            self._cache["qp_masks"] = masks
        return self._cache["qp_masks"]

    def inflight(self):
        """{qpn: (positions in ``flow()`` of that QP's events, WRs in flight after each)}: the count a running
        sum of +1 a WR and -1 a completion (itertools.accumulate, in C); read by the replay and the plot."""
        if "inflight" not in self._cache:
            kinds, out = self.flow()["kind"], {}
            for qpn, mask in self.qp_masks().items():
                mine = kinds if mask is None else bytes(compress(kinds, mask))
                positions = range(len(kinds)) if mask is None else compress(range(len(kinds)), mask)
                out[qpn] = (list(positions), list(accumulate(map(_STEP.__getitem__, mine))))
            self._cache["inflight"] = out
        return self._cache["inflight"]

    def digests(self):
        """The SHA-256 (32 bytes, or None where not hashed) of each data event, in the order of ``data()``."""
        if "digests" not in self._cache:
            data, body = self.data(), self._body
            self._cache["digests"] = [
                None if flag & NOT_HASHED else body[p * RECORD_BYTES + 40:p * RECORD_BYTES + 72]
                for p, flag in zip(data["position"], data["flags"])]
        return self._cache["digests"]

    @property
    def events(self):
        """Every event as the JSON format writes it (header, dev and summary left out), in log order.
        For tests and reports: the rules read the columns. None of a log that could not be read."""
        if self.problem is not None:
            return []
        if "events" not in self._cache:
            rows = {kind: iter(zip(*self.table(kind).values())) for kind in _FIELDS}
            digests = iter(self.digests())
            devices = self.devices
            out = []
            for pos, kind in enumerate(self.kinds):
                if kind == TEXT:
                    if pos in self.texts:
                        out.append(self.texts[pos])
                    continue
                row = dict(zip(self.table(kind), next(rows[kind])))
                del row["position"]
                if kind == WR:
                    row.update(dev=devices[row["dev"]], opcode=OPCODE_NAMES[row["opcode"]])
                if kind == DATA:
                    digest = next(digests)
                    row["sha256"] = digest.hex() if digest else None
                else:
                    row.update(ctx=pointer_text(row["ctx"]), cq=pointer_text(row["cq"]))
                name = {WR: "wr", CQE: "cqe", WITHHELD: "withheld", DATA: "data"}[kind]
                out.append({"ev": name, **row})
            self._cache["events"] = out
        return self._cache["events"]


def _header_problem(header):
    """Why the header (a dict) is not one of an observer log we read, or None."""
    version = header.get("version")
    if header.get("schema") != OBSERVER_SCHEMA[0] or version not in (1, 2) or isinstance(version, bool):
        return (f"header schema {header.get('schema')!r} v{version!r}, expected {OBSERVER_SCHEMA[0]!r} v1 or v2",
                "receipt.schema")
    if not isinstance(header.get("pid"), int) or not isinstance(header.get("tool"), str):
        return "header: pid must be an integer and tool a string", "receipt.shape"
    if version == 1:
        return None
    fmt, size, guard = header.get("format"), header.get("record_bytes"), header.get("guard_bytes")
    if (fmt, size) not in (("json", 0), ("binary", RECORD_BYTES)) or isinstance(size, bool):
        return (f"header: format {fmt!r} with record_bytes {size!r}, expected 'json' with 0 or 'binary' with "
                f"{RECORD_BYTES}", "receipt.shape")
    if header.get("digest") not in ("sha256", None) or not isinstance(guard, int) or isinstance(guard, bool) \
            or guard < 0:
        return (f"header: digest {header.get('digest')!r} (sha256 or null) and guard_bytes {guard!r} (an integer "
                ">= 0)", "receipt.shape")
    return None


def _text_event(log, where, record):
    """Check a destroy, not_armed, context_close or summary event found at ``where`` ("line 3", "records 4-5"); a
    ReceiptProblem or None."""
    kind = record.get("ev")
    if kind not in ("destroy", "not_armed", "context_close", "summary", "inflight_fault", "inflight_cqe",
                    "inflight_destroy"):
        return ReceiptProblem("receipt.shape", log.path, f"{where}: unknown event {kind!r}")
    fast = _OBS_FAST[kind]  # None for a one-field shape (not_armed): the full walk
    if fast is None or not fast(record):
        errors = shape_errors(record, _OBS_LINE[kind], where=where)
        if errors:
            return ReceiptProblem("receipt.shape", log.path, "; ".join(errors))
    return None


def _is_plain_int(value):
    """An int that is not a bool (JSON true/false decode to bools, which are ints)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _exact_ints(record, keys):
    """True when every key holds an int >= 0 (no bool, no None)."""
    return all(_is_plain_int(record[key]) and record[key] >= 0 for key in keys)


_EV_CODES = {"wr": WR, "cqe": CQE, "withheld": WITHHELD, "data": DATA, "destroy": TEXT, "not_armed": TEXT,
             "context_close": TEXT, "summary": TEXT + 1}


def _from_json_lines(log, records):
    """Fill the columns from JSON-lines records (after the header); False with log.problem set on bad input.

    A kind at a time (each record's fields taken in one visit, checks over whole columns); a log that
    fails any check is read again line by line, which names the first bad line."""
    try:
        if _json_columns(log, [record for _number, record in records]):
            return True
    except (TypeError, ValueError, KeyError):  # a missing field, an unhashable value: the line walk names it
        pass
    log.summary, log.texts, log._cache = None, {}, {}
    if not _json_lines_one_by_one(log, records):
        return False
    # The walk found nothing the column checks did not like either: the columns after all.
    log._cache = {}
    return _json_columns(log, [record for _number, record in records])


def _json_columns(log, dicts):
    """The columns of JSON-lines events if every check passes at once, else False (nothing reported)."""
    kinds = bytes(map(_EV_CODES.get, map(methodcaller("get", "ev"), dicts), repeat(0)))
    summaries = kinds.count(TEXT + 1)
    if 0 in kinds or summaries > 1 or (summaries and kinds[-1] != TEXT + 1):
        return False
    if summaries:
        if _text_event(log, "summary", dicts[-1]):
            return False
        log.summary, dicts, kinds = dicts[-1], dicts[:-1], kinds[:-1]
    log.kinds = kinds
    for pos in log.positions(TEXT):
        if _text_event(log, "", dicts[pos]):
            return False
        log.texts[pos] = dicts[pos]
    for kind, fields in _FIELDS.items():
        records = log.select(kind, dicts)
        names = [json_name for _column, json_name in fields]
        rows = list(map(itemgetter(*names), records)) if records else []
        table = {column: list(map(itemgetter(i), rows)) for i, (column, _json) in enumerate(fields)}
        for column, values in table.items():
            types = set(map(type, values))
            if column in _INTS:
                if types - {int} or (values and min(values) < 0):
                    return False
            elif types - {str}:
                return False
        table["position"] = log.positions(kind)
        log._cache[("table", kind)] = table
    wr = log._cache[("table", WR)]
    if not set(wr["opcode"]) <= OPCODES.keys() or max(log._cache[("table", DATA)]["flags"], default=0) > 15:
        return False
    wr["opcode"] = list(map(OPCODES.__getitem__, wr["opcode"]))
    log.devices = list(dict.fromkeys(wr["dev"]))
    wr["dev"] = list(map({name: i for i, name in enumerate(log.devices)}.__getitem__, wr["dev"]))
    data = log._cache[("table", DATA)]
    digests = []
    for record, flags in zip(log.select(DATA, dicts), data["flags"]):
        digest = record.get("sha256")
        if (digest is None) != bool(flags & NOT_HASHED) or (
                digest is not None and not (isinstance(digest, str) and _HEX.fullmatch(digest))):
            return False
        digests.append(None if digest is None else bytes.fromhex(digest))
    log._cache["digests"] = digests
    rows = list(map(itemgetter("qpn", "wr_id", "ctx", "cq"), compress(dicts, kinds.translate(_FLOW))))
    log._cache["flow"] = {"kind": bytes(compress(kinds, kinds.translate(_FLOW))),
                          **{name: list(map(itemgetter(i), rows))
                             for i, name in enumerate(("qpn", "wr_id", "ctx", "cq"))}}
    return True


def _json_lines_one_by_one(log, records):
    """The line walk: True, or the first bad line's problem (False)."""
    for number, record in records:
        if log.summary is not None:
            log.problem = problem_at("receipt.shape", log.path, number, "event after the summary line")
            return False
        ev = record.get("ev")
        kind = _KIND_NAMES.get(ev) if isinstance(ev, str) else None
        if kind is None:
            log.problem = _text_event(log, f"line {number}", record)
            if log.problem:
                return False
            if ev == "summary":
                log.summary = record
            continue
        why = None
        if not _OBS_FAST[ev](record):
            why = "; ".join(shape_errors(record, _OBS_LINE[ev], where=f"line {number}")) or f"line {number}: a " \
                "field is null"
        elif kind == WR and (record["opcode"] not in OPCODES or not _exact_ints(record, ("qpn", "wr_id", "bytes"))):
            why = f"line {number}: opcode must be RDMA_READ or RDMA_WRITE, qpn/wr_id/bytes integers >= 0"
        elif kind == DATA:
            digest, flags = record.get("sha256"), record["flags"]
            if not _exact_ints(record, ("qpn", "wr_id", "sge", "off", "len", "mr_len", "flags")) or flags > 15:
                why = f"line {number}: qpn/wr_id/sge/off/len/mr_len must be integers >= 0, flags in 0..15"
            elif (digest is None) != bool(flags & NOT_HASHED) or (
                    digest is not None and not (isinstance(digest, str) and _HEX.fullmatch(digest))):
                why = (f"line {number}: sha256 must be 64 lowercase hex digits, or null exactly when flags say the "
                       "range was not hashed (4, 8)")
        elif kind in (CQE, WITHHELD) and not (_exact_ints(record, ("qpn", "wr_id")) and (
                kind == WITHHELD or _exact_ints(record, ("status",)))):
            why = f"line {number}: qpn/wr_id/status must be integers >= 0"
        if why:
            log.problem = ReceiptProblem("receipt.shape", log.path, why)
            return False
    return True


def _binary_problem(log, message, code="receipt.shape"):
    log.problem = ReceiptProblem(code, log.path, message)
    return False


def _from_binary(log, body, budget):
    """Fill the columns from binary records (strided views: no loop per record but for text events)."""
    size = RECORD_BYTES
    if len(body) % size:
        return _binary_problem(log, f"{len(body)} bytes of records after the header: not whole {size}-byte records "
                                    "(cut short)", "receipt.truncated")
    count = len(body) // size
    if budget is not None:
        if count * _VALUES_PER_RECORD > budget.values:
            return _binary_problem(log, f"holds {count} records, over what is left of the case's budget of "
                                        f"{budget.values // _VALUES_PER_RECORD}", "receipt.oversize")
        budget.values -= count * _VALUES_PER_RECORD
    kinds = body[0::size]
    unknown = kinds.translate(None, bytes((WR, CQE, WITHHELD, DATA, TEXT)))
    if unknown:
        at = kinds.index(unknown[:1])
        return _binary_problem(log, f"record {at + 1}: unknown record type {unknown[0]}")
    view = memoryview(body)
    log.kinds, log._body = kinds, body
    # One column a slot, over every record; a slot holds one field per kind (docs/receipts.md 2.2).
    log._slots = {name: body[index::size] if cast == "B" else view.cast(cast)[index::size // view.cast(cast).itemsize]
                  .tolist() for name, (cast, index) in _SLOTS.items() if name != "type"}
    if not _binary_texts(log, body, budget):
        return False
    checks = ((WR, "opcode", set(OPCODE_NAMES), "opcode"),
              (WR, "dev", set(range(len(log.devices))), "device index"),
              (DATA, "flags", set(range(16)), "flags"))
    for kind, column, allowed, name in checks:
        values = log.column(kind, column)  # kept: the rules read the same column
        if not set(values) <= allowed:
            bad = next(v for v in values if v not in allowed)
            log._cache.clear()
            return _binary_problem(log, f"a record of type {kind} has {name} {bad} (allowed: {sorted(allowed)})")
    return True


def _binary_texts(log, body, budget):
    """Assemble the text events (JSON split over consecutive text records): devices, summary, others."""
    size, kinds, text, first, last = RECORD_BYTES, log.kinds, b"", None, -1
    devices = {}
    for pos in (m.start() for m in re.finditer(b"\x05", kinds)):
        if first is not None and pos != last + 1:
            return _binary_problem(log, f"record {last + 1}: a text event continues into a record of another type")
        length = log._slots["b"][pos]  # a text record's byte count
        if length > _TEXT_CHUNK:
            return _binary_problem(log, f"record {pos + 1}: text length {length} over {_TEXT_CHUNK}")
        start = pos * size + 4
        text += body[start:start + length]
        first = pos if first is None else first
        last = pos
        if log._slots["a"][pos]:  # continued in the next record
            continue
        record, problem = parse_json(log.path, text, budget)
        where = f"records {first + 1}-{pos + 1}"
        if problem:
            problem.message = f"{where}: {problem.message}"
            log.problem = problem
            return False
        if not isinstance(record, dict):
            return _binary_problem(log, f"{where}: a text event is not a JSON object")
        if log.summary is not None:
            return _binary_problem(log, f"{where}: event after the summary")
        if record.get("ev") == "dev":
            index, name = record.get("index"), record.get("dev")
            if not _is_plain_int(index) or index != len(devices) or not isinstance(name, str) or name in devices:
                return _binary_problem(log, f"{where}: dev event {record!r}: indexes count from 0, names once each")
            devices[name] = index
        else:
            problem = _text_event(log, where, record)
            if problem:
                log.problem = problem
                return False
            if record["ev"] == "summary":
                log.summary = record
            else:
                log.texts[first] = record
        text, first = b"", None
    if first is not None:
        return _binary_problem(log, f"record {last + 1}: the last text event is cut short", "receipt.truncated")
    if log.summary is not None and last != len(kinds) - 1:
        return _binary_problem(log, f"record {last + 2}: event after the summary")
    log.devices = list(devices)
    return True


# An observer log's name says its format (docs/receipts.md 2): observer-<tool>.bin or .jsonl.
LOG_SUFFIXES = {".bin": "binary", ".jsonl": "json"}


def observer_log_path(stem):
    """(path, None) of the observer log ``<stem>.bin`` or ``<stem>.jsonl``, whichever exists; else (a
    path, ReceiptProblem): receipt.missing when neither exists, receipt.format when both do (which one
    the observer wrote is not said)."""
    found = [stem + suffix for suffix in LOG_SUFFIXES if os.path.lexists(stem + suffix)]
    if len(found) == 1:
        return found[0], None
    names = " and ".join(os.path.basename(stem) + suffix for suffix in LOG_SUFFIXES)
    if not found:
        return stem + ".bin", ReceiptProblem("receipt.missing", stem + ".bin", f"receipt is missing (neither {names})")
    return found[0], ReceiptProblem("receipt.format", found[0], f"both {names} are present: one observer log per "
                                    "tool, its name saying its format")


def load_observer_log(path, root=None, budget=None, killed=False) -> ObserverLog:
    """The observer log at ``path``: binary records or JSON lines as its header says, which must be what its
    name says (.bin, .jsonl: receipt.format otherwise). ``killed``: the profile has its process SIGKILLed
    (one write per event: every record up to the kill is there, only the summary is not)."""
    log = ObserverLog(path)
    data, log.problem = read_bounded(path, _root(path, root), MAX_LOG_BYTES, budget)
    if log.problem:
        return log
    end = data.find(b"\n")
    header, problem = parse_json(path, data[:end] if end >= 0 else data)
    binary = problem is None and isinstance(header, dict) and header.get("format") == "binary"
    named = LOG_SUFFIXES.get(os.path.splitext(path)[1])
    if named is not None and problem is None and isinstance(header, dict) and ("binary" if binary else "json") != named:
        log.problem = problem_at("receipt.format", path, 1, f"header format {header.get('format', 'json')!r}, but the "
                                 f"file name says {named!r} (observer-<tool>.bin: binary, .jsonl: JSON lines)")
        return log
    if binary:
        records = None
    else:  # every line measured (size, nesting, values) before anything is parsed
        with no_gc():
            records, log.problem = parse_json_lines(path, data, budget)
        if log.problem:
            return log
        header = records[0][1] if records else None
    not_header = ("the first line is not the JSON header object", "receipt.malformed")
    why = _header_problem(header) if isinstance(header, dict) else not_header
    if why:
        log.problem = problem_at(why[1], path, 1, why[0])
        return log
    log.header = header
    with no_gc():
        filled = _from_binary(log, data[end + 1:], budget) if binary else _from_json_lines(log, records[1:])
    if not filled:
        return log
    if log.summary is None and not killed:
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
