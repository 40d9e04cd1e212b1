# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Counter rules: the WRs, bytes and counters of both peers, against the derived workload.

Every expected figure is derived from the profile (``derive_workload``, ``slice_sizes``, the
placement of docs/runner-contract.md §4) or read from the peer's ledger; none from the ledger
under test. The figures a ledger states about itself (its WR list against its own totals) agree
in a consistent defect, so they are never held against each other alone.
"""

from __future__ import annotations

from collections import Counter
from itertools import compress, repeat
from operator import add, eq, itemgetter, mul

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import (
    MAX_PROBLEMS_SHOWN,
    enabled_rails,
    rounds,
    wr_rows,
)

OPCODES = {"read": "RDMA_READ", "write": "RDMA_WRITE"}


def _runs(sizes):
    return ", ".join(f"{r['count']} x {r['bytes']}" for r in model._compress(sizes)) if sizes else "none"


def _placement(case):
    """parent -> (rail, lane) of the documented placement."""
    return {e["parent"]: (e["rail"], e["lane"]) for e in case.workload["placement"]}


def _peer_round(case, role, generation, number):
    """The round ``number`` of the other role's ledger, or None."""
    other = "source" if role == "requester" else "requester"
    for rnd in case.ledger(other, generation)["rounds"]:
        if rnd.get("round") == number:
            return rnd
    return None


def _region_offsets(rnd):
    return {p["parent"]: p.get("region_offset") for p in rnd["parents"]}


def _per_rail(figures, field=None):
    """{rail int: value} of a per_rail object keyed by decimal text (a nested field or a plain value)."""
    out = {}
    for key, value in (figures or {}).items():
        out[int(key) if str(key).isdigit() else key] = value.get(field) if field and isinstance(value, dict) else value
    return out


@rule("counters.slicing", "counters",
      "the derived WRs a round; each parent cut into the derived slices, each slice posted exactly once at its "
      "offset in the parent's region and in the peer's",
      witness=("profile", "peer"), after=("ledger.rounds",))
def check_slicing(case):
    """The derived number of payload WRs a round, and each parent cut into the derived slices: slice
    s of every parent exactly once, of its derived size, at s x block into the parent's region on
    this side (local) and on the peer's side (remote, from the peer's ledger)."""
    problems = []
    profile = case.profile
    sizes = model.expand_runs(case.workload["slice_sizes"])
    block, expected = profile["block"], case.workload["wrs_per_round"]
    for role, generation, rnd, where in rounds(case, ("requester",)):
        label = f"g{generation} round {rnd['round']}"
        wrs = rnd["wrs"]
        if len(wrs["wr_id"]) != expected:
            problems.append((f"{label}: {len(wrs['wr_id'])} payload WRs, expected {expected} "
                             f"({profile['parents']} parents x {len(sizes)} slices)", f"{where}.wrs",
                             {"expected": expected, "observed": len(wrs["wr_id"])}))
        local = _region_offsets(rnd)
        peer = _peer_round(case, role, generation, rnd["round"])
        remote = _region_offsets(peer) if peer else {}
        if _sliced_as_derived(wrs, profile["parents"], sizes, block, local, remote):
            continue
        stray = sorted(set(wrs["parent"]).difference(range(profile["parents"])))
        if stray:
            problems.append((f"{label}: WRs of parents {stray[:MAX_PROBLEMS_SHOWN]} the profile does not have",
                             f"{where}.wrs"))
        positions = range(len(wrs["parent"]))
        for parent in range(profile["parents"]):  # only when something is wrong: the first parent that shows it
            mine = list(compress(positions, map(eq, wrs["parent"], repeat(parent))))
            found = _parent_slicing(wrs, mine, sizes, block, local.get(parent), remote.get(parent))
            if found:
                message, figures = found
                problems.append((f"{label} parent {parent}: {message}", f"{where}.wrs", figures))
                break  # one parent names the fault; the others usually repeat it
    return problems


def _sliced_as_derived(wrs, parents, sizes, block, local, remote):
    """True when every parent's slices are each listed exactly once, of their derived size, at their
    offsets on both sides: whole-column comparisons (the common case; any doubt takes the walk)."""
    parent_col, slice_col, count = wrs["parent"], wrs["slice"], len(sizes)
    if len(parent_col) != parents * count or not parent_col:
        return False
    if min(parent_col) < 0 or max(parent_col) >= parents or min(slice_col) < 0 or max(slice_col) >= count:
        return False
    keys = set(map(add, map(mul, parent_col, repeat(count)), slice_col))
    if len(keys) != len(parent_col):  # a (parent, slice) twice, so another never
        return False
    if None in (local.get(p) for p in range(parents)) or None in (remote.get(p) for p in range(parents)):
        return False
    steps = list(map(mul, slice_col, repeat(block)))
    return (list(map(sizes.__getitem__, slice_col)) == wrs["bytes"]
            and list(map(add, map(local.__getitem__, parent_col), steps)) == wrs["local_offset"]
            and list(map(add, map(remote.__getitem__, parent_col), steps)) == wrs["remote_offset"])


