"""The observer log reader (loader.py, both formats) and the accounting replay over its columns.

Logs are written by tests/helpers/observer_log.py (struct, independent of the reader). Every
malformed binary log is one coded receipt.* problem, never a traceback; the replay's whole-column
fast path gives exactly the figures of the event-by-event walk.
"""

import json
import random
import struct

import pytest
from helpers import observer_log

from ansible_collections.orbite.qualification.plugins.module_utils._verify import loader, reading
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules.accounting import (
    Replay,
    _most_distinct,
)

HEADER = {"schema": "orbite.observer-log", "version": 2, "tool": "accounting", "pid": 7, "format": "binary",
          "record_bytes": 80, "digest": "sha256", "guard_bytes": 4096}
SUMMARY = {"ev": "summary", "accepted_wrs": 1, "joined": 1, "unjoined": 0, "max_inflight_per_qp": {"9": 1},
           "max_outstanding_parents_per_qp": {}}
KEY = {"ctx": "0x5000", "cq": "0x6000", "qpn": 9, "wr_id": 1}
WR_EVENT = dict(ev="wr", dev="mlx5_0", opcode="RDMA_READ", bytes=4096, **KEY)
CQE_EVENT = dict(ev="cqe", status=0, status_name="IBV_WC_SUCCESS", **KEY)
DATA_EVENT = {"ev": "data", "qpn": 9, "wr_id": 1, "sge": 0, "off": 4096, "len": 4096, "mr_len": 1 << 20,
              "sha256": "ab" * 32, "flags": 0}
DESTROY = {"ev": "destroy", "kind": "mr", "handle": "5:3", "errno": 5, "injected": True, "retry": False}


def _load(tmp_path, data, budget=None):
    """Load ``data`` from a file named as its header says (.bin for binary records, else .jsonl)."""
    binary = data.split(b"\n", 1)[0].replace(b" ", b"").find(b'"format":"binary"') >= 0
    path = tmp_path / observer_log.file_name("accounting", "binary" if binary else "json")
    path.write_bytes(data)
    return loader.load_observer_log(str(path), root=str(tmp_path), budget=budget)


def _events(*events):
    return [HEADER, *events, SUMMARY]


@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_both_formats_read_the_same(tmp_path, fmt):
    log = _load(tmp_path, observer_log.encode(_events(WR_EVENT, CQE_EVENT, DATA_EVENT, DESTROY), fmt))
    assert log.ok, log.problem
    assert log.header["format"] == fmt and log.summary == SUMMARY
    assert log.events == [WR_EVENT, {k: v for k, v in CQE_EVENT.items() if k != "status_name"}, DATA_EVENT, DESTROY]
    assert log.wrs()["dev"] == ["mlx5_0"] and log.wrs()["opcode"] == ["RDMA_READ"]
    assert log.digests() == [bytes.fromhex("ab" * 32)]


def test_a_version_1_log_of_json_lines_still_reads(tmp_path):
    header = {"schema": "orbite.observer-log", "version": 1, "tool": "accounting", "pid": 7}
    log = _load(tmp_path, observer_log.encode([header, WR_EVENT, CQE_EVENT, SUMMARY], "json"))
    assert log.ok and log.count(loader.WR) == 1 and log.digests() == []


def _binary(*events):
    return observer_log.encode(_events(*events), "binary")


def _record(kind, a=0, b=0, qpn=9, wr_id=1, c=0, d=0, e=0, digest=b""):
    return observer_log.RECORD.pack(kind, a, b, qpn, wr_id, c, d, e, digest)


def _text(obj, cut=None):
    records = observer_log.text_records(obj)
    return records if cut is None else records[:cut]


