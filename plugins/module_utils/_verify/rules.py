# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The verifier's rules: each has a stable code, a one-line meaning and one check function.

Written from docs/receipts.md and the profile model alone; it shares no code with any runner (the
simulated one included), so a runner bug cannot cancel itself out. Expected figures come from
``profile.derive_workload``; observed figures come from the receipts.

A check function takes a ``CaseReceipts`` and returns a list of problems ``(message, evidence)``;
an empty list is a PASS. Rules whose receipts are unusable are skipped (the receipt rule fails).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._inventory.discovery import (
    DiscoveryExpectError,
    expectations,
)
from ansible_collections.orbite.qualification.plugins.module_utils._inventory.compare import diff_inventories
from ansible_collections.orbite.qualification.plugins.module_utils._verify.loader import (
    INVENTORY_SCHEMA,
    load_journal,
    load_json,
    load_ledger,
    load_observer_log,
)

ROLES = ("source", "requester")
# Rendezvous carries small control messages only: this budget per round is far below one slice of
# any profile that could hide payload in it, and far above what the control protocol needs.
RENDEZVOUS_BASE_BUDGET = 64 * 1024
RENDEZVOUS_PER_PARENT_BUDGET = 2 * 1024
MAX_PROBLEMS_SHOWN = 5


@dataclass
class CaseReceipts:
    case_id: str
    case_dir: str
    profile: dict
    workload: dict
    ledgers: dict = field(default_factory=dict)  # (role, generation) -> Receipt
    observer_logs: dict = field(default_factory=dict)  # (role, generation, tool) -> ObserverLog
    journals: dict = field(default_factory=dict)  # role -> Receipt of {"header", "events"}
    inventories: dict = field(default_factory=dict)  # (role, generation, "before"|"after") -> Receipt

    def ledger(self, role, generation=1):
        return self.ledgers[(role, generation)].data

    def ledger_path(self, role, generation=1):
        return self.ledgers[(role, generation)].path

    def generations(self):
        return range(1, self.workload["generations"] + 1)

    def destination_role(self):
        return "requester" if self.profile["operation"] == "read" else "source"

    def data_role(self):
        return "source" if self.profile["operation"] == "read" else "requester"


def case_receipts(case_dir, case_id, profile, workload):
    """Load every receipt the case's profile implies, from the layout in docs/verifier.md."""
    case = CaseReceipts(case_id=case_id, case_dir=case_dir, profile=profile, workload=workload)
    for generation in range(1, workload["generations"] + 1):
        for role in ROLES:
            case.ledgers[(role, generation)] = load_ledger(f"{case_dir}/{role}/g{generation}/ledger.json")
        for observer in workload["observers"]:
            key = (observer["role"], generation, observer["tool"])
            path = f"{case_dir}/{observer['role']}/g{generation}/observer-{observer['tool']}.jsonl"
            case.observer_logs[key] = load_observer_log(path)
    for role in ROLES:
        case.journals[role] = load_journal(f"{case_dir}/{role}/journal.jsonl")
        if profile.get("discovery") == "auto":
            for generation in range(1, workload["generations"] + 1):
                for when in ("before", "after"):
                    path = f"{case_dir}/{role}/g{generation}/inventory-{when}.json"
                    case.inventories[(role, generation, when)] = load_json(path, INVENTORY_SCHEMA)
    return case


@dataclass(frozen=True)
class Rule:
    code: str
    group: str
    meaning: str
    check: object
    needs: tuple = ("ledgers",)
    applies: object = None  # profile, workload -> bool; None = always
    # Rules reading the same fact through a more derived receipt: when one of these failed, this
    # rule is reported as masked (SKIP) so that one broken fact gives one failing code.
    after: tuple = ()

    def applies_to(self, profile, workload):
        return self.applies is None or self.applies(profile, workload)


# --------------------------------------------------------------------------------------------
# helpers


def _each_ledger(case, roles=ROLES):
    for generation in case.generations():
        for role in roles:
            yield role, generation, case.ledger(role, generation), case.ledger_path(role, generation)


def _rounds(case, roles=ROLES):
    for role, generation, ledger, path in _each_ledger(case, roles):
        for index, rnd in enumerate(ledger["rounds"]):
            yield role, generation, rnd, f"{path}#rounds[{index}]"


def _enabled(case):
    return set(case.workload["rails"])


# --------------------------------------------------------------------------------------------
# ledger rules


def check_identity(case):
    problems = []
    expected = {
        "mode": case.profile["mode"],
        "operation": case.profile["operation"],
        "progress": case.workload["progress"],
    }
    for role, generation, ledger, path in _each_ledger(case):
        wanted = dict(expected, role=role, generation=generation)
        for key, value in wanted.items():
            if ledger.get(key) != value:
                problems.append((f"{role} g{generation}: {key} is {ledger.get(key)!r}, expected {value!r}", path))
        for key in ("parents", "payload", "block", "num_lanes", "mask", "operation", "rdma_events"):
            if ledger["profile"].get(key) != case.profile[key]:
                problems.append(
                    (
                        f"{role} g{generation}: profile.{key} is {ledger['profile'].get(key)!r}, "
                        f"the case says {case.profile[key]!r}",
                        path,
                    )
                )
    return problems


