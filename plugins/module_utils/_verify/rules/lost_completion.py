# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""installed-lost-completion rules (seed 000, "Lost payload completions"; docs/lost_completion.md).

The mode runs the restart roles (rules/restart.py holds the kill, the survivor, the replacement and
the stale epochs). Before each nonfinal restart the requester submits one more round; the source
grants it, every payload WR is posted and the verbs provider moves its bytes, but the cq_fault
observer preloaded into the requester withholds every successful completion from poll_cq. At the
kill point the engine still owns its SQ debt, the source's grants, the DMA loans and busy batches.
The survivor destroys every affected QP before its drain receipt; a surviving requester fails its
batches with zero reported bytes and WRITE effects Unknown, a surviving source releases the grants.

Witnesses: the observer log (what it withheld, by QPN and WR ID; it never delivers one of them), the
profile model (parents, rails, rounds, payload), the peer's ledger and the verbs provider's own
counters; the runner's word on its lost round is one witness, never the expectation.
"""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._verify.loader import CQE, WITHHELD, WR
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import _lifecycle as lifecycle
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._lifecycle import (
    fault_round,
    nonfinal_generations,
    restart_section,
)

TOOL = "cq_fault"
MAX_SHOWN = 8


@applies("installed-lost-completion")
def lost_mode(profile, _workload):
    return profile.get("mode") == lifecycle.LOST_MODE


@applies("installed-lost-completion, fault_role source")
def requester_survives(profile, _workload):
    return lost_mode(profile, _workload) and profile.get("fault_role") == "source"


@applies("installed-lost-completion, fault_role requester")
def source_survives(profile, _workload):
    return lost_mode(profile, _workload) and profile.get("fault_role") == "requester"


def _batches_expected(case):
    """{rail: [parents]}: one batch per enabled rail, the parents the profile model places there."""
    out = {}
    for entry in case.workload["placement"]:
        out.setdefault(entry["rail"], []).append(entry["parent"])
    return out


def _effect(case):
    """A lost WRITE may have changed the source's memory (Unknown); a lost READ changed nothing remote."""
    return "Unknown" if case.profile["operation"] == "write" else "None"


def _lost_wrs(ledger):
    lost = restart_section(ledger, "lost") or {}
    return [w for w in lost.get("wrs") or [] if isinstance(w, dict)]


def _processes(case):
    """[(generation whose directory holds the log, [generations that process served])] of the requester."""
    if lifecycle.restart_roles(case.profile)[1] == "requester":
        return [(1, list(case.generations()))]
    return [(g, [g]) for g in case.generations()]


@rule("lost_completion.withheld", "lost_completion",
      "the cq_fault observer armed in each requester process withheld exactly the successful completions of the "
      "lost rounds' payload WRs (one per parent per nonfinal generation, joined by QPN and WR ID to WRs it saw "
      "accepted), delivered none of them and withheld nothing else; the runner reports none of them completed",
      witness=("observer", "profile"), needs=("ledgers", "observers"), applies=lost_mode)