HEAD = json.dumps(HEADER).encode() + b"\n"
DEV = _text({"ev": "dev", "index": 0, "dev": "mlx5_0"})
BAD_BINARY = {
    "cut in a record": (_binary(WR_EVENT)[:-7], "receipt.truncated", "not whole 80-byte records"),
    "unknown record type": (HEAD + _record(9) + _text(SUMMARY), "receipt.shape", "unknown record type 9"),
    "text length over a record": (HEAD + struct.pack("<BBH", 5, 0, 77) + b"{" * 76 + _text(SUMMARY),
                                  "receipt.shape", "text length 77"),
    "text continued into a completion": (HEAD + DEV + _text(SUMMARY, 80) + _record(2) + _text(SUMMARY),
                                         "receipt.shape", "continues into a record of another type"),
    "text cut at the end": (HEAD + DEV + _text(SUMMARY, 80), "receipt.truncated", "cut short"),
    "event after the summary": (HEAD + DEV + _text(SUMMARY) + _record(2), "receipt.shape", "after the summary"),
    "WR of an unknown device": (HEAD + _record(1, a=1, b=3) + _text(SUMMARY), "receipt.shape", "device index 3"),
    "WR of an unknown opcode": (HEAD + DEV + _record(1, a=7) + _text(SUMMARY), "receipt.shape", "opcode 7"),
    "data flags out of range": (HEAD + _record(4, a=16) + _text(SUMMARY), "receipt.shape", "flags 16"),
    "device indexes out of order": (HEAD + _text({"ev": "dev", "index": 1, "dev": "x"}) + _text(SUMMARY),
                                    "receipt.shape", "indexes count from 0"),
    "text that is not JSON": (HEAD + struct.pack("<BBH", 5, 0, 12) + b'{"ev": nope}'.ljust(76, b"\0")
                              + _text(SUMMARY), "receipt.malformed", "records 1-1"),
    "unknown text event": (HEAD + _text({"ev": "party"}) + _text(SUMMARY), "receipt.shape", "unknown event 'party'"),
    "no summary": (HEAD + DEV + _record(1, a=1), "receipt.truncated", "no summary line"),
    "record size not 80": (json.dumps(dict(HEADER, record_bytes=64)).encode() + b"\n", "receipt.shape",
                           "record_bytes 64"),
    "header of another schema": (json.dumps(dict(HEADER, version=3)).encode() + b"\n", "receipt.schema", "v3"),
}


def _text_chunks(text):
    chunk = observer_log.TEXT_CHUNK
    pieces = [text[i:i + chunk] for i in range(0, len(text), chunk)]
    return [struct.pack("<BBH", 5, int(i + 1 < len(pieces)), len(p)) + p.ljust(chunk, b"\0")
            for i, p in enumerate(pieces)]


@pytest.mark.parametrize("name", sorted(BAD_BINARY))
def test_malformed_binary_logs_are_coded_problems(tmp_path, name):
    data, code, words = BAD_BINARY[name]
    log = _load(tmp_path, data)
    assert log.problem is not None and log.problem.code == code, (name, log.problem)
    assert words in log.problem.message, log.problem.message


def test_a_text_event_nested_too_deep_is_refused_unparsed(tmp_path):
    deep = b'{"ev":"destroy","x":' + b"[" * 40 + b"]" * 40 + b"}"
    log = _load(tmp_path, HEAD + b"".join(_text_chunks(deep)) + _text(SUMMARY))
    assert log.problem.code == "receipt.nesting"


def test_a_binary_log_over_the_case_budget_is_oversize(tmp_path):
    data = _binary(*[dict(WR_EVENT, wr_id=i) for i in range(1000)])
    log = _load(tmp_path, data, budget=reading.Budget(values=100))
    assert log.problem.code == "receipt.oversize"


BAD_JSON_LINES = {
    "a digest that is not hex": dict(DATA_EVENT, sha256="zz" * 32),
    "a missing digest on a hashed range": dict(DATA_EVENT, sha256=None),
    "a digest on a range not hashed": dict(DATA_EVENT, flags=4),
    "a boolean QPN": dict(WR_EVENT, qpn=True),
    "a null WR ID": dict(CQE_EVENT, wr_id=None),
    "a negative length": dict(DATA_EVENT, len=-1),
    "flags out of range": dict(DATA_EVENT, flags=16, sha256=None),
    "an unknown opcode": dict(WR_EVENT, opcode="SEND"),
}