def _recorded_check_failures(ledger):
    """Failed checks a runner records itself (each has a rule of its own)."""
    failed = 0
    for rnd in ledger["rounds"]:
        for parent in rnd["parents"]:
            for check in ("byte_check", "guard_check"):
                if isinstance(parent.get(check), dict) and parent[check].get("ok") is False:
                    failed += 1
        if not rnd["drain"]["drained"]:
            failed += 1
    return failed


def check_exit(case):
    """Each runner ran to its end. Exit 1 ("a check of mine failed") is accepted only when the
    failed check is in the ledger, where its own rule reports it."""
    problems = []
    for role, generation, ledger, path in _each_ledger(case):
        status, code = ledger["status"], ledger.get("exit_code")
        explained = status == "failed" and code == 1 and _recorded_check_failures(ledger) > 0
        if (status, code) != ("complete", 0) and not explained:
            problems.append(
                (
                    f"{role} g{generation}: status {status!r}, exit code {code!r} (expected 'complete', 0, "
                    "or exit 1 with a failed check in the ledger)",
                    path,
                )
            )
    return problems


def check_rounds(case):
    problems = []
    wanted = list(range(1, case.workload["rounds_per_generation"] + 1))
    for role, generation, ledger, path in _each_ledger(case):
        numbers = [rnd["round"] for rnd in ledger["rounds"]]
        if numbers != wanted:
            problems.append((f"{role} g{generation}: rounds {numbers}, expected {wanted}", path))
    return problems


def check_fresh_input(case):
    problems = []
    seen = {}
    for generation in case.generations():
        data_side = case.ledger(case.data_role(), generation)
        other = case.ledger("requester" if case.data_role() == "source" else "source", generation)
        path = case.ledger_path(case.data_role(), generation)
        for index, rnd in enumerate(data_side["rounds"]):
            seed = rnd["input_seed"]
            where = f"{path}#rounds[{index}].input_seed"
            if seed in seen:
                problems.append(
                    (
                        f"g{generation} round {rnd['round']}: input seed {seed} already used in "
                        f"{seen[seed]}: input is not fresh",
                        where,
                    )
                )
            seen.setdefault(seed, f"g{generation} round {rnd['round']}")
            peer_rounds = [r for r in other["rounds"] if r["round"] == rnd["round"]]
            if peer_rounds and peer_rounds[0]["input_seed"] != seed:
                problems.append(
                    (
                        f"g{generation} round {rnd['round']}: peers disagree on the input seed "
                        f"({seed} vs {peer_rounds[0]['input_seed']})",
                        where,
                    )
                )
    return problems


def _destination_parents(case):
    for role, generation, rnd, where in _rounds(case, (case.destination_role(),)):
        for index, parent in enumerate(rnd["parents"]):
            yield role, generation, rnd, parent, f"{where}.parents[{index}]"


def check_bytes(case):
    problems = []
    payload = case.profile["payload"]
    for _role, generation, rnd, parent, where in _destination_parents(case):
        check = parent.get("byte_check")
        label = f"g{generation} round {rnd['round']} parent {parent['parent']}"
        if not isinstance(check, dict):
            problems.append((f"{label}: no byte check recorded on the destination side", where))
        elif check.get("checked_bytes") != payload or check.get("mismatched_bytes") != 0 or check.get("ok") is not True:
            problems.append(
                (
                    f"{label}: byte check {check.get('checked_bytes')!r} checked of {payload}, "
                    f"{check.get('mismatched_bytes')!r} mismatched (first at {check.get('first_mismatch')!r})",
                    where,
                )
            )
    return problems


def check_guards(case):
    problems = []
    for _role, generation, rnd, parent, where in _destination_parents(case):
        check = parent.get("guard_check")
        label = f"g{generation} round {rnd['round']} parent {parent['parent']}"
        if not isinstance(check, dict):
            problems.append((f"{label}: no guard check recorded on the destination side", where))
            continue
        guard = check.get("guard_bytes")
        changed = (check.get("leading_changed"), check.get("trailing_changed"))
        if not isinstance(guard, int) or guard <= 0 or changed != (0, 0) or check.get("ok") is not True:
            problems.append((f"{label}: guards of {guard!r} B, changed leading/trailing {changed}", where))
    return problems


def check_parents_completed(case):
    problems = []
    payload, parents = case.profile["payload"], case.profile["parents"]
    for _role, generation, rnd, where in _rounds(case, ("requester",)):
        label = f"g{generation} round {rnd['round']}"
        numbers = sorted(p["parent"] for p in rnd["parents"])
        if numbers != list(range(parents)):
            problems.append((f"{label}: parents {numbers}, expected 0..{parents - 1}", where))
        for parent in rnd["parents"]:
            observed = (parent["status"], parent["requested_bytes"], parent["completed_bytes"])
            if observed != ("Completed", payload, payload):
                problems.append(
                    (
                        f"{label} parent {parent['parent']}: {parent['status']}, "
                        f"{parent['completed_bytes']}/{parent['requested_bytes']} B of {payload}",
                        where,
                    )
                )
    return problems


