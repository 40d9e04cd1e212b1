# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""installed-restart rules (seed 000, "Peer restart with a surviving engine"; docs/restart.md).

Each generation runs three rounds and drains with its cached QPs and four persistent MRs live (its
restart point); then the fault role's supervisor SIGKILLs and reaps that one runner, and a
replacement starts with the same service address and registration ID and a fresh epoch. The
survivor keeps its pid, engine, epoch, registration and MRs, and every earlier epoch of its peer
must fail ``open_segment`` and a submission with EpochMismatch, with no effect at all.

What is checked where: the kills and exit statuses against the profile are journal.children's, the
pid of each generation identity.processes', a fresh epoch per process identity.epochs', at most
rails x lanes new QPs per generation qps.reuse's (each generation has a ledger of its own). The
rules here hold the rest against the journals, the peer's ledgers and the profile model.
"""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import _lifecycle as lifecycle
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import ROLES, runner_starts
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules.identity import told_case

MRS_PER_CONTEXT = 2  # a data MR and a ctrl MR per context: four persistent MRs per peer
PROBED = ("open_segment", "submit")


@applies("installed-restart, installed-interruption, installed-lost-completion")
def restart_mode(profile, _workload):
    return lifecycle.restart_roles(profile) is not None


def _restart(ledger):
    section = ledger.get("restart")
    return section if isinstance(section, dict) else {}


def _journal_events(case, role, name):
    return [e for e in case.journals[role].data["events"] if e.get("ev") == name]


def relay_start(case):
    """The relay journal's start record ({} when there is none or it is unusable)."""
    events = case.relay.data.get("events") if case.relay is not None and case.relay.ok else None
    header = case.relay.data.get("header") if case.relay is not None and case.relay.ok else None
    for record in ([header] if isinstance(header, dict) else []) + (events or []):
        if isinstance(record, dict) and record.get("ev") == "start":
            return record
    return {}


@rule("restart.restart_point", "restart",
      "each nonfinal generation of both peers ends at its restart point: three rounds drained, its rails x lanes "
      "cached QPs and four persistent MRs still live (also in the verbs provider's own count)",
      witness=("profile", "runner"), applies=restart_mode)
def check_restart_point(case):
    problems = []
    bound = case.workload["qp_bound_per_peer_operation"]
    mrs = MRS_PER_CONTEXT * model.RAIL_COUNT
    for generation in case.generations():
        if not lifecycle.ends_idle(case.profile, generation):
            continue
        for role in ROLES:
            ledger, path = case.ledger(role, generation), case.ledger_path(role, generation)
            point = _restart(ledger).get("restart_point")
            if not isinstance(point, dict):
                problems.append((f"{role} g{generation}: no restart point recorded", f"{path}#restart"))
                continue
            cached = sorted(q["qpn"] for q in ledger["qps"] if q.get("destroyed_round") is None)
            live_mrs = sum(1 for c in ledger["contexts"] for m in c["mrs"] if m.get("live") is True)
            held = point.get("provider_held") if isinstance(point.get("provider_held"), dict) else {}
            found = {"cached QPs": len(cached), "QPs live at the point": len(point.get("qps_live") or []),
                     "live MRs": live_mrs, "provider QPs": held.get("qp"), "provider MRs": held.get("mr"),
                     "rounds": len(ledger["rounds"])}
            wanted = {"cached QPs": bound, "QPs live at the point": bound, "live MRs": mrs, "provider QPs": bound,
                      "provider MRs": mrs, "rounds": case.workload["rounds_per_generation"]}
            if lifecycle.dependency_cleanup(case.profile) and (role, generation) == ("requester", 1):
                # cq, channel, pd: the cleanup step released the fault rail's QPs (and MRs): cleanup.owners
                # holds the provider's counts against the profile model's table; the rounds still count here.
                for key in ("cached QPs", "QPs live at the point", "live MRs", "provider QPs", "provider MRs"):
                    found.pop(key)
            wrong = {k: v for k, v in found.items() if v != wanted[k]}
            if wrong or (sorted(point.get("qps_live") or []) != cached and "cached QPs" in found):
                problems.append((f"{role} g{generation}: at the restart point {wrong or found} (expected "
                                 f"{ {k: wanted[k] for k in (wrong or wanted)} }, the ledger's live QPs "
                                 f"{cached[:4]})", f"{path}#restart.restart_point"))
    return problems


