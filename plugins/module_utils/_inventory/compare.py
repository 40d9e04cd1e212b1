# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Compare two RDMA inventories (before/after a child) and list every difference by path.

Stdlib only. Paths join dict keys with ``/``; an element of a list of records is addressed by its
key in brackets: GID entries by ``index`` (``devices/mlx5_0/ports/1/gids[3]/type``), error entries
by ``path`` (``errors[devices/mlx5_0/ports/1/state]``). Other lists are compared as whole values.
Rules are documented in docs/inventory.md.
"""

import fnmatch

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError

SCHEMA = "orbite.rdma-inventory"
SUPPORTED_VERSIONS = (1,)
# Lists of records whose elements are matched by one of these keys (first that every element has).
RECORD_KEYS = ("index", "path")


class InventoryCompareError(OrbiteError):
    """An argument is not an inventory of a supported schema/version."""

    code = "inventory.compare"


def check_inventory(inventory, name):
    """Raise InventoryCompareError unless ``inventory`` looks like an orbite.rdma-inventory."""
    if not isinstance(inventory, dict):
        raise InventoryCompareError(f"{name}: expected an inventory dict, got {type(inventory).__name__}")
    if inventory.get("schema") != SCHEMA:
        raise InventoryCompareError(f"{name}.schema {inventory.get('schema')!r}: expected {SCHEMA!r}")
    if inventory.get("version") not in SUPPORTED_VERSIONS:
        raise InventoryCompareError(
            f"{name}.version {inventory.get('version')!r}: expected one of {list(SUPPORTED_VERSIONS)}"
        )


def diff_inventories(before, after, ignore=None):
    """Every difference between two inventories, sorted by path.

    Each difference: {"path": str, "change": "added"|"removed"|"changed", "before": x, "after": y}
    (``before`` is None for added, ``after`` is None for removed). ``ignore`` is a list of fnmatch
    patterns on paths (e.g. ``node/boot_id``); a difference whose path matches one is left out.
    """
    check_inventory(before, "before")
    check_inventory(after, "after")
    patterns = _check_ignore(ignore)
    out = []
    _diff(before, after, "", out)
    out = [d for d in out if not any(fnmatch.fnmatchcase(d["path"], p) for p in patterns)]
    out.sort(key=lambda d: d["path"])
    return out


def _check_ignore(ignore):
    if ignore is None:
        return []
    if isinstance(ignore, str) or not all(isinstance(p, str) for p in ignore):
        raise InventoryCompareError(f"ignore {ignore!r}: expected a list of path patterns (strings)")
    return list(ignore)


def _join(prefix, key):
    return f"{prefix}/{key}" if prefix else str(key)


def _diff(a, b, path, out):
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            sub = _join(path, key)
            if key not in b:
                out.append({"path": sub, "change": "removed", "before": a[key], "after": None})
            elif key not in a:
                out.append({"path": sub, "change": "added", "before": None, "after": b[key]})
            else:
                _diff(a[key], b[key], sub, out)
        return
    if isinstance(a, list) and isinstance(b, list):
        key = _record_key(a, b)
        if key is not None:
            _diff_records(a, b, key, path, out)
            return
    # bool is an int in Python: compare types too, so True never equals 1.
    if a != b or type(a) is not type(b):
        out.append({"path": path, "change": "changed", "before": a, "after": b})


def _record_key(a, b):
    items = a + b
    if not items or not all(isinstance(i, dict) for i in items):
        return None
    for key in RECORD_KEYS:
        values = [i.get(key) for i in items if key in i]
        if len(values) == len(items) and all(isinstance(v, (str, int)) for v in values):
            if len({i[key] for i in a}) == len(a) and len({i[key] for i in b}) == len(b):
                return key
    return None


def _diff_records(a, b, key, path, out):
    left = {i[key]: i for i in a}
    right = {i[key]: i for i in b}
    for k in sorted(set(left) | set(right), key=lambda v: (isinstance(v, str), v)):
        sub = f"{path}[{k}]"
        if k not in right:
            out.append({"path": sub, "change": "removed", "before": left[k], "after": None})
        elif k not in left:
            out.append({"path": sub, "change": "added", "before": None, "after": right[k]})
        else:
            _diff(left[k], right[k], sub, out)