def check_drained(case):
    problems = []
    for role, generation, rnd, where in _rounds(case):
        drain = rnd["drain"]
        debt = (drain["debt_wrs"], drain["debt_bytes"], drain["debt_grants"])
        if not drain["drained"] or debt != (0, 0, 0):
            problems.append(
                (
                    f"{role} g{generation} round {rnd['round']}: not drained (debt WRs/bytes/grants {debt})",
                    f"{where}.drain",
                )
            )
    return problems


def check_typed_errors(case):
    problems = []
    for role, generation, ledger, path in _each_ledger(case):
        errors = [(e, f"{path}#errors") for e in ledger["errors"]]
        for index, rnd in enumerate(ledger["rounds"]):
            errors += [(e, f"{path}#rounds[{index}].errors") for e in rnd["errors"]]
        for error, where in errors:
            if not (isinstance(error, dict) and error.get("expected") is True):
                name = error.get("error") if isinstance(error, dict) else error
                problems.append((f"{role} g{generation}: unexpected typed error {name!r}", where))
    return problems


# --------------------------------------------------------------------------------------------
# counter rules (requester: the side that posts payload WRs)


def check_wr_count(case):
    """The WRs the ledger lists, their successful completions, the native WR counter and the
    native CQE counter agree (the count itself is held against the workload by counters.slicing)."""
    problems = []
    for _role, generation, rnd, where in _rounds(case, ("requester",)):
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


def check_byte_count(case):
    """Public bytes and the bytes of the listed WRs equal the derived workload (native bytes are
    held against public ones by counters.native_public)."""
    problems = []
    expected = case.workload["bytes_per_round"]
    for _role, generation, rnd, where in _rounds(case, ("requester",)):
        figures = {"public": rnd["counters"]["public"]["bytes"], "listed WRs": sum(wr["bytes"] for wr in rnd["wrs"])}
        wrong = {k: v for k, v in figures.items() if v != expected}
        if wrong:
            problems.append((f"g{generation} round {rnd['round']}: bytes {wrong}, expected {expected}", where))
    return problems


def check_native_equals_public(case):
    problems = []
    for _role, generation, rnd, where in _rounds(case, ("requester",)):
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


def check_slicing(case):
    """The derived number of payload WRs a round, and each parent cut into the derived slices."""
    problems = []
    sizes = model.slice_sizes(case.profile["payload"], case.profile["block"])
    expected = case.workload["wrs_per_round"]
    for _role, generation, rnd, where in _rounds(case, ("requester",)):
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


def _runs(sizes):
    return ", ".join(f"{r['count']} x {r['bytes']}" for r in model._compress(sizes)) if sizes else "none"


def check_rails_used(case):
    problems = []
    enabled = _enabled(case)
    for _role, generation, rnd, where in _rounds(case, ("requester",)):
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


# --------------------------------------------------------------------------------------------
# QP and MR rules


def check_qp_bound(case):
    """QPs live in a round: at most num_lanes per rail (context) and operation, rails x lanes per
    peer. (Creating QPs again instead of reusing them is qps.reuse.)"""
    problems = []
    lanes, bound = case.profile["num_lanes"], case.workload["qp_bound_per_peer_operation"]
    for role, generation, rnd, where in _rounds(case):
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


def check_qp_reuse(case):
    problems = []
    for role, generation, ledger, path in _each_ledger(case):
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


def check_sq_depth(case):
    problems = []
    depth = case.workload["send_queue_depth"]
    for role, generation, ledger, path in _each_ledger(case):
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


def check_persistent_mrs(case):
    problems = []
    for role, generation, ledger, path in _each_ledger(case):
        contexts = {c["rail"]: c for c in ledger["contexts"]}
        for rail in range(model.RAIL_COUNT):
            mrs = contexts.get(rail, {}).get("mrs", [])
            persistent = [
                mr
                for mr in mrs
                if mr["kind"] == "data"
                and mr.get("registered_round") == 0
                and (mr["live"] or mr.get("deregistered_round") == "teardown")
            ]
            if not persistent:
                problems.append(
                    (
                        f"{role} g{generation}: context of rail {rail} holds no persistent data MR "
                        f"(both contexts must, whatever the mask)",
                        f"{path}#contexts",
                    )
                )
    return problems


