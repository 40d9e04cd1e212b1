"""Observer logs for tests: decode either format to JSON objects and write them back in a given format.

Written from docs/receipts.md section 2 with struct alone, independent of the verifier's reader
(plugins/module_utils/_verify/loader.py), so that a test of one against the other means something.
A binary record renders as the JSON format writes the same event; device-index text events only
name the devices of later WRs and are folded into them (and written again by ``encode``).
"""

import json
import struct

RECORD = struct.Struct("<BBHIQQQQ32s8x")  # 80 bytes, little-endian
TEXT_CHUNK = RECORD.size - 4
WR, CQE, WITHHELD, DATA, TEXT = 1, 2, 3, 4, 5
OPCODES = {1: "RDMA_READ", 2: "RDMA_WRITE"}
NOT_HASHED = 4 | 8  # data flags: no MR, outside the MR
# ibv_wc_status names by value (a binary completion carries only the value).
WC_STATUS = ("IBV_WC_SUCCESS", "IBV_WC_LOC_LEN_ERR", "IBV_WC_LOC_QP_OP_ERR", "IBV_WC_LOC_EEC_OP_ERR",
             "IBV_WC_LOC_PROT_ERR", "IBV_WC_WR_FLUSH_ERR", "IBV_WC_MW_BIND_ERR", "IBV_WC_BAD_RESP_ERR",
             "IBV_WC_LOC_ACCESS_ERR", "IBV_WC_REM_INV_REQ_ERR", "IBV_WC_REM_ACCESS_ERR", "IBV_WC_REM_OP_ERR",
             "IBV_WC_RETRY_EXC_ERR", "IBV_WC_RNR_RETRY_EXC_ERR", "IBV_WC_LOC_RDD_VIOL_ERR",
             "IBV_WC_REM_INV_RD_REQ_ERR", "IBV_WC_REM_ABORT_ERR", "IBV_WC_INV_EECN_ERR",
             "IBV_WC_INV_EEC_STATE_ERR", "IBV_WC_FATAL_ERR", "IBV_WC_RESP_TIMEOUT_ERR", "IBV_WC_GENERAL_ERR")


def _pointer(value):
    """A pointer as the JSON format prints it (glibc %p)."""
    return hex(value) if value else "(nil)"


def _from_pointer(text):
    return 0 if text == "(nil)" else int(text, 16)


def decode(data):
    """[header, event, ...] of an observer log (bytes) in either format (JSON lines or binary)."""
    header_end = data.index(b"\n") + 1
    header = json.loads(data[:header_end])
    if header.get("format", "json") == "json":
        return [header] + [json.loads(line) for line in data[header_end:].splitlines() if line.strip()]
    body = data[header_end:]
    assert header["record_bytes"] == RECORD.size and len(body) % RECORD.size == 0, len(body)
    events, devices, text = [header], {}, b""
    for index, (kind, a, b, qpn, wr_id, c, d, e, digest) in enumerate(RECORD.iter_unpack(body)):
        if kind == WR:
            events.append({"ev": "wr", "ctx": _pointer(c), "dev": devices[b], "cq": _pointer(d), "qpn": qpn,
                           "wr_id": wr_id, "opcode": OPCODES[a], "bytes": e})
        elif kind in (CQE, WITHHELD):
            event = {"ev": "cqe" if kind == CQE else "withheld", "ctx": _pointer(c), "cq": _pointer(d), "qpn": qpn,
                     "wr_id": wr_id}
            if kind == CQE:
                event.update(status=a, status_name=WC_STATUS[a] if a < len(WC_STATUS) else "UNKNOWN")
            else:
                assert a == 0
            events.append(event)
        elif kind == DATA:
            events.append({"ev": "data", "qpn": qpn, "wr_id": wr_id, "sge": b, "off": c, "len": e, "mr_len": d,
                           "sha256": None if a & NOT_HASHED else digest.hex(), "flags": a})
        else:
            assert kind == TEXT and b <= TEXT_CHUNK, (index, kind, b)
            start = index * RECORD.size + 4
            text += body[start:start + b]
            if not a:
                obj = json.loads(text)
                text = b""
                if obj.get("ev") == "dev":
                    devices[obj["index"]] = obj["dev"]
                else:
                    events.append(obj)
    assert text == b"", "a text event is cut short"
    return events


def text_records(obj):
    """The binary text records of one JSON object (a device, destroy or summary event)."""
    text = json.dumps(obj, separators=(",", ":")).encode()
    chunks = [text[i:i + TEXT_CHUNK] for i in range(0, len(text), TEXT_CHUNK)] or [b""]
    return b"".join(struct.pack("<BBH", TEXT, int(i + 1 < len(chunks)), len(chunk)) + chunk.ljust(TEXT_CHUNK, b"\0")
                    for i, chunk in enumerate(chunks))


def encode(events, fmt=None):
    """Bytes of an observer log holding ``events`` ([header, event, ...]); ``fmt`` "json" or "binary" (default:
    the header's). Events the binary format has no record for are written as text events."""
    header = dict(events[0])
    fmt = fmt or header.get("format", "json")
    if fmt == "json":
        if "format" in header:
            header.update(format="json", record_bytes=0)
        return b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in [header, *events[1:]])
    header.update(format="binary", record_bytes=RECORD.size)
    out, devices = [json.dumps(header, separators=(",", ":")).encode() + b"\n"], {}
    for e in events[1:]:
        kind = e.get("ev")
        if kind == "wr" and e["opcode"] in ("RDMA_READ", "RDMA_WRITE"):
            if e["dev"] not in devices:
                devices[e["dev"]] = len(devices)
                out.append(text_records({"ev": "dev", "index": devices[e["dev"]], "dev": e["dev"]}))
            out.append(RECORD.pack(WR, 1 if e["opcode"] == "RDMA_READ" else 2, devices[e["dev"]], e["qpn"],
                                   e["wr_id"], _from_pointer(e["ctx"]), _from_pointer(e["cq"]), e["bytes"], b""))
        elif kind in ("cqe", "withheld"):
            out.append(RECORD.pack(CQE if kind == "cqe" else WITHHELD, e.get("status", 0), 0, e["qpn"], e["wr_id"],
                                   _from_pointer(e["ctx"]), _from_pointer(e["cq"]), 0, b""))
        elif kind == "data":
            digest = bytes.fromhex(e["sha256"]) if e["sha256"] else b""
            out.append(RECORD.pack(DATA, e["flags"], e["sge"], e["qpn"], e["wr_id"], e["off"], e["mr_len"],
                                   e["len"], digest))
        else:
            out.append(text_records(e))
    return b"".join(out)


SUFFIXES = {"binary": ".bin", "json": ".jsonl"}  # the file name says the format (docs/receipts.md 2)


def file_name(tool, fmt="binary"):
    """observer-<tool>.bin (binary records) or observer-<tool>.jsonl (JSON lines)."""
    return f"observer-{tool}{SUFFIXES[fmt]}"


def find(directory, tool="accounting"):
    """The path of the one observer log of ``tool`` in ``directory``, whichever format it is in."""
    (path,) = [directory / file_name(tool, fmt) for fmt in SUFFIXES if (directory / file_name(tool, fmt)).exists()]
    return path


def read(path):
    return decode(path.read_bytes())


def edit(path, change):
    """Rewrite the log at ``path`` in its own format with ``change([header, event, ...])``'s events."""
    events = read(path)
    fmt = events[0].get("format", "json")
    path.write_bytes(encode(change(events), fmt))
