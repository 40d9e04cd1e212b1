# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Accounting observer rules: the requester's observer log, replayed, against the ledger and the workload.

Every rule here reads one replay of the log (``Replay``), made once per generation and kept in
``case.memo``, so a log of a million records is read once, not seven times.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from itertools import chain, compress, filterfalse, islice, repeat
from operator import and_, eq, gt, is_not, le, not_

from ansible_collections.orbite.qualification.plugins.module_utils._verify.loader import (
    CQE,
    WITHHELD,
    WR,
    pointer_text,
)
from ansible_collections.orbite.qualification.plugins.module_utils._verify.reading import no_gc
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import (
    MAX_PROBLEMS_SHOWN,
    enabled_rails,
    ledger_wrs,
)

_OBS = ("ledgers", "observers")


@applies("modes loading the accounting observer for their rounds (installed-restart's watches the survivor's "
         "stale attempts: restart.stale_no_effect)")
def has_accounting(profile, workload):
    return profile.get("mode") != "installed-restart" and any(o["tool"] == "accounting" for o in workload["observers"])


@applies("installed-rail-accounting")
def rail_accounting(profile, _workload):
    return profile["mode"] == "installed-rail-accounting"


def _accounting_logs(case):
    for generation in case.generations():
        key = ("requester", generation, "accounting")
        if key in case.observer_logs:
            yield generation, case.observer_logs[key], case.ledger("requester", generation)


def _device_rails(ledger):
    return {rail["device"]: rail["rail"] for rail in ledger["rails"]}


_FIELDS = ("qpn", "wr_id", "bytes", "opcode")
_LISTED = (*_FIELDS, "context", "cq", "parent")  # the ledger's WR columns the replay reads


