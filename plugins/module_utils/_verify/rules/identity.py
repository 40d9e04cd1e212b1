# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Identity rules: every receipt is of this run, case, role, generation, node, process and build.

Each fact is taken from a witness other than the receipt under test: the plan (``run.json`` and
``case.json``, written by the controller before any node ran), the node's supervisor journal
(what it started, where, and the sha256 of every file it handed the runner) or the peer's ledger.
What each runner was told (its case file) is read from the journal too: the supervisor pinned the
case file it handed the runner and journaled its sha256 and content (``child_start`` ``pinned``,
docs/supervisor.md), so the fetched copy beside the ledger is never needed as a witness.
docs/verifier.md, "Bound identity", lists what binds what.
"""

from __future__ import annotations

import os

from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import EVERY_RUN, declare, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import _lifecycle as lifecycle
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import (
    ROLES,
    each_ledger,
    runner_starts,
)

RUNNER_CASE_SCHEMA = ("orbite.runner-case", 1)
EPOCH_LIMIT = 1 << 63

declare("run.diagnostic", "run", "no defect switch was on (`run.json` `defects`): a run with any is diagnostic and "
        "never PASSes, whatever its cases say", applies=EVERY_RUN, witness=("plan",))


def _other(role):
    return "requester" if role == "source" else "source"


def expected_ids(run_id, case_id):
    """The IDs the plan format derives for a case (docs/verifier.md): supervisors' run ID, registrations."""
    base = f"{run_id}-{case_id}"
    return base, {role: f"{base}-{role}" for role in ROLES}


def _plan_path(case):
    return os.path.join(case.root or os.path.dirname(os.path.dirname(case.case_dir)), "run.json")


def _no_plan(case):
    if not case.plan:
        return [("no run plan (run.json) was given to check this case against", case.case_dir)]
    return None


# --- what the journals say each generation's runner was -------------------------------------------


def runner_start(case, role, generation):
    """The one runner start the journal shows for this role and generation (installed-restart's survivor:
    its generation 1 start, for every generation), or None."""
    found = runner_starts(case, role).get(lifecycle.process_generation(case.profile, role, generation), [])
    return found[0] if len(found) == 1 else None


def _pins(start):
    """{what: pinned file record} of a runner start (``argv[0]``, ``argv[3]``, ``ld_preload[0]``, ...)."""
    pinned = start.get("pinned")
    return {p["what"]: p for p in pinned if isinstance(p, dict) and isinstance(p.get("what"), str)} if isinstance(
        pinned, list) else {}


def _flag_index(start, flag):
    argv = start.get("argv")
    return argv.index(flag) if isinstance(argv, list) and flag in argv else None


def _mapping(value):
    return value if isinstance(value, dict) else {}


def _told(start):
    """(pinned record of the case file the runner got, its JSON as the supervisor journaled it) or (None, None)."""
    index = _flag_index(start, "--case")
    pin = _pins(start).get(f"argv[{index + 1}]") if index is not None else None
    told = pin.get("json") if pin is not None else None
    return pin, told if isinstance(told, dict) else None


def told_case(start):
    """The case file the supervisor journaled for a runner start (``child_start``), or {} when it pins none."""
    return _told(start)[1] or {}


def told_cases(case):
    """(role, generation, case the runner was told, journal path) for each runner whose case the journal records.

    A runner without one is identity.case_files' finding; the other rules read only what is recorded.
    """
    if not case.usable()["journals"]:
        return
    for generation in case.generations():
        for role in ROLES:
            start = runner_start(case, role, generation)
            told = _told(start)[1] if start is not None else None
            if told is not None:
                yield role, generation, told, case.journals[role].path


# --- the rules ----------------------------------------------------------------------------------


@rule("identity.plan", "identity",
      "`case.json` is the case `run.json` plans: same case ID, profile and hosts, and the supervisor and "
      "registration IDs the plan format derives (`<run_id>-<case>`, `<run_id>-<case>-<role>`)",
      witness=("plan",), needs=())
