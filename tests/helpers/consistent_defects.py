"""Consistent defects: what a clever faulty engine would leave, every receipt it writes agreeing.

Each defect edits a copy of a clean case directory (tests/helpers/sim_pair.py) the way an engine
that keeps its receipts self-consistent would: the fact is changed in the ledger, and every figure a
naive cross-check compares it with is changed to agree (per-round counters, QP usage, totals, the
peer's ledger, the observer's lines and summary, which see what the engine posts). Journals,
inventories, the profile and the plan are written by the supervisor, the gate and the controller,
which the engine cannot write: a defect touches them only when the defect is theirs (``writes``
names the roles), never to make an engine's defect agree.

``DEFECTS`` maps a name to (case, the one code that must fail, issue class, what is wrong, edit).
Used by tests/unit/plugins/module_utils/_verify/test_consistent_defects.py.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from helpers import observer_log
from helpers.receipts import ledger_as_columns, ledger_as_rows, reorder

from ansible_collections.orbite.qualification.plugins.module_utils._node.locks import iso_time

ROLES = ("source", "requester")
SUCCESS = "SUCCESS"


class CaseFiles:
    """The receipts of one single-generation case, loaded for editing and saved back."""

    def __init__(self, case_dir):
        self.dir = Path(case_dir)
        # WRs edited as objects; written back as the ledger's columns (docs/receipts.md 1.6).
        self.ledgers = {role: ledger_as_rows(self._json(self._ledger_path(role))) for role in ROLES}
        # Observer logs edited as JSON objects, written back in their own format (the name says which).
        self.logs = {path.name: observer_log.read(path)
                     for path in sorted((self.dir / "requester" / "g1").glob("observer-*"))}
        self.journals = {role: [json.loads(line) for line in self._journal_path(role).read_text().splitlines()
                                if line.strip()] for role in ROLES}
        self.touched = set()  # roles whose journal a defect of the supervisor's or the gate's edited

    @property
    def requester(self):
        return self.ledgers["requester"]

    @property
    def source(self):
        return self.ledgers["source"]

    def _accounting_name(self):
        return next((name for name in self.logs if name.startswith("observer-accounting.")), None)

    @property
    def accounting(self):
        name = self._accounting_name()
        return None if name is None else self.logs[name]

    @accounting.setter
    def accounting(self, events):
        self.logs[self._accounting_name()] = events

    def _ledger_path(self, role):
        return self.dir / role / "g1" / "ledger.json"

    def _journal_path(self, role):
        return self.dir / role / "journal.jsonl"

    @staticmethod
    def _json(path):
        return json.loads(path.read_text())

    def save(self):
        for role, ledger in self.ledgers.items():
            self._ledger_path(role).write_text(json.dumps(ledger_as_columns(copy.deepcopy(ledger))))
        for name, events in self.logs.items():
            path = self.dir / "requester" / "g1" / name
            path.write_bytes(observer_log.encode(events, observer_log.read(path)[0].get("format", "json")))
        for role in self.touched:
            self._journal_path(role).write_text("".join(json.dumps(x) + "\n" for x in self.journals[role]))


# --- keeping the engine's own receipts in agreement ----------------------------------------------


def _rail_keys(ledger):
    return [str(r) for r in ledger["workload"]["enabled_rails"]]


def recount_requester(ledger):
    """Every figure of the requester's ledger derived from its WR and parent lists, recomputed from
    them: what a naive check compares the lists with now agrees, whatever the lists say."""
    rails = _rail_keys(ledger)
    for rnd in ledger["rounds"]:
        wrs, ok = rnd["wrs"], [wr for wr in rnd["wrs"] if wr["status"] == SUCCESS]
        native = {"bytes": sum(wr["bytes"] for wr in ok), "wrs": len(wrs), "cqes": len(ok),
                  "per_rail": {r: {"bytes": 0, "wrs": 0, "cqes": 0} for r in rails}}
        for wr in wrs:
            slot = native["per_rail"].setdefault(str(wr["rail"]), {"bytes": 0, "wrs": 0, "cqes": 0})
            slot["wrs"] += 1
            if wr["status"] == SUCCESS:
                slot["cqes"] += 1
                slot["bytes"] += wr["bytes"]
        public = {"bytes": 0, "per_rail": dict.fromkeys(rails, 0)}
        slices = defaultdict(int)
        for wr in wrs:
            slices[wr["parent"]] += 1
        for parent in rnd["parents"]:
            parent["slices"] = slices[parent["parent"]]
            if parent["status"] == "Completed":
                public["bytes"] += parent["completed_bytes"]
                key = str(parent["rail"])
                public["per_rail"][key] = public["per_rail"].get(key, 0) + parent["completed_bytes"]
        rnd["counters"] = {"public": public, "native": native}
        for usage in rnd["qp_usage"]:
            mine = [wr for wr in wrs if wr["qpn"] == usage["qpn"]]
            done = [wr for wr in mine if wr["status"] == SUCCESS]
            usage.update(wrs_posted=len(mine), cqes=len(done), cqes_error=len(mine) - len(done),
                         bytes_posted=sum(wr["bytes"] for wr in mine), bytes_completed=sum(wr["bytes"] for wr in done))
        rnd["progress"]["cqes_polled"] = len(wrs)
    retotal(ledger)


def source_moved(source):
    """The device counter the source's public bytes are (served for READ, landed for WRITE)."""
    return "read_bytes_served" if source["operation"] == "read" else "write_bytes_landed"


def recount_source(source):
    """The source's public bytes (what its devices served or received, per rail) from its device
    counters, and its provider totals from the per-rail ones. Its verbs layer sees no one-sided
    operation: its native counters stay as written."""
    rails, moved = _rail_keys(source), source_moved(source)
    for rnd in source["rounds"]:
        device = rnd["device"]
        public = {"bytes": 0, "per_rail": dict.fromkeys(rails, 0)}
        for key in rails:
            public["bytes"] += device[key][moved]
            public["per_rail"][key] = device[key][moved]
        rnd["counters"]["public"] = public
        for name in ("read_bytes_landed", "read_bytes_served", "write_bytes_sent", "write_bytes_landed"):
            rnd["provider"][name] = sum(figures[name] for figures in device.values())
    retotal(source)