@rule("restart.kill_point", "restart",
      "each kill came at the documented point: after the killed runner's restart point, naming the pid and start "
      "time the supervisor started it with, and its replacement started only after it was reaped",
      witness=("journal",), needs=("ledgers", "journals"), applies=restart_mode)
def check_kill_point(case):
    problems = []
    for role, generation in lifecycle.expected_kills(case.profile):
        path = case.journals[role].path
        events = case.journals[role].data["events"]
        starts = {g: found[-1] for g, found in runner_starts(case, role).items()}
        start, after = starts.get(generation), starts.get(generation + 1)
        if start is None or after is None:
            problems.append((f"{role} g{generation}: the journal has no start of this runner or of its replacement",
                             path))
            continue
        pid = start.get("pid")
        kills = [e for e in events if e.get("ev") == "signal" and e.get("pid") == pid]
        exits = [e for e in events if e.get("ev") == "child_exit" and e.get("pid") == pid]
        point = _restart(case.ledger(role, generation)).get("restart_point") or {}
        if len(kills) != 1 or not exits:
            problems.append((f"{role} g{generation}: pid {pid} signalled {len(kills)} time(s), reaped "
                             f"{len(exits)} time(s) (expected one kill, reaped)", path))
            continue
        kill = kills[0]
        if kill.get("start_time") != start.get("start_time"):
            problems.append((f"{role} g{generation}: the kill named start time {kill.get('start_time')!r}, pid {pid} "
                             f"started with {start.get('start_time')!r}", path))
        at = point.get("at")
        # Both times are this node's clock: the runner's restart point and its supervisor's kill.
        if not isinstance(at, (int, float)) or not isinstance(kill.get("t"), (int, float)) or kill["t"] < at:
            problems.append((f"{role} g{generation}: killed at {kill.get('t')!r}, its restart point is {at!r}: "
                             "the kill must follow the generation's rounds and drain", path))
        if not (kill.get("seq", -1) < exits[0].get("seq", -1) < after.get("seq", -1)):
            problems.append((f"{role} g{generation}: the replacement (pid {after.get('pid')}) started before pid "
                             f"{pid} was killed and reaped", path))
    return problems


@rule("restart.survivor", "restart",
      "the survivor is one runner for every generation: started once, with one epoch, one registration and the "
      "same four MRs (handles and keys) throughout, never registered again",
      witness=("journal",), needs=("ledgers", "journals"), applies=restart_mode)
def check_survivor(case):
    _fault, survivor = lifecycle.restart_roles(case.profile)
    problems = []
    journal_path = case.journals[survivor].path
    starts = _journal_events(case, survivor, "child_start")
    if len(starts) != 1:
        problems.append((f"{survivor}: the journal shows {len(starts)} runner start(s); the survivor starts once",
                         journal_path))
    pid = starts[0].get("pid") if starts else None
    first = case.ledger(survivor, 1)

    def mrs(ledger):
        return sorted((c.get("rail"), m.get("kind"), m.get("mr"), m.get("lkey"), m.get("rkey"))
                      for c in ledger["contexts"] for m in c["mrs"])

    for generation in case.generations():
        ledger, path = case.ledger(survivor, generation), case.ledger_path(survivor, generation)
        seen = {"pid": ledger.get("pid"), "epoch": ledger.get("epoch"), "registration": ledger.get("registration_id")}
        wanted = {"pid": pid, "epoch": first.get("epoch"), "registration": first.get("registration_id")}
        wrong = {k: v for k, v in seen.items() if v != wanted[k]}
        if wrong:
            problems.append((f"{survivor} g{generation}: {wrong}, the survivor's are "
                             f"{ {k: wanted[k] for k in wrong} }", path))
        if len(mrs(ledger)) != MRS_PER_CONTEXT * model.RAIL_COUNT or mrs(ledger) != mrs(first):
            problems.append((f"{survivor} g{generation}: MRs {mrs(ledger)[:4]}, generation 1 registered "
                             f"{mrs(first)[:4]}: the survivor keeps its four MRs", f"{path}#contexts"))
    return problems


