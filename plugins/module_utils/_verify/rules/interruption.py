# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""installed-interruption rules (seed 000, "Interrupt a posted completion RQ"; docs/interruption.md).

The mode runs the restart roles (rules/restart.py holds the kill, the survivor, the replacement and
the stale epochs). Before each nonfinal restart the requester submits one more round; the source
binds a memory window over its data MR, posts its completion receive and answers READY, which the
control relay on the source node holds. Both peers then show the grant pending with no byte moved
and no QP created; the requester's batches stay Running, each wait times out and free() returns
BatchBusy; only then are the restart points written and the fault role killed. The surviving source
drains the outstanding receive (flushed, polled); a surviving requester fails its held batches,
drained locally, with zero bytes and RemoteEffect None; the survivor reclaims the failed lanes.

Expectations come from the profile model (parents, enabled rails, rounds per generation) and the
relay's journal (which frames it held), never from the ledger under test alone.
"""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import _lifecycle as lifecycle
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._lifecycle import (
    fault_round,
    nonfinal_generations,
    restart_section,
)
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import ROLES

HELD_KIND = "ROUND_READY"
FLUSHED = "WR_FLUSH_ERR"


@applies("installed-interruption")
def interruption_mode(profile, _workload):
    return profile.get("mode") == lifecycle.INTERRUPTION_MODE


@applies("installed-interruption, fault_role requester")
def source_survives(profile, _workload):
    return interruption_mode(profile, _workload) and profile.get("fault_role") == "requester"


@applies("installed-interruption, fault_role source")
def requester_survives(profile, _workload):
    return interruption_mode(profile, _workload) and profile.get("fault_role") == "source"


def _batches_expected(case):
    """{rail: [parents]} of the held round: the parents the workload's placement puts on each rail."""
    out = {}
    for entry in case.workload["placement"]:
        out.setdefault(entry["rail"], []).append(entry["parent"])
    return out


def _relay_events(case):
    return [e for e in case.relay.data["events"] if isinstance(e, dict)]


def _connections(case):
    """{conn: {"requester_epoch", "source_epoch", "frames"}} from the relay journal's frames."""
    conns = {}
    for event in _relay_events(case):
        if event.get("ev") != "frame":
            continue
        entry = conns.setdefault(event.get("conn"), {"requester_epoch": None, "source_epoch": None, "frames": []})
        entry["frames"].append(event)
        side = "requester_epoch" if event.get("dir") == "to_source" else "source_epoch"
        if entry[side] is None:
            entry[side] = event.get("epoch")
    return conns


def _pair_connections(case, generation):
    """The relay connections that carried generation ``generation``'s pair (by both ledgers' epochs)."""
    want = (case.ledger("requester", generation).get("epoch"), case.ledger("source", generation).get("epoch"))
    return [c for c in _connections(case).values() if (c["requester_epoch"], c["source_epoch"]) == want]


@rule("interruption.relay_path", "interruption",
      "the requester reached the source only through the control relay on the source node: it forwarded "
      "the rendezvous of every generation's pair (the relay's upstream is the source's service address) and no "
      "payload frame ever passed it",
      witness=("relay", "peer"), needs=("ledgers", "relay"), applies=interruption_mode)
def check_relay_path(case):
    problems = []
    path = case.relay.path
    start = next((e for e in [case.relay.data["header"], *_relay_events(case)] if e.get("ev") == "start"), {})
    service = case.ledger("source", 1).get("service_address")
    if start.get("upstream") != service:
        problems.append((f"the relay forwarded to {start.get('upstream')!r}, the source serves {service!r}", path))
    for generation in case.generations():
        if not _pair_connections(case, generation):
            problems.append((f"g{generation}: no relay connection carried the pair's epochs (requester "
                             f"{case.ledger('requester', generation).get('epoch')}, source "
                             f"{case.ledger('source', generation).get('epoch')})", path))
    payload = [e for e in _relay_events(case) if e.get("ev") == "frame" and e.get("kind") == "PAYLOAD"]
    if payload:
        problems.append((f"{len(payload)} payload frame(s) passed the relay: payload belongs to the data path", path))
    return problems


@rule("interruption.grant_held", "interruption",
      "before each nonfinal restart the relay held exactly one READY, the source's grant of the round after the "
      "generation's three, forwarded no READY of a later round, and held nothing in the last generation",
      witness=("relay", "profile"), needs=("ledgers", "relay"), applies=interruption_mode)