def retotal(ledger):
    totals = ledger["totals"]
    rounds = ledger["rounds"]
    totals.update(
        rounds_completed=len(rounds),
        wrs_posted=sum(r["counters"]["native"]["wrs"] for r in rounds),
        cqes=sum(r["counters"]["native"]["cqes"] for r in rounds),
        public_bytes=sum(r["counters"]["public"]["bytes"] for r in rounds),
        native_bytes=sum(r["counters"]["native"]["bytes"] for r in rounds),
        qps_created=len(ledger["qps"]),
        persistent_mrs=sum(1 for c in ledger["contexts"] for mr in c["mrs"] if mr.get("registered_round") == 0),
    )
    totals["provider"] = {name: sum(r["provider"][name] for r in rounds) for name in totals["provider"]}
    if isinstance(ledger.get("teardown"), dict):
        ledger["teardown"]["qps_destroyed"] = len(ledger["qps"])


def resummarize(lines, ledger):
    """The observer's summary line recomputed from its own events (and the ledger's WR -> parent map)."""
    parent_of = {(wr["qpn"], wr["wr_id"]): wr["parent"] for rnd in ledger["rounds"] for wr in rnd["wrs"]}
    header, *events, summary = lines
    accepted, joined, inflight, most, most_parents = set(), set(), defaultdict(dict), {}, {}
    for event in events:
        if event["ev"] not in ("wr", "cqe"):
            continue
        key = (event["ctx"], event["cq"], event["qpn"], event["wr_id"])
        qpn = str(event["qpn"])
        if event["ev"] == "wr":
            accepted.add(key)
            inflight[qpn][key] = parent_of.get((event["qpn"], event["wr_id"]))
            most[qpn] = max(most.get(qpn, 0), len(inflight[qpn]))
            most_parents[qpn] = max(most_parents.get(qpn, 0), len(set(inflight[qpn].values()) - {None}))
        elif event["ev"] == "cqe":
            if key in accepted and event["status"] == 0:
                joined.add(key)
            inflight[qpn].pop(key, None)
    # An observer that cannot resolve parents writes {} (docs/receipts.md §2): so does this one.
    if summary.get("max_outstanding_parents_per_qp") == {}:
        most_parents = {}
    summary = dict(summary, accepted_wrs=len(accepted), joined=len(joined), unjoined=len(accepted - joined),
                   max_inflight_per_qp=most, max_outstanding_parents_per_qp=most_parents)
    return [header, *events, summary]


def _observed(files, change):
    """Apply ``change(event)`` to every event line of the accounting log, then redo its summary."""
    lines = files.accounting
    if lines is None:
        return
    for event in lines[1:-1]:
        change(event)
    files.accounting = resummarize(lines, files.requester)


def sync_landed(files):
    """The observer's `data` lines (where a WR's bytes landed: offset, MR length) follow the WRs the
    engine posted: an engine that posts elsewhere makes the observer see elsewhere."""
    lines = files.accounting
    if lines is None:
        return
    wrs = {(wr["qpn"], wr["wr_id"]): wr for rnd in files.requester["rounds"] for wr in rnd["wrs"]}
    lengths = {c["context"]: mr["length"] for c in files.requester["contexts"] for mr in c["mrs"]
               if mr["kind"] == "data"}
    for event in lines[1:-1]:
        wr = wrs.get((event.get("qpn"), event.get("wr_id")))
        if event["ev"] == "data" and wr is not None and event.get("sge", 0) == 0:
            event["off"] = wr["local_offset"]
            if "mr_len" in event:
                event["mr_len"] = lengths.get(wr["context"], event["mr_len"])


def _round(ledger, number):
    return next(r for r in ledger["rounds"] if r["round"] == number)


def _qp_of(ledger, rail, lane=0):
    return next(qp for qp in ledger["qps"] if qp["rail"] == rail and qp["lane"] == lane)


def _observer_ids(files, qpn):
    """(dev, ctx, cq) the observer logs for a QP: its own opaque strings, taken from its lines."""
    for event in files.accounting or []:
        if event.get("ev") == "wr" and event["qpn"] == qpn:
            return event["dev"], event["ctx"], event["cq"]
    return None


def _keeps_sq_depth(lines, moved, target, depth=8):
    """Whether moving WR ``moved`` (qpn, wr_id) onto QP ``target`` keeps at most ``depth`` WRs in
    flight there, in the order the observer logged (an engine that knows its queue would)."""
    inflight = 0
    for event in lines[1:-1]:
        if event["ev"] not in ("wr", "cqe"):
            continue
        if (event["qpn"], event["wr_id"]) == moved or event["qpn"] == target:
            inflight += 1 if event["ev"] == "wr" else -1
            if inflight > depth:
                return False
    return True


def _post_when_drained(lines, moved, target, round_wr_ids):
    """Move the observer lines of WR ``moved`` (qpn, wr_id) right after the last line of QP
    ``target`` in the round (``round_wr_ids``), where nothing is in flight on the target any more."""
    mine = [e for e in lines[1:-1] if (e.get("qpn"), e.get("wr_id")) == moved]
    rest = [e for e in lines if not any(e is m for m in mine)]
    last = max(i for i, e in enumerate(rest) if e.get("qpn") == target and e.get("wr_id") in round_wr_ids)
    lines[:] = rest[: last + 1] + mine + rest[last + 1:]


def _move_wr(files, wr, rail, lane=0):
    """Put a requester WR on another rail's QP, in the ledger and in the observer's lines."""
    qp = _qp_of(files.requester, rail, lane)
    old = wr["qpn"], wr["wr_id"]
    ids = _observer_ids(files, qp["qpn"])
    wr.update(rail=rail, lane=lane, qpn=qp["qpn"], context=qp["context"], cq=qp["cq"])

    def change(event):
        if (event.get("qpn"), event.get("wr_id")) == old:
            event["qpn"] = qp["qpn"]
            if event["ev"] in ("wr", "cqe", "withheld"):
                event.update(ctx=ids[1], cq=ids[2])
            if event["ev"] == "wr":
                event["dev"] = ids[0]

    _observed(files, change)


# --- the defects ---------------------------------------------------------------------------------


def native_wrs_split_per_rail(f):
    """The verbs counters attribute one of rail 1's WRs (and its CQE) to rail 0 in round 1; the
    totals, the WR list and the observer still agree with each other."""
    native = _round(f.requester, 1)["counters"]["native"]["per_rail"]
    for field in ("wrs", "cqes"):
        native["0"][field] += 1
        native["1"][field] -= 1