def _parent_slicing(wrs, mine, sizes, block, local, remote):
    """What is wrong with one parent's WRs (``mine``: their indices in the round's WR columns): (message,
    {"expected", "observed"}), or None."""
    numbers = list(map(wrs["slice"].__getitem__, mine))
    if sorted(numbers) != list(range(len(sizes))):
        seen = sorted(set(numbers))
        twice = sorted(number for number, many in Counter(numbers).items() if many > 1)
        got = list(map(wrs["bytes"].__getitem__, mine))
        return (f"{len(numbers)} slices {_first(seen)} (twice: {_first(twice)}) of {_runs(got)}, expected each "
                f"of 0..{len(sizes) - 1} exactly once, {_runs(sizes)}",
                {"expected": {"slices": list(range(len(sizes))), "bytes": _runs(sizes)},
                 "observed": {"slices": sorted(numbers), "bytes": _runs(got)}})
    for wr in sorted(wr_rows(wrs, mine, ("wr_id", "slice", "bytes", "local_offset", "remote_offset")),
                     key=itemgetter("slice")):
        number = wr["slice"]
        want = {"bytes": sizes[number],
                "local_offset": None if local is None else local + number * block,
                "remote_offset": None if remote is None else remote + number * block}
        got = {key: wr.get(key) for key in want}
        if got != want:
            return (f"slice {number} (wr_id {wr['wr_id']}) is {got}, expected {want} (the parent's regions + s x "
                    "block)", {"expected": want, "observed": got})
    return None


def _first(numbers):
    """A list of numbers as text, the first few of a long one."""
    shown = numbers[:2 * MAX_PROBLEMS_SHOWN]
    return f"{shown}" if len(shown) == len(numbers) else f"{str(shown)[:-1]}, ... ({len(numbers)})]"


@rule("counters.bytes", "counters", "public bytes per round equal the derived workload", witness=("profile",))
def check_byte_count(case):
    """Public bytes and the bytes of the listed WRs equal the derived workload (native bytes are
    held against it by counters.native_public)."""
    problems = []
    expected = case.workload["bytes_per_round"]
    for _role, generation, rnd, where in rounds(case, ("requester",)):
        figures = {"public": rnd["counters"]["public"]["bytes"], "listed WRs": sum(rnd["wrs"]["bytes"])}
        wrong = {k: v for k, v in figures.items() if v != expected}
        if wrong:
            problems.append((f"g{generation} round {rnd['round']}: bytes {wrong}, expected {expected}", where,
                             {"expected": expected, "observed": figures}))
    return problems


@rule("counters.rails", "counters", "payload on every enabled rail and on no disabled rail", witness=("profile",))
def check_rails_used(case):
    problems = []
    enabled = enabled_rails(case)
    for _role, generation, rnd, where in rounds(case, ("requester",)):
        rail_col, sizes = rnd["wrs"]["rail"], rnd["wrs"]["bytes"]
        used = {rail: sum(compress(sizes, map(eq, rail_col, repeat(rail)))) for rail in set(rail_col)}
        idle = sorted(r for r in enabled if not used.get(r))
        stray = sorted(r for r in used if r not in enabled)
        if idle or stray:
            problems.append(
                (
                    f"g{generation} round {rnd['round']}: enabled rails without payload {idle}, "
                    f"payload on disabled rails {stray}",
                    f"{where}.wrs",
                )
            )
    return problems


@rule("counters.placement", "counters",
      "every parent on its documented rail and lane (both peers), every WR on its parent's, and the public bytes "
      "per rail those of the placement",
      witness=("profile",), after=("counters.slicing", "counters.rails"))