@pytest.mark.parametrize("name", sorted(BAD_JSON_LINES))
def test_malformed_json_lines_are_shape_problems(tmp_path, name):
    log = _load(tmp_path, observer_log.encode(_events(WR_EVENT, BAD_JSON_LINES[name]), "json"))
    assert log.problem is not None and log.problem.code == "receipt.shape", (name, log.problem)
    assert "line 3" in log.problem.message


# --- the replay: fast path and walk give the same figures ------------------------------------------


def _engine(seed, qpns=(0x100, 0x200), parents=6, slices=5, depth=8):
    """A log and ledger as an engine with ``depth`` WRs in flight per QP, completions in random order
    per QP, would leave them (one round)."""
    rng = random.Random(seed)
    ids = {qpn: (f"0x{0x5000 + i:x}", f"0x{0x6000 + i:x}") for i, qpn in enumerate(qpns)}
    events, wrs, flight = [HEADER], [], {qpn: [] for qpn in qpns}
    wr_id = 0
    todo = [(parent, s) for parent in range(parents) for s in range(slices)]
    while todo or any(flight.values()):
        qpn = rng.choice(qpns)
        if todo and len(flight[qpn]) < depth and rng.random() < 0.6:
            parent, s = todo.pop(0)
            wr_id += 1
            ctx, cq = ids[qpn]
            size = 1000 + s
            events.append({"ev": "wr", "ctx": ctx, "dev": f"mlx5_{qpns.index(qpn)}", "cq": cq, "qpn": qpn,
                           "wr_id": wr_id, "opcode": "RDMA_READ", "bytes": size})
            wrs.append({"qpn": qpn, "wr_id": wr_id, "parent": parent, "bytes": size, "opcode": "RDMA_READ",
                        "context": ctx, "cq": cq})
            flight[qpn].append(wr_id)
        elif flight[qpn]:
            done = flight[qpn].pop(rng.randrange(len(flight[qpn])))
            ctx, cq = ids[qpn]
            events.append({"ev": "cqe", "ctx": ctx, "cq": cq, "qpn": qpn, "wr_id": done, "status": 0,
                           "status_name": "IBV_WC_SUCCESS"})
    events.append(dict(SUMMARY, accepted_wrs=wr_id, joined=wr_id))
    return events, {"rounds": [{"round": 1, "wrs": wrs}]}


FIGURES = ("accepted_count", "joined_count", "unjoined", "orphans", "duplicates", "failed", "joined_bytes",
           "max_wrs", "max_parents", "unlisted", "differing", "missing", "wrs", "bytes", "devices")


def _figures(replay):
    return {name: getattr(replay, name) for name in FIGURES}


def _no_walk(*_):
    raise AssertionError("the healthy log took the walk")


def _in_columns(ledger):
    """The ledger with its WR objects as the round's columns (docs/receipts.md 1.6), as the loader gives them."""
    keys = ("qpn", "wr_id", "parent", "bytes", "opcode", "context", "cq")
    return {"rounds": [dict(rnd, wrs={key: [wr[key] for wr in rnd["wrs"]] for key in keys})
                       for rnd in ledger["rounds"]]}


def _replays(tmp_path, events, ledger, fmt, monkeypatch, healthy=False):
    ledger = _in_columns(ledger)
    log = _load(tmp_path, observer_log.encode(events, fmt))
    assert log.ok, log.problem
    with monkeypatch.context() as patch:
        if healthy:
            patch.setattr(Replay, "_walk", _no_walk)
        fast = Replay(log, ledger)
    with monkeypatch.context() as patch:
        patch.setattr(Replay, "_fast", lambda *_: False)
        walked = Replay(log, ledger)
    return fast, walked


@pytest.mark.parametrize("fmt", ["binary", "json"])
@pytest.mark.parametrize("seed", range(6))
def test_fast_path_equals_the_walk(tmp_path, seed, fmt, monkeypatch):
    events, ledger = _engine(seed)
    if seed % 2:  # each QP numbers its WRs from 1: the fast path joins by (QPN, WR ID)
        numbers = {}
        for item in [*events[1:-1], *ledger["rounds"][0]["wrs"]]:
            key = (item["qpn"], item["wr_id"])
            item["wr_id"] = numbers.setdefault(key, sum(1 for q, _ in numbers if q == item["qpn"]) + 1)
    if seed == 4:  # a ledger listing the same WRs in another order
        ledger["rounds"][0]["wrs"].reverse()
    fast, walked = _replays(tmp_path, events, ledger, fmt, monkeypatch, healthy=True)
    assert _figures(fast) == _figures(walked)
    assert fast.unjoined == [] and fast.joined_count == fast.accepted_count == 30
    assert set(fast.max_wrs.values()) <= set(range(1, 9))
    assert max(most.get(1, 0) for most in fast.max_parents.values()) >= 2  # {round: most}, per QP