def extra_qp_never_used(f):
    """Both peers create and list one more QP in round 1 (first rail, lane num_lanes, never posted
    on), count it created and reused, destroy it at teardown: it has no QP-usage row, so the bound
    on live QPs never sees it."""
    new = {role: max(q["qpn"] for q in f.ledgers[role]["qps"]) + 1000 for role in ROLES}
    for role, peer_role in (("requester", "source"), ("source", "requester")):
        ledger = f.ledgers[role]
        ledger["qps"].append(dict(_qp_of(ledger, 0), qpn=new[role], peer_qpn=new[peer_role],
                                  lane=ledger["workload"]["num_lanes"]))
        for rnd in ledger["rounds"]:
            if rnd["round"] == 1:
                rnd["qps_created"] += 1
            else:
                rnd["qps_reused"] += 1
        retotal(ledger)


def qps_recreated_listed_as_round_one(f):
    """The requester recreates its QPs in round 2 (new QPNs, the source follows) but lists every QP
    as created in round 1 and counts all of them created there, none later."""
    fresh = {}
    for role in ROLES:
        ledger = f.ledgers[role]
        shift = 500
        for qp in list(ledger["qps"]):
            new = dict(qp, qpn=qp["qpn"] + shift, peer_qpn=qp["peer_qpn"] + shift)
            qp.update(destroyed_round=2, state="DESTROYED")
            ledger["qps"].append(new)
            fresh[(role, qp["qpn"])] = new["qpn"]
        for rnd in ledger["rounds"]:
            if rnd["round"] == 1:
                rnd["qps_created"] = len(ledger["qps"])
                continue
            rnd["qps_created"], rnd["qps_reused"] = 0, len(ledger["qps"])
            for item in rnd["parents"] + rnd["wrs"] + rnd["qp_usage"]:
                item["qpn"] = fresh[(role, item["qpn"])]
        retotal(ledger)
    late = {wr["wr_id"] for rnd in f.requester["rounds"] if rnd["round"] > 1 for wr in rnd["wrs"]}

    def change(event):
        if event.get("wr_id") in late:
            event["qpn"] = fresh[("requester", event["qpn"])]

    _observed(f, change)


def completion_never_reaped(f):
    """The engine lists a WR of round 2 as completed (its counters and totals count the CQE) but
    never reaped that completion: the observer, which sees every completion poll_cq returns, logged
    the post and no completion (nor the landed bytes it hashes at the completion)."""
    wr = next(wr for wr in _round(f.requester, 2)["wrs"] if wr["parent"] == 3 and wr["slice"] == 1)
    key = (wr["qpn"], wr["wr_id"])
    lines = f.accounting
    lines[:] = [e for e in lines if not (e.get("ev") in ("cqe", "data") and (e.get("qpn"), e.get("wr_id")) == key)]
    f.accounting = resummarize(lines, f.requester)


def timeout_marked_expected(f):
    """A Timeout in round 2 that the runner marks `expected` and so exits 0."""
    _round(f.requester, 2)["errors"].append(
        {"error": "Timeout", "operation": "wait", "round": 2, "parent": None, "remote_effect": "None",
         "locally_drained": True, "qps_created": 0, "wrs_posted": 0, "bytes": 0, "expected": True,
         "message": "wait timed out; retried"})


def unquiesced_marked_expected(f):
    """The source records Unquiesced at close, marked `expected`."""
    f.source["errors"].append(
        {"error": "Unquiesced", "operation": "close", "round": None, "parent": None, "remote_effect": "None",
         "locally_drained": False, "qps_created": 0, "wrs_posted": 0, "bytes": 0, "expected": True,
         "message": "engine closed with work outstanding"})


def _preload(f, role, tools):
    """The role's runner started with exactly ``tools`` preloaded, as the supervisor would journal it:
    each library the plan's artifact of that tool (path and sha256), pinned and handed over."""
    plan = json.loads((f.dir.parent.parent / "run.json").read_text())
    artifacts = (plan.get("artifacts") or {}).get("observers") or {}
    libraries = [dict(artifacts.get(tool) or {"path": f"/opt/orbite/lib/liborbite_{tool}.so", "sha256": "0" * 64})
                 for tool in tools]
    for event in f.journals[role]:
        if event.get("ev") != "child_start":
            continue
        records = [dict(lib, size=1, copy="memfd", loaded_as=f"/proc/self/fd/{40 + i}")
                   for i, lib in enumerate(libraries)]
        event["ld_preload"] = records
        keys = [k for k in event.get("env_keys") or [] if k != "LD_PRELOAD"]
        event["env_keys"] = sorted([*keys, "LD_PRELOAD"]) if tools else keys
        if isinstance(event.get("pinned"), list):
            kept = [p for p in event["pinned"] if not str(p.get("what", "")).startswith("ld_preload")]
            event["pinned"] = kept + [dict(r, what=f"ld_preload[{i}]") for i, r in enumerate(records)]
    f.touched.add(role)


def extra_observer_preloaded(f):
    """The gate preloads cq_fault beside accounting into the requester (both the plan's artifacts,
    pinned by hash): the old rule only asked whether something was preloaded. The gate's defect:
    the journal is edited."""
    _preload(f, "requester", ["accounting", "cq_fault"])


def observer_preloaded_into_the_source(f):
    """The gate preloads the accounting observer (the plan's artifact) into the source of an
    installed-host case, which loads no observer. The gate's defect: the journal is edited."""
    _preload(f, "source", ["accounting"])


def discovery_lists_ignored(f):
    """The engine ran without the gate's whitelist/blacklist (it echoes empty lists): with the lists
    it echoes, its choice is the one the inventory implies."""
    for ledger in f.ledgers.values():
        ledger["discovery"].update(whitelist=[], blacklist=[])


def strict_pin_other_index(f):
    """The separate engine pins GID index 254 instead of 255 (also unpopulated, also Unavailable),
    and records the index it pinned."""
    for ledger in f.ledgers.values():
        ledger["discovery"]["strict_gid_request"]["gid_index"] = 254