def check_grant_held(case):
    problems = []
    path = case.relay.path
    held_round = fault_round(case)
    final = list(case.generations())[-1]
    for generation in case.generations():
        frames = [f for c in _pair_connections(case, generation) for f in c["frames"]
                  if f.get("dir") == "to_requester" and f.get("kind") == HELD_KIND]
        held = [f for f in frames if f.get("action") == "held"]
        late = [f for f in frames if f.get("action") != "held" and isinstance(f.get("round"), int)
                and f["round"] > case.workload["rounds_per_generation"]]
        wanted = 0 if generation == final else 1
        if len(held) != wanted or late or any(f.get("round") != held_round for f in held):
            problems.append((f"g{generation}: the relay held {[f.get('round') for f in held]} and forwarded "
                             f"{[f.get('round') for f in late]} READY of a later round (expected "
                             f"{[held_round] * wanted} held, none forwarded)", path))
    leaked = [e for e in _relay_events(case) if e.get("ev") == "frame" and e.get("leaked") is True]
    if leaked:
        problems.append((f"the relay let {len(leaked)} grant(s) through", path))
    return problems


@rule("interruption.pending", "interruption",
      "at each nonfinal restart point both peers show the held round's grants pending: the source bound its "
      "memory window, posted its completion receive and holds one grant per parent; the requester holds one "
      "batch per enabled rail covering every parent, all still awaiting their grants, none received; the "
      "restart points come after the held state, and after the relay held the grant",
      witness=("profile", "peer", "relay"), needs=("ledgers", "relay"), applies=interruption_mode,
      after=("interruption.grant_held",))
def check_pending(case):
    problems = []
    parents = case.profile["parents"]
    expected = _batches_expected(case)
    for generation in nonfinal_generations(case):
        source, requester = case.ledger("source", generation), case.ledger("requester", generation)
        spath, rpath = case.ledger_path("source", generation), case.ledger_path("requester", generation)
        held_s, held_r = restart_section(source, "interruption"), restart_section(requester, "interruption")
        if held_s is None or held_r is None:
            problems.append((f"g{generation}: no held round recorded (source {held_s is not None}, requester "
                             f"{held_r is not None})", spath if held_s is None else rpath))
            continue
        receive = held_s.get("completion_receive") or {}
        mw = held_s.get("mw") or {}
        if (held_s.get("round"), held_s.get("grants_pending"), mw.get("bind"), receive.get("pending")) != (
                fault_round(case), parents, "SUCCESS", 1):
            problems.append((f"source g{generation}: round {held_s.get('round')}, grants pending "
                             f"{held_s.get('grants_pending')}, window bind {mw.get('bind')!r}, completion receives "
                             f"pending {receive.get('pending')} (expected round {fault_round(case)}, {parents}, "
                             "'SUCCESS', 1)", f"{spath}#restart.interruption"))
        batches = held_r.get("batches") if isinstance(held_r.get("batches"), list) else []
        found = {b.get("rail"): b.get("parents") for b in batches if isinstance(b, dict)}
        pending = sum(b.get("pending_grants") or 0 for b in batches if isinstance(b, dict))
        if found != expected or pending != parents or held_r.get("grant_received") is not False \
                or held_r.get("round") != held_s.get("round"):
            problems.append((f"requester g{generation}: batches {found}, grants pending {pending}, grant received "
                             f"{held_r.get('grant_received')!r} (expected {expected}, {parents} pending, none "
                             f"received, the source's round {held_s.get('round')})", f"{rpath}#restart.interruption"))
        for role, ledger, held, path in (("source", source, held_s, spath), ("requester", requester, held_r, rpath)):
            point = restart_section(ledger, "restart_point") or {}
            after = held.get("after") or {}
            if not isinstance(point.get("at"), (int, float)) or not isinstance(after.get("at"), (int, float)) \
                    or point["at"] < after["at"]:
                problems.append((f"{role} g{generation}: restart point at {point.get('at')!r}, held state reached at "
                                 f"{after.get('at')!r}: the point must follow the held state", path))
        held_at = [f.get("t") for c in _pair_connections(case, generation) for f in c["frames"]
                   if f.get("action") == "held"]
        point_at = (restart_section(source, "restart_point") or {}).get("at")
        # Both on the source node's clock: the relay held the grant before the source's restart point.
        if held_at and isinstance(point_at, (int, float)) and min(held_at) > point_at:
            problems.append((f"source g{generation}: restart point at {point_at}, the relay held the grant only at "
                             f"{min(held_at)}", spath))
    return problems