def check_plan(case):
    missing = _no_plan(case)
    if missing:
        return missing
    plan, meta, case_id = case.plan, case.meta, case.case_id
    where = os.path.join(case.case_dir, "case.json")
    problems = []
    if meta.get("case_id") != case_id:
        problems.append((f"case.json names case {meta.get('case_id')!r}, but lies in cases/{case_id}", where))
    for field in ("profiles", "hosts"):
        planned = plan[field].get(case_id)  # run.json checked: an object of objects
        mine = _mapping(meta.get("profile" if field == "profiles" else "hosts"))
        if planned is None:
            problems.append((f"run.json {field} has no entry for case {case_id}", _plan_path(case)))
        elif planned != mine:
            keys = sorted(k for k in set(planned) | set(mine) if planned.get(k) != mine.get(k))
            problems.append((f"case.json {field[:-1] if field == 'profiles' else field} differs from run.json "
                             f"{field}[{case_id}] in {keys}", where))
    hosts = _mapping(meta.get("hosts"))
    for role in ROLES:
        if hosts.get(role) != case.profile.get(role):
            problems.append((f"case.json hosts.{role} is {hosts.get(role)!r}, its profile says "
                             f"{case.profile.get(role)!r}", where))
    supervisor, registrations = expected_ids(plan["run_id"], case_id)
    if meta.get("supervisor_run_id") != supervisor:
        problems.append((f"case.json supervisor_run_id is {meta.get('supervisor_run_id')!r}, the plan format "
                         f"gives {supervisor!r}", where))
    if meta.get("registrations") != registrations:
        problems.append((f"case.json registrations are {meta.get('registrations')!r}, the plan format gives "
                         f"{registrations!r}", where))
    return problems


@rule("identity.processes", "identity",
      "each generation's ledger and observer logs come from the one runner the journal started for that role "
      "and generation (`--output .../g<N>`): same pid",
      witness=("journal",), needs=("ledgers", "journals"))
def check_processes(case):
    problems = []
    for role in ROLES:
        path = case.journals[role].path
        starts = runner_starts(case, role)
        for generation in case.generations():
            started = lifecycle.process_generation(case.profile, role, generation)
            found = starts.get(started, [])
            if len(found) != 1:
                problems.append((f"{role} g{generation}: the journal shows {len(found)} runner start(s) with "
                                 f"--output .../g{started}, expected exactly one", path))
                continue
            pid = found[0].get("pid")
            ledger = case.ledger(role, generation)
            if ledger.get("pid") != pid:
                problems.append((f"{role} g{generation}: the ledger is pid {ledger.get('pid')!r}'s, the journal "
                                 f"started pid {pid!r} for this generation", case.ledger_path(role, generation)))
            for (log_role, log_generation, tool), log in sorted(case.observer_logs.items()):
                if (log_role, log_generation) != (role, generation) or not log.ok:
                    continue  # an unusable log is its receipt.* finding
                header = (log.header.get("pid"), log.header.get("tool"))
                if header != (pid, tool):
                    problems.append((f"{role} g{generation}: observer log {tool} is of pid {header[0]!r} (tool "
                                     f"{header[1]!r}), the journal started pid {pid!r}", log.path))
    return problems


@rule("identity.case_files", "identity",
      "each runner was given the plan's case for its role and generation: the case file the supervisor pinned "
      "for it and journaled (sha256 and content, `child_start` `pinned`)",
      witness=("journal", "plan"), needs=("ledgers", "journals"), after=("identity.processes",))