def slice_written_twice(f):
    """Parent 0's slice 1 goes to slice 0's offsets (slice 0's bytes land twice, slice 1's region is
    never written); the sizes, the slice numbers and every counter are unchanged."""
    wrs = [wr for wr in _round(f.requester, 1)["wrs"] if wr["parent"] == 0]
    first, second = (next(wr for wr in wrs if wr["slice"] == n) for n in (0, 1))
    second.update(local_offset=first["local_offset"], remote_offset=first["remote_offset"])


def slice_numbered_twice(f):
    """Parent 3's slices are posted as 0, 0, 2, 3 at the offsets of slice 0 for both first ones:
    the sizes still read 3 x block + the rest."""
    wrs = [wr for wr in _round(f.requester, 2)["wrs"] if wr["parent"] == 3]
    first, second = (next(wr for wr in wrs if wr["slice"] == n) for n in (0, 1))
    second.update(slice=0, local_offset=first["local_offset"], remote_offset=first["remote_offset"])


def wr_on_the_other_rail(f):
    """One slice of a rail-1 parent goes on rail 0's QP (one that keeps rail 0's send queue within
    its depth, as the observer saw it); the per-rail counters of both peers, the QP usage and the
    observer's lines all follow the WR."""
    target = _qp_of(f.requester, 0)["qpn"]
    found = next(((rnd, wr) for rnd in f.requester["rounds"] for wr in rnd["wrs"]
                  if wr["rail"] == 1 and _keeps_sq_depth(f.accounting, (wr["qpn"], wr["wr_id"]), target)), None)
    if found is None:
        # Under load the target QP may have been full all along: the engine would have posted the WR
        # once the target drained, so its observer lines move after the target's last event of the round.
        rnd = f.requester["rounds"][0]
        wr = next(w for w in rnd["wrs"] if w["rail"] == 1)
        _post_when_drained(f.accounting, (wr["qpn"], wr["wr_id"]), target, {w["wr_id"] for w in rnd["wrs"]})
    else:
        rnd, wr = found
    _move_wr(f, wr, 0)
    recount_requester(f.requester)
    recount_source(f.source)
    # the public figures follow the bytes too, as an engine counting them per WR would
    for ledger in f.ledgers.values():
        public = _round(ledger, rnd["round"])["counters"]["public"]["per_rail"]
        public["0"] += wr["bytes"]
        public["1"] -= wr["bytes"]


def parents_swap_rails(f):
    """Parents 0 and 1 trade rails (0 on rail 1, 1 on rail 0) in round 2 on both peers, with all
    their WRs and observer lines: every rail still carries the same bytes."""
    for ledger in f.ledgers.values():
        rnd = _round(ledger, 2)
        by_parent = {p["parent"]: p for p in rnd["parents"]}
        a, b = by_parent[0], by_parent[1]
        for key in ("rail", "lane", "qpn"):
            a[key], b[key] = b[key], a[key]
    for wr in _round(f.requester, 2)["wrs"]:
        if wr["parent"] in (0, 1):
            _move_wr(f, wr, 1 - wr["rail"], wr["lane"])
    recount_requester(f.requester)
    recount_source(f.source)


def public_and_native_shifted(f):
    """Both peers' public and native per-rail bytes move 1000 B from rail 1 to rail 0 in round 3:
    the totals, and native against public, agree."""
    for ledger in f.ledgers.values():
        counters = _round(ledger, 3)["counters"]
        counters["public"]["per_rail"]["0"] += 1000
        counters["public"]["per_rail"]["1"] -= 1000
        counters["native"]["per_rail"]["0"]["bytes"] += 1000
        counters["native"]["per_rail"]["1"]["bytes"] -= 1000


def _relayout(f, offset_of, guard=None, arena=None):
    """Move every parent's region (and every WR's offsets) to ``offset_of(parent)``, on both peers."""
    for ledger in f.ledgers.values():
        block = ledger["workload"]["block"]
        for rnd in ledger["rounds"]:
            for parent in rnd["parents"]:
                parent["region_offset"] = offset_of(parent["parent"])
                if guard is not None and isinstance(parent.get("guard_check"), dict):
                    parent["guard_check"]["guard_bytes"] = guard
            for wr in rnd["wrs"]:
                wr["local_offset"] = wr["remote_offset"] = offset_of(wr["parent"]) + wr["slice"] * block
        if guard is not None:
            payload = ledger["workload"]["payload"]
            ledger["workload"].update(guard_bytes=guard, region_stride=payload + 2 * guard)
        if arena is not None:
            ledger["workload"]["arena_bytes"] = arena
            for context in ledger["contexts"]:
                for mr in context["mrs"]:
                    if mr["kind"] == "data":
                        mr["length"] = arena


def guards_halved(f):
    """2 KiB guards instead of the documented 4 KiB, consistently: regions, WR offsets, the guard
    checks, the MRs and the runner's own `workload` all say 2 KiB."""
    payload, parents = f.requester["workload"]["payload"], f.requester["workload"]["parents"]
    _relayout(f, lambda p: p * (payload + 4096) + 2048, guard=2048, arena=parents * (payload + 4096))


def regions_without_guards_between(f):
    """Parents' regions abut (no guard between them) while the guard checks claim 4 KiB guards."""
    payload = f.requester["workload"]["payload"]
    _relayout(f, lambda p: p * payload + 4096)


def _shift_device(ledger, number, moved, delta):
    """Move ``delta`` bytes of the round's device counter ``moved`` from rail 1 to rail 0."""
    device = _round(ledger, number)["device"]
    device["0"][moved] += delta
    device["1"][moved] -= delta


def source_served_from_the_other_rail(f):
    """In round 2 the source's rail-0 device served one rail-1 parent's bytes (its own provider
    counted them there); the source's public counters and totals follow its devices. The requester
    landed them on rail 1 by its own receipts, and the relayed figure (the requester's word that
    each parent completed) still agrees with it."""
    _shift_device(f.source, 2, "read_bytes_served", f.source["workload"]["payload"])
    recount_source(f.source)


def source_received_shifted(f):
    """In round 1 the source's rail-1 device received 1000 B more and its rail-0 device 1000 B less
    than the placement gives (a WRITE landed across the rails); its public counters and totals
    follow its devices, the requester's receipts are unchanged."""
    _shift_device(f.source, 1, "write_bytes_landed", -1000)
    recount_source(f.source)