def _snapshot_change(held, keys):
    before, after = held.get("before") or {}, held.get("after") or {}
    return {k: (before.get(k), after.get(k)) for k in keys
            if not isinstance(before.get(k), int) or before.get(k) != after.get(k)}


@rule("interruption.no_bytes", "interruption",
      "while the grant was held no byte moved on either peer: the verbs provider's byte counters and the engine's "
      "native byte counters are the same at the held state as when the round was submitted",
      witness=("runner", "peer"), applies=interruption_mode, after=("interruption.grant_held",))
def check_no_bytes(case):
    problems = []
    for generation in nonfinal_generations(case):
        for role in ROLES:
            held = restart_section(case.ledger(role, generation), "interruption")
            changed = _snapshot_change(held or {}, ("provider_bytes", "native_bytes"))
            if held is None or changed:
                problems.append((f"{role} g{generation}: byte counters moved while the grant was held {changed}",
                                 f"{case.ledger_path(role, generation)}#restart.interruption"))
    return problems


@rule("interruption.no_new_qps", "interruption",
      "while the grant was held neither peer created a QP: the engine's count of QPs created and the verbs "
      "provider's count of live QPs are unchanged",
      witness=("runner", "peer"), applies=interruption_mode, after=("interruption.grant_held",))
def check_no_new_qps(case):
    problems = []
    for generation in nonfinal_generations(case):
        for role in ROLES:
            held = restart_section(case.ledger(role, generation), "interruption")
            changed = _snapshot_change(held or {}, ("qps_created", "provider_qps"))
            if held is None or changed:
                problems.append((f"{role} g{generation}: QPs created while the grant was held {changed}",
                                 f"{case.ledger_path(role, generation)}#restart.interruption"))
    return problems


@rule("interruption.batch_busy", "interruption",
      "while the grant was held each of the requester's batches stayed Running, its wait timed out and free() "
      "returned BatchBusy, each a typed error (Timeout in wait, BatchBusy in free) of the held round",
      witness=("profile",), applies=interruption_mode, after=("interruption.grant_held",))
def check_batch_busy(case):
    problems = []
    held_round = fault_round(case)
    count = len(_batches_expected(case))
    for generation in nonfinal_generations(case):
        ledger, path = case.ledger("requester", generation), case.ledger_path("requester", generation)
        held = restart_section(ledger, "interruption") or {}
        batches = [b for b in held.get("batches") or [] if isinstance(b, dict)]
        wrong = [(b.get("batch"), b.get("state"), (b.get("wait") or {}).get("result"), b.get("free")) for b in batches
                 if (b.get("state"), (b.get("wait") or {}).get("result"), (b.get("wait") or {}).get("state_after"),
                     b.get("free")) != ("Running", "Timeout", "Running", "BatchBusy")]
        if len(batches) != count or wrong:
            problems.append((f"requester g{generation}: {len(batches)} batch(es) (expected {count}); not Running with "
                             f"a timed-out wait and a busy free(): {wrong}", f"{path}#restart.interruption"))
        for name in (("Timeout", "wait"), ("BatchBusy", "free")):
            typed = [e for e in ledger["errors"] if isinstance(e, dict) and (e.get("error"), e.get("operation")) == name
                     and e.get("round") == held_round and e.get("remote_effect") == "None" and not e.get("bytes")]
            if len(typed) != count:
                problems.append((f"requester g{generation}: {len(typed)} typed {name[0]} error(s) in {name[1]} of "
                                 f"round {held_round} with no effect, expected {count}", f"{path}#errors"))
    return problems


@rule("interruption.source_drain", "interruption",
      "the surviving source drained the outstanding completion receive after the requester died: the receive it "
      "posted for the held round completed flushed and was polled, its window and grants were released",
      witness=("profile", "runner"), applies=source_survives)