def check_rendezvous(case):
    problems = []
    budget = RENDEZVOUS_BASE_BUDGET + RENDEZVOUS_PER_PARENT_BUDGET * case.profile["parents"]
    expected = case.workload["bytes_per_round"]
    for role, generation, rnd, where in _rounds(case):
        rendezvous = rnd["rendezvous"]["bytes_sent"] + rnd["rendezvous"]["bytes_received"]
        if rendezvous > budget:
            problems.append(
                (
                    f"{role} g{generation} round {rnd['round']}: {rendezvous} B on rendezvous, over the "
                    f"control budget of {budget} B: payload travelled on rendezvous",
                    f"{where}.rendezvous",
                )
            )
        if role == "requester":
            channel = rnd["data_channel"]
            moved = (
                channel["payload_bytes_received"]
                if case.profile["operation"] == "read"
                else channel["payload_bytes_sent"]
            )
            if moved != expected:
                problems.append(
                    (
                        f"g{generation} round {rnd['round']}: {moved} payload B on the data channel, "
                        f"expected {expected}",
                        f"{where}.data_channel",
                    )
                )
    return problems


# --------------------------------------------------------------------------------------------
# accounting observer rules (requester's observer log, joined to the ledger)


def _accounting_logs(case):
    for generation in case.generations():
        key = ("requester", generation, "accounting")
        if key in case.observer_logs:
            yield generation, case.observer_logs[key], case.ledger("requester", generation)


def _replay(log):
    """Walk the log in order: joins, in-flight WRs and outstanding parents per QP (parent via wr_id)."""
    accepted, joined, orphans, duplicates, failed = {}, {}, [], [], []
    for event in log.events:
        key = (event["ctx"], event["cq"], event["qpn"], event["wr_id"])
        if event["ev"] == "wr":
            if key in accepted:
                duplicates.append(key)
            accepted[key] = event
        elif event["ev"] == "cqe":
            if key not in accepted:
                orphans.append(key)
            elif event["status"] != 0:
                failed.append(key)
            elif key in joined:
                duplicates.append(key)
            else:
                joined[key] = event
    return accepted, joined, orphans, duplicates, failed


def check_observer_join(case):
    problems = []
    for generation, log, _ledger in _accounting_logs(case):
        accepted, joined, orphans, duplicates, failed = _replay(log)
        unjoined = [k for k in accepted if k not in joined]
        if unjoined or orphans or duplicates or failed:
            problems.append(
                (
                    f"g{generation}: {len(unjoined)} accepted payload WR(s) without exactly one successful "
                    f"completion (first {unjoined[:2]}), {len(orphans)} completion(s) of unknown WRs, "
                    f"{len(duplicates)} duplicate(s), {len(failed)} error completion(s)",
                    log.path,
                )
            )
        summary = log.summary
        if (summary["accepted_wrs"], summary["joined"], summary["unjoined"]) != (
            len(accepted),
            len(joined),
            len(accepted) - len(joined),
        ):
            problems.append(
                (
                    f"g{generation}: the log's summary says accepted/joined/unjoined "
                    f"{summary['accepted_wrs']}/{summary['joined']}/{summary['unjoined']}, its lines give "
                    f"{len(accepted)}/{len(joined)}/{len(accepted) - len(joined)}",
                    log.path,
                )
            )
    return problems


def _ledger_wrs(ledger):
    return {(wr["qpn"], wr["wr_id"]): wr for rnd in ledger["rounds"] for wr in rnd["wrs"]}


def check_observer_ledger_join(case):
    problems = []
    for generation, log, ledger in _accounting_logs(case):
        listed = _ledger_wrs(ledger)
        seen = set()
        for event in log.events:
            if event["ev"] != "wr":
                continue
            key = (event["qpn"], event["wr_id"])
            wr = listed.get(key)
            seen.add(key)
            if wr is None:
                problems.append(
                    (f"g{generation}: observer WR qpn {key[0]} wr_id {key[1]} is not in the ledger", log.path)
                )
            elif (wr["bytes"], wr["opcode"], wr["context"], wr["cq"]) != (
                event["bytes"],
                event["opcode"],
                event["ctx"],
                event["cq"],
            ):
                problems.append(
                    (
                        f"g{generation}: WR {key} differs between ledger and observer (bytes/opcode/ctx/cq "
                        f"{wr['bytes']}/{wr['opcode']}/{wr['context']}/{wr['cq']} vs {event['bytes']}/"
                        f"{event['opcode']}/{event['ctx']}/{event['cq']})",
                        log.path,
                    )
                )
        missing = sorted(set(listed) - seen)
        if missing:
            problems.append(
                (
                    f"g{generation}: {len(missing)} ledger WR(s) the observer never saw accepted (first {missing[:2]})",
                    log.path,
                )
            )
        if len(problems) >= MAX_PROBLEMS_SHOWN:
            break
    return problems[:MAX_PROBLEMS_SHOWN]


def _device_rails(ledger):
    return {rail["device"]: rail["rail"] for rail in ledger["rails"]}


def check_observer_native_bytes(case):
    problems = []
    for generation, log, ledger in _accounting_logs(case):
        accepted, joined = _replay(log)[:2]
        rails = _device_rails(ledger)
        native = defaultdict(int)
        for key in joined:
            native[rails.get(accepted[key]["dev"], accepted[key]["dev"])] += accepted[key]["bytes"]
        public = defaultdict(int)
        for rnd in ledger["rounds"]:
            for rail, value in rnd["counters"]["public"]["per_rail"].items():
                public[int(rail)] += value
        if dict(native) != {k: v for k, v in public.items() if v}:
            problems.append(
                (
                    f"g{generation}: observer's completed bytes per rail {dict(native)} != the engine's "
                    f"public counters {dict(public)}",
                    log.path,
                )
            )
    return problems


