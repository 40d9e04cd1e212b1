# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Optional cross-check of a sysfs inventory against libibverbs, through pyverbs.

pyverbs is optional on nodes. When it cannot be imported, when the inventory was not read from
``/`` (verbs only see the real host), or when ``get_device_list`` raises (a host without the RDMA
subsystem makes pyverbs raise instead of returning an empty list), the check is reported as
skipped with the reason. Otherwise every device and port of both views is compared: presence,
port state number, link layer and the type of each listed GID.
"""

import importlib
import os

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import QUOTE_LIMIT, quote

LINK_LAYERS = {1: "InfiniBand", 2: "Ethernet"}  # IBV_LINK_LAYER_* (0 = unspecified)
GID_TYPES = {0: "IB/RoCE v1", 1: "RoCE v2"}  # ibv_query_gid_type: IBV_GID_TYPE_SYSFS_*


def _skipped(reason):
    return {"status": "skipped", "reason": reason, "devices": 0, "comparisons": 0, "mismatches": []}


def verbs_crosscheck(inventory, root="/", module_name="pyverbs.device"):
    """Compare ``inventory`` with what pyverbs reports; never raises for a missing/failing pyverbs."""
    if os.path.realpath(str(root)) != os.path.sep:
        return _skipped(f"root {quote(root)} is not '/': verbs describe the real host, not that tree")
    try:
        device_mod = importlib.import_module(module_name)
    except ImportError as exc:
        return _skipped(f"pyverbs not importable: {_cut(str(exc))}")
    try:
        listed = device_mod.get_device_list()
    except Exception as exc:  # PyverbsRDMAError and friends: no RDMA subsystem on this host
        return _skipped(f"pyverbs get_device_list raised {_why(exc)}")
    names = sorted(_text(d.name) for d in listed)
    checker = _Checker(device_mod)
    sysfs = inventory.get("devices") or {}
    for name in sorted(set(names) | set(sysfs)):
        if name not in sysfs:
            checker.mismatch(f"devices/{name}", "absent", "present")
        elif name not in names:
            checker.mismatch(f"devices/{name}", "present", "absent")
        else:
            checker.device(name, sysfs[name])
    return {
        "status": "checked",
        "reason": None,
        "devices": len(names),
        "comparisons": checker.comparisons,
        "mismatches": checker.mismatches,
    }


def _text(value):
    """A device name from pyverbs: bytes that are not UTF-8 are shown escaped, never a crash."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)


def _cut(text):
    return text if len(text) <= QUOTE_LIMIT else text[: QUOTE_LIMIT - 3] + "..."


def _why(exc):
    """'<class>: <message>' of an exception raised by pyverbs, cut to a bounded length."""
    return _cut(f"{type(exc).__name__}: {exc}")


class _Checker:
    def __init__(self, device_mod):
        self.device_mod = device_mod
        self.comparisons = 0
        self.mismatches = []

    def mismatch(self, path, sysfs, verbs):
        self.mismatches.append({"path": path, "sysfs": sysfs, "verbs": verbs})

    def compare(self, path, sysfs, verbs):
        self.comparisons += 1
        if sysfs != verbs:
            self.mismatch(path, sysfs, verbs)

    def device(self, name, dev):
        try:
            ctx = self.device_mod.Context(name=name)
        except Exception as exc:
            self.mismatch(f"devices/{name}", "present", f"open failed: {_why(exc)}")
            return
        try:
            for num, port in (dev.get("ports") or {}).items():
                self.port(ctx, f"devices/{name}/ports/{num}", int(num), port)
        finally:
            ctx.close()

    def port(self, ctx, path, num, port):
        try:
            attr = ctx.query_port(num)
        except Exception as exc:
            self.mismatch(path, "present", f"query_port failed: {_why(exc)}")
            return
        self.compare(path + "/state", (port.get("state") or {}).get("num"), int(attr.state))
        self.compare(path + "/link_layer", port.get("link_layer"), LINK_LAYERS.get(int(attr.link_layer)))
        for entry in port.get("gids") or []:
            where = f"{path}/gids[{entry['index']}]/type"
            try:
                verbs_type = GID_TYPES.get(int(ctx.query_gid_type(num, entry["index"])))
            except Exception as exc:
                self.mismatch(where, entry.get("type"), f"query_gid_type failed: {_why(exc)}")
                continue
            self.compare(where, entry.get("type"), verbs_type)
