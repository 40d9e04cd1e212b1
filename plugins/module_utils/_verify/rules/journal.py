# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Supervisor journal rules (docs/supervisor.md): what each node's supervisor saw, against the ledgers."""

from __future__ import annotations

import os
import re
from collections import defaultdict

from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import _lifecycle as lifecycle
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import ROLES, runner_starts


def _journal(case, role):
    return case.journals[role].data, case.journals[role].path


def _events(journal, name):
    return [e for e in journal["events"] if e.get("ev") == name]


@rule("journal.identity", "journal",
      "each supervisor rechecked its node inside the locks, where the runner ran",
      witness=("journal",), needs=("ledgers", "journals"))
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


@rule("journal.distinct_nodes", "journal",
      "source and requester differ in hostname and boot ID",
      witness=("journal",), needs=("ledgers", "journals"))
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


@rule("journal.locks", "journal",
      "every RNIC used was locked, and every lock released at the end",
      witness=("journal",), needs=("ledgers", "journals"))
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


@rule("journal.children", "journal",
      "each runner was the supervisor's child, reaped with the ledger's exit status; the only signals are the "
      "profile's kills (installed-restart: one SIGKILL per nonfinal generation's fault-role runner, reaped killed)",
      witness=("journal",), needs=("ledgers", "journals"))
def check_journal_children(case):
    problems = []
    for role in ROLES:
        journal, path = _journal(case, role)
        starts = {e.get("pid"): e for e in _events(journal, "child_start")}
        exits = {e.get("pid"): e for e in _events(journal, "child_exit")}
        expected_pids = set()
        kills = []
        for generation in case.generations():
            ledger = case.ledger(role, generation)
            pid = ledger.get("pid")
            expected_pids.add(pid)
            if pid not in starts:
                problems.append((f"{role} g{generation}: runner pid {pid} was not a child of the supervisor", path))
            elif pid not in exits:
                problems.append((f"{role} g{generation}: runner pid {pid} was never reaped", path))
            elif lifecycle.killed(case.profile, role, generation):
                if (exits[pid].get("exit_code"), exits[pid].get("exit_signal")) != (None, lifecycle.SIGKILL):
                    problems.append((f"{role} g{generation}: pid {pid} was to be killed at the restart point; the "
                                     f"supervisor reaped it with exit {exits[pid].get('exit_code')!r} signal "
                                     f"{exits[pid].get('exit_signal_name')!r}", path))
                else:
                    kills.append(pid)
            elif lifecycle.ends_idle(case.profile, generation):
                continue  # the survivor lives on: its exit is its last generation's
            elif (exits[pid].get("exit_code"), exits[pid].get("exit_signal")) != (ledger.get("exit_code"), None):
                problems.append((f"{role} g{generation}: the supervisor reaped pid {pid} with exit "
                                 f"{exits[pid].get('exit_code')!r} signal {exits[pid].get('exit_signal_name')!r}, "
                                 f"the ledger says exit {ledger.get('exit_code')!r}", path))
        stray = sorted(set(starts) - expected_pids, key=str)
        if stray:
            problems.append((f"{role}: children the case does not account for: pids {stray}", path))
        # The profile model's kills (installed-restart), each one SIGKILL requested for its pid; any other
        # signal or lease event is a fault the mode does not provoke.
        signals = [e for e in _events(journal, "signal")
                   if not (e.get("pid") in kills and e.get("signal") == lifecycle.SIGKILL
                           and e.get("reason") == "request")]
        signals += _events(journal, "lease_expired")
        wanted = len(kills)
        sent = [e.get("pid") for e in _events(journal, "signal") if e.get("pid") in kills]
        if signals or sorted(sent, key=str) != sorted(kills, key=str):
            problems.append((f"{role}: {len(signals)} signal/lease event(s) the mode does not provoke; SIGKILL "
                             f"requested for pids {sent}, the profile kills {wanted} runner(s) ({kills})", path))
    return problems


# The observer libraries are built as liborbite_<tool>.so (docs/build.md); the journal names each
# library the supervisor preloaded by the path and sha256 it checked.
_OBSERVER_LIBRARY = re.compile(r"liborbite_([a-z_]+)\.so")


def _planned_tools(case):
    """{sha256: tool} of the observers the plan names (run.json ``artifacts.observers``)."""
    artifacts = case.plan.get("artifacts") if isinstance(getattr(case, "plan", None), dict) else None
    observers = artifacts.get("observers") if isinstance(artifacts, dict) else None
    return {entry.get("sha256"): tool for tool, entry in (observers if isinstance(observers, dict) else {}).items()
            if isinstance(entry, dict) and entry.get("sha256")}


def _preloaded_tools(start, planned):
    """The observer tools a child_start preloaded: by the plan's hash, else by library name (None for a
    library of no tool). Whether each hash is the plan's is identity.artifacts'."""
    tools = []
    for entry in start.get("ld_preload") or []:
        path = entry.get("path") if isinstance(entry, dict) else entry
        sha = entry.get("sha256") if isinstance(entry, dict) and isinstance(entry.get("sha256"), str) else None
        match = _OBSERVER_LIBRARY.fullmatch(os.path.basename(path)) if isinstance(path, str) else None
        tools.append(planned.get(sha) or (match.group(1) if match else None))
    return tools