class Replay:
    """What one walk of the log in order shows: joins by (context, CQ, QPN, WR ID), WRs and distinct
    parents in flight per QP (the parent of a WR from the ledger), and the WRs against the ledger's.

    Built from the log's columns (loader.ObserverLog). A healthy log (one context and CQ per QPN,
    every WR accepted once, every completion of an accepted WR, once, after it) is read with whole-
    column operations and one tight loop for the parents in flight; any other log takes the exact
    walk event by event (``_walk``), whose findings name the offenders. Both give the same figures:
    ``accepted_count``, ``joined_count``, ``unjoined`` (keys), ``orphans``, ``duplicates``, ``failed``,
    ``joined_bytes`` (per device), ``max_wrs`` (per QPN), ``max_parents`` (per QPN, {round: most}: a
    parent is one round's, its round the ledger's), ``unlisted``, ``differing``,
    ``missing``, ``wrs``, ``bytes``, ``devices``.
    """

    def __init__(self, log, ledger):
        with no_gc():
            flow = log.flow()  # WRs and completions in log order: what moves the in-flight figures
            seq = (flow["kind"], flow["qpn"], flow["wr_id"], flow["ctx"], flow["cq"])
            table = log.wrs()
            parents, rounds = self._against_ledger(table, ledger)
            if not self._fast(log, seq, table, parents, rounds):
                self._walk(log, seq, table)
                seq_parent = [None if i is None or parents[i] is None else (rounds[i], parents[i]) for i in self._wr_of]
                self.max_wrs, self.max_parents = _in_flight(seq[0], seq[1], seq_parent, self._valid)
                del self._wr_of, self._valid
            for qpn in self.max_wrs:
                self.max_parents.setdefault(qpn, {})

    def _fast(self, log, seq, table, parents, rounds):
        """The healthy log's figures from whole columns; False (nothing set) when the exact walk must run.

        Healthy: on each QP one context and CQ, each WR ID posted once and completed once, never
        before its WR. A QP's completions are joined to its WRs by list equality when they come in
        the order of the WRs (RC: a send queue completes in order; its in-flight count, a running sum
        from ``ObserverLog.inflight``, then only has to stay >= 0), else by a dict of its WR IDs.
        """
        seq_kind, _seq_qpn, seq_wr_id, seq_ctx, seq_cq = seq
        is_wr, done = seq_kind.translate(_IS_WR), seq_kind.translate(_IS_DONE)
        runs = log.inflight()
        most_wrs, most_parents = {}, {}
        for qpn, mask in log.qp_masks().items():
            mine = (seq_kind, seq_wr_id, seq_ctx, seq_cq) if mask is None else (
                bytes(compress(seq_kind, mask)), *(list(compress(column, mask)) for column in seq[2:]))
            kinds, wr_ids, ctxs, cqs = mine
            if ctxs.count(ctxs[0]) != len(ctxs) or cqs.count(cqs[0]) != len(cqs):
                return False  # a QPN on two contexts or CQs: only the full key joins
            mine_wr, mine_done = kinds.translate(_IS_WR), kinds.translate(_IS_DONE)
            posted, completed = list(compress(wr_ids, mine_wr)), list(compress(wr_ids, mine_done))
            if len(completed) != len(posted) or len(set(posted)) != len(posted):
                return False  # a WR accepted twice, or not completed once: the walk names them
            theirs = parents if mask is None else list(compress(parents, compress(mask, is_wr)))
            their_rounds = rounds if mask is None else list(compress(rounds, compress(mask, is_wr)))
            counts = runs[qpn][1]
            if posted == completed:  # in order: the k-th completion is of the k-th WR
                if min(counts) < 0:
                    return False  # a completion logged before its WR: the walk counts it as an orphan
                done_parents, done_rounds = theirs, their_rounds
            else:
                rank = dict(zip(posted, range(len(posted))))
                order = list(map(rank.get, completed))
                if None in order or len(set(order)) != len(order):
                    return False  # a completion of no WR of this QP, or twice
                at = range(len(kinds))
                if not all(map(gt, compress(at, mine_done), map(list(compress(at, mine_wr)).__getitem__, order))):
                    return False  # a completion logged before its WR
                done_parents = list(map(theirs.__getitem__, order))
                done_rounds = list(map(their_rounds.__getitem__, order))
            most_wrs[qpn] = max(counts)
            # Each completion's parent (and round) is its WR's: the QP's events in order, each with its parent.
            most_parents[qpn] = _most_distinct(mine_wr, _merge(kinds, theirs, done_parents),
                                               _merge(kinds, their_rounds, done_rounds))
        statuses = log.column(CQE, "status")
        self.accepted_count, self.joined_count = len(table["wr_id"]), statuses.count(0)
        self.orphans, self.duplicates = [], []
        self.max_wrs, self.max_parents = most_wrs, most_parents
        dev, size = table["dev"], table["bytes"]
        joined_bytes = defaultdict(int)
        if self.joined_count == self.accepted_count:  # every completion a successful CQE: all joined
            self.unjoined, self.failed = [], []
            for name in set(dev):
                joined_bytes[name] = sum(compress(size, map(eq, dev, repeat(name))))
        else:
            # The WR each completion joins, by its (QPN, WR ID): unique, as checked above.
            accepted = dict(zip(zip(table["qpn"], table["wr_id"]), range(len(dev))))
            index = list(map(accepted.__getitem__, zip(compress(seq[1], done), compress(seq_wr_id, done))))
            cqe_index = list(compress(index, bytes(compress(seq_kind, done)).translate(_IS_CQE)))
            full = _full_keys(table)
            self.failed = [full(i) for i in compress(cqe_index, statuses)]
            mark = bytearray(len(dev))
            for i in compress(cqe_index, map(not_, statuses)):
                mark[i] = 1
                joined_bytes[dev[i]] += size[i]
            self.unjoined = [full(i) for i in compress(range(len(mark)), map(not_, mark))]
        self.joined_bytes = joined_bytes
        return True

    def _walk(self, log, seq, table):
        """The exact replay, event by event, by the full key (logs with duplicates, orphans or completions
        out of order)."""
        seq_kind, seq_qpn, seq_wr_id, seq_ctx, seq_cq = seq
        accepted, joined, in_flight = {}, set(), set()
        orphans, duplicates, failed, valid, wr_of = [], [], [], [], []
        joined_bytes = defaultdict(int)
        dev, size = table["dev"], table["bytes"]
        statuses = iter(log.column(CQE, "status"))
        index = 0
        for kind, key in zip(seq_kind, zip(seq_ctx, seq_cq, seq_qpn, seq_wr_id)):
            if kind == WR:
                if key in accepted:
                    duplicates.append(key)
                accepted[key] = index
                wr_of.append(index)
                index += 1
                valid.append(key not in in_flight)  # a duplicate still in flight replaces its first post
                in_flight.add(key)
                continue
            if kind == CQE:
                status = next(statuses)
                if key not in accepted:
                    orphans.append(key)
                elif status:
                    failed.append(key)
                elif key in joined:
                    duplicates.append(key)
                else:
                    joined.add(key)
                    position = accepted[key]
                    joined_bytes[dev[position]] += size[position]
            wr_of.append(accepted.get(key))  # None: a completion of no WR (moves nothing)
            valid.append(key in in_flight)
            in_flight.discard(key)
        self.accepted_count, self.joined_count = len(accepted), len(joined)
        self.unjoined = _shown(key for key in accepted if key not in joined)
        self.joined_bytes = joined_bytes
        self.orphans, self.duplicates, self.failed = _shown(orphans), _shown(duplicates), _shown(failed)
        self._wr_of, self._valid = wr_of, valid

    def _against_ledger(self, table, ledger):
        """WRs the ledger does not list, or lists differently (first few), and ledger WRs never seen;
        returns the parent and the round of each logged WR (None: not listed)."""
        qpns, wr_ids, sizes = table["qpn"], table["wr_id"], table["bytes"]
        self.wrs, self.bytes, self.devices = len(qpns), sum(sizes), set(table["dev"])
        rounds = [rnd["wrs"] for rnd in ledger["rounds"]]
        # Each listed WR's round, in the ledger's order (a parent is one round's: the concurrency rule is per round).
        round_of = list(chain.from_iterable(repeat(rnd["round"], len(rnd["wrs"]["wr_id"])) for rnd in ledger["rounds"]))
        # The same WRs in the same order (an engine lists them as it posts them): each round's columns
        # compared with its stretch of the log's, no key built, nothing joined.
        if _listed_in_order(table, rounds):
            self.unlisted, self.differing, self.missing = [], [], []
            return list(chain.from_iterable(columns["parent"] for columns in rounds)), round_of
        wrs = ledger_wrs(ledger, _LISTED)
        ctxs, cqs = _texts(table["ctx"]), _texts(table["cq"])
        seen = list(zip(qpns, wr_ids))
        listed = dict(zip(zip(wrs["qpn"], wrs["wr_id"]), range(len(wrs["qpn"]))))
        self.unlisted = list(islice(filterfalse(listed.__contains__, seen), MAX_PROBLEMS_SHOWN))
        self.differing = []
        for entry in zip(qpns, wr_ids, sizes, table["opcode"], ctxs, cqs):
            at = listed.get(entry[:2])
            if at is None:
                continue
            wr = {name: wrs[name][at] for name in ("bytes", "opcode", "context", "cq")}
            if entry[2:] != (wr["bytes"], wr["opcode"], wr["context"], wr["cq"]):
                event = dict(zip(("qpn", "wr_id", "bytes", "opcode", "ctx", "cq"), entry))
                self.differing.append((entry[:2], wr, event))
                if len(self.differing) == MAX_PROBLEMS_SHOWN:
                    break
        self.missing = sorted(set(listed).difference(seen))
        parent = wrs["parent"]
        at_of = list(map(listed.get, seen))
        return ([None if at is None else parent[at] for at in at_of],
                [None if at is None else round_of[at] for at in at_of])


