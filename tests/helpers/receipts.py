"""Editing receipts in place for red checks: a JSON document, or a JSON-lines log (journal, observer log)."""

import json


def edit_json(path, change):
    """Rewrite the JSON document at ``path`` after ``change(data)`` has changed it in place."""
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def edit_lines(path, change):
    """Rewrite the JSON-lines file at ``path`` with the lines ``change(lines)`` returns."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.write_text("".join(json.dumps(line) + "\n" for line in change(lines)))


def reorder(value):
    """The same JSON value with every object's keys in reverse order (for no-op rewrites)."""
    if isinstance(value, dict):
        return {key: reorder(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reorder(item) for item in value]
    return value


# A ledger round's WRs are columns (docs/receipts.md 1.6); red checks edit them as objects.
WR_COLUMNS = ("wr_id", "parent", "slice", "rail", "lane", "qpn", "context", "cq", "opcode", "bytes", "local_offset",
              "remote_offset", "status", "posted_seq", "completed_seq")


def wr_rows(columns):
    """The WR objects of a round's WR columns, in order."""
    names = list(columns)
    return [dict(zip(names, values)) for values in zip(*(columns[name] for name in names))]


def wr_columns(rows):
    """The WR columns of WR objects (every documented column, in the documented order)."""
    return {name: [row[name] for row in rows] for name in WR_COLUMNS}


def ledger_as_rows(ledger):
    """The ledger with each round's WRs as a list of objects, in place (``ledger_as_columns`` undoes it)."""
    for rnd in ledger.get("rounds", ()):
        if isinstance(rnd.get("wrs"), dict):
            rnd["wrs"] = wr_rows(rnd["wrs"])
    return ledger


def ledger_as_columns(ledger):
    """The ledger with each round's WR objects back in columns, in place."""
    for rnd in ledger.get("rounds", ()):
        if isinstance(rnd.get("wrs"), list):
            rnd["wrs"] = wr_columns(rnd["wrs"])
    return ledger
