# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Digest rules: the bytes themselves, as the accounting observer hashed them, against the seeded content.

At each successful completion of a payload WR the observer hashes the WR's local range (READ: the
bytes that landed in the requester; WRITE: the requester's bytes the peer acknowledged) and logs the
SHA-256 with the range's offset in its MR (docs/observers.md, "Digests"). Here every logged range is
placed in the arena layout of docs/content.md and its digest recomputed from the round's seed by the
verifier's own implementation (_verify/content.py). The seed is the ledgers' word, witnessed by the
bytes: another seed gives other bytes. Which round a range belongs to comes from the requester's WR
list; a range attributed to the wrong round fails its digest for the same reason.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import chain, compress, repeat
from operator import eq

from ansible_collections.orbite.qualification.plugins.module_utils._verify import content
from ansible_collections.orbite.qualification.plugins.module_utils._verify.loader import NOT_HASHED
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import MAX_PROBLEMS_SHOWN
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules.accounting import has_accounting

_OBS = ("ledgers", "observers")
# Facts a range's placement rests on: when one of them failed, the digests are not read (masking is
# not transitive, so each digest rule names them all).
_PLACEMENT = ("ledger.rounds", "layout.regions", "counters.slicing", "accounting.join", "accounting.ledger_join")
LEAD_CHANGED, TRAIL_CHANGED = 1, 2  # data flags: a guard window changed while the range landed


@applies("modes loading the accounting observer, READ (the requester holds the destination)")
def read_with_accounting(profile, workload):
    return profile["operation"] == "read" and has_accounting(profile, workload)


def _rounds_of(ledger_rounds, data):
    """The round of each data event: the last round whose WR list holds its (QPN, WR ID); None where none does.

    First by the WR ID alone (int keys: no (QPN, WR ID) tuple built per WR and per event, at a million
    records most of this rule's time), the QPN of the WR last listed with that ID checked against the
    event's in one column comparison: when every event's matches, each event's (QPN, WR ID) is listed,
    last in that WR's round, so this is the pair join's answer. Otherwise the pair join itself.
    """
    numbers = [rnd["round"] for rnd in ledger_rounds]
    round_of = {}
    for rnd, number in zip(ledger_rounds, numbers):
        round_of.update(dict.fromkeys(rnd["wrs"]["wr_id"], number))
    qpn_of = dict(zip(chain.from_iterable(rnd["wrs"]["wr_id"] for rnd in ledger_rounds),
                      chain.from_iterable(rnd["wrs"]["qpn"] for rnd in ledger_rounds)))
    if list(map(qpn_of.get, data["wr_id"])) == list(data["qpn"]):
        return list(map(round_of.get, data["wr_id"]))
    round_of = {}
    for rnd, number in zip(ledger_rounds, numbers):
        round_of.update(dict.fromkeys(zip(rnd["wrs"]["qpn"], rnd["wrs"]["wr_id"]), number))
    return list(map(round_of.get, zip(data["qpn"], data["wr_id"])))


class Witnessed:
    """The requester log's data events of one generation, placed in the documented layout, by round.

    ``slices[round][parent]`` = [(start within the payload, length, event index)] sorted by start;
    ``problems`` = why the coverage is not exactly every parent's payload once (per round).
    """

    def __init__(self, case, generation):
        self.log = case.observer_logs[("requester", generation, "accounting")]
        ledger = case.ledger("requester", generation)
        profile = case.profile
        self.parents, self.payload, self.workload = profile["parents"], profile["payload"], case.workload
        self.rounds = [rnd["round"] for rnd in ledger["rounds"]]
        self.problems = defaultdict(list)
        self.slices = {}
        data = self.log.data()
        self.flags = data["flags"]
        rounds = _rounds_of(ledger["rounds"], data)
        header = self.log.header
        if header.get("digest") != "sha256":
            self.problems[None].append(f"the observer took no digests (header digest {header.get('digest')!r}, "
                                       "expected 'sha256'): nothing witnesses the bytes")
            return
        unplaced = [i for i, r in enumerate(rounds) if r is None] if None in rounds else []
        if unplaced:
            self.problems[None].append(
                f"{len(unplaced)} data event(s) of WRs the ledger does not list (first qpn/wr_id "
                f"{data['qpn'][unplaced[0]]}/{data['wr_id'][unplaced[0]]})")
        want = self.parents * self.payload
        for number in self.rounds:
            mine = list(map(eq, rounds, repeat(number)))  # operator.eq: a None round is no match
            total = sum(compress(data["len"], mine))
            if total != want:  # cheap, before any sorting: a log of any size costs one pass here
                self.problems[number].append(f"round {number}: {rounds.count(number)} range(s) witness {total} B, "
                                             f"the {self.parents} parents hold {want} B")
                continue
            self._place(number, list(compress(range(len(rounds)), mine)), data)

    def _place(self, number, mine, data):
        stride, arena, guard = self.workload["region_stride"], self.workload["backing_per_peer"], \
            self.workload["guard_bytes"]
        found = self.problems[number]
        per_parent = defaultdict(list)
        offs, lens, all_flags, mr_lens = data["off"], data["len"], data["flags"], data["mr_len"]

        def where(i):  # only for a range found wrong
            return f"round {number}: range at MR offset {offs[i]} ({lens[i]} B, wr_id {data['wr_id'][i]})"

        for i in mine:
            off, length, flags = offs[i], lens[i], all_flags[i]
            if flags & NOT_HASHED:
                found.append(f"{where(i)} was not hashed ({'its lkey named no MR' if flags & 4 else 'outside its MR'})")
                continue
            if mr_lens[i] != arena:
                found.append(f"{where(i)} is in an MR of {mr_lens[i]} B, the arena is {arena} B (parents x (payload "
                             f"+ 2 x {guard} B))")
                continue
            parent, start = divmod(off, stride)
            start -= guard
            if parent >= self.parents or start < 0 or start + length > self.payload:
                found.append(f"{where(i)} is not inside one parent's payload (parent p at p x {stride} + {guard})")
                continue
            per_parent[parent].append((start, length, i))
        slices = {}
        for parent in range(self.parents):
            ranges = sorted(per_parent.get(parent, ()))
            end = 0
            for start, length, _digest in ranges:
                if start != end:
                    what = "overlaps the range before it" if start < end else f"leaves bytes {end}..{start - 1} unseen"
                    found.append(f"round {number} parent {parent}: the range at payload offset {start} {what}")
                    break
                end = start + length
            else:
                if end != self.payload:
                    found.append(f"round {number} parent {parent}: bytes {end}..{self.payload - 1} never witnessed")
            slices[parent] = ranges
        if not found:
            self.slices[number] = slices

    def all_problems(self):
        return [message for messages in self.problems.values() for message in messages]