def _full_keys(table):
    """The (context, CQ, QPN, WR ID) join key of a WR, by its index in the log's WR columns, as the
    JSON format writes it."""
    return lambda i: (pointer_text(table["ctx"][i]), pointer_text(table["cq"][i]), table["qpn"][i],
                      table["wr_id"][i])


def _shown(keys):
    """Join keys as the JSON format writes them (pointers as text)."""
    return [(pointer_text(ctx), pointer_text(cq), qpn, wr_id) for ctx, cq, qpn, wr_id in keys]


_IS_WR = bytes(1 if byte == WR else 0 for byte in range(256))
_IS_CQE = bytes(1 if byte == CQE else 0 for byte in range(256))
_IS_DONE = bytes(1 if byte in (CQE, WITHHELD) else 0 for byte in range(256))


def _texts(column):
    """Contexts or CQs as the ledger names them (the JSON format's pointer text): a process has few,
    so each distinct pointer is rendered once."""
    if column and isinstance(column[0], int):
        text = {value: pointer_text(value) for value in dict.fromkeys(column)}
        return list(map(text.__getitem__, column))
    return column


def _listed_in_order(table, rounds):
    """Whether the ledger's rounds' WR columns list the log's WRs (``table``: ObserverLog.wrs) one for one
    in log order: whole-list comparisons in C, a round against its stretch of the log."""
    if sum(len(columns["wr_id"]) for columns in rounds) != len(table["wr_id"]):
        return False
    start = 0
    for columns in rounds:
        end = start + len(columns["wr_id"])
        if not all(columns[name] == table[name][start:end] for name in _FIELDS) or not (
                _same_texts(columns["context"], table["ctx"][start:end])
                and _same_texts(columns["cq"], table["cq"][start:end])):
            return False
        start = end
    return True


