# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""QP rules: how many QPs each peer creates, and how it reuses and fills them."""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from itertools import compress, count, repeat
from operator import eq, is_not, sub

from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import (
    MAX_PROBLEMS_SHOWN,
    each_ledger,
    rounds,
)


@rule("qps.bound", "qps",
      "QPs live within num_lanes per context/operation and rails x lanes per peer",
      witness=("profile",))
def check_qp_bound(case):
    """QPs live in a round: at most num_lanes per rail (context) and operation, rails x lanes per
    peer. (Creating QPs again instead of reusing them is qps.reuse.)"""
    problems = []
    lanes, bound = case.workload["qps_per_context_operation"], case.workload["qp_bound_per_peer_operation"]
    for role, generation, rnd, where in rounds(case):
        per_context = defaultdict(int)
        for usage in rnd["qp_usage"]:
            per_context[(usage["rail"], usage.get("operation"))] += 1
        over = {f"rail {r}/{o}": n for (r, o), n in per_context.items() if n > lanes}
        if over or len(rnd["qp_usage"]) > bound:
            problems.append(
                (
                    f"{role} g{generation} round {rnd['round']}: {len(rnd['qp_usage'])} QPs live (bound {bound}); "
                    f"over {lanes} per context and operation: {over}",
                    f"{where}.qp_usage",
                )
            )
    return problems


@rule("qps.reuse", "qps",
      "rails x num_lanes QPs per peer, created once in round 1 and reused after; every WR on one of them",
      witness=("profile",), after=("qps.bound",))
def check_qp_reuse(case):
    """The derived QPs (enabled rails x num_lanes) are created in round 1, none later, and reused
    in rounds 2 and 3: the ledger's QP list and its per-round counts are held to that figure, not
    to each other (a ledger that lists an extra QP also counts it)."""
    problems = []
    want = case.workload["qp_bound_per_peer_operation"]
    # installed-inflight-dma: the fresh QP of the rounds after the interrupted one is inflight_dma.survival's.
    last = case.workload["rounds_per_generation"] if case.profile["mode"] == "installed-inflight-dma" else None
    for role, generation, ledger, path in each_ledger(case):
        first = [qp["qpn"] for qp in ledger["qps"] if qp["created_round"] == 1]
        late = [qp["qpn"] for qp in ledger["qps"] if qp["created_round"] != 1
                and not (last and isinstance(qp["created_round"], int) and qp["created_round"] > last)]
        if late or len(first) != want:
            problems.append((f"{role} g{generation}: {len(first)} QPs created in round 1 (expected {want}), "
                             f"created later: {late[:MAX_PROBLEMS_SHOWN]}", f"{path}#qps",
                             {"expected": {"created in round 1": want, "created later": []},
                              "observed": {"created in round 1": len(first),
                                           "created later": late[:MAX_PROBLEMS_SHOWN]}}))
        live = set(first)
        for index, rnd in enumerate(ledger["rounds"]):
            created, reused = (want, 0) if rnd["round"] == 1 else (0, want)
            if (rnd["qps_created"], rnd["qps_reused"]) != (created, reused):
                problems.append(
                    (
                        f"{role} g{generation} round {rnd['round']}: {rnd['qps_created']} QPs created, "
                        f"{rnd['qps_reused']} reused (expected {created} created, {reused} reused)",
                        f"{path}#rounds[{index}]",
                        {"expected": {"qps_created": created, "qps_reused": reused},
                         "observed": {"qps_created": rnd["qps_created"], "qps_reused": rnd["qps_reused"]}},
                    )
                )
            used = set(rnd["wrs"]["qpn"]) | {p["qpn"] for p in rnd["parents"] if "qpn" in p}
            stray = sorted(used - live, key=str)
            if stray:
                problems.append(
                    (
                        f"{role} g{generation} round {rnd['round']}: parents or WRs on QPs not created once in "
                        f"round 1: {stray[:MAX_PROBLEMS_SHOWN]}",
                        f"{path}#rounds[{index}]",
                    )
                )
    return problems


@rule("qps.sq_depth", "qps", "at most eight payload WRs in flight per QP", witness=("profile",))
def check_sq_depth(case):
    problems = []
    depth = case.workload["send_queue_depth"]
    for role, generation, ledger, path in each_ledger(case):
        for qp in ledger["qps"]:
            if qp["max_send_wr"] > depth:
                problems.append(
                    (f"{role} g{generation} QP {qp['qpn']}: max_send_wr {qp['max_send_wr']} > {depth}", f"{path}#qps",
                     {"expected": f"<= {depth}", "observed": qp["max_send_wr"]})
                )
        for index, rnd in enumerate(ledger["rounds"]):
            for usage in rnd["qp_usage"]:
                if usage["max_inflight_wrs"] > depth:
                    problems.append(
                        (
                            f"{role} g{generation} round {rnd['round']} QP {usage['qpn']}: "
                            f"{usage['max_inflight_wrs']} payload WRs in flight > {depth}",
                            f"{path}#rounds[{index}].qp_usage",
                            {"expected": f"<= {depth}", "observed": usage["max_inflight_wrs"]},
                        )
                    )
    return problems


