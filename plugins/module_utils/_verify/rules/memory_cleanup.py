# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""installed-memory-cleanup rules (seed 000, "MR/MW cleanup and engine replacement"; docs/memory_cleanup.md).

One process per role, two engines in it. After the old engines' three healthy rounds, the fault role's real
``ibv_dereg_mr`` (``cleanup_kind: mr``) or ``ibv_dealloc_mw`` (``mw``, the source's grant window) fails with
EIO through the preloaded uverbs_fault observer's seccomp filter, and any retry is rejected. The MR keeps its
registration charge and backing; the MW keeps its parent MR borrow, grant, DMA loan, quota and key domain. The
rail's real PD destroy still fails EBUSY. Both processes then create fresh engines at the same addresses: the old
epochs fail before QP creation, three rounds pass, and the old quarantined allocation stays retained until exit.

Witnesses: the observer's own log (which destroys reached the uverbs descriptor, which it failed, any retry), the
verbs provider's figures (its count of held objects and its key-domain query, taken by the runner but computed by
the provider), the profile model (one parent, its backing, what one quarantined MR or MW keeps) and the peer's
ledger (its old epoch, its fresh engine's rounds). The fault role's ledger is one witness among these.
"""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import ROLES, part

MODE = "installed-memory-cleanup"
TOOL = "uverbs_fault"
GENERATION = 1
EIO = 5
RELEASE_CALLS = {"mr": "ibv_dereg_mr", "mw": "ibv_dealloc_mw"}
ROUNDS = model.ROUNDS_PER_GENERATION
PROBED = ("open_segment", "submit")


@applies("installed-memory-cleanup")
def memory_mode(profile, _workload):
    return profile.get("mode") == MODE


@applies("installed-memory-cleanup, cleanup_kind mr")
def mr_kind(profile, _workload):
    return memory_mode(profile, _workload) and profile.get("cleanup_kind") == "mr"


@applies("installed-memory-cleanup, cleanup_kind mw")
def mw_kind(profile, _workload):
    return memory_mode(profile, _workload) and profile.get("cleanup_kind") == "mw"


def _section(case, role):
    """(the role's ``memory_cleanup`` section, its evidence path)."""
    path = case.ledger_path(role, GENERATION)
    return part(case.ledger(role, GENERATION), "memory_cleanup"), f"{path}#memory_cleanup"


def _fault(case):
    return case.profile["fault_role"]


def _log(case):
    return case.observer_logs.get((_fault(case), GENERATION, TOOL))


def _destroys(log):
    return log.text_events("destroy")


def _injected(destroys):
    return [e for e in destroys if e.get("injected") is True]


def _quarantined_held(profile):
    """What the provider must still hold once the old engine is gone, from the profile model alone: the rail's
    context and PD, the quarantined MR (mr) or the window and its parent MR (mw); nothing else."""
    held = dict.fromkeys(("ctx", "pd", "mr", "mw", "cq", "channel", "qp"), 0)
    held.update(ctx=1, pd=1, mr=1)
    if profile.get("cleanup_kind") == "mw":
        held["mw"] = 1
    return held


@rule("memory_cleanup.fault", "memory_cleanup",
      "the real uverbs_fault observer (preloaded into the fault role) failed that role's first dereg_mr (mr) or "
      "dealloc_mw (mw) with EIO, injected and not a retry, on the object the runner recorded, and nothing else; "
      "the old engine's close failed Unquiesced, not locally drained",
      witness=("observer", "runner"), needs=("ledgers", "observers"), applies=memory_mode)
def check_fault(case):
    role, kind = _fault(case), case.profile["cleanup_kind"]
    record, where = _section(case, role)
    log = _log(case)
    if log is None or not log.ok:
        return [(f"{role} g1: no usable uverbs_fault observer log (the profile model loads it into the fault role): "
                 "no fault was injected", log.path if log is not None else case.ledger_path(role, GENERATION))]
    refused = [event.get("reason") for event in log.text_events("not_armed")]
    if refused:
        return [(f"{role} g1: the uverbs_fault observer refused to arm ({refused[0]}): no fault was injected",
                 log.path)]
    problems = []
    destroys = _destroys(log)
    first = next((e for e in destroys if e.get("kind") == kind), None)
    close = part(record, "close")
    obj = part(close, "object")
    handle = str((first or {}).get("handle", ""))
    if first is None or (first.get("errno"), first.get("injected"), first.get("retry")) != (EIO, True, False) \
            or handle.rpartition(":")[2] != str(obj.get("uverbs_handle")):
        problems.append((f"{role} g1: the observer's first {kind} destroy is {first}, expected the recorded object's "
                         f"(uverbs handle {obj.get('uverbs_handle')!r}) failed with EIO ({EIO}), injected, not a "
                         "retry: the fault never reached the uverbs descriptor", log.path))
    others = [e for e in _injected(destroys) if e is not first and not e.get("retry")]  # a retry: no_retry's
    if others:
        problems.append((f"{role} g1: the observer failed other destroys too: {others[:3]}", log.path))
    release = part(close, "release")
    if (release.get("call"), release.get("errno")) != (RELEASE_CALLS[kind], "EIO") or close.get("result") != \
            "Unquiesced":
        problems.append((f"{role} g1: the old engine's close recorded {close.get('release')} with result "
                         f"{close.get('result')!r}; the observer failed {RELEASE_CALLS[kind]} with EIO (expected "
                         "Unquiesced)", f"{where}.close"))
    errors = [e for e in case.ledger(role, GENERATION)["errors"] if isinstance(e, dict)
              and (e.get("error"), e.get("operation")) == ("Unquiesced", "close")]
    if len(errors) != 1 or errors[0].get("locally_drained") is not False:
        problems.append((f"{role} g1: typed errors Unquiesced in close: {errors} (expected one, not locally "
                         "drained)", case.ledger_path(role, GENERATION)))
    return problems


@rule("memory_cleanup.no_retry", "memory_cleanup",
      "a repeated close of the quarantined MR/MW reports Unquiesced again without calling the release, and the "
      "observer saw no retry (no second destroy of that object, no destroy marked retry)",
      witness=("observer", "runner"), needs=("ledgers", "observers"), applies=memory_mode,
      after=("memory_cleanup.fault",))
def check_no_retry(case):
    role = _fault(case)
    record, where = _section(case, role)
    again = part(part(record, "close"), "repeated_close")
    problems = []
    if (again.get("result"), again.get("release_called")) != ("Unquiesced", False):
        problems.append((f"{role} g1: the repeated close gave {again.get('result')!r}, release called "
                         f"{again.get('release_called')!r} (expected Unquiesced, false)", f"{where}.close"))
    log = _log(case)
    if log is not None and log.ok:
        destroys = _destroys(log)
        failed = {(e.get("kind"), e.get("handle")) for e in _injected(destroys) if not e.get("retry")}
        retries = [e for e in destroys if e.get("retry") is not False]
        repeated = [e for e in destroys if (e.get("kind"), e.get("handle")) in failed]
        if retries or len(repeated) > len(failed):
            problems.append((f"{role} g1: the observer saw the failed object destroyed again: "
                             f"{(retries or repeated)[:3]}", log.path))
    return problems


def _retention_points(record):
    """The three points the quarantine is looked at: the close, after the caller dropped the old engine, at exit."""
    close = part(record, "close")
    return (("at the close", close), ("after the handles were dropped", part(record, "retained")),
            ("at process exit", part(record, "at_exit")))


def _charges_held(role, record, where, want, what):
    """A problem for each retention point whose charges are not ``want`` (the profile model's)."""
    problems = []
    for label, point in _retention_points(record):
        charges = part(point, "charges")
        if {k: charges.get(k) for k in want} != want:
            problems.append((f"{role} g1: {what} {label} {charges or None}, expected {want} (the profile model's)",
                             where))
    return problems


@rule("memory_cleanup.registration", "memory_cleanup",
      "the quarantined MR keeps its registration charge (one registration of the profile's backing) at the close, "
      "after the caller drops the old engine and at exit (the engine's charges: the runner's word), and the "
      "provider's key domain still answers for the MR with that length",
      witness=("profile", "provider", "runner"), needs=("ledgers",), applies=mr_kind, after=("memory_cleanup.fault",))
def check_registration(case):
    role = _fault(case)
    record, where = _section(case, role)
    backing = case.workload["backing_per_peer"]
    problems = _charges_held(role, record, where, {"registrations": 1, "registered_bytes": backing},
                             "registration charge")
    for label, point in _retention_points(record)[1:]:
        query = part(point, "key_query")
        if (query.get("kind"), query.get("length")) != ("mr", backing):
            problems.append((f"{role} g1: the provider's key query {label} gave {point.get('key_query')}, expected "
                             f"a live MR of {backing} B", where))
    return problems


@rule("memory_cleanup.window", "memory_cleanup",
      "the quarantined MW keeps its parent MR borrow, its grant (the profile's parents), its DMA loan (the "
      "profile's backing), its quota (the engine's charges: the runner's word) and its key domain: the provider "
      "still answers for the window, bound, and for its parent MR with one window bound",
      witness=("profile", "provider", "runner"), needs=("ledgers",), applies=mw_kind, after=("memory_cleanup.fault",))
def check_window(case):
    role = _fault(case)
    record, where = _section(case, role)
    backing = case.workload["backing_per_peer"]
    want = {"borrows": 1, "grants_pending": case.profile["parents"], "loan_bytes": backing, "windows": 1}
    problems = _charges_held(role, record, where, want, "window charges")
    for label, point in _retention_points(record)[1:]:
        query, parent = part(point, "key_query"), part(point, "parent_query")
        if (query.get("kind"), query.get("windows"), query.get("length")) != ("mw", 1, backing) or (
                parent.get("kind"), parent.get("windows")) != ("mr", 1):
            problems.append((f"{role} g1: the provider's key domain {label}: window {point.get('key_query')}, parent "
                             f"MR {point.get('parent_query')} (expected a bound window of {backing} B over a live MR "
                             "with one window bound)", where))
    return problems


@rule("memory_cleanup.pd_busy", "memory_cleanup",
      "the rail's real PD destroy still failed EBUSY: the command reached the uverbs descriptor unfiltered (a "
      "genuine dependency failure in the provider, not the observer's) and the provider still holds the PD",
      witness=("observer", "provider", "runner"), needs=("ledgers", "observers"), applies=memory_mode,
      after=("memory_cleanup.fault",))
def check_pd_busy(case):
    role = _fault(case)
    record, where = _section(case, role)
    close = part(record, "close")
    pd = part(close, "pd_destroy")
    problems = []
    if (pd.get("call"), pd.get("errno")) != ("ibv_dealloc_pd", "EBUSY"):
        problems.append((f"{role} g1: the PD destroy recorded {close.get('pd_destroy')}, expected ibv_dealloc_pd "
                         "failing EBUSY (the PD still has the quarantined object)", f"{where}.close"))
    held = part(close, "provider_held").get("pd")
    if held != 1:
        problems.append((f"{role} g1: the verbs provider holds {held!r} PD(s) after the old engine's close; the "
                         "quarantined object's PD must stay (1)", f"{where}.close"))
    log = _log(case)
    if log is not None and log.ok:
        destroys = _destroys(log)
        fault = next((i for i, e in enumerate(destroys) if e.get("injected") is True), None)
        after = [e for e in destroys[fault + 1:] if e.get("kind") == "pd"] if fault is not None else []
        if not after or (after[0].get("errno"), after[0].get("injected")) != (0, False):
            problems.append((f"{role} g1: the observer saw PD destroys {after[:2]} after the fault, expected the "
                             "rail's PD destroy command passing the filter (errno 0, not injected)", log.path))
    return problems


@rule("memory_cleanup.until_exit", "memory_cleanup",
      "the old quarantined allocation stays retained until process exit: a weak owner is alive after the caller "
      "dropped the old engine and at exit, and the provider holds exactly what the profile model says one "
      "quarantined MR or MW keeps, before and after the fresh engine's complete teardown (0 retained owners)",
      witness=("profile", "provider", "runner"), needs=("ledgers",), applies=memory_mode,
      after=("memory_cleanup.fault",))
def check_until_exit(case):
    role = _fault(case)
    record, where = _section(case, role)
    want = _quarantined_held(case.profile)
    problems = []
    for label, point in _retention_points(record)[1:]:
        if point.get("weak_owner_alive") is not True:
            problems.append((f"{role} g1: the weak owner of the quarantined allocation is dead {label}: the backing "
                             "was released before process exit", where))
        held = part(point, "provider_held")
        if {k: held.get(k) for k in want} != want:
            problems.append((f"{role} g1: the verbs provider holds {held or None} {label}, expected {want} (the "
                             "profile model's quarantine)", where))
    teardown = part(part(record, "replacement"), "teardown")
    if (teardown.get("retained_owners"), teardown.get("errors")) != (0, []):
        problems.append((f"{role} g1: the fresh engine's teardown retained {teardown.get('retained_owners')!r} "
                         f"owner(s), errors {teardown.get('errors')!r}", f"{where}.replacement.teardown"))
    return problems


@rule("memory_cleanup.old_epochs", "memory_cleanup",
      "each fresh engine, at the same address, refused the peer's old epoch (the peer's own ledger) in open_segment "
      "and submit with EpochMismatch before any QP, WR or byte; the fresh epochs are new",
      witness=("peer",), needs=("ledgers",), applies=memory_mode)
def check_old_epochs(case):
    problems = []
    for role in ROLES:
        peer = "requester" if role == "source" else "source"
        record, where = _section(case, role)
        fresh = part(record, "replacement")
        old_peer_epoch = case.ledger(peer, GENERATION).get("epoch")
        probes = [p for p in (part(fresh, "restart").get("stale_probes") or []) if isinstance(p, dict)]
        shown = {(p.get("operation"), p.get("peer_epoch")): p for p in probes}
        for operation in PROBED:
            probe = shown.get((operation, old_peer_epoch), {})
            if (probe.get("result"), probe.get("qps_created"), probe.get("wrs_posted"), probe.get("bytes")) != (
                    "EpochMismatch", 0, 0, 0):
                problems.append((f"{role}: the fresh engine's {operation} with the peer's old epoch {old_peer_epoch} "
                                 f"gave {probe or None} (expected EpochMismatch, 0 QPs, 0 WRs, 0 bytes)",
                                 f"{where}.replacement.restart.stale_probes"))
        if fresh.get("epoch") in (None, record.get("old_epoch"), case.ledger(role, GENERATION).get("epoch")):
            problems.append((f"{role}: the fresh engine's epoch {fresh.get('epoch')!r} is not new (old "
                             f"{record.get('old_epoch')!r})", f"{where}.replacement.epoch"))
    source = part(_section(case, "source")[0], "replacement")
    if source.get("service_address") != case.ledger("source", GENERATION).get("service_address"):
        problems.append((f"source: the fresh engine served {source.get('service_address')!r}, the old one "
                         f"{case.ledger('source', GENERATION).get('service_address')!r} (the same address)",
                         f"{case.ledger_path('source', GENERATION)}#memory_cleanup.replacement.service_address"))
    return problems


@rule("memory_cleanup.replacement", "memory_cleanup",
      "the fresh engines ran three rounds numbered 1..3 towards each other's fresh epoch with the same fresh input "
      "seeds, every parent completed with its bytes and guards checked on the destination side, the profile's bytes "
      "each round on both peers, and tore down completely",
      witness=("profile", "peer"), needs=("ledgers",), applies=memory_mode)
def check_replacement(case):
    problems = []
    fresh = {role: part(_section(case, role)[0], "replacement") for role in ROLES}
    per_round = case.workload["bytes_per_round"]
    old_seeds = {r.get("input_seed") for role in ROLES for r in case.ledger(role, GENERATION)["rounds"]}
    destination = "requester" if case.profile["operation"] == "read" else "source"
    for role in ROLES:
        peer = "requester" if role == "source" else "source"
        where = f"{case.ledger_path(role, GENERATION)}#memory_cleanup.replacement"
        rounds = [r for r in fresh[role].get("rounds") or [] if isinstance(r, dict)]
        numbers = [r.get("round") for r in rounds]
        if numbers != list(range(1, ROUNDS + 1)):
            problems.append((f"{role}: the fresh engine's rounds {numbers}, expected 1..{ROUNDS}", f"{where}.rounds"))
            continue
        peer_rounds = {r.get("round"): r for r in fresh[peer].get("rounds") or [] if isinstance(r, dict)}
        for rnd in rounds:
            label = f"{role}: fresh round {rnd['round']}"
            other = peer_rounds.get(rnd["round"], {})
            if rnd.get("peer_epoch") != fresh[peer].get("epoch") or rnd.get("input_seed") != other.get("input_seed") \
                    or rnd.get("input_seed") in old_seeds:
                problems.append((f"{label}: peer epoch {rnd.get('peer_epoch')!r} (the peer's fresh engine is "
                                 f"{fresh[peer].get('epoch')!r}), seed {rnd.get('input_seed')!r} (peer "
                                 f"{other.get('input_seed')!r}; fresh, never an old round's)", f"{where}.rounds"))
            public = part(part(rnd, "counters"), "public").get("bytes")
            if public != per_round:
                problems.append((f"{label}: public bytes {public!r}, the profile model's {per_round}",
                                 f"{where}.rounds"))
            if role == destination:
                bad = [p.get("parent") for p in rnd.get("parents") or [] if not (
                    part(p, "byte_check").get("ok") is True and part(p, "guard_check").get("ok") is True)]
                if bad or len(rnd.get("parents") or []) != case.profile["parents"]:
                    problems.append((f"{label}: parents {bad} failed their byte or guard check (destination side)",
                                     f"{where}.rounds"))
        teardown = part(fresh[role], "teardown")
        if teardown.get("retained_owners") != 0 or teardown.get("drained") is not True:
            problems.append((f"{role}: the fresh engine's teardown {teardown or None} (expected drained, 0 retained)",
                             f"{where}.teardown"))
    return problems