@rule("journal.env", "journal",
      "no RDMAV_ALLOW_DISASSOC_DESTROY; LD_PRELOAD holds exactly the mode's observers for the role, whatever the "
      "runner kind",
      witness=("journal", "profile"), needs=("journals",))
def check_journal_env(case):
    """What the supervisor started each runner with (its journal), against the observers the
    profile model loads into that role (``workload.observers``). Every runner kind preloads the
    real observers, the simulated one too: the runner's word on its kind changes nothing."""
    problems = []
    planned = _planned_tools(case)
    for role in ROLES:
        journal, path = _journal(case, role)
        by_generation = runner_starts(case, role)
        for start in _events(journal, "child_start"):
            # Which generation this start served (an observer may be scoped to one: installed-cleanup-failure).
            generation = next((g for g, starts in by_generation.items() if any(s is start for s in starts)), None)
            wanted = sorted(o["tool"] for o in case.workload["observers"]
                            if lifecycle.observer_loaded(o, role, generation))
            keys = start.get("env_keys") or []
            if "RDMAV_ALLOW_DISASSOC_DESTROY" in keys:
                problems.append((f"{role}: pid {start.get('pid')} ran with RDMAV_ALLOW_DISASSOC_DESTROY", path))
            tools = _preloaded_tools(start, planned)
            if sorted(tools, key=str) != wanted or ("LD_PRELOAD" in keys) != bool(wanted):
                problems.append((f"{role}: pid {start.get('pid')} preloaded {tools} (LD_PRELOAD "
                                 f"{'set' if 'LD_PRELOAD' in keys else 'unset'}), the mode loads {wanted or 'none'} "
                                 f"into the {role}", path,
                                 {"expected": {"preloaded": wanted, "LD_PRELOAD": bool(wanted)},
                                  "observed": {"preloaded": tools, "LD_PRELOAD": "LD_PRELOAD" in keys}}))
    return problems


@rule("journal.order", "journal",
      "every RNIC locked and the node rechecked before a runner started; no lock released before every runner "
      "was reaped; nothing after the journal's close (of any kind) but a new supervisor's journal_open",
      witness=("journal",), needs=("journals",), after=("journal.identity", "journal.locks", "journal.children"))
def check_journal_order(case):
    """The order of the supervisor's own events (docs/supervisor.md): locks, the identity recheck
    inside them, then the children; each child reaped before the first lock is released; the close last."""
    problems = []
    for role in ROLES:
        journal, path = _journal(case, role)
        problems.extend((f"{role}: {what}", path) for what in _after_the_close(journal["events"]))
        at = defaultdict(list)
        for index, event in enumerate(journal["events"]):
            at[event.get("ev")].append((index, event))
        starts, exits = at["child_start"], at["child_exit"]
        if not starts:
            continue  # journal.children names a runner that never started
        first_start = starts[0][0]
        late = [e.get("rnic") for i, e in at["lock_acquire"] if i > first_start]
        last_lock = max((i for i, _e in at["lock_acquire"]), default=-1)
        rechecked = [i for i, e in at["identity_check"]
                     if e.get("stage") == "inside_locks" and e.get("ok") is True and last_lock < i < first_start]
        if late or not rechecked:
            problems.append((f"{role}: the first runner started before {'locks ' + str(late) if late else ''}"
                             f"{' and ' if late and not rechecked else ''}"
                             f"{'the identity recheck inside the locks' if not rechecked else ''}", path))
        reaped = {}
        for i, e in exits:
            reaped.setdefault(e.get("pid"), i)
        first_release = min((i for i, _e in at["lock_release"]), default=len(journal["events"]))
        # A child never reaped at all is journal.children's; here: reaped only after a lock went.
        unreaped = [e.get("pid") for i, e in starts if e.get("pid") in reaped
                    and not i < reaped[e.get("pid")] < first_release]
        if unreaped:
            released = journal["events"][first_release].get("rnic") if first_release < len(journal["events"]) else None
            problems.append((f"{role}: runner pid(s) {unreaped} not reaped before the first lock release "
                             f"({released!r})", path))
    return problems


def _after_the_close(events):
    """The events a closed journal holds after its journal_close, named: the supervisor writes none (only a
    supervisor started again on the run directory opens a new session). Checked by position, whatever the
    kind: a rule that reads only the kinds it knows would miss one of a kind it does not."""
    closed, found = None, []
    for index, event in enumerate(events):  # the header (line 1) is not among them
        kind = event.get("ev")
        if closed is not None and kind != "journal_open":
            found.append(f"line {index + 2} ({kind!r}, seq {event.get('seq')!r}) follows the journal's close "
                         f"(seq {closed.get('seq')!r}): a closed journal is final")
        if kind == "journal_close":
            closed = event
        elif kind == "journal_open":
            closed = None
    return found[:1] + ([f"and {len(found) - 1} more event(s) after the close"] if len(found) > 1 else [])