def _same_texts(texts, column):
    """Whether the ledger's ``texts`` name the log's pointers ``column`` one for one: each distinct pointer
    rendered once (a process has few contexts and CQs), the lists compared whole."""
    return texts == _texts(column)


def _merge(seq_kind, wr_values, done_values):
    """One value per flow event: the WRs' in order at WR events, the completions' at the others (each
    event takes the next value of its kind's iterator, in C)."""
    done = iter(done_values)
    sources = {WR: iter(wr_values), CQE: done, WITHHELD: done}
    return list(map(next, map(sources.__getitem__, seq_kind)))


def _most_distinct(is_wr, parents, rounds):
    """{round: most distinct parents of that round in flight at once} on one QP: its events in order (``is_wr``
    1 for a WR, 0 for a completion), each event's parent and round (None: a WR the ledger does not list).
    Per round, as the concurrency rule asks it of each round, not of the run: each round's events taken
    apart (in C), then counted."""
    most = {}
    if None not in rounds and all(map(le, rounds, islice(rounds, 1, None))):
        # The rounds one after the other (a round drains before the next): each round is a slice.
        for number in dict.fromkeys(rounds):
            start, end = bisect_left(rounds, number), bisect_right(rounds, number)
            most[number] = _distinct_in_flight(is_wr[start:end], parents[start:end])
        return most
    for number in set(rounds) - {None}:
        mine = bytes(map(eq, rounds, repeat(number)))
        most[number] = _distinct_in_flight(compress(is_wr, mine), list(compress(parents, mine)))
    return most


def _distinct_in_flight(is_wr, parents):
    """Most distinct parents in flight at once in one stretch of a QP's events (each with its parent)."""
    count = dict.fromkeys(parents, 0)
    distinct = most = 0
    for wr, parent in zip(is_wr, parents):
        held = count[parent]
        if wr:
            count[parent] = held + 1
            if not held:
                distinct += 1
                if distinct > most:  # noqa: PLR1730 - max() costs a call an event
                    most = distinct
        else:
            count[parent] = held - 1
            if held == 1:
                distinct -= 1
    return most


def _most_parents(seq_kind, seq_qpn, seq_parent, valid):
    """{QPN: {round: most distinct parents of that round with a WR in flight}} (events not ``valid``
    skipped, and events of WRs the ledger does not list: no parent; ``seq_parent`` (round, parent))."""
    keep = list(map(and_, map(is_not, seq_parent, repeat(None)), valid))
    top = {qpn: {} for qpn in compress(seq_qpn, seq_kind.translate(_IS_WR))}  # every QPN with a WR
    parents = defaultdict(int)
    count = {}
    get = count.get
    for kind, key in compress(zip(seq_kind, zip(seq_qpn, seq_parent)), keep):
        held = get(key, 0)
        qpn, (number, _parent) = key
        if kind == WR:
            count[key] = held + 1
            if not held:
                now = parents[(qpn, number)] + 1
                parents[(qpn, number)] = now
                top[qpn][number] = max(top[qpn].get(number, 0), now)
        else:
            count[key] = held - 1
            if held == 1:
                parents[(qpn, number)] -= 1
    return top