def check_placement(case):
    """Parent p on rail rails[p % R], lane (p // R) % lanes (docs/runner-contract.md §4) on both
    peers; each WR on the rail, lane and QP of its parent; the requester's public bytes per rail
    recomputed from the parents under that placement (``derive_workload``'s ``per_rail``; the
    source's counters are counters.source's)."""
    problems = []
    placement = _placement(case)
    per_rail = {int(r): figures["bytes"] for r, figures in case.workload["per_rail"].items()}
    for role, generation, rnd, where in rounds(case):
        label = f"{role} g{generation} round {rnd['round']}"
        misplaced = [(p["parent"], (p["rail"], p.get("lane")), placement.get(p["parent"])) for p in rnd["parents"]
                     if (p["rail"], p.get("lane")) != placement.get(p["parent"])]
        if misplaced:
            shown = misplaced[:MAX_PROBLEMS_SHOWN]
            problems.append((f"{label}: parents (parent, rail/lane, documented) {shown}", f"{where}.parents",
                             {"expected": {str(p): documented for p, _at, documented in shown},
                              "observed": {str(p): at for p, at, _documented in shown}}))
            continue
        qpn_of = {p["parent"]: p.get("qpn") for p in rnd["parents"]}
        wrs = rnd["wrs"]
        wanted = {"rail": {p: at[0] for p, at in placement.items()}, "lane": {p: at[1] for p, at in placement.items()},
                  "qpn": qpn_of}
        astray = []
        if any(list(map(want.get, wrs["parent"])) != wrs[name] for name, want in wanted.items()):
            astray = [wrs["wr_id"][i] for i, wr in enumerate(zip(wrs["rail"], wrs["lane"], wrs["qpn"], wrs["parent"]))
                      if wr[:2] != placement.get(wr[3]) or wr[2] != qpn_of.get(wr[3])]
        if astray:
            problems.append((f"{label}: WRs {astray[:MAX_PROBLEMS_SHOWN]} not on their parent's rail, lane and QP",
                             f"{where}.wrs"))
        public = _per_rail(rnd["counters"]["public"]["per_rail"])
        if role == "requester" and public != per_rail:  # the source's counters: counters.source
            problems.append((f"{label}: public bytes per rail {public}, the placement gives {per_rail}",
                             f"{where}.counters.public", {"expected": per_rail, "observed": public}))
    return problems


@rule("counters.wrs", "counters",
      "the native WR and CQE counters and the successful completions are the derived WRs, in all and per rail",
      witness=("profile",), after=("counters.slicing", "counters.rails", "counters.placement"))
def check_wr_count(case):
    """The native WR and CQE counters, in all and per rail, and the WRs listed with a successful
    completion equal the derived figures (WRs a round, and per rail under the placement)."""
    problems = []
    expected = case.workload["wrs_per_round"]
    per_rail = {int(r): figures["wrs"] for r, figures in case.workload["per_rail"].items()}
    for _role, generation, rnd, where in rounds(case, ("requester",)):
        native = rnd["counters"]["native"]
        figures = {
            "native WRs": native["wrs"],
            "native CQEs": native["cqes"],
            "successful completions listed": rnd["wrs"]["status"].count("SUCCESS"),
        }
        wrong = {k: v for k, v in figures.items() if v != expected}
        rails = {"WRs": _per_rail(native["per_rail"], "wrs"), "CQEs": _per_rail(native["per_rail"], "cqes")}
        wrong.update({f"native {k} per rail": v for k, v in rails.items() if v != per_rail})
        if wrong:
            problems.append((f"g{generation} round {rnd['round']}: {wrong}, expected {expected} "
                             f"({per_rail} per rail)", f"{where}.counters.native",
                             {"expected": {"wrs": expected, "per_rail": per_rail}, "observed": wrong}))
    return problems


@rule("counters.native_public", "counters",
      "native bytes equal the derived bytes, in all and on every rail of the placement",
      witness=("profile",), after=("counters.bytes", "counters.rails", "counters.placement"))
def check_native_equals_public(case):
    """The verbs layer's byte counters, in all and per rail, equal the bytes derived from the
    parents and the placement (what the public counters must also say: counters.bytes/.placement)."""
    problems = []
    expected = case.workload["bytes_per_round"]
    per_rail = {int(r): figures["bytes"] for r, figures in case.workload["per_rail"].items()}
    for _role, generation, rnd, where in rounds(case, ("requester",)):
        native = rnd["counters"]["native"]
        got = _per_rail(native["per_rail"], "bytes")
        if native["bytes"] != expected or got != per_rail:
            problems.append((f"g{generation} round {rnd['round']}: native {native['bytes']} B, per rail {got}; "
                             f"derived {expected} B, per rail {per_rail}", f"{where}.counters.native",
                             {"expected": {"bytes": expected, "per_rail": per_rail},
                              "observed": {"bytes": native["bytes"], "per_rail": got}}))
    return problems


