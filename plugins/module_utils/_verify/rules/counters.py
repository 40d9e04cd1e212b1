# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Counter rules: the requester's WR and byte counters, against the derived workload."""

from __future__ import annotations

from collections import defaultdict

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import enabled_rails, rounds


def _runs(sizes):
    return ", ".join(f"{r['count']} x {r['bytes']}" for r in model._compress(sizes)) if sizes else "none"


@rule("counters.wrs", "counters",
      "listed WRs, their completions and the native WR and CQE counters agree",
      witness=("runner",))
def check_wr_count(case):
    """The WRs the ledger lists, their successful completions, the native WR counter and the
    native CQE counter agree (the count itself is held against the workload by counters.slicing)."""
    problems = []
    for _role, generation, rnd, where in rounds(case, ("requester",)):
        native = rnd["counters"]["native"]
        figures = {
            "posted WRs listed": len(rnd["wrs"]),
            "successful completions listed": sum(1 for wr in rnd["wrs"] if wr["status"] == "SUCCESS"),
            "native WRs": native["wrs"],
            "native CQEs": native["cqes"],
        }
        if len(set(figures.values())) != 1:
            problems.append((f"g{generation} round {rnd['round']}: WR accounting disagrees: {figures}", where))
    return problems


@rule("counters.bytes", "counters", "public bytes per round equal the derived workload", witness=("profile",))
def check_byte_count(case):
    """Public bytes and the bytes of the listed WRs equal the derived workload (native bytes are
    held against public ones by counters.native_public)."""
    problems = []
    expected = case.workload["bytes_per_round"]
    for _role, generation, rnd, where in rounds(case, ("requester",)):
        figures = {"public": rnd["counters"]["public"]["bytes"], "listed WRs": sum(wr["bytes"] for wr in rnd["wrs"])}
        wrong = {k: v for k, v in figures.items() if v != expected}
        if wrong:
            problems.append((f"g{generation} round {rnd['round']}: bytes {wrong}, expected {expected}", where))
    return problems


@rule("counters.native_public", "counters",
      "native bytes equal public bytes, in all and on every rail",
      witness=("runner",))
def check_native_equals_public(case):
    problems = []
    for _role, generation, rnd, where in rounds(case, ("requester",)):
        counters = rnd["counters"]
        if counters["native"]["bytes"] != counters["public"]["bytes"]:
            problems.append(
                (
                    f"g{generation} round {rnd['round']}: native {counters['native']['bytes']} B != public "
                    f"{counters['public']['bytes']} B",
                    f"{where}.counters",
                )
            )
        public, native = counters["public"]["per_rail"], counters["native"]["per_rail"]
        for rail in sorted(set(public) | set(native)):
            native_bytes = native.get(rail, {}).get("bytes") if isinstance(native.get(rail), dict) else None
            if public.get(rail) != native_bytes:
                problems.append(
                    (
                        f"g{generation} round {rnd['round']} rail {rail}: native {native_bytes!r} B "
                        f"!= public {public.get(rail)!r} B",
                        f"{where}.counters",
                    )
                )
    return problems


@rule("counters.slicing", "counters",
      "the derived WRs a round, each parent cut into the derived slices",
      witness=("profile",))
def check_slicing(case):
    """The derived number of payload WRs a round, and each parent cut into the derived slices."""
    problems = []
    sizes = model.slice_sizes(case.profile["payload"], case.profile["block"])
    expected = case.workload["wrs_per_round"]
    for _role, generation, rnd, where in rounds(case, ("requester",)):
        if len(rnd["wrs"]) != expected:
            problems.append(
                (
                    f"g{generation} round {rnd['round']}: {len(rnd['wrs'])} payload WRs, expected {expected} "
                    f"({case.profile['parents']} parents x {len(sizes)} slices)",
                    f"{where}.wrs",
                )
            )
        by_parent = defaultdict(list)
        for wr in rnd["wrs"]:
            by_parent[wr["parent"]].append((wr["slice"], wr["bytes"]))
        for parent, slices in sorted(by_parent.items()):
            got = [size for _slice, size in sorted(slices)]
            if got != sizes:
                problems.append(
                    (
                        f"g{generation} round {rnd['round']} parent {parent}: slices {_runs(got)}, "
                        f"expected {_runs(sizes)}",
                        f"{where}.wrs",
                    )
                )
                break
    return problems


@rule("counters.rails", "counters", "payload on every enabled rail and on no disabled rail", witness=("profile",))
def check_rails_used(case):
    problems = []
    enabled = enabled_rails(case)
    for _role, generation, rnd, where in rounds(case, ("requester",)):
        used = defaultdict(int)
        for wr in rnd["wrs"]:
            used[wr["rail"]] += wr["bytes"]
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