def check_source_drain(case):
    problems = []
    for generation in nonfinal_generations(case):
        held = restart_section(case.ledger("source", generation), "interruption") or {}
        receive = held.get("completion_receive") or {}
        ledger, path = case.ledger("source", generation + 1), case.ledger_path("source", generation + 1)
        recovery = restart_section(ledger, "recovery")
        if recovery is None:
            problems.append((f"source g{generation + 1}: no recovery recorded after the requester died",
                             f"{path}#restart.recovery"))
            continue
        drained = [f for f in recovery.get("flushed") or [] if isinstance(f, dict) and f.get("kind") == "recv"
                   and (f.get("qpn"), f.get("wr_id"), f.get("status")) == (receive.get("qpn"), receive.get("wr_id"),
                                                                           FLUSHED)]
        found = {"receive drained": len(drained), "window released": recovery.get("mw_released"),
                 "grants released": recovery.get("grants_released")}
        wanted = {"receive drained": 1, "window released": True, "grants released": case.profile["parents"]}
        if found != wanted:
            problems.append((f"source g{generation + 1}: {found}, expected {wanted} (the receive "
                             f"{receive.get('wr_id')} on QP {receive.get('qpn')})", f"{path}#restart.recovery"))
    return problems


@rule("interruption.requester_failed", "interruption",
      "the surviving requester reported each held batch failed after the source died: drained locally, zero "
      "bytes, RemoteEffect None, a typed PeerLost of its own, and then free() succeeded",
      witness=("profile",), applies=requester_survives)
def check_requester_failed(case):
    problems = []
    expected = _batches_expected(case)
    for generation in nonfinal_generations(case):
        ledger, path = case.ledger("requester", generation + 1), case.ledger_path("requester", generation + 1)
        recovery = restart_section(ledger, "recovery") or {}
        batches = [b for b in recovery.get("batches") or [] if isinstance(b, dict)]
        found = {b.get("rail"): b.get("parents") for b in batches}
        wrong = [(b.get("batch"), b.get("state"), b.get("bytes"), b.get("remote_effect"), b.get("locally_drained"),
                  b.get("free")) for b in batches
                 if (b.get("state"), b.get("bytes"), b.get("remote_effect"), b.get("locally_drained"), b.get("free"))
                 != ("Failed", 0, "None", True, "Ok")]
        if found != expected or wrong:
            problems.append((f"requester g{generation + 1}: failed batches {found} (expected {expected}); not failed "
                             f"with no effect: {wrong}", f"{path}#restart.recovery"))
        typed = [e for e in ledger["errors"] if isinstance(e, dict) and (e.get("error"), e.get("operation"))
                 == ("PeerLost", "wait")]
        bad = [e for e in typed
               if (e.get("bytes"), e.get("remote_effect"), e.get("locally_drained")) != (0, "None", True)]
        if len(typed) != len(expected) or bad:
            problems.append((f"requester g{generation + 1}: {len(typed)} PeerLost error(s) in wait (expected "
                             f"{len(expected)}), {len(bad)} with an effect", f"{path}#errors"))
    return problems


@rule("interruption.lanes_reclaimed", "interruption",
      "the survivor reclaimed the failed lanes: every QP live at the previous restart point went to ERR with "
      "nothing left queued, the CQs were polled empty before the QPs were retired, and it kept its PDs",
      witness=("runner",), applies=interruption_mode, after=("interruption.source_drain",))
def check_lanes_reclaimed(case):
    _fault, survivor = lifecycle.restart_roles(case.profile)
    problems = []
    first_pds = sorted(c.get("pd") for c in case.ledger(survivor, 1)["contexts"])
    for generation in nonfinal_generations(case):
        point = restart_section(case.ledger(survivor, generation), "restart_point") or {}
        ledger, path = case.ledger(survivor, generation + 1), case.ledger_path(survivor, generation + 1)
        recovery = restart_section(ledger, "recovery") or {}
        lanes = [lane for lane in recovery.get("lanes") or [] if isinstance(lane, dict)]
        qpns = sorted(lane.get("qpn") for lane in lanes)
        wrong = [lane.get("qpn") for lane in lanes
                 if (lane.get("state"), lane.get("receives_pending"), lane.get("wrs_pending")) != ("ERR", 0, 0)]
        retired = sorted((ledger.get("restart") or {}).get("retired_qps") or [])
        if qpns != sorted(point.get("qps_live") or []) or wrong or recovery.get("cqs_empty") is not True \
                or qpns != retired:
            problems.append((f"{survivor} g{generation + 1}: reclaimed lanes {qpns} (live at the restart point "
                             f"{sorted(point.get('qps_live') or [])}, retired {retired}), not in ERR or still queued "
                             f"{wrong}, CQs empty {recovery.get('cqs_empty')!r}", f"{path}#restart.recovery"))
        if sorted(recovery.get("pds") or []) != first_pds:
            problems.append((f"{survivor} g{generation + 1}: PDs {recovery.get('pds')}, generation 1 had {first_pds}",
                             f"{path}#restart.recovery"))
    return problems