@rule("counters.opcodes", "counters",
      "every QP, QP usage and payload WR is of the profile's operation (RDMA_READ or RDMA_WRITE)",
      witness=("profile",))
def check_opcodes(case):
    problems = []
    operation = case.profile["operation"]
    opcode = OPCODES[operation]
    for role, generation, ledger, path in ((r, g, case.ledger(r, g), case.ledger_path(r, g))
                                           for g in case.generations() for r in ("source", "requester")):
        wrong_qps = [qp["qpn"] for qp in ledger["qps"] if qp["operation"] != operation]
        if wrong_qps:
            problems.append((f"{role} g{generation}: QPs {wrong_qps[:MAX_PROBLEMS_SHOWN]} are not for {operation}",
                             f"{path}#qps"))
        for index, rnd in enumerate(ledger["rounds"]):
            usage = [u["qpn"] for u in rnd["qp_usage"] if u.get("operation") != operation]
            wrs = sorted(set(rnd["wrs"]["opcode"]) - {opcode})
            if usage or wrs:
                problems.append((f"{role} g{generation} round {rnd['round']}: opcodes {wrs} and QP usage of "
                                 f"QPs {usage[:MAX_PROBLEMS_SHOWN]} are not the profile's {opcode}",
                                 f"{path}#rounds[{index}]"))
    return problems


# What a role's own device counts for the profile's operation (the provider's per-context counters,
# the round's ``device``; docs/receipts.md section 1.6).
DEVICE_BYTES = {
    ("requester", "read"): "read_bytes_landed",
    ("source", "read"): "read_bytes_served",
    ("requester", "write"): "write_bytes_sent",
    ("source", "write"): "write_bytes_landed",
}


def device_bytes(rnd, role, operation):
    """{rail int: bytes} the role's own devices moved in the round, or a text saying why it cannot be read."""
    device, counter = rnd.get("device"), DEVICE_BYTES[(role, operation)]
    if not isinstance(device, dict):
        return f"`device` is {device!r}, expected an object of the provider's counters per rail"
    out = {}
    for key, figures in device.items():
        value = figures.get(counter) if isinstance(figures, dict) else None
        if not str(key).isdigit() or isinstance(value, bool) or not isinstance(value, int):
            return f"`device.{key}.{counter}` is {value!r}, expected a byte count under a rail key"
        out[int(key)] = value
    return out


@rule("counters.source", "counters",
      "the source's own devices served (read) or received (write) per round and per rail the derived bytes, as the "
      "requester completed them, and its public counters say so",
      witness=("provider", "profile", "peer"), needs=("ledgers", "provider"),
      after=("ledger.rounds", "ledger.parents", "counters.slicing", "counters.bytes", "counters.rails",
             "counters.placement"))
def check_source_counters(case):
    """The source's figures are its own: what the verbs provider moved through each of its rail's contexts
    (the round's ``device``, counted by the provider per device, never learnt from a message), which
    must be the derived bytes per rail (none on a disabled rail); the requester's per-rail figures (its
    public counters and its own devices') must be the same, and the source's public counters must
    say what its devices moved. A source's ledger holds no per-parent byte figure (a one-sided
    operation leaves none there): the requester's word relayed would prove nothing."""
    problems = []
    operation = case.profile["operation"]
    per_rail = {int(r): figures["bytes"] for r, figures in case.workload["per_rail"].items()}
    for role, generation, rnd, where in rounds(case, ("source",)):
        label = f"g{generation} round {rnd['round']}"
        served = device_bytes(rnd, role, operation)
        if isinstance(served, str):
            problems.append((f"source {label}: {served}", f"{where}.device"))
            continue
        moved = {rail: nbytes for rail, nbytes in served.items() if nbytes or rail in per_rail}
        peer = _peer_round(case, role, generation, rnd["round"])
        figures = {"the source's devices": moved, "the source's public counters": _per_rail(
            rnd["counters"]["public"]["per_rail"])}
        if peer is not None:
            figures["the requester's public counters"] = _per_rail(peer["counters"]["public"]["per_rail"])
            mine = device_bytes(peer, "requester", operation)
            figures["the requester's devices"] = mine if isinstance(mine, str) else {
                rail: nbytes for rail, nbytes in mine.items() if nbytes or rail in per_rail}
        wrong = {k: v for k, v in figures.items() if v != per_rail}
        if wrong:
            problems.append((f"source {label}: bytes per rail {wrong}; the placement gives {per_rail} "
                             f"({DEVICE_BYTES[(role, operation)]} per rail of the source)", f"{where}.device",
                             {"expected": per_rail, "observed": wrong}))
    return problems