@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_fast_path_equals_the_walk_with_more_qps_than_a_byte_numbers(tmp_path, fmt, monkeypatch):
    # 300 QPs: no QP number per event in a byte, each QP's mask a pass of its own (ObserverLog.qp_masks).
    events, ledger = _engine(7, qpns=tuple(range(0x100, 0x100 + 300)), parents=60, slices=10)
    fast, walked = _replays(tmp_path, events, ledger, fmt, monkeypatch, healthy=True)
    assert _figures(fast) == _figures(walked)
    assert fast.joined_count == fast.accepted_count == 600 and len(fast.max_wrs) > 256

ANOMALIES = {
    # each breaks the fast path's premise; the walk's findings are then the figures
    "a WR accepted twice": (lambda ev: ev.insert(2, dict(ev[1])), {"duplicates": 1}),
    "a completion of no WR": (lambda ev: ev.insert(-1, dict(CQE_EVENT, qpn=0x100, wr_id=999)), {"orphans": 1}),
    "a completion before its WR": (lambda ev: ev.insert(1, ev.pop(next(i for i, e in enumerate(ev) if
                                                                       e.get("ev") == "cqe"))), {"orphans": 1}),
    "a completion twice": (lambda ev: ev.insert(-1, dict(next(e for e in ev if e.get("ev") == "cqe"))),
                           {"duplicates": 1}),
    "a failed completion": (lambda ev: next(e for e in ev if e.get("ev") == "cqe").update(status=12), {"failed": 1}),
}


@pytest.mark.parametrize("name", sorted(ANOMALIES))
def test_anomalies_take_the_walk(tmp_path, name, monkeypatch):
    change, counts = ANOMALIES[name]
    events, ledger = _engine(1)
    change(events)
    fast, walked = _replays(tmp_path, events, ledger, "binary", monkeypatch)
    assert _figures(fast) == _figures(walked)
    for figure, count in counts.items():
        assert len(getattr(fast, figure)) == count, (figure, getattr(fast, figure))


def test_a_log_of_completions_only_is_all_orphans(tmp_path):
    log = _load(tmp_path, _binary(CQE_EVENT, dict(CQE_EVENT, wr_id=2)))
    replay = Replay(log, _in_columns({"rounds": [{"round": 1, "wrs": []}]}))
    assert (len(replay.orphans), replay.accepted_count, replay.max_wrs, replay.max_parents) == (2, 0, {}, {})


def test_a_withheld_completion_leaves_the_flight_but_joins_nothing(tmp_path, monkeypatch):
    events, ledger = _engine(2)
    first = next(e for e in events if e.get("ev") == "cqe")
    first["ev"] = "withheld"
    del first["status"], first["status_name"]
    fast, walked = _replays(tmp_path, events, ledger, "binary", monkeypatch)
    assert _figures(fast) == _figures(walked)
    assert fast.unjoined == [(first["ctx"], first["cq"], first["qpn"], first["wr_id"])]


def test_the_ledger_differences_are_named(tmp_path, monkeypatch):
    events, ledger = _engine(3)
    wrs = ledger["rounds"][0]["wrs"]
    wrs[3]["bytes"] += 1
    gone = wrs.pop(5)
    wrs.append(dict(wrs[0], wr_id=777))
    fast, walked = _replays(tmp_path, events, ledger, "binary", monkeypatch)
    assert _figures(fast) == _figures(walked)
    assert fast.unlisted == [(gone["qpn"], gone["wr_id"])] and fast.missing == [(wrs[0]["qpn"], 777)]
    assert [key for key, _wr, _event in fast.differing] == [(wrs[3]["qpn"], wrs[3]["wr_id"])]