@applies("installed-restart")
def plain_restart(profile, _workload):
    return profile.get("mode") == lifecycle.RESTART_MODE


def _left_live(ledger):
    """The QPs a generation's ledger leaves live (never destroyed), sorted."""
    return sorted((q.get("qpn") for q in ledger["qps"] if q.get("destroyed_round") is None), key=str)


@rule("restart.retired", "restart",
      "from generation 2 the QPs the survivor retires are exactly the ones the previous generation left live: its "
      "own list at that restart point, the peers of the killed runner's QPs, and the verbs provider's count of QPs "
      "the survivor then held (when the plan loads the provider)",
      witness=("runner", "peer", "provider"), applies=plain_restart, after=("restart.restart_point",))
def check_retired(case):
    """A survivor that keeps a QP of its dead peer (or retires one it never had) says so nowhere else."""
    problems = []
    fault, survivor = lifecycle.restart_roles(case.profile)
    for generation in list(case.generations())[1:]:
        before = case.ledger(survivor, generation - 1)
        retired = _restart(case.ledger(survivor, generation)).get("retired_qps")
        retired = sorted(retired, key=str) if isinstance(retired, list) else retired
        peers = sorted((q.get("peer_qpn") for q in case.ledger(fault, generation - 1)["qps"]
                        if q.get("destroyed_round") is None), key=str)
        wanted = {"its own live QPs": _left_live(before), "the killed runner's peers": peers}
        if case.provider_planned():
            point = _restart(before).get("restart_point")
            held = point.get("provider_held") if isinstance(point, dict) else None
            wanted["the provider's QP count"] = held.get("qp") if isinstance(held, dict) else None
        found = {"its own live QPs": retired, "the killed runner's peers": retired,
                 "the provider's QP count": len(retired) if isinstance(retired, list) else None}
        wrong = {k: v for k, v in wanted.items() if found[k] != v}
        if wrong:
            problems.append((f"{survivor} g{generation}: retired QPs {retired}; generation {generation - 1} left "
                             f"live {wrong}", f"{case.ledger_path(survivor, generation)}#restart.retired_qps"))
    return problems


@rule("restart.replacement", "restart",
      "each generation's fault-role runner is a new process (a pid of its own) with the same registration ID, the "
      "same service address as generation 1 (the requester: the same peer address, the source's)",
      witness=("journal", "peer"), needs=("ledgers", "journals"), applies=restart_mode)
def check_replacement(case):
    fault, _survivor = lifecycle.restart_roles(case.profile)
    problems = []
    path = case.journals[fault].path
    starts = runner_starts(case, fault)
    pids = []
    first = case.ledger(fault, 1)
    source_address = case.ledger("source", 1).get("service_address")
    # installed-interruption: the requester reaches the source through the control relay (its journal's start).
    relayed = relay_start(case).get("listen") if case.relay is not None else None
    for generation in case.generations():
        found = starts.get(generation, [])
        if len(found) != 1:
            problems.append((f"{fault} g{generation}: {len(found)} runner start(s) for this generation", path))
            continue
        pids.append(found[0].get("pid"))
        told = told_case(found[0])
        ledger = case.ledger(fault, generation)
        if ledger.get("registration_id") != first.get("registration_id"):
            problems.append((f"{fault} g{generation}: registration {ledger.get('registration_id')!r}, generation 1 "
                             f"was {first.get('registration_id')!r}", case.ledger_path(fault, generation)))
        if fault == "source":
            bound = ledger.get("service_address")
            if bound != source_address or (generation > 1 and told.get("service_address") != source_address):
                problems.append((f"source g{generation}: told {told.get('service_address')!r}, bound {bound!r}; "
                                 f"generation 1 served {source_address!r}", path))
        elif told.get("peer_address") != (relayed or source_address):
            problems.append((f"requester g{generation}: told peer {told.get('peer_address')!r}, the source serves "
                             f"{source_address!r}" + (f" through the relay at {relayed!r}" if relayed else ""), path))
    if len(set(pids)) != len(pids):
        problems.append((f"{fault}: pids {pids}: each generation must be a new process", path))
    return problems


