# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Ledger rules: each runner's ledger, against the plan, the profile and the peer's ledger."""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import _lifecycle as lifecycle
from ansible_collections.orbite.qualification.plugins.module_utils._verify import content
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import (
    MAX_PROBLEMS_SHOWN as MAX_SHOWN,
)
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import (
    each_ledger,
    rounds,
)


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


def _destination_checks(case, key, what, problems):
    """Yield (label, check, where) for each destination parent's recorded check ``key``; a parent without one
    is a problem of its own, appended here."""
    for _role, generation, rnd, where in rounds(case, (case.destination_role(),)):
        for index, parent in enumerate(rnd["parents"]):
            check = parent.get(key)
            label = f"g{generation} round {rnd['round']} parent {parent['parent']}"
            where_parent = f"{where}.parents[{index}]"
            if isinstance(check, dict):
                yield label, check, where_parent
            else:
                problems.append((f"{label}: no {what} check recorded on the destination side", where_parent))


@rule("ledger.identity", "ledger", "each ledger is of the case's role, generation, mode and profile", witness=("plan",))
def check_identity(case):
    problems = []
    expected = {
        "mode": case.profile["mode"],
        "operation": case.profile["operation"],
        "progress": case.workload["progress"],
    }
    for role, generation, ledger, path in each_ledger(case):
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


@rule("ledger.exit", "ledger",
      "each runner ran to its end (exit 0, or 1 with its failed check recorded); installed-restart: every nonfinal "
      "generation's ledger ends idle at its restart point",
      witness=("runner",))
def check_exit(case):
    """Each runner ran to its end. Exit 1 ("a check of mine failed") is accepted only when the
    failed check is in the ledger, where its own rule reports it."""
    problems = []
    for role, generation, ledger, path in each_ledger(case):
        status, code = ledger["status"], ledger.get("exit_code")
        if lifecycle.ends_idle(case.profile, generation):
            # installed-restart: a nonfinal generation's ledger ends at its restart point (the process
            # was then killed, or lived on into the next generation's ledger).
            if (status, code) != ("idle", None):
                problems.append((f"{role} g{generation}: status {status!r}, exit code {code!r} (expected 'idle', "
                                 "None: the generation's restart point)", path))
            continue
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


@rule("ledger.rounds", "ledger", "three rounds per generation, numbered 1..3", witness=("profile",))
def check_rounds(case):
    problems = []
    wanted = list(range(1, case.workload["rounds_per_generation"] + 1))
    for role, generation, ledger, path in each_ledger(case):
        numbers = [rnd["round"] for rnd in ledger["rounds"]]
        if numbers != wanted:
            problems.append((f"{role} g{generation}: rounds {numbers}, expected {wanted}", path))
    return problems


@rule("ledger.fresh_input", "ledger", "a new input seed every round, agreed by both peers", witness=("peer",))
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


@rule("ledger.bytes", "ledger", "every destination byte was checked and matched", witness=("runner",))
def check_bytes(case):
    problems = []
    payload = case.profile["payload"]
    for label, check, where in _destination_checks(case, "byte_check", "byte", problems):
        if check.get("checked_bytes") != payload or check.get("mismatched_bytes") != 0 or check.get("ok") is not True:
            problems.append(
                (
                    f"{label}: byte check {check.get('checked_bytes')!r} checked of {payload}, "
                    f"{check.get('mismatched_bytes')!r} mismatched (first at {check.get('first_mismatch')!r})",
                    where,
                )
            )
    return problems


@rule("ledger.guards", "ledger", "every guard around every destination was checked and unchanged", witness=("runner",))
def check_guards(case):
    problems = []
    for label, check, where in _destination_checks(case, "guard_check", "guard", problems):
        guard = check.get("guard_bytes")
        changed = (check.get("leading_changed"), check.get("trailing_changed"))
        if not isinstance(guard, int) or guard <= 0 or changed != (0, 0) or check.get("ok") is not True:
            problems.append((f"{label}: guards of {guard!r} B, changed leading/trailing {changed}", where))
    return problems


@rule("ledger.guard_content", "ledger",
      "every destination guard window holds, after its round, the bytes of the round's guard seed (SHA-256 recomputed "
      "by the verifier, docs/content.md), a fresh guard seed every round; READ and WRITE alike",
      witness=("runner", "profile"), after=("ledger.guards",))
def check_guard_content(case):
    """The destination records each round's guard seed and the SHA-256 of every guard window as it is after
    the round; the verifier recomputes the windows the seed gives with its own code. This turns the
    runner's "unchanged" into bytes a verifier can check (a flag can say anything, the digest of the
    wrong bytes cannot pass), for WRITE as for READ. It is still the destination's own reading of its
    buffer: READ guards are also witnessed in flight by the requester's observer (digests.guards); for
    WRITE no observer can be (docs/observers.md, "Digests"), and what bounds the responder's writes is the
    source's device count (counters.source) with every WRITE at its slice's offset (counters.slicing)."""
    problems = []
    seen = {}
    for _role, generation, rnd, where in rounds(case, (case.destination_role(),)):
        label = f"g{generation} round {rnd['round']}"
        seed = rnd.get("guard_seed")
        try:
            windows = {p: content.guard_digests(seed, p) for p in range(case.profile["parents"])}
        except ValueError as exc:
            problems.append((f"{label}: the destination's {exc} (docs/content.md)", f"{where}.guard_seed"))
            continue
        if seed in seen:
            problems.append((f"{label}: guard seed {seed} already used in {seen[seed]}: guards are not fresh",
                             f"{where}.guard_seed"))
        seen.setdefault(seed, label)
        wrong = []
        for parent in rnd["parents"]:
            check = parent.get("guard_check") if isinstance(parent.get("guard_check"), dict) else {}
            want = windows.get(parent["parent"])
            got = tuple(check.get(k) for k in ("leading_sha256", "trailing_sha256"))
            if want is None or got != tuple(w.hex() for w in want):
                wrong.append(parent["parent"])
        if wrong:
            problems.append((f"{label}: guard windows of parents {wrong[:MAX_SHOWN]} are not those of guard seed "
                             f"{seed} (leading/trailing SHA-256 recorded after the round)", f"{where}.parents"))
    return problems