def check_case_files(case):
    problems = []
    for generation in case.generations():
        for role in ROLES:
            start = runner_start(case, role, generation)
            if start is None:
                continue  # identity.processes
            path = case.journals[role].path
            pin, told = _told(start)
            if pin is None or not isinstance(pin.get("sha256"), str):
                problems.append((f"{role} g{generation}: the journal does not record the case file the runner got "
                                 "(the argument after --case was not pinned)", path))
                continue
            if told is None:
                problems.append((f"{role} g{generation}: the journal records the case file's sha256 "
                                 f"{pin['sha256']} but not its content (record_json)", path))
                continue
            found = {"schema": (told.get("schema"), told.get("version")), "role": told.get("role"),
                     "generation": told.get("generation"), "profile": told.get("profile")}
            wanted = {"schema": RUNNER_CASE_SCHEMA, "role": role,
                      "generation": lifecycle.process_generation(case.profile, role, generation),
                      "profile": case.meta.get("profile")}
            for key, value in wanted.items():
                if found[key] != value:
                    shown = "the plan's" if key == "profile" else repr(value)
                    problems.append((f"{role} g{generation}: the case file the runner got (sha256 {pin['sha256']}) "
                                     f"says {key} {found[key]!r}, expected {shown}", path))
    return problems


@rule("identity.run", "identity",
      "every ledger, runner case file and supervisor journal names this run (the journal also this case)",
      witness=("plan",), needs=("ledgers", "journals"))
def check_run(case):
    missing = _no_plan(case)
    if missing:
        return missing
    run_id = case.plan["run_id"]
    supervisor, _registrations = expected_ids(run_id, case.case_id)
    problems = []
    for role, generation, ledger, path in each_ledger(case):
        if ledger.get("run_id") != run_id:
            problems.append((f"{role} g{generation}: the ledger is of run {ledger.get('run_id')!r}, the plan's "
                             f"is {run_id!r}", path))
    for role, generation, data, path in told_cases(case):
        if data.get("run_id") != run_id:
            problems.append((f"{role} g{generation}: the runner was told run {data.get('run_id')!r}, the plan's "
                             f"is {run_id!r}", path))
    for role in ROLES:
        journal = case.journals[role]
        named = [("journal_open", journal.data["header"].get("run_id"))]
        named += [(e.get("ev"), e.get("run_id")) for e in journal.data["events"] if e.get("ev") == "supervisor_start"]
        for event, value in named:
            if value != supervisor:
                problems.append((f"{role}: the supervisor's {event} names run {value!r}, this case's supervisors "
                                 f"are {supervisor!r}", journal.path))
    return problems


@rule("identity.registration", "identity",
      "each ledger and runner case file carries its role's registration ID and its peer's, as the plan derives them",
      witness=("plan",), needs=("ledgers", "journals"), after=("identity.run",))
def check_registration(case):
    missing = _no_plan(case)
    if missing:
        return missing
    _supervisor, registrations = expected_ids(case.plan["run_id"], case.case_id)
    problems = []
    for role, generation, ledger, path in each_ledger(case):
        seen = (ledger.get("registration_id"), ledger.get("peer_registration_id"))
        wanted = (registrations[role], registrations[_other(role)])
        if seen != wanted:
            problems.append((f"{role} g{generation}: registration/peer {seen}, the plan's are {wanted}", path))
    for role, generation, data, path in told_cases(case):
        peer = data.get("peer_registration_id")
        # The source may learn its peer at the rendezvous: its case file may leave it out.
        peer_ok = peer == registrations[_other(role)] or (role == "source" and peer is None)
        if data.get("registration_id") != registrations[role] or not peer_ok:
            problems.append((f"{role} g{generation}: the runner was told registration/peer "
                             f"{(data.get('registration_id'), peer)}, the plan's are "
                             f"{(registrations[role], registrations[_other(role)])}", path))
    return problems


@rule("identity.defects", "identity",
      "every ledger and runner case file names exactly the plan's defect switches (none in a qualifying run); "
      "installed-interruption: the control relay's journal names the plan's relay switches, the runners the rest",
      witness=("plan", "journal"), needs=("ledgers",))