@rule("restart.stale_refused", "restart",
      "from generation 2 on the survivor tried every earlier epoch of its peer (the killed runners' own epochs) "
      "with open_segment and with a submission, and each failed EpochMismatch (a typed error of its own)",
      witness=("peer",), applies=restart_mode, after=("identity.epochs",))
def check_stale_refused(case):
    fault, survivor = lifecycle.restart_roles(case.profile)
    problems = []
    for generation in case.generations():
        ledger, path = case.ledger(survivor, generation), case.ledger_path(survivor, generation)
        probes = _restart(ledger).get("stale_probes") or []
        stale = [case.ledger(fault, g).get("epoch") for g in range(1, generation)]
        current = case.ledger(fault, generation).get("epoch")
        wanted = sorted((epoch, op) for epoch in stale for op in PROBED)
        tried = sorted((p.get("peer_epoch"), p.get("operation")) for p in probes)
        refused = [p for p in probes if p.get("result") == "EpochMismatch" and p.get("current_peer_epoch") == current]
        if tried != wanted or len(refused) != len(probes):
            problems.append((f"{survivor} g{generation}: stale attempts {tried} ({len(refused)} refused against the "
                             f"peer's epoch {current}), expected {wanted} all refused", f"{path}#restart.stale_probes"))
        for op in PROBED:
            typed = [e for e in ledger["errors"] if isinstance(e, dict) and (e.get("error"), e.get("operation"))
                     == ("EpochMismatch", op)]
            if len(typed) != len(stale):
                problems.append((f"{survivor} g{generation}: {len(typed)} EpochMismatch error(s) in {op}, expected "
                                 f"{len(stale)} (one per earlier epoch)", f"{path}#errors"))
    for generation in case.generations():
        if _restart(case.ledger(fault, generation)).get("stale_probes"):
            problems.append((f"{fault} g{generation}: a fresh runner has no earlier epoch to try",
                             case.ledger_path(fault, generation)))
    return problems


def _stray_wrs(case, survivor):
    """What the survivor's accounting observer saw posted outside every round of every generation: the
    WRs (qpn, wr_id) of its log that no round of its ledgers lists, or a text why the log is missing."""
    log = case.observer_logs.get((survivor, 1, "accounting"))
    if log is None:
        return None, "no accounting observer log of the survivor (the profile model loads one)"
    listed = {key for g in case.generations() for rnd in case.ledger(survivor, g)["rounds"]
              for key in zip(rnd["wrs"]["qpn"], rnd["wrs"]["wr_id"])}
    wrs = log.wrs()
    seen = list(zip(wrs["qpn"], wrs["wr_id"]))
    stray = [key for key in seen if key not in listed]
    twice = len(seen) - len(set(seen))
    return log, (stray, twice)


@rule("restart.stale_no_effect", "restart",
      "every stale-epoch attempt created no QP, posted no WR, moved no byte, reported RemoteEffect None and "
      "drained locally; the verbs provider held the same objects before and after; the survivor's accounting "
      "observer saw no WR posted outside its rounds",
      witness=("runner", "observer"), needs=("ledgers", "observers"), applies=restart_mode)
