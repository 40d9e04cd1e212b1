# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Lock rules across the cases of a run: two supervisors never hold one RNIC of one machine at once, and
every runner lives inside the locks of its rails (docs/verifier.md, "Locks across cases").

A machine is what the journals' identity checks observed (host name and boot ID), never an inventory
name: two inventory aliases of one machine (lanes) are one machine. Times are the journals' ``t``, the
node's wall clock (CLOCK_REALTIME, time.time()), the one clock every supervisor of a boot shares: holds
compare only between journals of one boot ID, and a journal whose times run backwards (the clock was
stepped) cannot be ordered against another and fails. A hold runs from its ``lock_acquire`` to its
``lock_release`` (``ok``: true); a lock never released, or whose release failed, is held until the
supervisor's session ends (its ``journal_close``, or the journal's last line).

The other cases' journals are other processes' word: each case's holds are held against every other
journal of the plan on its machine, and an overlap is reported once, by the hold that began last. A
runner's own receipts (its ledger's times) are held against its supervisor's windows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ansible_collections.orbite.qualification.plugins.module_utils._verify.loader import load_journal
from ansible_collections.orbite.qualification.plugins.module_utils._verify.reading import Budget
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import (
    MAX_PROBLEMS_SHOWN,
    ROLES,
    each_ledger,
)
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules.discovery import locked_rnics
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules.identity import runner_start, told_case

# Events that end a supervisor session: what it still held ends there (a new journal_open follows a
# supervisor that died; its kernel flocks went with it).
_SESSION_ENDS = ("journal_close", "supervisor_killed", "journal_open")


@dataclass(frozen=True)
class Hold:
    """One supervisor's hold of one RNIC, [start, end] on its node's wall clock."""

    rnic: str
    start: float
    end: float


def _time(event):
    t = event.get("t") if isinstance(event, dict) else None
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None


def clock_problem(lines):
    """None, or why the journal's times cannot be ordered: a line without a time, or a time earlier than
    the line before it (the wall clock stepped back while the supervisor ran)."""
    previous = None
    for index, line in enumerate(lines):
        t = _time(line)
        if t is None:
            return f"line {index + 1} ({line.get('ev') if isinstance(line, dict) else line!r}) has no time t"
        if previous is not None and t < previous:
            return (f"line {index + 1} ({line.get('ev')!r}, t {t}) is earlier than the line before it (t {previous}): "
                    "the node's clock was stepped back")
        previous = t
    return None


def holds(lines):
    """[Hold] of a journal's lines (header first), in the order they began."""
    found, open_at = [], {}
    last = None
    for line in lines:
        t, kind = _time(line), line.get("ev")
        if t is None:
            continue
        last = t
        rnic = line.get("rnic")
        if kind == "lock_acquire" and isinstance(rnic, str):
            open_at.setdefault(rnic, t)  # a second acquire of a lock held: the same hold
        elif kind == "lock_release" and line.get("ok") is True and rnic in open_at:
            found.append(Hold(rnic, open_at.pop(rnic), t))
        elif kind in _SESSION_ENDS:
            found.extend(Hold(r, start, t) for r, start in open_at.items())
            open_at.clear()
    found.extend(Hold(r, start, last) for r, start in open_at.items())
    return sorted(found, key=lambda h: (h.start, h.rnic))


def overlap(a, b):
    """Whether two holds share an instant beyond one: one ending at the instant the other begins is a
    hand-over (lock_release is stamped while the lock is still held, the next lock_acquire once held)."""
    return a.rnic == b.rnic and a.start < b.end and b.start < a.end


def machine(events):
    """(host name, boot ID) the journal's last passing identity check inside the locks observed, or None."""
    checks = [e for e in events if e.get("ev") == "identity_check" and e.get("stage") == "inside_locks"
              and e.get("ok") is True]
    observed = checks[-1].get("observed") if checks else None
    if not isinstance(observed, dict):
        return None
    key = (observed.get("hostname"), observed.get("boot_id"))
    return key if all(isinstance(part, str) and part for part in key) else None