def check_observer_exact_counts(case):
    problems = []
    rounds = case.workload["rounds_per_generation"]
    want_wrs, want_bytes = case.workload["wrs_per_round"] * rounds, case.workload["bytes_per_round"] * rounds
    for generation, log, _ledger in _accounting_logs(case):
        wrs = [e for e in log.events if e["ev"] == "wr"]
        total = sum(e["bytes"] for e in wrs)
        if (len(wrs), total) != (want_wrs, want_bytes):
            problems.append(
                (
                    f"g{generation}: observer accepted {len(wrs)} payload WRs / {total} B over {rounds} "
                    f"rounds, expected {want_wrs} / {want_bytes} "
                    f"({case.workload['wrs_per_round']} WRs, {case.workload['bytes_per_round']} B a round)",
                    log.path,
                )
            )
    return problems


def check_observer_rails(case):
    problems = []
    for generation, log, ledger in _accounting_logs(case):
        rails = _device_rails(ledger)
        carried = {rails.get(e["dev"]) for e in log.events if e["ev"] == "wr"}
        idle = sorted(r for r in _enabled(case) if r not in carried)
        if idle:
            problems.append((f"g{generation}: enabled rail(s) {idle} carried no accepted payload WR", log.path))
    return problems


def _inflight_profile(log, parent_of):
    """Per QP: most WRs in flight at once, and most distinct parents in flight at once."""
    inflight = defaultdict(dict)  # qpn -> {key: parent}
    max_wrs, max_parents = defaultdict(int), defaultdict(int)
    for event in log.events:
        key = (event["ctx"], event["cq"], event["qpn"], event["wr_id"])
        if event["ev"] == "wr":
            inflight[event["qpn"]][key] = parent_of.get((event["qpn"], event["wr_id"]))
        elif event["ev"] in ("cqe", "withheld"):
            inflight[event["qpn"]].pop(key, None)
        else:
            continue
        current = inflight[event["qpn"]]
        max_wrs[event["qpn"]] = max(max_wrs[event["qpn"]], len(current))
        max_parents[event["qpn"]] = max(max_parents[event["qpn"]], len(set(current.values()) - {None}))
    return max_wrs, max_parents


def check_observer_sq_depth(case):
    problems = []
    depth = case.workload["send_queue_depth"]
    for generation, log, ledger in _accounting_logs(case):
        parent_of = {key: wr["parent"] for key, wr in _ledger_wrs(ledger).items()}
        max_wrs = _inflight_profile(log, parent_of)[0]
        over = {qpn: n for qpn, n in max_wrs.items() if n > depth}
        if over:
            problems.append((f"g{generation}: payload WRs in flight per QP over {depth}: {over}", log.path))
    return problems


def check_observer_outstanding(case):
    problems = []
    least = case.workload.get("min_outstanding_parents_per_rail_qp", 0)
    for generation, log, ledger in _accounting_logs(case):
        parent_of = {key: wr["parent"] for key, wr in _ledger_wrs(ledger).items()}
        max_parents = _inflight_profile(log, parent_of)[1]
        rail_of_qp = {qp["qpn"]: qp["rail"] for qp in ledger["qps"]}
        for rail in sorted(_enabled(case)):
            qps = [q for q, r in rail_of_qp.items() if r == rail]
            best = max((max_parents.get(q, 0) for q in qps), default=0)
            if best < least:
                problems.append(
                    (
                        f"g{generation} rail {rail}: at most {best} parent(s) outstanding at once on its "
                        f"shared QP, expected at least {least}",
                        log.path,
                    )
                )
    return problems


# --------------------------------------------------------------------------------------------
# supervisor journal rules (docs/supervisor.md): what the node's supervisor saw, against the ledgers


def _journal(case, role):
    return case.journals[role].data, case.journals[role].path


def _events(journal, name):
    return [e for e in journal["events"] if e.get("ev") == name]


def check_journal_identity(case):
    problems = []
    for role in ROLES:
        journal, path = _journal(case, role)
        checks = [e for e in _events(journal, "identity_check") if e.get("stage") == "inside_locks"]
        if not checks or not all(e.get("ok") is True for e in checks):
            problems.append((f"{role}: no passing identity recheck inside the locks", path))
            continue
        observed = checks[-1].get("observed") or {}
        for generation in case.generations():
            ledger = case.ledger(role, generation)
            seen = (ledger.get("hostname"), ledger.get("boot_id"))
            if seen != (observed.get("hostname"), observed.get("boot_id")):
                problems.append((f"{role} g{generation}: the runner ran on {seen}, the supervisor checked "
                                 f"{(observed.get('hostname'), observed.get('boot_id'))}", path))
    return problems