def grant_never_returned(f):
    """The requester never handed back parent 3's grant in round 2 and the source never took it back
    (parent 3 stays Granted there); both peers still say drained with no grant debt."""
    for role, fields in (("requester", ("grants_returned",)), ("source", ("grants_released",))):
        drain = _round(f.ledgers[role], 2)["drain"]
        for field in fields:
            drain[field] = [p for p in drain[field] if p != 3]
    for parent in _round(f.source, 2)["parents"]:
        if parent["parent"] == 3:
            parent["status"] = "Granted"


def batch_never_freed(f):
    """The requester's free() of round 3's batch answered BatchBusy (a WR it lost track of), and it
    went on: its drain and every counter still say all is done."""
    _round(f.requester, 3)["batches"][0]["free"] = "BatchBusy"


def guard_seed_reused(f):
    """The destination writes round 1's guards again in rounds 2 and 3 (one guard seed for the
    case: a region left from round 1 would pass its guard check); every guard check and digest it
    records is that of the bytes it wrote."""
    import sys

    from helpers.paths import REPO

    sys.path.insert(0, str(REPO / "sim"))
    from orbite_sim import content as sim_content  # the guard windows as the runner writes them

    destination = f.requester if f.requester["operation"] == "read" else f.source
    seed = _round(destination, 1)["guard_seed"]
    for rnd in destination["rounds"]:
        rnd["guard_seed"] = seed
        for parent in rnd["parents"]:
            lead, trail = sim_content.guard_bytes(seed, parent["parent"])
            parent["guard_check"].update(leading_sha256=hashlib.sha256(lead).hexdigest(),
                                         trailing_sha256=hashlib.sha256(trail).hexdigest())


def writes_on_a_read(f):
    """A read profile done with RDMA WRITEs: the WR opcodes, the QPs and QP usage of both peers, and
    the observer's lines all say write (the top-level `operation` still echoes the profile)."""
    for ledger in f.ledgers.values():
        for qp in ledger["qps"]:
            qp["operation"] = "write"
        for rnd in ledger["rounds"]:
            for usage in rnd["qp_usage"]:
                usage["operation"] = "write"
            for wr in rnd["wrs"]:
                wr["opcode"] = "RDMA_WRITE"

    def change(event):
        if event["ev"] == "wr":
            event["opcode"] = "RDMA_WRITE"

    _observed(f, change)


def gid_not_the_inventorys(f):
    """Rail 0 runs on the link-local GID text under the IPv4 RoCE v2 GID's index (and the
    discovery candidate says the same)."""
    for ledger in f.ledgers.values():
        rail = ledger["rails"][0]
        link_local = "fe80" + rail["gid"][4:]
        rail["gid"] = link_local
        for candidate in ledger["discovery"]["candidates"]:
            if candidate["device"] == rail["device"]:
                candidate["gid"] = link_local


def gid_type_v1(f):
    """The requester's rail 1 is a RoCE v1 GID by its own account, at the RoCE v2 entry's index."""
    f.requester["rails"][1]["gid_type"] = "IB/RoCE v1"


def busy_polling_claims_events(f):
    """An events profile reaped by busy polling: no CQ arm, no event, in every round (the mode
    field still says events, the channels exist)."""
    for rnd in f.requester["rounds"]:
        rnd["progress"].update(cq_events=0, cq_arms=0, poll_calls=rnd["progress"]["poll_calls"] + 500)


def events_on_a_polling_profile(f):
    """A polling profile run with completion channels and armed CQs (the mode field says polling)."""
    for ledger in f.ledgers.values():
        for context in ledger["contexts"]:
            channel = f"ch-{context['rail']}"
            context["completion_channel"] = channel
            for cq in context["cqs"]:
                cq["channel"] = channel
    for rnd in f.requester["rounds"]:
        rnd["progress"].update(cq_events=3, cq_arms=4)


def teardown_retains_an_owner(f):
    """The requester's teardown keeps one owner (an Unquiesced close it marks `expected`)."""
    teardown = f.requester["teardown"]
    teardown["retained_owners"] = 1
    teardown["errors"].append({"error": "Unquiesced", "operation": "close", "round": None, "parent": None,
                               "remote_effect": "None", "locally_drained": False, "qps_created": 0,
                               "wrs_posted": 0, "bytes": 0, "expected": True, "message": "1 owner held"})


def teardown_unquiesced(f):
    """The source's teardown records Unquiesced (marked `expected`) yet claims 0 retained owners."""
    f.source["teardown"]["errors"].append(
        {"error": "Unquiesced", "operation": "close", "round": None, "parent": None, "remote_effect": "None",
         "locally_drained": True, "qps_created": 0, "wrs_posted": 0, "bytes": 0, "expected": True,
         "message": "quiesce timed out"})


def _renumber(events):
    for seq, event in enumerate(events):
        event["seq"] = seq


def locks_released_before_reaping(f):
    """The requester's supervisor released its locks before it reaped the runner (a supervisor
    defect: the journal is edited, every event still present, seq renumbered)."""
    events = f.journals["requester"]
    exit_at = next(i for i, e in enumerate(events) if e.get("ev") == "child_exit")
    releases = [e for e in events if e.get("ev") == "lock_release"]
    rest = [e for e in events if e.get("ev") != "lock_release"]
    events[:] = rest[:exit_at] + releases + rest[exit_at:]
    _renumber(events)
    f.touched.add("requester")


def child_started_before_locks(f):
    """The source's supervisor started the runner before it took its second lock and rechecked the
    node (a supervisor defect: the journal is edited)."""
    events = f.journals["source"]
    start = next(e for e in events if e.get("ev") == "child_start")
    events.remove(start)
    second = [i for i, e in enumerate(events) if e.get("ev") == "lock_acquire"][1]
    events.insert(second, start)
    _renumber(events)
    f.touched.add("source")


def event_after_the_close(f):
    """An event of a kind no rule reads appended to the source's journal after its close, numbered and timed
    as the supervisor would have (someone else wrote the journal after the supervisor finished)."""
    events = f.journals["source"]
    close = events[-1]
    assert close["ev"] == "journal_close"
    at = close["t"] + 0.25
    events.append({"seq": close["seq"] + 1, "ev": "x_status_note", "t": round(at, 6), "time": iso_time(at),
                   "note": "all good"})
    f.touched.add("source")


