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