def check_distinct_nodes(case):
    identities = {}
    for role in ROLES:
        journal = _journal(case, role)[0]
        checks = _events(journal, "identity_check")
        observed = (checks[-1].get("observed") or {}) if checks else {}
        identities[role] = (observed.get("hostname"), observed.get("boot_id"))
    source, requester = identities["source"], identities["requester"]
    same = [name for name, a, b in zip(("hostname", "boot ID"), source, requester) if a == b or a is None]
    if same:
        return [(f"source and requester share {' and '.join(same)} ({source} vs {requester}): the gate needs "
                 "two distinct nodes", case.journals["requester"].path)]
    return []


def check_journal_locks(case):
    problems = []
    for role in ROLES:
        journal, path = _journal(case, role)
        rnics = {rail["device"] for rail in case.ledger(role, 1)["rails"]}
        acquired = {e.get("rnic") for e in _events(journal, "lock_acquire")}
        released = {e.get("rnic") for e in _events(journal, "lock_release") if e.get("ok") is True}
        closing = _events(journal, "journal_close")
        if not rnics <= acquired:
            problems.append((f"{role}: RNICs used without their lock: {sorted(rnics - acquired)}", path))
        if acquired - released:
            problems.append((f"{role}: locks never released: {sorted(acquired - released)}", path))
        if not closing or closing[-1].get("locks_released") is not True:
            problems.append((f"{role}: the journal does not close with the locks released", path))
    return problems


def check_journal_children(case):
    problems = []
    for role in ROLES:
        journal, path = _journal(case, role)
        starts = {e.get("pid"): e for e in _events(journal, "child_start")}
        exits = {e.get("pid"): e for e in _events(journal, "child_exit")}
        expected_pids = set()
        for generation in case.generations():
            ledger = case.ledger(role, generation)
            pid = ledger.get("pid")
            expected_pids.add(pid)
            if pid not in starts:
                problems.append((f"{role} g{generation}: runner pid {pid} was not a child of the supervisor", path))
            elif pid not in exits:
                problems.append((f"{role} g{generation}: runner pid {pid} was never reaped", path))
            elif (exits[pid].get("exit_code"), exits[pid].get("exit_signal")) != (ledger.get("exit_code"), None):
                problems.append((f"{role} g{generation}: the supervisor reaped pid {pid} with exit "
                                 f"{exits[pid].get('exit_code')!r} signal {exits[pid].get('exit_signal_name')!r}, "
                                 f"the ledger says exit {ledger.get('exit_code')!r}", path))
        stray = sorted(set(starts) - expected_pids, key=str)
        if stray:
            problems.append((f"{role}: children the case does not account for: pids {stray}", path))
        signals = _events(journal, "signal") + _events(journal, "lease_expired")
        if signals:
            problems.append((f"{role}: {len(signals)} signal/lease event(s) in a mode without faults", path))
    return problems


def check_journal_env(case):
    problems = []
    for role in ROLES:
        journal, path = _journal(case, role)
        wants_preload = case.ledger(role, 1)["runner"].get("kind") == "native" and any(
            o["role"] == role for o in case.workload["observers"])
        for start in _events(journal, "child_start"):
            keys = start.get("env_keys") or []
            if "RDMAV_ALLOW_DISASSOC_DESTROY" in keys:
                problems.append((f"{role}: pid {start.get('pid')} ran with RDMAV_ALLOW_DISASSOC_DESTROY", path))
            if bool(start.get("ld_preload")) != wants_preload or ("LD_PRELOAD" in keys) != wants_preload:
                problems.append((f"{role}: pid {start.get('pid')} LD_PRELOAD {start.get('ld_preload')!r}, expected "
                                 f"{'the observer' if wants_preload else 'none'} for this mode and runner", path))
    return problems


# --------------------------------------------------------------------------------------------
# discovery rules (discovery: auto): the engine's choices against the independent inventory


def _inventory(case, role, generation, when="before"):
    return case.inventories[(role, generation, when)]


def _expected_discovery(case, role, generation):
    ledger = case.ledger(role, generation)
    lists = ledger["discovery"] or {}
    return expectations(_inventory(case, role, generation).data, lists.get("whitelist"), lists.get("blacklist"),
                        (lists.get("strict_gid_request") or {}).get("gid_index", 255))


def check_inventory_unchanged(case):
    problems = []
    for role in ROLES:
        for generation in case.generations():
            before, after = _inventory(case, role, generation), _inventory(case, role, generation, "after")
            changes = diff_inventories(before.data, after.data)
            if changes:
                problems.append((f"{role} g{generation}: the inventory changed across the child: "
                                 f"{[(c['path'], c['change']) for c in changes][:5]}", after.path))
    return problems