def check_withheld(case):
    problems = []
    per_round = case.workload["wrs_per_round"]
    for started, served in _processes(case):
        log = case.observer_logs.get(("requester", started, TOOL))
        if log is None or not log.ok:
            continue  # its receipt.* finding
        withheld = set(zip(log.column(WITHHELD, "qpn"), log.column(WITHHELD, "wr_id")))
        accepted = set(zip(log.column(WR, "qpn"), log.column(WR, "wr_id")))
        delivered = set(zip(log.column(CQE, "qpn"), log.column(CQE, "wr_id")))
        expected = set()
        for generation in served:
            ledger, path = case.ledger("requester", generation), case.ledger_path("requester", generation)
            wrs = _lost_wrs(ledger)
            if not lifecycle.ends_idle(case.profile, generation):
                if wrs:
                    problems.append((f"requester g{generation}: a lost round in the last generation", path))
                continue
            if sorted(w.get("parent") for w in wrs) != list(range(case.profile["parents"])) or len(wrs) != per_round:
                problems.append((f"requester g{generation}: the lost round lists {len(wrs)} WR(s) for parents "
                                 f"{sorted(w.get('parent') for w in wrs)[:MAX_SHOWN]}, the profile gives {per_round}, "
                                 "one per parent", f"{path}#restart.lost"))
            expected |= {(w.get("qpn"), w.get("wr_id")) for w in wrs}
            claimed = [w.get("wr_id") for w in wrs if (w.get("qpn"), w.get("wr_id")) in withheld
                       and (w.get("status") != "PENDING" or w.get("completed_seq") is not None)]
            if claimed:
                problems.append((f"requester g{generation}: the runner reports WR(s) {claimed[:MAX_SHOWN]} completed "
                                 f"({len(claimed)}), whose completions the observer withheld: a completion nobody "
                                 "delivered", f"{path}#restart.lost"))
        stray, missing = sorted(withheld - expected), sorted(expected - withheld)
        if stray or missing:
            problems.append((f"requester g{started}: the observer withheld {len(withheld)} completion(s); not of a "
                             f"lost round's WR {stray[:MAX_SHOWN]}, lost WRs not withheld {missing[:MAX_SHOWN]}",
                             log.path))
        unaccepted, redelivered = sorted(withheld - accepted), sorted(withheld & delivered)
        if unaccepted or redelivered:
            problems.append((f"requester g{started}: withheld completion(s) of WRs never accepted "
                             f"{unaccepted[:MAX_SHOWN]}, withheld and yet delivered {redelivered[:MAX_SHOWN]}",
                             log.path))
    return problems


def _withheld_per_qp(case):
    """{nonfinal generation: {qpn (str): completions the cq_fault observer withheld on it}}, from the observer's
    log alone: each requester process withholds one round's completions per nonfinal generation it serves,
    in log order (the runner's word is the other witness)."""
    per_round, found = case.workload["wrs_per_round"], {}
    for started, served in _processes(case):
        log = case.observer_logs.get(("requester", started, TOOL))
        if log is None or not log.ok:
            continue  # its receipt.* finding
        qpns = log.column(WITHHELD, "qpn")
        for index, generation in enumerate(g for g in served if lifecycle.ends_idle(case.profile, g)):
            counts = {}
            for qpn in qpns[index * per_round:(index + 1) * per_round]:
                counts[str(qpn)] = counts.get(str(qpn), 0) + 1
            found[generation] = counts
    return found


@rule("lost_completion.kill_point", "lost_completion",
      "at each nonfinal restart point the engine still owns the lost round: every batch Running with a timed-out "
      "wait and a busy free(), one WR of SQ debt per parent on the QPs that carried them, the source's grant of "
      "every parent held on both peers, one DMA loan per parent region; zero bytes reported while the verbs "
      "provider moved the round's payload; the restart points follow that state",
      witness=("profile", "peer", "runner", "observer"), applies=lost_mode, after=("lost_completion.withheld",))