def check_defects(case):
    missing = _no_plan(case)
    if missing:
        return missing
    planned = sorted(case.plan.get("defects") or [])
    # installed-interruption: the control relay's own switches are the relay's, named in its journal.
    relayed = sorted(d for d in planned if d in lifecycle.RELAY_SWITCHES) if case.relay is not None else []
    wanted = [d for d in planned if d not in relayed]
    problems = []
    if case.relay is not None and case.relay.ok:
        start = next((e for e in [case.relay.data["header"], *case.relay.data["events"]]
                      if isinstance(e, dict) and e.get("ev") == "start"), {})
        seen = start.get("defects")
        if not isinstance(seen, list) or sorted(map(str, seen)) != relayed:
            problems.append((f"the relay says defect switches {seen!r}, the plan {relayed}", case.relay.path))
    for role, generation, ledger, path in each_ledger(case):
        runner = ledger.get("runner")
        seen = runner.get("defects") if isinstance(runner, dict) else None
        if not isinstance(seen, list) or sorted(map(str, seen)) != wanted:
            problems.append((f"{role} g{generation}: the ledger says defect switches {seen!r}, the plan {wanted}",
                             path))
    for role, generation, data, path in told_cases(case):
        seen = data.get("defects", [])
        if not isinstance(seen, list) or sorted(map(str, seen)) != wanted:
            problems.append((f"{role} g{generation}: the runner was given defect switches {seen!r}, the plan "
                             f"{wanted}", path))
    return problems


@rule("identity.epochs", "identity",
      "each runner's epoch is the one its peer saw (and in every round), fresh for every process of the case",
      witness=("peer",))
def check_epochs(case):
    problems = []
    first_seen = {}
    for generation in case.generations():
        ledgers = {role: case.ledger(role, generation) for role in ROLES}
        for role in ROLES:
            ledger, path = ledgers[role], case.ledger_path(role, generation)
            epoch, peer_epoch = ledger.get("epoch"), ledger.get("peer_epoch")
            if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 < epoch < EPOCH_LIMIT:
                problems.append((f"{role} g{generation}: epoch {epoch!r} is not in (0, 2^63)", path))
                continue
            peer = ledgers[_other(role)].get("epoch")
            if peer_epoch != peer:
                problems.append((f"{role} g{generation}: saw peer epoch {peer_epoch!r}, the {_other(role)}'s "
                                 f"ledger has epoch {peer!r}", path))
            for index, rnd in enumerate(ledger["rounds"]):
                if (rnd.get("epoch"), rnd.get("peer_epoch")) != (epoch, peer_epoch):
                    problems.append((f"{role} g{generation} round {rnd.get('round')}: epochs "
                                     f"{(rnd.get('epoch'), rnd.get('peer_epoch'))}, the ledger's are "
                                     f"{(epoch, peer_epoch)}", f"{path}#rounds[{index}]"))
            # One process keeps its epoch (installed-restart's survivor, through its generations).
            process = (role, lifecycle.process_generation(case.profile, role, generation))
            if epoch in first_seen and first_seen[epoch][0] != process:
                problems.append((f"{role} g{generation}: epoch {epoch} was already {first_seen[epoch][1]}'s: a new "
                                 "process must announce a fresh epoch", path))
            first_seen.setdefault(epoch, (process, f"{role} g{generation}"))
    return problems


def _names_host(planned, hostname):
    """True when the node's kernel host name is the plan's host (equal, or one the other's first label)."""
    if not isinstance(planned, str) or not isinstance(hostname, str) or not planned or not hostname:
        return False
    planned, hostname = names.host_key(planned), names.host_key(hostname)
    return planned == hostname or planned == hostname.split(".")[0] or hostname == planned.split(".")[0]


@rule("identity.hosts", "identity",
      "each role ran on the plan's host: every identity check of its journal saw that host name and one boot ID",
      witness=("plan", "journal"), needs=("journals",), after=("journal.identity", "journal.distinct_nodes"))