@pytest.mark.parametrize("fmt", ["binary", "json"])
@pytest.mark.parametrize("column", ["context", "cq"])
def test_a_ledger_pointer_of_another_qp_is_named(tmp_path, monkeypatch, fmt, column):
    # Contexts and CQs are compared one distinct (ledger text, log pointer) pair at a time: one WR
    # naming another QP's context or CQ is found.
    events, ledger = _engine(3)
    wrs = ledger["rounds"][0]["wrs"]
    wrs[3][column] = next(wr for wr in wrs if wr["qpn"] != wrs[3]["qpn"])[column]
    fast, walked = _replays(tmp_path, events, ledger, fmt, monkeypatch)
    assert _figures(fast) == _figures(walked)
    assert [key for key, _wr, _event in fast.differing] == [(wrs[3]["qpn"], wrs[3]["wr_id"])]
    assert fast.unlisted == fast.missing == []

def _columns(log):
    """Every column a rule can read, pointers as text (the binary form holds the pointers themselves)."""
    out = {"devices": log.devices, "summary": log.summary, "digests": log.digests(), "wrs": log.wrs()}
    for kind in (loader.WR, loader.CQE, loader.WITHHELD, loader.DATA):
        table = dict(log.table(kind))
        del table["position"]  # the binary form has text records where JSON has lines
        for name in ("ctx", "cq"):
            if name in table:
                table[name] = list(map(loader.pointer_text, table[name]))
        out[kind] = table
    flow = dict(log.flow())
    flow["ctx"], flow["cq"] = list(map(loader.pointer_text, flow["ctx"])), list(map(loader.pointer_text, flow["cq"]))
    out["flow"] = flow
    out["wrs"] = {k: v for k, v in out["wrs"].items() if k not in ("position", "ctx", "cq")}
    return out


def test_json_columns_equal_the_line_walk_and_the_binary_form(tmp_path, monkeypatch):
    events, _ledger = _engine(5)
    events[1:1] = [DATA_EVENT, DESTROY, dict(DATA_EVENT, flags=4, sha256=None)]
    events.insert(-1, dict(CQE_EVENT, ev="withheld", qpn=0x100, wr_id=3))
    del events[-2]["status"], events[-2]["status_name"]
    data = observer_log.encode(events, "json")
    with monkeypatch.context() as patch:
        patch.setattr(loader, "_json_lines_one_by_one", _no_walk)  # a healthy log never walks line by line
        fast = _load(tmp_path, data)
    binary = _load(tmp_path, observer_log.encode(events, "binary"))
    assert fast.ok and binary.ok
    assert _columns(fast) == _columns(binary)
    assert list(binary.texts.values()) == list(fast.texts.values()) == [DESTROY]
    assert fast.events == binary.events


def test_a_log_the_columns_refuse_is_named_by_the_line_walk(tmp_path):
    # A WR without its bytes: the column pass fails (KeyError), the walk names the line.
    broken = {k: v for k, v in WR_EVENT.items() if k != "bytes"}
    log = _load(tmp_path, observer_log.encode(_events(WR_EVENT, broken), "json"))
    assert log.problem.code == "receipt.shape" and "line 3" in log.problem.message and "bytes" in log.problem.message


def test_distinct_parents_in_flight_are_counted_per_round():
    """Two parents of round 1 at once, then round 2 one parent at a time: round 2 is not lifted by round 1
    (rounds one after the other, sliced; or interleaved, taken apart)."""
    is_wr = bytes([1, 1, 0, 0, 1, 0, 1, 0])
    parents = [0, 1, 0, 1, 0, 0, 1, 1]
    assert _most_distinct(is_wr, parents, [1, 1, 1, 1, 2, 2, 2, 2]) == {1: 2, 2: 1}
    # round 2's first parent posted while round 1's are in flight: still one of round 2's at a time
    assert _most_distinct(bytes([1, 1, 1, 0, 0, 0, 1, 0]), [0, 1, 0, 0, 1, 0, 1, 1],
                          [1, 1, 2, 1, 1, 2, 2, 2]) == {1: 2, 2: 1}