def _in_flight(seq_kind, seq_qpn, seq_parent, valid):
    """(most WRs, most distinct parents) in flight per QP, events not ``valid`` skipped (the walk's)."""
    wrs, top = {}, {}
    for kind, qpn in compress(zip(seq_kind, seq_qpn), valid):
        now = wrs.get(qpn, 0) + (1 if kind == WR else -1)
        wrs[qpn] = now
        if now > top.get(qpn, 0):
            top[qpn] = now
    for qpn in wrs:
        top.setdefault(qpn, 0)
    return top, _most_parents(seq_kind, seq_qpn, seq_parent, valid)


def _replays(case):
    """(generation, log, ledger, Replay) of every accounting log; each replay made once per case."""
    for generation, log, ledger in _accounting_logs(case):
        memo = ("accounting.replay", generation)
        if memo not in case.memo:
            case.memo[memo] = Replay(log, ledger)
        yield generation, log, ledger, case.memo[memo]


@rule("accounting.join", "accounting",
      "every accepted payload WR joins exactly one successful completion by (context, CQ, QPN, WR ID)",
      witness=("observer",), needs=_OBS, applies=has_accounting)
def check_observer_join(case):
    problems = []
    for generation, log, _ledger, replay in _replays(case):
        accepted, joined, unjoined = replay.accepted_count, replay.joined_count, replay.unjoined
        if unjoined or replay.orphans or replay.duplicates or replay.failed:
            problems.append(
                (
                    f"g{generation}: {len(unjoined)} accepted payload WR(s) without exactly one successful "
                    f"completion (first {unjoined[:2]}), {len(replay.orphans)} completion(s) of unknown WRs, "
                    f"{len(replay.duplicates)} duplicate(s), {len(replay.failed)} error completion(s)",
                    log.path,
                )
            )
        summary = log.summary
        if (summary["accepted_wrs"], summary["joined"], summary["unjoined"]) != (
            accepted,
            joined,
            accepted - joined,
        ):
            problems.append(
                (
                    f"g{generation}: the log's summary says accepted/joined/unjoined "
                    f"{summary['accepted_wrs']}/{summary['joined']}/{summary['unjoined']}, its lines give "
                    f"{accepted}/{joined}/{accepted - joined}",
                    log.path,
                )
            )
    return problems


@rule("accounting.ledger_join", "accounting",
      "the observer's WRs and the ledger's WRs are the same set",
      witness=("observer",), needs=_OBS, applies=has_accounting)
def check_observer_ledger_join(case):
    problems = []
    for generation, log, _ledger, replay in _replays(case):
        for qpn, wr_id in replay.unlisted:
            problems.append((f"g{generation}: observer WR qpn {qpn} wr_id {wr_id} is not in the ledger", log.path))
        for key, wr, event in replay.differing:
            problems.append(
                (
                    f"g{generation}: WR {key} differs between ledger and observer (bytes/opcode/ctx/cq "
                    f"{wr['bytes']}/{wr['opcode']}/{wr['context']}/{wr['cq']} vs {event['bytes']}/"
                    f"{event['opcode']}/{event['ctx']}/{event['cq']})",
                    log.path,
                )
            )
        if replay.missing:
            problems.append(
                (
                    f"g{generation}: {len(replay.missing)} ledger WR(s) the observer never saw accepted "
                    f"(first {replay.missing[:2]})",
                    log.path,
                )
            )
        if len(problems) >= MAX_PROBLEMS_SHOWN:
            break
    return problems[:MAX_PROBLEMS_SHOWN]