@rule("ledger.parents", "ledger",
      "every parent completed with all its bytes",
      witness=("profile",), after=("ledger.bytes", "ledger.guards"))
def check_parents_completed(case):
    problems = []
    payload, parents = case.profile["payload"], case.profile["parents"]
    for _role, generation, rnd, where in rounds(case, ("requester",)):
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


_GRANT_LISTS = {"source": ("grants_issued", "grants_released"), "requester": ("grants_received", "grants_returned")}


def _grant_lists(drain, role):
    """{field: sorted ints} of a drain record's grant lists, or a text naming the field that is not one."""
    out = {}
    for field in _GRANT_LISTS[role]:
        value = drain.get(field)
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            return f"drain.{field} is {value!r}, expected a list of parent numbers"
        out[field] = sorted(value)
    return out


@rule("ledger.drain", "ledger",
      "both peers drained to zero debt after every round: no WR outstanding (also in the verbs provider's send "
      "queues, where the plan loads it), the requester's batch of all parents freed Ok, and every grant the source "
      "issued (the profile's parents) handed back by the requester and taken back by the source, by both peers' own "
      "lists",
      witness=("runner", "peer", "profile", "provider"))
def check_drained(case):
    """Each peer's drain record says drained with no debt, and the provider's count of send-queue slots
    still held is 0 (the runner's word, and its provider's). The grant debt has a second witness: the
    verifier recomputes it from both peers' lists, the grants the source issued against those the
    requester handed back and those the source took back, each of which must be the profile's parents,
    so one peer's "debt 0" never stands alone."""
    problems = []
    parents = list(range(case.profile["parents"]))
    lists = {}
    for role, generation, rnd, where in rounds(case):
        drain = rnd["drain"]
        debt = (drain["debt_wrs"], drain["debt_bytes"], drain["debt_grants"])
        # The provider's count of held send-queue slots exists only where the plan loads it.
        slots = drain.get("provider_outstanding_wrs") if case.provider_planned() else 0
        if not drain["drained"] or debt != (0, 0, 0) or slots != 0:
            problems.append((f"{role} g{generation} round {rnd['round']}: not drained (debt WRs/bytes/grants {debt}, "
                             f"send-queue slots the provider still holds {slots!r})", f"{where}.drain"))
        if role == "requester":
            batches = [(b.get("parents"), b.get("state"), b.get("free")) if isinstance(b, dict) else b
                       for b in rnd["batches"]]
            if batches != [(parents, "Completed", "Ok")]:
                problems.append((f"requester g{generation} round {rnd['round']}: batches (parents, state, free) "
                                 f"{batches[:MAX_SHOWN]}, expected one of all {len(parents)} parents, Completed, "
                                 "freed Ok", f"{where}.batches",
                                 {"expected": [(parents, "Completed", "Ok")], "observed": batches[:MAX_SHOWN]}))
        found = _grant_lists(drain, role)
        if isinstance(found, str):
            problems.append((f"{role} g{generation} round {rnd['round']}: {found}", f"{where}.drain"))
            continue
        lists[(generation, rnd["round"])] = dict(lists.get((generation, rnd["round"]), {}), **found,
                                                 where=f"{where}.drain")
    for (generation, number), found in sorted(lists.items()):
        if not all(field in found for fields in _GRANT_LISTS.values() for field in fields):
            continue  # a round one peer does not have: ledger.rounds'
        issued = set(found["grants_issued"])
        held = issued - set(found["grants_returned"]) | issued - set(found["grants_released"])
        wrong = {k: v for k, v in found.items() if k != "where" and v != parents}
        if held or wrong:
            problems.append((f"g{generation} round {number}: grants still held {sorted(held)[:MAX_SHOWN]} (issued by "
                             f"the source and not handed back or not taken back); lists that are not the profile's "
                             f"{len(parents)} parents: { {k: v[:MAX_SHOWN] for k, v in wrong.items()} }",
                             found["where"]))
    return problems


@applies("modes whose provoked errors are modelled")
def errors_modelled(profile, _workload):
    # A mode whose faults are not modelled yet fails by name instead (case.mode_unverified).
    return model.provoked_errors(profile) is not None


@rule("ledger.errors", "ledger", "no typed error but those the mode provokes (the profile model's list)",
      witness=("profile",), applies=errors_modelled)
def check_typed_errors(case):
    """Every typed error of the ledger (top level and per round) must be one the profile model says
    the mode provokes; the runner's `expected` flag excuses nothing (a faulty engine sets it)."""
    problems = []
    provoked = model.provoked_errors(case.profile)
    for role, generation, ledger, path in each_ledger(case):
        errors = [(e, f"{path}#errors") for e in ledger["errors"]]
        for index, rnd in enumerate(ledger["rounds"]):
            errors += [(e, f"{path}#rounds[{index}].errors") for e in rnd["errors"]]
        for error, where in errors:
            name = (error.get("error"), error.get("operation")) if isinstance(error, dict) else (error, None)
            if name not in provoked:
                flag = error.get("expected") if isinstance(error, dict) else None
                problems.append((f"{role} g{generation}: typed error {name[0]!r} in {name[1]!r} (marked expected="
                                 f"{flag!r}), which mode {case.profile['mode']} does not provoke", where))
    return problems