def check_inventory_candidates(case):
    problems = []
    for role, generation, ledger, _path in _each_ledger(case):
        try:
            expected = _expected_discovery(case, role, generation)
        except DiscoveryExpectError as error:
            problems.append((f"{role} g{generation}: {error}", _inventory(case, role, generation).path))
            continue
        for device in sorted(rail["device"] for rail in ledger["rails"]):
            rnic = expected["rnics"].get(device)
            if rnic is None or len(rnic["active_ethernet_ports"]) != 1 or rnic["ipv4_roce_v2"] != 1:
                problems.append((f"{role} g{generation} {device}: the inventory shows "
                                 f"{'no candidate' if rnic is None else rnic['active_ethernet_ports']} active Ethernet "
                                 f"port(s) and {0 if rnic is None else rnic['ipv4_roce_v2']} IPv4 RoCE v2 GID(s), "
                                 "expected exactly one of each", _inventory(case, role, generation).path))
    return problems


def check_discovery_nics(case):
    problems = []
    for role, generation, ledger, path in _each_ledger(case):
        expected = _expected_discovery(case, role, generation)
        wanted = [f"{d}:{expected['rnics'][d]['preferred_gid']['port']}" for d in expected["candidates"]
                  if expected["rnics"][d]["preferred_gid"]]
        chosen = (ledger["discovery"] or {}).get("chosen_nic_ids")
        if chosen != wanted:
            problems.append((f"{role} g{generation}: the engine chose NICs {chosen}, the inventory implies {wanted}",
                             f"{path}#discovery.chosen_nic_ids"))
        for rail in ledger["rails"]:
            preferred = (expected["rnics"].get(rail["device"]) or {}).get("preferred_gid") or {}
            if rail.get("gid_index") != preferred.get("index"):
                problems.append((f"{role} g{generation} rail {rail['rail']}: GID index {rail.get('gid_index')}, the "
                                 f"inventory's preferred RoCE v2 GID is {preferred.get('index')}", f"{path}#rails"))
    return problems


def check_discovery_tiers(case):
    problems = []
    for role, generation, ledger, path in _each_ledger(case):
        expected = _expected_discovery(case, role, generation)["memory_tiers"]
        reported = {f"cpu:{entry['numa_node']}": entry["tiers"] for entry in (ledger["discovery"] or {}).get(
            "memory_tiers", [])}
        for node, tiers in sorted(expected.items()):
            local = sorted(f"{d}:{p}" for d, tier in tiers.items() if tier == 0
                           for p in [_port_of(ledger, d)])
            got = reported.get(node)
            got_local = sorted(got[0]) if got and local else []
            got_all = sorted(n for tier in (got or []) for n in tier)
            want_all = sorted(f"{d}:{_port_of(ledger, d)}" for d in tiers)
            if got is None or got_local != local or got_all != want_all:
                problems.append((f"{role} g{generation} {node}: the engine's tiers {got}, the inventory implies "
                                 f"tier 0 {local} of {want_all}", f"{path}#discovery.memory_tiers"))
    return problems


def _port_of(ledger, device):
    for rail in ledger["rails"]:
        if rail["device"] == device:
            return rail["port"]
    return "?"


def check_strict_pin(case):
    problems = []
    for role, generation, ledger, path in _each_ledger(case):
        expected = _expected_discovery(case, role, generation)["strict_gid_pin"]
        request = (ledger["discovery"] or {}).get("strict_gid_request") or {}
        want = expected["expected"] if expected else "Unavailable"
        if request.get("result") != want or request.get("retained_owners") != 0:
            problems.append((f"{role} g{generation}: strict GID {request.get('gid_index')} request gave "
                             f"{request.get('result')!r} with {request.get('retained_owners')!r} retained owner(s); "
                             f"expected {want!r} with 0", f"{path}#discovery.strict_gid_request"))
    return problems


# --------------------------------------------------------------------------------------------
# the rule table


def _has_accounting(_profile, workload):
    return any(o["tool"] == "accounting" for o in workload["observers"])


def _rail_accounting(profile, _workload):
    return profile["mode"] == "installed-rail-accounting"


_OBS = ("ledgers", "observers")

LEDGER_RULES = (
    Rule("ledger.identity", "ledger", "each ledger is of the case's role, generation, mode and profile",
         check_identity),
    Rule("ledger.exit", "ledger", "each runner ran to its end (exit 0, or 1 with its failed check recorded)",
         check_exit),
    Rule("ledger.rounds", "ledger", "three rounds per generation, numbered 1..3", check_rounds),
    Rule("ledger.fresh_input", "ledger", "a new input seed every round, agreed by both peers", check_fresh_input),
    Rule("ledger.bytes", "ledger", "every destination byte was checked and matched", check_bytes),
    Rule("ledger.guards", "ledger", "every guard around every destination was checked and unchanged", check_guards),
    # A parent that failed its own byte or guard check is that rule's finding, not this one's.
    Rule("ledger.parents", "ledger", "every parent completed with all its bytes", check_parents_completed,
         after=("ledger.bytes", "ledger.guards")),
    Rule("ledger.drain", "ledger", "both peers drained to zero debt after every round", check_drained),
    Rule("ledger.errors", "ledger", "no typed error that the mode does not provoke", check_typed_errors),
    Rule("counters.wrs", "counters", "listed WRs, their completions and the native WR and CQE counters agree",
         check_wr_count),
    Rule("counters.bytes", "counters", "public bytes per round equal the derived workload", check_byte_count),
    Rule("counters.native_public", "counters", "native bytes equal public bytes, in all and on every rail",
         check_native_equals_public),
    Rule("counters.slicing", "counters", "the derived WRs a round, each parent cut into the derived slices",
         check_slicing),
    Rule("counters.rails", "counters", "payload on every enabled rail and on no disabled rail", check_rails_used),
    Rule("qps.bound", "qps", "QPs live within num_lanes per context/operation and rails x lanes per peer",
         check_qp_bound),
    Rule("qps.reuse", "qps", "QPs created once in round 1 and reused after", check_qp_reuse),
    Rule("qps.sq_depth", "qps", "at most eight payload WRs in flight per QP", check_sq_depth),
    Rule("mrs.persistent", "mrs", "persistent MRs on both contexts of both peers, even under a one-rail mask",
         check_persistent_mrs),
    Rule("rendezvous.no_payload", "rendezvous", "rendezvous carried control only; payload went on the data path",
         check_rendezvous),
)