def comparable(a, b):
    """Two machines' clocks compare only when host name and boot ID are the same (another boot: never)."""
    return a is not None and a == b


@dataclass(frozen=True)
class JournalHolds:
    case_id: str
    role: str
    path: str
    machine: tuple
    holds: tuple
    clock: str  # None, or why its times cannot be ordered


def journal_holds(case_id, role, path, data):
    lines = [data["header"], *data["events"]]
    problem = clock_problem(lines)
    return JournalHolds(case_id, role, path, machine(data["events"]), tuple(holds(lines) if not problem else ()),
                        problem)


def _others(case):
    """JournalHolds of every other planned case's journals that can be read (one that cannot is its own
    case's receipt finding), read once per run (``case.run_memo``)."""
    cases = case.plan.get("cases") if isinstance(case.plan.get("cases"), list) else []
    root = case.root or os.path.dirname(os.path.dirname(case.case_dir))
    found = []
    for case_id in cases:
        if case_id == case.case_id:
            continue
        for role in ROLES:
            key = ("locks.journal", case_id, role)
            if key not in case.run_memo:
                path = os.path.join(root, "cases", case_id, role, "journal.jsonl")
                journal = load_journal(path, root, Budget())  # bounded and safe, as every receipt
                try:
                    case.run_memo[key] = journal_holds(case_id, role, path, journal.data) if journal.ok else None
                except (KeyError, TypeError, AttributeError):
                    case.run_memo[key] = None  # a journal of another shape: journal.* of its own case
            if case.run_memo[key] is not None:
                found.append(case.run_memo[key])
    return found


def _order(entry, plan_index):
    return plan_index.get(entry.case_id, -1), ROLES.index(entry.role)


def _clash(mine, theirs, plan_index):
    """Overlapping (my hold, their hold) pairs I report: those where my hold began last (ties: later in the
    plan), so each overlap is one finding, in one case."""
    clashes = []
    for held in mine.holds:
        for other in theirs.holds:
            mine_key = (held.start, _order(mine, plan_index))
            if overlap(held, other) and mine_key > (other.start, _order(theirs, plan_index)):
                clashes.append((held, other))
    return clashes


def _exclusive(case, own):
    problems = []
    cases = case.plan.get("cases") if isinstance(case.plan.get("cases"), list) else []
    plan_index = {c: i for i, c in enumerate(cases)}
    journals = own + _others(case)
    for mine in own:
        if mine.clock:
            problems.append((f"{mine.role}: its holds cannot be ordered against other supervisors': {mine.clock}",
                             mine.path))
            continue
        for theirs in journals:
            if theirs is mine or not comparable(mine.machine, theirs.machine):
                continue
            for held, other in _clash(mine, theirs, plan_index)[:MAX_PROBLEMS_SHOWN]:
                problems.append((f"{mine.role}: {held.rnic} on {mine.machine[0]} (boot {mine.machine[1]}) held "
                                 f"[{held.start}, {held.end}] while case {theirs.case_id}'s {theirs.role} "
                                 f"supervisor held it [{other.start}, {other.end}]", mine.path,
                                 {"expected": {"other holders of " + held.rnic: []},
                                  "observed": {"other holders of " + held.rnic: [
                                      {"case": theirs.case_id, "role": theirs.role,
                                       "held": [other.start, other.end]}],
                                      "held": [held.start, held.end]}}))
    return problems


def _rail_devices(case, role, start):
    """The RNICs a runner was told to use: its journaled case's rails, or (no pins: discovery) the locks."""
    rails = told_case(start).get("rails")
    if isinstance(rails, list) and rails and all(isinstance(r, dict) and isinstance(r.get("device"), str)
                                                 for r in rails):
        return sorted({r["device"] for r in rails})
    return sorted(r for r in locked_rnics(case, role) if isinstance(r, str))