def check_hosts(case):
    problems = []
    hosts = _mapping(case.meta.get("hosts"))
    for role in ROLES:
        journal = case.journals[role]
        observed = sorted({(e["observed"].get("hostname"), e["observed"].get("boot_id"))
                           for e in journal.data["events"]
                           if e.get("ev") == "identity_check" and isinstance(e.get("observed"), dict)}, key=str)
        if not observed:
            problems.append((f"{role}: the journal has no identity check", journal.path))
        elif len(observed) > 1:
            problems.append((f"{role}: the journal saw more than one node identity: {observed}", journal.path))
        elif not _names_host(hosts.get(role), observed[0][0]):
            problems.append((f"{role}: ran on host {observed[0][0]!r} (boot {observed[0][1]}), the plan's "
                             f"{role} is {hosts.get(role)!r}", journal.path))
    return problems


@rule("identity.artifacts", "identity",
      "each runner, verbs library and observer the supervisors exec'd or preloaded (sha256 in the journal) is the "
      "plan's artifact, and each ledger's runner kind the plan's",
      witness=("plan", "journal"), needs=("ledgers", "journals"), after=("identity.processes", "identity.case_files"))
def check_artifacts(case):
    missing = _no_plan(case)
    if missing:
        return missing
    artifacts = case.plan.get("artifacts")
    if not isinstance(artifacts, dict):
        return [("run.json names no artifacts (runner, verbs library, observers): a PASS would qualify no build",
                 _plan_path(case))]
    kind, runner_sha = case.plan.get("runner_kind"), artifacts["runner"]["sha256"]
    library = (artifacts.get("verbs_library") or {}).get("sha256")
    observers = {tool: entry["sha256"] for tool, entry in (artifacts.get("observers") or {}).items()}
    may_preload = set(observers.values()) | ({library} if library else set())
    problems = []
    for generation in case.generations():
        for role in ROLES:
            start = runner_start(case, role, generation)
            if start is None:
                continue  # identity.processes
            path, label = case.journals[role].path, f"{role} g{generation}"
            ledger_kind = _mapping(case.ledger(role, generation).get("runner")).get("kind")
            if ledger_kind != kind:
                problems.append((f"{label}: the ledger's runner kind is {ledger_kind!r}, the plan's {kind!r}",
                                 case.ledger_path(role, generation)))
            pins = _pins(start)
            index = _flag_index(start, "--case")
            position = f"argv[{index - 1}]" if index else None
            runner = pins.get(position) if position else None
            if runner is None:
                problems.append((f"{label}: the runner ({position or 'no --case in argv'}) was not pinned: the "
                                 "journal does not say which build ran", path))
            elif runner.get("sha256") != runner_sha:
                problems.append((f"{label}: the runner exec'd ({runner.get('path')}) has sha256 "
                                 f"{runner.get('sha256')}, the plan's is {runner_sha}", path))
            handed = {p.get("sha256") for p in pins.values()}
            told = (_told(start)[1] or {}).get("verbs_library")
            told = told.get("sha256") if isinstance(told, dict) else told
            # The verbs library is witnessed when the supervisor handed it over pinned, or when the
            # journaled case file told the runner to load exactly those bytes (the runner contract
            # makes any other bytes a case error before anything is opened).
            if library and library not in handed and told != library:
                problems.append((f"{label}: the plan's verbs library (sha256 {library}) is neither among the files "
                                 f"the runner was given ({sorted(map(str, handed))}) nor the one its case file names "
                                 f"({told})", path))
            preloaded = {p.get("sha256"): what for what, p in pins.items() if what.startswith("ld_preload[")}
            for sha, what in sorted(preloaded.items(), key=str):
                if sha not in may_preload:
                    problems.append((f"{label}: {what} (sha256 {sha}) is not an artifact of the plan", path))
            for observer in case.workload["observers"]:
                tool = observer["tool"]
                if lifecycle.observer_loaded(observer, role, generation) and tool in observers \
                        and observers[tool] not in preloaded:
                    problems.append((f"{label}: observer {tool} (sha256 {observers[tool]}) was not preloaded", path))
    for role, generation, data, path in told_cases(case):
        told = data.get("verbs_library")
        told = told.get("sha256") if isinstance(told, dict) else told
        if told is not None and told != library:
            problems.append((f"{role} g{generation}: the runner was told to load verbs library sha256 {told}, the "
                             f"plan's is {library}", path))
    return problems