ACCOUNTING_RULES = (
    Rule("accounting.join", "accounting",
         "every accepted payload WR joins exactly one successful completion by (context, CQ, QPN, WR ID)",
         check_observer_join, needs=_OBS, applies=_has_accounting),
    Rule("accounting.ledger_join", "accounting", "the observer's WRs and the ledger's WRs are the same set",
         check_observer_ledger_join, needs=_OBS, applies=_has_accounting),
    Rule("accounting.native_bytes", "accounting", "observed native bytes per rail equal the public counters",
         check_observer_native_bytes, needs=_OBS, applies=_has_accounting,
         after=("accounting.join", "counters.native_public")),
    Rule("accounting.exact_counts", "accounting", "exactly the derived payload WRs and bytes a round, as observed",
         check_observer_exact_counts, needs=_OBS, applies=_has_accounting,
         after=("counters.slicing", "accounting.ledger_join")),
    Rule("accounting.both_rails", "accounting", "accepted payload on every enabled rail, as observed",
         check_observer_rails, needs=_OBS, applies=_has_accounting, after=("counters.rails",)),
    Rule("accounting.sq_depth", "accounting", "at most eight payload WRs in flight per QP, as observed",
         check_observer_sq_depth, needs=_OBS, applies=_has_accounting, after=("accounting.join", "qps.sq_depth")),
    Rule("accounting.outstanding", "accounting", "at least two parents outstanding at once on each rail's QP",
         check_observer_outstanding, needs=_OBS, applies=_rail_accounting,
         after=("accounting.join", "counters.rails")),
)

_JOURNAL = ("ledgers", "journals")

JOURNAL_RULES = (
    Rule("journal.identity", "journal", "each supervisor rechecked its node inside the locks, where the runner ran",
         check_journal_identity, needs=_JOURNAL),
    Rule("journal.distinct_nodes", "journal", "source and requester differ in hostname and boot ID",
         check_distinct_nodes, needs=_JOURNAL),
    Rule("journal.locks", "journal", "every RNIC used was locked, and every lock released at the end",
         check_journal_locks, needs=_JOURNAL),
    Rule("journal.children", "journal", "each runner was the supervisor's child, reaped with the ledger's exit status",
         check_journal_children, needs=_JOURNAL),
    Rule("journal.env", "journal", "no RDMAV_ALLOW_DISASSOC_DESTROY; LD_PRELOAD only where the mode needs it",
         check_journal_env, needs=_JOURNAL),
)


def _discovery(profile, _workload):
    return profile.get("discovery") == "auto"


_DISC = ("ledgers", "inventories")

DISCOVERY_RULES = (
    Rule("discovery.inventory_unchanged", "discovery", "each node's inventory is the same before and after the child",
         check_inventory_unchanged, needs=_DISC, applies=_discovery),
    Rule("discovery.candidates", "discovery", "one active Ethernet port and one IPv4 RoCE v2 GID per locked RNIC",
         check_inventory_candidates, needs=_DISC, applies=_discovery),
    Rule("discovery.nics", "discovery", "the engine's NIC IDs and GIDs are the ones the inventory implies",
         check_discovery_nics, needs=_DISC, applies=_discovery, after=("discovery.candidates",)),
    Rule("discovery.tiers", "discovery", "the engine's memory tiers per NUMA node are the inventory's",
         check_discovery_tiers, needs=_DISC, applies=_discovery, after=("discovery.candidates",)),
    Rule("discovery.strict_pin", "discovery", "a strict GID 255 pin is Unavailable and leaves no owner retained",
         check_strict_pin, needs=_DISC, applies=_discovery, after=("discovery.candidates",)),
)

RULES = LEDGER_RULES + ACCOUNTING_RULES + JOURNAL_RULES + DISCOVERY_RULES

# Modes whose fault-specific rules are not written yet: the verdict fails them by name instead
# of passing on the healthy-path rules alone.
VERIFIED_MODES = ("installed-host", "installed-rail-accounting")