def check_stale_no_effect(case):
    """The runner's record of each probe (its counts, its provider's held objects before and after), and
    the survivor's own accounting observer (one process, one log through every generation): every
    payload WR it saw accepted must be one its ledgers list in a round (the source's: none at all), so
    a WR posted for a stale epoch shows as one no round has. The observer does not see a QP created
    and destroyed without a WR (it does not interpose ibv_create_qp): for that the runner's count and
    its provider's held objects stand alone."""
    _fault, survivor = lifecycle.restart_roles(case.profile)
    problems = []
    zero = {"qps_created": 0, "wrs_posted": 0, "bytes": 0, "remote_effect": "None", "locally_drained": True}
    for generation in case.generations():
        ledger, path = case.ledger(survivor, generation), case.ledger_path(survivor, generation)
        for index, probe in enumerate(_restart(ledger).get("stale_probes") or []):
            wrong = {k: probe.get(k) for k, v in zero.items() if probe.get(k) != v}
            if probe.get("provider_held_before") != probe.get("provider_held_after"):
                wrong["provider_held"] = (probe.get("provider_held_before"), probe.get("provider_held_after"))
            if wrong:
                problems.append((f"{survivor} g{generation}: stale {probe.get('operation')} at epoch "
                                 f"{probe.get('peer_epoch')}: {wrong}", f"{path}#restart.stale_probes[{index}]"))
        for index, error in enumerate(ledger["errors"]):
            if isinstance(error, dict) and error.get("error") == "EpochMismatch":
                wrong = {k: error.get(k) for k, v in zero.items() if error.get(k) != v}
                if wrong:
                    problems.append((f"{survivor} g{generation}: EpochMismatch in {error.get('operation')}: {wrong}",
                                     f"{path}#errors[{index}]"))
    if {"tool": "accounting", "role": survivor} not in case.workload["observers"]:
        return problems  # installed-interruption loads no observer: the runner and its provider stand alone
    log, found = _stray_wrs(case, survivor)
    if log is None:
        problems.append((f"{survivor}: {found}", case.ledger_path(survivor, 1)))
    elif found[0] or found[1]:
        stray, twice = found
        problems.append((f"{survivor}: its accounting observer saw {len(stray)} WR(s) posted outside every round "
                         f"(qpn/wr_id {stray[:4]}) and {twice} logged twice: a WR posted for a stale epoch (or "
                         "anywhere else) is an effect", log.path))
    return problems


@rule("restart.teardown", "restart",
      "only the last generation's runners tear down, drained and quiesced (their QPs, the four MRs and both contexts "
      "released, nothing left in the verbs provider); a ledger at a restart point records no teardown",
      witness=("profile",), applies=restart_mode)
def check_restart_teardown(case):
    problems = []
    want = {"qps_destroyed": case.workload["qp_bound_per_peer_operation"],
            "mrs_deregistered": MRS_PER_CONTEXT * model.RAIL_COUNT, "contexts_closed": model.RAIL_COUNT,
            "retained_owners": 0, "drained": True, "debt_wrs": 0, "debt_bytes": 0, "debt_grants": 0}
    for generation in case.generations():
        for role in ROLES:
            ledger, path = case.ledger(role, generation), case.ledger_path(role, generation)
            teardown = ledger.get("teardown")
            if lifecycle.ends_idle(case.profile, generation):
                if teardown is not None:
                    problems.append((f"{role} g{generation}: a teardown at a restart point", f"{path}#teardown"))
                continue
            if not isinstance(teardown, dict):
                problems.append((f"{role} g{generation}: no teardown recorded", f"{path}#teardown"))
                continue
            wrong = {k: teardown.get(k) for k, v in want.items() if teardown.get(k) != v}
            held = teardown.get("provider_held")
            if isinstance(held, dict) and any(held.values()):
                wrong["provider_held"] = held
            if wrong or teardown.get("errors"):
                problems.append((f"{role} g{generation}: teardown {wrong} (expected "
                                 f"{ {k: want.get(k, 'all 0') for k in wrong} }), errors {teardown.get('errors')}",
                                 f"{path}#teardown"))
    return problems