def check_kill_point(case):
    problems = []
    withheld = _withheld_per_qp(case)
    parents = list(range(case.profile["parents"]))
    payload, nbytes = case.profile["payload"], case.workload["bytes_per_round"]
    expected = _batches_expected(case)
    for generation in nonfinal_generations(case):
        req, src = case.ledger("requester", generation), case.ledger("source", generation)
        rpath = f"{case.ledger_path('requester', generation)}#restart.lost"
        spath = f"{case.ledger_path('source', generation)}#restart.lost"
        lost, peer = restart_section(req, "lost"), restart_section(src, "lost")
        if lost is None or peer is None:
            problems.append((f"g{generation}: no lost round recorded (requester {lost is not None}, source "
                             f"{peer is not None})", rpath if lost is None else spath))
            continue
        batches = [b for b in lost.get("batches") or [] if isinstance(b, dict)]
        found = {b.get("rail"): b.get("parents") for b in batches}
        busy = [(b.get("batch"), b.get("state"), (b.get("wait") or {}).get("result"), b.get("free")) for b in batches
                if (b.get("state"), (b.get("wait") or {}).get("result"), b.get("free"))
                != ("Running", "Timeout", "BatchBusy")]
        if found != expected or busy or lost.get("round") != fault_round(case):
            problems.append((f"requester g{generation}: round {lost.get('round')}, batches {found} (expected "
                             f"{expected}); not Running with a timed-out wait and a busy free(): {busy}", rpath))
        # The debt per QP is what the observer withheld there (never the ledger's own WR list), one per parent;
        # without its log (receipt.missing) the rest of the state below still decides.
        debt = withheld.get(generation)
        if debt is not None and ((lost.get("sq_debt") or {}) != debt or sum(debt.values()) != len(parents)):
            problems.append((f"requester g{generation}: SQ debt {lost.get('sq_debt')}, the observer withheld per QP "
                             f"{debt} ({len(parents)} expected in all)", rpath))
        if lost.get("grants_held") != parents or peer.get("grants_pending") != len(parents) \
                or peer.get("grants_issued") != parents:
            problems.append((f"g{generation}: grants held by the requester {lost.get('grants_held')}, pending at the "
                             f"source {peer.get('grants_pending')} of {peer.get('grants_issued')} issued (expected "
                             f"every parent {parents[:MAX_SHOWN]}...)", spath))
        loans = sorted((x.get("parent"), x.get("offset"), x.get("bytes")) for x in lost.get("loans") or []
                       if isinstance(x, dict))
        want = [(p, case.workload["region_offsets"][p], payload) for p in parents]
        if loans != want:
            problems.append((f"requester g{generation}: DMA loans {loans[:MAX_SHOWN]}, expected one per parent region "
                             f"{want[:MAX_SHOWN]}", rpath))
        before, after = lost.get("before") or {}, lost.get("after") or {}
        moved = (after.get("provider_bytes") or 0) - (before.get("provider_bytes") or 0)
        native = (after.get("native_bytes") or 0) - (before.get("native_bytes") or 0)
        served = sum(v for v in (peer.get("device_bytes") or {}).values() if isinstance(v, int))
        if lost.get("reported_bytes") != 0 or native != 0 or moved != nbytes or served != nbytes:
            problems.append((f"g{generation}: reported {lost.get('reported_bytes')!r} byte(s) and {native} native, the "
                             f"provider moved {moved} (requester) and {served} (source's devices); expected 0 reported "
                             f"and {nbytes} moved", rpath))
        for role, ledger, at in (("requester", req, after.get("at")), ("source", src, peer.get("at"))):
            point = (restart_section(ledger, "restart_point") or {}).get("at")
            if not isinstance(point, (int, float)) or not isinstance(at, (int, float)) or point < at:
                problems.append((f"{role} g{generation}: restart point at {point!r}, lost state at {at!r}: the point "
                                 "must follow it", case.ledger_path(role, generation)))
    return problems


def _recovery(case, role, generation):
    return restart_section(case.ledger(role, generation), "recovery") or {}


@rule("lost_completion.destroy_before_drain", "lost_completion",
      "the survivor destroyed every QP affected by the lost round (the requester: each QP that carried a lost WR; "
      "the source: each QP towards the dead requester), each destroy successful, before its one drain receipt; the "
      "verbs provider held no QP of them at the drain",
      witness=("runner", "peer"), applies=lost_mode, after=("lost_completion.withheld", "steps.times"))
def check_destroy_before_drain(case):
    problems = []
    _fault, survivor = lifecycle.restart_roles(case.profile)
    for generation in nonfinal_generations(case):
        if survivor == "requester":
            affected = sorted({w.get("qpn") for w in _lost_wrs(case.ledger("requester", generation))})
        else:
            affected = sorted((restart_section(case.ledger("source", generation), "lost") or {}).get("qps_live") or [])
        path = f"{case.ledger_path(survivor, generation + 1)}#restart.recovery"
        steps = [s for s in _recovery(case, survivor, generation + 1).get("steps") or [] if isinstance(s, dict)]
        destroys = {s.get("qpn"): s for s in steps if s.get("action") == "destroy_qp"}
        drains = [s for s in steps if s.get("action") == "drain"]
        failed = [q for q, s in destroys.items() if s.get("result") != "Ok"]
        missing = [q for q in affected if q not in destroys]
        if not affected or missing or failed or len(drains) != 1:
            problems.append((f"{survivor} g{generation + 1}: affected QPs {affected}, not destroyed {missing}, destroy "
                             f"failed {failed}, {len(drains)} drain receipt(s) (expected one)", path))
            continue
        late = [q for q in affected if (destroys[q].get("step"), destroys[q].get("at"))
                >= (drains[0].get("step"), drains[0].get("at"))]
        if late or drains[0].get("provider_qps") != 0:
            problems.append((f"{survivor} g{generation + 1}: QP(s) {late} destroyed after the drain receipt; the "
                             f"provider held {drains[0].get('provider_qps')!r} QP(s) at the drain", path))
    return problems