def _life(events, pid):
    """[child_start t, child_exit t] of a runner, the exit the session's end when it was never reaped."""
    start = next((e for e in events if e.get("ev") == "child_start" and e.get("pid") == pid), None)
    if start is None or _time(start) is None:
        return None
    after = events[events.index(start):]
    end = next((e for e in after if e.get("ev") == "child_exit" and e.get("pid") == pid), None)
    end = end or next((e for e in after if e.get("ev") in _SESSION_ENDS), None) or events[-1]
    return _time(start), _time(end)


def _ledger_times(ledger):
    """(field, time) of every instant the runner's ledger states (docs/receipts.md: Unix times)."""
    found = [(key, ledger.get(key)) for key in ("started_at", "finished_at")]
    for index, rnd in enumerate(ledger.get("rounds") or []):
        if isinstance(rnd, dict):
            found += [(f"rounds[{index}].{key}", rnd.get(key)) for key in ("started_at", "finished_at")]
    point = ledger.get("restart_point")
    if isinstance(point, dict):
        found.append(("restart_point.at", point.get("at")))
    return [(k, float(t)) for k, t in found if isinstance(t, (int, float)) and not isinstance(t, bool)]


def _lifetimes(case, own):
    """Each runner's life (its supervisor's child start..exit) inside its hold of every RNIC of its rails,
    and every time its ledger states inside that hold and before its exit."""
    problems = []
    by_role = {entry.role: entry for entry in own}
    for role, generation, ledger, path in each_ledger(case):
        entry, start = by_role.get(role), runner_start(case, role, generation)
        if entry is None or entry.clock or start is None:
            continue  # a clock that cannot be ordered is reported above; a start the journal lacks: journal.*
        events = case.journals[role].data["events"]
        life = _life(events, start.get("pid"))
        if life is None or life[1] is None:
            continue
        rnics = _rail_devices(case, role, start)
        windows = {}
        for rnic in rnics:
            window = next((h for h in entry.holds if h.rnic == rnic and h.start <= life[0] and life[1] <= h.end), None)
            if window is None:
                held = [[h.start, h.end] for h in entry.holds if h.rnic == rnic]
                problems.append((f"{role} g{generation}: runner pid {start.get('pid')} lived [{life[0]}, {life[1]}], "
                                 f"not inside a hold of {rnic} ({held or 'never held'})", entry.path,
                                 {"expected": {f"{rnic} held over": list(life)},
                                  "observed": {f"{rnic} held": held}}))
            else:
                windows[rnic] = window
        if len(windows) != len(rnics) or not windows:
            continue
        low = max(h.start for h in windows.values())
        high = min(life[1], *(h.end for h in windows.values()))
        outside = [(k, t) for k, t in _ledger_times(ledger) if not low <= t <= high]
        if outside:
            problems.append((f"{role} g{generation}: the runner's ledger states times {outside[:MAX_PROBLEMS_SHOWN]} "
                             f"outside its locks of {rnics} and its life, [{low}, {high}]", f"{path}#finished_at",
                             {"expected": {"within": [low, high]},
                              "observed": {"ledger times outside": outside[:MAX_PROBLEMS_SHOWN]}}))
    return problems


@rule("locks.exclusive", "locks",
      "across every case of the run, no RNIC of one machine (host name and boot ID its journals observed, "
      "whatever the inventory calls it) was held by two supervisors at once (hold intervals on the node's wall "
      "clock, compared within one boot); each runner lived inside its hold of every RNIC of its rails, and "
      "every time its ledger states lies inside those holds and before its exit",
      witness=("journal",), needs=("ledgers", "journals"),
      after=("journal.identity", "journal.distinct_nodes", "journal.locks", "journal.children", "journal.order",
             "rails.pinned"))
def check_exclusive(case):
    own = [journal_holds(case.case_id, role, case.journals[role].path, case.journals[role].data) for role in ROLES]
    return _exclusive(case, own) + _lifetimes(case, own)