def source_qp_pairs_crossed(f):
    """The source's QPs of rail 0 and rail 1 are each paired with the requester's QP of the other
    rail; the source's parents sit on the matching (crossed) QPs."""
    q0, q1 = _qp_of(f.source, 0), _qp_of(f.source, 1)
    q0["peer_qpn"], q1["peer_qpn"] = q1["peer_qpn"], q0["peer_qpn"]
    swap = {q0["qpn"]: q1["qpn"], q1["qpn"]: q0["qpn"]}
    for rnd in f.source["rounds"]:
        for parent in rnd["parents"]:
            parent["qpn"] = swap[parent["qpn"]]


def source_one_qp_per_rail(f):
    """The source lists one QP per rail where the requester has two lanes on each: its rounds count
    the QPs it lists, its lane-1 parents sit on its lane-0 QP."""
    source = f.source
    lane0 = {qp["rail"]: qp["qpn"] for qp in source["qps"] if qp["lane"] == 0}
    source["qps"] = [qp for qp in source["qps"] if qp["lane"] == 0]
    for rnd in source["rounds"]:
        if rnd["round"] == 1:
            rnd["qps_created"] = len(source["qps"])
        else:
            rnd["qps_reused"] = len(source["qps"])
        rnd["qp_usage"] = [u for u in rnd["qp_usage"] if u["lane"] == 0]
        for parent in rnd["parents"]:
            parent["qpn"] = lane0[parent["rail"]]
    retotal(source)


def _swap_devices(lines):
    """The observer's view of WRs posted through the other rail's device: every `wr` line names it."""
    names = sorted({e["dev"] for e in lines[1:-1] if e.get("ev") == "wr"})
    other = dict(zip(names, reversed(names)))
    for event in lines[1:-1]:
        if event.get("ev") == "wr":
            event["dev"] = other[event["dev"]]


def rails_swapped_between_devices(f):
    """Both engines run rail 0 on the gate's rail-1 RNIC and rail 1 on its rail-0 RNIC (the right GID
    index on each), and say so: rails, contexts, NIC IDs, GIDs, netdevs, NUMA nodes follow the devices,
    and the observer saw each rail's WRs on the device the ledger names."""
    moved = ("device", "port", "gid_index", "gid", "gid_type", "netdev", "numa_node", "nic_id")
    for ledger in f.ledgers.values():
        first, second = ledger["rails"][0], ledger["rails"][1]
        for key in moved:
            first[key], second[key] = second[key], first[key]
        by_rail = {c["rail"]: c for c in ledger["contexts"]}
        by_rail[0]["device"], by_rail[1]["device"] = by_rail[1]["device"], by_rail[0]["device"]
    if f.accounting is not None:
        _swap_devices(f.accounting)


def rails_swapped_behind_pinned_rails(f):
    """The requester posts each rail's WRs through the other rail's RNIC while its ledger names the
    pinned rails: only the observer, which logs the device of each accepted WR, sees where they went."""
    _swap_devices(f.accounting)


def rail_on_another_gid(f):
    """The requester runs rail 0 on GID index 1 of the pinned device (RoCE v2 on the link-local
    address) instead of the pinned IPv4 one, and records that index and its GID."""
    rail = f.requester["rails"][0]
    rail.update(gid_index=1, gid="fe80" + rail["gid"][4:])


def told_rails(f, role, change):
    """Apply ``change(rails)`` to the rails of the case the role's supervisor journaled for its runner."""
    for event in (e for e in f.journals[role] if e.get("ev") == "child_start"):
        for pin in event.get("pinned") or []:
            if isinstance(pin.get("json"), dict) and "rails" in pin["json"]:
                pin["json"]["rails"] = change(pin["json"]["rails"])
    f.touched.add(role)


def gate_pins_the_rails_crossed(f):
    """The gate pins the source's rails the other way round (rail 0 on mlx5_1) and the runner ignores
    its case, running the usual order: the journaled case is the gate's defect (its journal edited)."""
    told_rails(f, "source", lambda rails: list(reversed(rails)))


# --- times: a journal's and a ledger's instants moved together (the lock rules read them) ----------------

_CLOCK_TICKS = 100  # USER_HZ: what /proc/<pid>/stat start times count in (the supervisors' start_time)


def _iso_shifted(text, delta):
    at = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
    return iso_time(at + delta)


def _shift_record(record, delta):
    """Every instant of a journal line (or a lock record in it) moved by ``delta`` s: Unix and ISO times, the
    lease's boot-clock deadline, process start times in clock ticks since boot."""
    for key, value in list(record.items()):
        if isinstance(value, dict):
            _shift_record(value, delta)
        elif key == "t":
            record["t"] = round(value + delta, 6)
            record["time"] = iso_time(record["t"])
        elif key.endswith("_at") and isinstance(value, str):
            record[key] = _iso_shifted(value, delta)
        elif key == "lease_expires" and isinstance(value, (int, float)):
            record[key] = round(value + delta, 3)
        elif key == "start_time" and isinstance(value, int) and value >= 0:
            record[key] = value + round(delta * _CLOCK_TICKS)


def _shift_ledger(ledger, delta):
    """Every instant a ledger states (docs/receipts.md: Unix times) moved by ``delta`` s, durations kept."""
    for record in [ledger, *ledger["rounds"]]:
        for key in ("started_at", "finished_at"):
            if isinstance(record.get(key), (int, float)):
                record[key] = record[key] + delta


def _sibling(files, case_id):
    """The journals of another case of the same run, as read (a defect never edits them)."""
    return {role: [json.loads(line) for line in (files.dir.parent / case_id / role / "journal.jsonl").read_text()
                   .splitlines() if line.strip()] for role in ROLES}


def _acquired(events, rnic):
    return next(e["t"] for e in events if e.get("ev") == "lock_acquire" and e.get("rnic") == rnic)


def _released(events, rnic):
    return next(e["t"] for e in events if e.get("ev") == "lock_release" and e.get("rnic") == rnic)