@rule("lost_completion.requester_failed", "lost_completion",
      "the surviving requester failed each batch of the lost round after the source died: drained locally with zero "
      "reported bytes, WRITE effects Unknown (a READ's None), a typed PeerLost in wait of its own, then free() "
      "succeeded; its SQ debt, loans and grants dropped by the drain",
      witness=("profile",), applies=requester_survives, after=("lost_completion.withheld",))
def check_requester_failed(case):
    problems = []
    expected, effect = _batches_expected(case), _effect(case)
    for generation in nonfinal_generations(case):
        ledger, path = case.ledger("requester", generation + 1), case.ledger_path("requester", generation + 1)
        recovery = _recovery(case, "requester", generation + 1)
        batches = [b for b in recovery.get("batches") or [] if isinstance(b, dict)]
        found = {b.get("rail"): b.get("parents") for b in batches}
        wrong = [(b.get("batch"), b.get("state"), b.get("bytes"), b.get("remote_effect"), b.get("locally_drained"),
                  b.get("free")) for b in batches
                 if (b.get("state"), b.get("bytes"), b.get("remote_effect"), b.get("locally_drained"), b.get("free"))
                 != ("Failed", 0, effect, True, "Ok")]
        drain = next((s for s in recovery.get("steps") or [] if isinstance(s, dict) and s.get("action") == "drain"), {})
        after = drain.get("debt_after") or {}
        if found != expected or wrong or any(after.get(k) != 0 for k in ("wrs", "bytes", "grants", "loans")):
            problems.append((f"requester g{generation + 1}: failed batches {found} (expected {expected}); not failed "
                             f"with zero bytes and effect {effect!r}: {wrong}; debt after the drain {after}",
                             f"{path}#restart.recovery"))
        typed = [e for e in ledger["errors"] if isinstance(e, dict)
                 and (e.get("error"), e.get("operation"), e.get("round")) == ("PeerLost", "wait", fault_round(case))]
        bad = [e for e in typed
               if (e.get("bytes"), e.get("remote_effect"), e.get("locally_drained")) != (0, effect, True)]
        if len(typed) != len(expected) or bad:
            problems.append((f"requester g{generation + 1}: {len(typed)} PeerLost error(s) in wait of round "
                             f"{fault_round(case)} (expected {len(expected)}), {len(bad)} with bytes or another effect",
                             f"{path}#errors"))
    return problems


@rule("lost_completion.source_released", "lost_completion",
      "the surviving source released every grant of the lost round after the requester died (its drain receipt: "
      "one grant per parent released, none held after)",
      witness=("profile",), applies=source_survives)
def check_source_released(case):
    problems = []
    parents = case.profile["parents"]
    for generation in nonfinal_generations(case):
        recovery = _recovery(case, "source", generation + 1)
        drain = next((s for s in recovery.get("steps") or [] if isinstance(s, dict) and s.get("action") == "drain"), {})
        found = (drain.get("grants_released"), (drain.get("debt_after") or {}).get("grants"),
                 drain.get("locally_drained"))
        if found != (parents, 0, True):
            problems.append((f"source g{generation + 1}: grants released, held after, drained {found}; expected "
                             f"({parents}, 0, True)", f"{case.ledger_path('source', generation + 1)}#restart.recovery"))
    return problems
