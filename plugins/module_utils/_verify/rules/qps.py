# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""QP rules: how many QPs each peer creates, and how it reuses and fills them."""

from __future__ import annotations

from collections import defaultdict

from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import rule
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
    lanes, bound = case.profile["num_lanes"], case.workload["qp_bound_per_peer_operation"]
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


@rule("qps.reuse", "qps", "QPs created once in round 1 and reused after", witness=("runner",))
def check_qp_reuse(case):
    problems = []
    for role, generation, ledger, path in each_ledger(case):
        live = {qp["qpn"] for qp in ledger["qps"] if qp["created_round"] == 1}
        late = [qp["qpn"] for qp in ledger["qps"] if qp["created_round"] != 1]
        if late:
            problems.append(
                (f"{role} g{generation}: QPs created after round 1: {late[:MAX_PROBLEMS_SHOWN]}", f"{path}#qps")
            )
        for index, rnd in enumerate(ledger["rounds"]):
            created_here = 0 if rnd["round"] > 1 else len(live)
            if rnd["qps_created"] != created_here or (rnd["round"] > 1 and rnd["qps_reused"] != len(live)):
                problems.append(
                    (
                        f"{role} g{generation} round {rnd['round']}: {rnd['qps_created']} QPs created, "
                        f"{rnd['qps_reused']} reused (expected {created_here} created"
                        f"{f', {len(live)} reused' if rnd['round'] > 1 else ''})",
                        f"{path}#rounds[{index}]",
                    )
                )
            stray = sorted({wr["qpn"] for wr in rnd["wrs"]} - live)
            if stray:
                problems.append(
                    (
                        f"{role} g{generation} round {rnd['round']}: WRs on QPs not created once in "
                        f"round 1: {stray[:MAX_PROBLEMS_SHOWN]}",
                        f"{path}#rounds[{index}].wrs",
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
                    (f"{role} g{generation} QP {qp['qpn']}: max_send_wr {qp['max_send_wr']} > {depth}", f"{path}#qps")
                )
        for index, rnd in enumerate(ledger["rounds"]):
            for usage in rnd["qp_usage"]:
                if usage["max_inflight_wrs"] > depth:
                    problems.append(
                        (
                            f"{role} g{generation} round {rnd['round']} QP {usage['qpn']}: "
                            f"{usage['max_inflight_wrs']} payload WRs in flight > {depth}",
                            f"{path}#rounds[{index}].qp_usage",
                        )
                    )
    return problems