@rule("accounting.native_bytes", "accounting",
      "observed native bytes per rail equal the public counters",
      witness=("observer",), needs=_OBS, applies=has_accounting, after=("accounting.join", "counters.native_public"))
def check_observer_native_bytes(case):
    problems = []
    for generation, log, ledger, replay in _replays(case):
        rails = _device_rails(ledger)
        native = defaultdict(int)
        for device, value in replay.joined_bytes.items():
            native[rails.get(device, device)] += value
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


@rule("accounting.exact_counts", "accounting",
      "exactly the derived payload WRs and bytes a round, as observed",
      witness=("observer", "profile"), needs=_OBS, applies=has_accounting,
      after=("counters.slicing", "accounting.ledger_join"))
def check_observer_exact_counts(case):
    problems = []
    rounds = case.workload["rounds_per_generation"]
    want_wrs, want_bytes = case.workload["wrs_per_round"] * rounds, case.workload["bytes_per_round"] * rounds
    for generation, log, _ledger, replay in _replays(case):
        if (replay.wrs, replay.bytes) != (want_wrs, want_bytes):
            problems.append(
                (
                    f"g{generation}: observer accepted {replay.wrs} payload WRs / {replay.bytes} B over {rounds} "
                    f"rounds, expected {want_wrs} / {want_bytes} "
                    f"({case.workload['wrs_per_round']} WRs, {case.workload['bytes_per_round']} B a round)",
                    log.path,
                    {"expected": {"wrs": want_wrs, "bytes": want_bytes}, "observed": {"wrs": replay.wrs,
                                                                                      "bytes": replay.bytes}},
                )
            )
    return problems


@rule("accounting.both_rails", "accounting",
      "accepted payload on every enabled rail, as observed",
      witness=("observer", "profile"), needs=_OBS, applies=has_accounting, after=("counters.rails",))
def check_observer_rails(case):
    problems = []
    for generation, log, ledger, replay in _replays(case):
        rails = _device_rails(ledger)
        carried = {rails.get(device) for device in replay.devices}
        idle = sorted(r for r in enabled_rails(case) if r not in carried)
        if idle:
            problems.append((f"g{generation}: enabled rail(s) {idle} carried no accepted payload WR", log.path))
    return problems


@rule("accounting.sq_depth", "accounting",
      "at most eight payload WRs in flight per QP, as observed",
      witness=("observer", "profile"), needs=_OBS, applies=has_accounting,
      after=("accounting.join", "qps.sq_depth"))
def check_observer_sq_depth(case):
    problems = []
    depth = case.workload["send_queue_depth"]
    for generation, log, _ledger, replay in _replays(case):
        over = {qpn: n for qpn, n in replay.max_wrs.items() if n > depth}
        if over:
            problems.append((f"g{generation}: payload WRs in flight per QP over {depth}: {over}", log.path,
                             {"expected": f"<= {depth} per QP", "observed": over}))
    return problems


@rule("accounting.outstanding", "accounting",
      "at least two parents outstanding at once on each rail's QP in each round, as observed",
      witness=("observer", "profile"), needs=_OBS, applies=rail_accounting,
      after=("accounting.join", "counters.rails", "ledger.rounds"))
def check_observer_outstanding(case):
    """Per round: concurrency in rounds 1 and 3 does not make up for a round run one parent at a time."""
    problems = []
    least = case.workload.get("min_outstanding_parents_per_rail_qp", 0)
    for generation, log, ledger, replay in _replays(case):
        rail_of_qp = {qp["qpn"]: qp["rail"] for qp in ledger["qps"]}
        for number in range(1, case.workload["rounds_per_generation"] + 1):
            for rail in sorted(enabled_rails(case)):
                qps = [q for q, r in rail_of_qp.items() if r == rail]
                best = max((replay.max_parents.get(q, {}).get(number, 0) for q in qps), default=0)
                if best < least:
                    problems.append(
                        (
                            f"g{generation} round {number} rail {rail}: at most {best} parent(s) outstanding at "
                            f"once on its shared QP, expected at least {least}",
                            log.path,
                            {"expected": f">= {least} in each round", "observed": best},
                        )
                    )
    return problems