def lane_alias_locks_in_its_own_directory(f):
    """A lane alias of the source's machine (another inventory name, the same host name and boot ID) ran
    this case while case ra held the RNICs there: its supervisor locked them in a lock directory of its
    own, so its flocks never met ra's (previous state none). The whole case ran then: every instant of
    both journals (lock records, leases, process start times) and of both ledgers moved together, so the
    case agrees with itself; only ra's journals, another process's word, show the same mlx5_0 held."""
    other = _sibling(f, "ra")
    mine = f.journals
    # Begin just after ra's last lock was taken on either node, so this case's holds are the later ones.
    begin = max(_acquired(other[role], rnic) for role in ROLES for rnic in ("mlx5_0", "mlx5_1")) + 0.005
    delta = begin - min(line["t"] for role in ROLES for line in mine[role])
    for role in ROLES:
        for line in mine[role]:
            _shift_record(line, delta)
            if line.get("ev") == "supervisor_start":
                line["lock_dir"] = line["lock_dir"] + "-lane1"
            if line.get("ev") in ("lock_acquire", "lock_release"):
                line["path"] = line["path"].replace("/locks/", "/locks-lane1/")
            if line.get("ev") == "lock_acquire":
                line.update(previous_state="none", previous_owner=None, previous_owner_gone=None)
        _shift_ledger(f.ledgers[role], delta)
        f.touched.add(role)
    source = mine["source"]
    assert _acquired(source, "mlx5_0") < _released(other["source"], "mlx5_0"), "the holds do not overlap"


def runner_outlives_its_locks(f):
    """The requester's engine went on after the process its supervisor started exited (a worker it left
    behind): its ledger, written last, states times after the supervisor reaped the runner and released
    the locks. The ledger's instants move together (the rounds' durations kept); the journal is untouched."""
    events = f.journals["requester"]
    gone = max(_released(events, rnic) for rnic in ("mlx5_0", "mlx5_1"))
    _shift_ledger(f.requester, gone + 0.25 - f.requester["finished_at"])


@dataclass(frozen=True)
class Defect:
    case: str  # the clean case it starts from: ra (rail accounting, read, polling), ih (installed-host,
    #            write, events), rad (rail accounting with discovery: auto)
    code: str  # the one code that must fail
    issue_class: str  # "self-referential checks" or "facts nobody reads" (issue 12)
    edit: object
    writes: tuple = ()  # the roles whose journal this defect (the supervisor's or the gate's) edits
    # Clean cases run beside it, untouched (a defect across the cases of a run: locks.exclusive).
    beside: tuple = ()

    @property
    def what(self):
        return " ".join((self.edit.__doc__ or "").split())


SELF = "self-referential checks"
UNREAD = "facts nobody reads"

DEFECTS = {
    "native_wrs_split_per_rail": Defect("ra", "counters.wrs", SELF, native_wrs_split_per_rail),
    "extra_qp_never_used": Defect("ra", "qps.reuse", SELF, extra_qp_never_used),
    "qps_recreated_listed_as_round_one": Defect("ra", "qps.reuse", SELF, qps_recreated_listed_as_round_one),
    "source_one_qp_per_rail": Defect("ih", "qps.reuse", SELF, source_one_qp_per_rail),
    "completion_never_reaped": Defect("ra", "accounting.join", SELF, completion_never_reaped),
    "timeout_marked_expected": Defect("ra", "ledger.errors", SELF, timeout_marked_expected),
    "unquiesced_marked_expected": Defect("ih", "ledger.errors", SELF, unquiesced_marked_expected),
    "extra_observer_preloaded": Defect("ra", "journal.env", SELF, extra_observer_preloaded, writes=("requester",)),
    "observer_preloaded_into_the_source": Defect("ih", "journal.env", SELF, observer_preloaded_into_the_source,
                                                 writes=("source",)),
    "discovery_lists_ignored": Defect("rad", "discovery.lists", SELF, discovery_lists_ignored),
    "strict_pin_other_index": Defect("rad", "discovery.strict_pin", SELF, strict_pin_other_index),
    "slice_written_twice": Defect("ra", "counters.slicing", SELF, slice_written_twice),
    "slice_numbered_twice": Defect("ra", "counters.slicing", SELF, slice_numbered_twice),
    "wr_on_the_other_rail": Defect("ra", "counters.placement", SELF, wr_on_the_other_rail),
    "parents_swap_rails": Defect("ih", "counters.placement", SELF, parents_swap_rails),
    "public_and_native_shifted": Defect("ih", "counters.placement", SELF, public_and_native_shifted),
    "source_served_from_the_other_rail": Defect("ra", "counters.source", UNREAD, source_served_from_the_other_rail),
    "source_received_shifted": Defect("ih", "counters.source", UNREAD, source_received_shifted),
    "grant_never_returned": Defect("ih", "ledger.drain", SELF, grant_never_returned),
    "batch_never_freed": Defect("ra", "ledger.drain", UNREAD, batch_never_freed),
    "guard_seed_reused_read": Defect("ra", "ledger.guard_content", UNREAD, guard_seed_reused),
    "guard_seed_reused_write": Defect("ih", "ledger.guard_content", UNREAD, guard_seed_reused),
    "writes_on_a_read": Defect("ra", "counters.opcodes", UNREAD, writes_on_a_read),
    "gid_not_the_inventorys": Defect("rad", "discovery.gids", UNREAD, gid_not_the_inventorys),
    "gid_type_v1": Defect("rad", "discovery.gids", UNREAD, gid_type_v1),
    "busy_polling_claims_events": Defect("ih", "progress.mode", UNREAD, busy_polling_claims_events),
    "events_on_a_polling_profile": Defect("ra", "progress.mode", UNREAD, events_on_a_polling_profile),
    "teardown_retains_an_owner": Defect("ra", "teardown.clean", UNREAD, teardown_retains_an_owner),
    "teardown_unquiesced": Defect("ih", "teardown.clean", UNREAD, teardown_unquiesced),
    "guards_halved": Defect("ra", "layout.regions", UNREAD, guards_halved),
    "regions_without_guards_between": Defect("ih", "layout.regions", UNREAD, regions_without_guards_between),
    "locks_released_before_reaping": Defect("ra", "journal.order", UNREAD, locks_released_before_reaping,
                                            writes=("requester",)),
    "child_started_before_locks": Defect("ih", "journal.order", UNREAD, child_started_before_locks,
                                         writes=("source",)),
    "source_qp_pairs_crossed": Defect("ra", "qps.peers", UNREAD, source_qp_pairs_crossed),
    "event_after_the_close": Defect("ra", "journal.order", UNREAD, event_after_the_close, writes=("source",)),
    "rails_swapped_between_devices": Defect("ra", "rails.pinned", UNREAD, rails_swapped_between_devices),
    "rails_swapped_behind_pinned_rails": Defect("ra", "rails.pinned", UNREAD, rails_swapped_behind_pinned_rails),
    "rail_on_another_gid": Defect("ih", "rails.pinned", UNREAD, rail_on_another_gid),
    "gate_pins_the_rails_crossed": Defect("ih", "rails.pinned", UNREAD, gate_pins_the_rails_crossed,
                                          writes=("source",)),
    "lane_alias_locks_in_its_own_directory": Defect("ih", "locks.exclusive", UNREAD,
                                                    lane_alias_locks_in_its_own_directory,
                                                    writes=("requester", "source"), beside=("ra",)),
    "runner_outlives_its_locks": Defect("ih", "locks.exclusive", UNREAD, runner_outlives_its_locks),
}