def _witnessed(case):
    """(generation, Witnessed) of every generation, each made once per case."""
    for generation in case.generations():
        memo = ("digests.witnessed", generation)
        if memo not in case.memo:
            case.memo[memo] = Witnessed(case, generation)
        yield generation, case.memo[memo]


@rule("digests.coverage", "digests",
      "the observer hashed every parent's payload of every round exactly once, in the documented arena layout",
      witness=("observer", "profile"), needs=_OBS, applies=has_accounting, after=_PLACEMENT)
def check_coverage(case):
    problems = []
    for generation, witnessed in _witnessed(case):
        for message in witnessed.all_problems()[:MAX_PROBLEMS_SHOWN]:
            problems.append((f"g{generation}: {message}", witnessed.log.path))
    return problems


@rule("digests.content", "digests",
      "every witnessed range holds the round's seeded content (SHA-256 recomputed from the seed, docs/content.md)",
      witness=("observer", "profile", "peer"), needs=_OBS, applies=has_accounting,
      after=(*_PLACEMENT, "digests.coverage", "ledger.fresh_input"))
def check_content(case):
    problems = []
    for generation, witnessed in _witnessed(case):
        data_side = case.ledger(case.data_role(), generation)
        seeds = {rnd["round"]: rnd["input_seed"] for rnd in data_side["rounds"]}
        for number, slices in witnessed.slices.items():
            seed = seeds.get(number)
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 64:
                problems.append((f"g{generation} round {number}: the {case.data_role()}'s ledger gives seed {seed!r}, "
                                 "not a 64-bit unsigned integer", case.ledger_path(case.data_role(), generation)))
                continue
            expected = content.RoundContent(seed, witnessed.parents, witnessed.payload)
            digests = witnessed.log.digests()
            wrong = [(parent, start, length) for parent, ranges in slices.items() for start, length, i in ranges
                     if digests[i] != expected.digest(parent, start, length)]
            if wrong:
                shown = ", ".join(f"parent {p} bytes {s}..{s + n - 1}" for p, s, n in wrong[:MAX_PROBLEMS_SHOWN])
                problems.append((f"g{generation} round {number}: {len(wrong)} range(s) differ from the content of "
                                 f"seed {seed}: {shown}", witnessed.log.path))
    return problems


@rule("digests.guards", "digests",
      "no guard byte of a READ destination changed while its parent's first or last range landed, with guard "
      "windows of the documented size",
      witness=("observer", "profile"), needs=_OBS, applies=read_with_accounting,
      after=(*_PLACEMENT, "digests.coverage"))
def check_guards(case):
    problems = []
    for generation, witnessed in _witnessed(case):
        size = witnessed.log.header.get("guard_bytes")
        if size != case.workload["guard_bytes"]:
            problems.append((f"g{generation}: the observer's guard windows are {size!r} B, the documented guard is "
                             f"{case.workload['guard_bytes']} B (docs/content.md)", witnessed.log.path))
            continue
        changed = []
        for number, slices in witnessed.slices.items():
            for parent, ranges in slices.items():
                if ranges and witnessed.flags[ranges[0][2]] & LEAD_CHANGED:
                    changed.append(f"round {number} parent {parent} leading")
                if ranges and witnessed.flags[ranges[-1][2]] & TRAIL_CHANGED:
                    changed.append(f"round {number} parent {parent} trailing")
        if changed:
            more = len(changed) - MAX_PROBLEMS_SHOWN
            problems.append((f"g{generation}: guard(s) changed while the payload next to them landed: "
                             f"{', '.join(changed[:MAX_PROBLEMS_SHOWN])}{f' (+{more})' if more > 0 else ''}",
                             witnessed.log.path))
    return problems