def _in_flight_by_order(columns):
    """{qpn: most payload WRs in flight at once} of one round's WR columns, replayed from the engine's own
    process-wide order of posts and reaped completions (``posted_seq``, ``completed_seq``; a WR never
    completed stays in flight). The most is reached right after a post: the k-th post of a QP has k
    posted and, in flight, all but the QP's completions reaped before it (a bisection, in C)."""
    qpns, posted, completed = columns["qpn"], columns["posted_seq"], columns["completed_seq"]
    most = {}
    for qpn in set(qpns):
        mine = bytes(map(eq, qpns, repeat(qpn)))
        posts = sorted(compress(posted, mine))
        done = list(compress(completed, mine))
        done = sorted(compress(done, map(is_not, done, repeat(None))))
        most[qpn] = max(map(sub, count(1), map(bisect_left, repeat(done), posts)), default=0)
    return most


@applies("installed-host (no observer runs: the accounting observer's accounting.sq_depth sees the depth elsewhere)")
def unobserved_rounds(profile, workload):
    return profile["mode"] == "installed-host" and not any(o["tool"] == "accounting" for o in workload["observers"])


@rule("qps.inflight_order", "qps",
      "per round and QP, the payload WRs in flight at once, replayed from the requester's own order of posts and "
      "completions (`posted_seq`, `completed_seq`), are at most eight and the maximum the engine states "
      "(`qp_usage` `max_inflight_wrs`)",
      witness=("profile", "runner"), applies=unobserved_rounds, after=("qps.sq_depth",))
def check_inflight_order(case):
    """Where no observer runs (installed-host) the engine's stated maximum is its word alone: it is
    recomputed from the order it recorded, which a send queue deeper than stated shows."""
    problems = []
    depth = case.workload["send_queue_depth"]
    for _role, generation, rnd, where in rounds(case, ("requester",)):
        replayed = _in_flight_by_order(rnd["wrs"])
        stated = {u["qpn"]: u["max_inflight_wrs"] for u in rnd["qp_usage"]}
        over = {qpn: most for qpn, most in replayed.items() if most > depth}
        differing = {qpn: (stated.get(qpn), most) for qpn, most in replayed.items() if stated.get(qpn) != most}
        if over or differing:
            problems.append((f"requester g{generation} round {rnd['round']}: replayed from its post and completion "
                             f"order, payload WRs in flight over {depth}: {over}; stated vs replayed: "
                             f"{dict(list(differing.items())[:MAX_PROBLEMS_SHOWN])}", f"{where}.wrs",
                             {"expected": f"<= {depth} per QP, as stated", "observed": over or differing}))
    return problems


@rule("qps.peers", "qps",
      "every QP is connected to exactly one QP of the peer, of the same rail, lane and operation, as the peer "
      "lists it; each parent on the peer QP of the requester's",
      witness=("peer",), after=("ledger.rounds", "qps.bound", "qps.reuse"))
def check_qp_peers(case):
    """Each peer lists its own side of every connection (docs/receipts.md 1.5): the requester's
    QPs and the source's pair one to one by qpn/peer_qpn, on the same rail, lane and operation,
    and the source's parents sit on the peer of the requester parent's QP."""
    problems = []
    for generation in case.generations():
        requester, source = case.ledger("requester", generation), case.ledger("source", generation)
        path = case.ledger_path("source", generation)
        mine = {qp["qpn"]: qp for qp in requester["qps"]}
        theirs = {qp["qpn"]: qp for qp in source["qps"]}
        unpaired = []
        for qpn, qp in mine.items():
            peer = theirs.get(qp.get("peer_qpn"))
            same = peer is not None and peer.get("peer_qpn") == qpn and all(
                peer.get(k) == qp.get(k) for k in ("rail", "lane", "operation"))
            if not same:
                unpaired.append(qpn)
        paired = {qp.get("peer_qpn") for qp in mine.values()}
        unpaired += [f"source {qpn}" for qpn in theirs if qpn not in paired]
        if unpaired or len(mine) != len(theirs):
            problems.append((f"g{generation}: {len(mine)} requester QPs and {len(theirs)} source QPs; not paired one "
                             f"to one on the same rail, lane and operation: {unpaired[:MAX_PROBLEMS_SHOWN]}",
                             f"{path}#qps"))
            continue
        peer_of = {qpn: qp.get("peer_qpn") for qpn, qp in mine.items()}
        for index, rnd in enumerate(source["rounds"]):
            mates = [r for r in requester["rounds"] if r["round"] == rnd["round"]]
            wanted = {p["parent"]: peer_of.get(p.get("qpn")) for p in (mates[0]["parents"] if mates else [])}
            wrong = [p["parent"] for p in rnd["parents"] if wanted.get(p["parent"]) != p.get("qpn")]
            if wrong:
                problems.append((f"g{generation} round {rnd['round']}: source parents {wrong[:MAX_PROBLEMS_SHOWN]} "
                                 "are not on the peer of the requester's QP", f"{path}#rounds[{index}].parents"))
    return problems