def naive_disagreements(files):
    """Where the receipts the engine writes disagree among themselves, as the pre-issue-12 checks
    compared them: the lists against the counters and totals, the QP list against the per-round
    QP counts, the observer's lines and summary against the ledger. A consistent defect leaves none."""
    found = []
    for role, ledger in files.ledgers.items():
        rounds = ledger["rounds"]
        live = [qp for qp in ledger["qps"] if qp["created_round"] == 1]
        for rnd in rounds:
            native, public = rnd["counters"]["native"], rnd["counters"]["public"]
            if role == "requester":
                ok = [wr for wr in rnd["wrs"] if wr["status"] == SUCCESS]
                if (native["wrs"], native["cqes"]) != (len(rnd["wrs"]), len(ok)):
                    found.append(f"{role} round {rnd['round']}: native WRs/CQEs vs the WR list")
                if native["bytes"] != public["bytes"] or {k: v["bytes"] for k, v in native["per_rail"].items()} != \
                        public["per_rail"]:
                    found.append(f"{role} round {rnd['round']}: native vs public bytes")
            if role == "requester":
                public_of = sum(p["completed_bytes"] for p in rnd["parents"] if p["status"] == "Completed")
            else:  # the source's public bytes are what its devices moved
                public_of = sum(figures[source_moved(ledger)] for figures in rnd["device"].values())
                if any(rnd["provider"][k] != sum(d[k] for d in rnd["device"].values()) for k in rnd["device"]["0"]):
                    found.append(f"{role} round {rnd['round']}: provider totals vs the device counters")
            if public["bytes"] != public_of or sum(public["per_rail"].values()) != public["bytes"]:
                found.append(f"{role} round {rnd['round']}: public bytes vs the parents (source: its devices)")
            drain = rnd["drain"]
            granted = drain.get("grants_returned", drain.get("grants_released"))
            held = {p["parent"] for p in rnd["parents"]} - set(granted) if role == "source" else set()
            if drain["debt_grants"] != 0 or any(p["status"] == "Released" for p in rnd["parents"]
                                                if p["parent"] in held):
                found.append(f"{role} round {rnd['round']}: grant debt vs its own lists")
            created = len(live) if rnd["round"] == 1 else 0
            if rnd["qps_created"] != created or (rnd["round"] > 1 and rnd["qps_reused"] != len(live)):
                found.append(f"{role} round {rnd['round']}: QP counts vs the QP list")
        totals = ledger["totals"]
        sums = {"wrs_posted": sum(r["counters"]["native"]["wrs"] for r in rounds),
                "cqes": sum(r["counters"]["native"]["cqes"] for r in rounds),
                "public_bytes": sum(r["counters"]["public"]["bytes"] for r in rounds),
                "native_bytes": sum(r["counters"]["native"]["bytes"] for r in rounds),
                "qps_created": len(ledger["qps"]),
                "provider": {k: sum(r["provider"][k] for r in rounds) for k in ledger["totals"]["provider"]}}
        found += [f"{role}: totals.{k}" for k, v in sums.items() if totals.get(k) != v]
    lines = files.accounting
    if lines is not None:
        listed = {(wr["qpn"], wr["wr_id"]): wr for rnd in files.requester["rounds"] for wr in rnd["wrs"]}
        seen = {(e["qpn"], e["wr_id"]): e for e in lines[1:-1] if e["ev"] == "wr"}
        if set(seen) != set(listed) or any((listed[k]["bytes"], listed[k]["opcode"]) != (e["bytes"], e["opcode"])
                                           for k, e in seen.items() if k in listed):
            found.append("observer WRs vs the ledger's")
        if resummarize(lines, files.requester)[-1] != lines[-1]:
            found.append("observer summary vs its lines")
    return found


def noop_rewrite(case_dir):
    """Rewrite every receipt without changing a fact: keys in reverse order, re-indented, an unknown
    field added to every document and log line (a binary observer log: to its header line)."""
    for path in sorted(Path(case_dir).rglob("*.json")):
        data = reorder(json.loads(path.read_text()))
        data["x_unknown"] = {"by": "a no-op rewrite", "nested": [1, {"deep": None}]}
        path.write_text(json.dumps(data, indent=3) + "\n")
    for path in sorted(Path(case_dir).rglob("*.jsonl")):
        lines = [reorder(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
        path.write_text("".join(json.dumps(dict(line, x_unknown="]}{"), separators=(" , ", " : ")) + "\n"
                                for line in lines))
    for path in sorted(Path(case_dir).rglob("*.bin")):  # a binary observer log: its JSON header line
        header, body = path.read_bytes().split(b"\n", 1)
        header = dict(reorder(json.loads(header)), x_unknown="]}{")
        path.write_bytes(json.dumps(header, separators=(" , ", " : ")).encode() + b"\n" + body)


def apply(name, case_dir):
    """Apply the defect ``name`` to the case directory in place."""
    files = CaseFiles(case_dir)
    DEFECTS[name].edit(files)
    sync_landed(files)
    files.save()
    return files


def renormalize(case_dir):
    """No defect: recount every derived figure and resummarize the observer, as the helpers above do
    after a defect. On a clean case this changes no fact (a test holds it to that)."""
    files = CaseFiles(case_dir)
    recount_requester(files.requester)
    recount_source(files.source)
    if files.accounting is not None:
        files.accounting = resummarize(files.accounting, files.requester)
    sync_landed(files)
    files.save()
    return files
