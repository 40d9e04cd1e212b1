"""Bound identity: every receipt is of this run, case, role, generation, node, process and build.

Red checks build CONSISTENT defects on a clean simulated run (tests/helpers/sim_pair.py): receipts of
another run, case, host or process, or of another build, with every receipt adjusted so that the
naive cross-checks (ledger against ledger, ledger against its own journal entry) agree; each must
fail exactly its identity code. A forger who rewrites what the runner was told (the case file the
journal records) rewrites its sha256 and the fetched copy with it. No-op rewrites still pass.

A red check's failures are compared with the clean run's: a code that another rule group already
fails on the clean run (work in progress elsewhere) cannot hide or fake an identity finding, since
the clean run must pass every identity and run code (test_the_clean_run_passes_every_identity_code).
"""

import hashlib
import json
import shutil
import xml.etree.ElementTree as ET

import pytest
from helpers import observer_log
from helpers.receipts import edit_json, edit_lines, reorder
from helpers.sim_pair import RAIL_ACCOUNTING, SMALL_HOST, run_pair

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.case import case_receipts
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import REGISTRY
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import identity
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

ROLES = ("source", "requester")
OTHER_SHA = "0123456789abcdef" * 4
IDENTITY_CODES = [*sorted(c for c in REGISTRY.codes() if c.startswith("identity.")), "run.diagnostic", "run.plan"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("identity") / "run"
    run_pair(run_dir, "ra", RAIL_ACCOUNTING)
    run_pair(run_dir, "ih", SMALL_HOST)
    return run_dir


@pytest.fixture
def run(clean, tmp_path):
    """A copy of the clean run planning case ``ra`` only (``ih`` stays on disk, unplanned)."""
    run_dir = tmp_path / "run"
    shutil.copytree(clean, run_dir, ignore=shutil.ignore_patterns("supervisors"))
    edit_json(run_dir / "run.json", lambda plan: plan.update(cases=["ra"]))
    return run_dir


@pytest.fixture(scope="module")
def baseline(clean, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("baseline") / "run"
    shutil.copytree(clean, run_dir, ignore=shutil.ignore_patterns("supervisors"))
    edit_json(run_dir / "run.json", lambda plan: plan.update(cases=["ra"]))
    return verify_run(str(run_dir), write=False)["failed_codes"]


def _failed_beyond(run_dir, baseline):
    failed = verify_run(str(run_dir), write=False)["failed_codes"]
    return [code for code in failed if code not in baseline]


# --- editing receipts --------------------------------------------------------------------------


def _case(run_dir, case_id="ra"):
    return run_dir / "cases" / case_id


def _ledger(run_dir, role):
    return _case(run_dir) / role / "g1" / "ledger.json"


def _journal(run_dir, role):
    return _case(run_dir) / role / "journal.jsonl"


def _ledgers(run_dir, change):
    for role in ROLES:
        edit_json(_ledger(run_dir, role), lambda ledger, role=role: change(role, ledger))


def _events(run_dir, role, ev, change):
    def each(lines):
        for line in lines:
            if line.get("ev") == ev:
                change(line)
        return lines

    edit_lines(_journal(run_dir, role), each)


def _tell(run_dir, role, change):
    """Change what the runner was told, as a forger would: the case file the journal records, its
    sha256 and size, and the copy fetched beside the ledger, all together."""
    def edit(start):
        for pin in start["pinned"]:
            if "json" in pin:
                change(pin["json"])
                data = json.dumps(pin["json"]).encode()
                pin.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
                (_case(run_dir) / role / "g1" / "case.json").write_bytes(data)

    _events(run_dir, role, "child_start", edit)


def _pin(start, what):
    return next(p for p in start["pinned"] if p["what"] == what)


# --- consistent defects, one per identity code ---------------------------------------------------


def another_run(run_dir):
    """The receipts are run ``other``'s: every ledger, case file, journal and registration says so."""
    registrations = {role: f"other-ra-{role}" for role in ROLES}
    _ledgers(run_dir, lambda role, ledger: ledger.update(
        run_id="other", registration_id=registrations[role],
        peer_registration_id=registrations["requester" if role == "source" else "source"]))
    for role in ROLES:
        _tell(run_dir, role, lambda case, role=role: case.update(
            run_id="other", registration_id=registrations[role],
            **({"peer_registration_id": registrations["source"]} if role == "requester" else {})))
        _events(run_dir, role, "journal_open", lambda e: e.update(run_id="other-ra"))
        _events(run_dir, role, "supervisor_start", lambda e: e.update(run_id="other-ra"))


def another_case(run_dir):
    """The peers registered under case ih's IDs (this run's, so run ids agree), consistently."""
    registrations = {role: f"run-ih-{role}" for role in ROLES}
    _ledgers(run_dir, lambda role, ledger: ledger.update(
        registration_id=registrations[role],
        peer_registration_id=registrations["requester" if role == "source" else "source"]))
    for role in ROLES:
        _tell(run_dir, role, lambda case, role=role: case.update(
            registration_id=registrations[role],
            **({"peer_registration_id": registrations["source"]} if role == "requester" else {})))


def run_json_edited(run_dir):
    """run.json claims a heavier profile was qualified than case.json (and every receipt) shows."""
    edit_json(run_dir / "run.json", lambda plan: plan["profiles"]["ra"].update(payload=8 << 20))


def observer_of_another_process(run_dir):
    """The observer log is another process's (its header names that pid): the first line rewritten."""
    path = observer_log.find(_case(run_dir) / "requester" / "g1")
    data = path.read_bytes()
    header, rest = data.split(b"\n", 1)
    value = json.loads(header)
    value["pid"] += 1
    path.write_bytes(json.dumps(value, separators=(",", ":")).encode() + b"\n" + rest)


def told_another_profile(run_dir):
    """The requester was given another case (fewer parents) but its ledger reports the plan's."""
    _tell(run_dir, "requester", lambda case: case["profile"].update(parents=8))


def hidden_defect_switch(run_dir):
    """The runners ran with a defect switch on; run.json (the plan) says none."""
    _ledgers(run_dir, lambda role, ledger: ledger["runner"].update(defects=["stale_input"]))
    for role in ROLES:
        _tell(run_dir, role, lambda case: case.update(defects=["stale_input"]))


def declared_defect_switch(run_dir):
    """A run whose plan, case files and ledgers all agree that a defect switch was on: diagnostic."""
    hidden_defect_switch(run_dir)
    edit_json(run_dir / "run.json", lambda plan: plan.update(defects=["stale_input"]))


def stale_peer(run_dir):
    """The requester talked to another source process (its epoch, in every round), consistently."""
    def change(_role, ledger):
        if ledger["role"] == "requester":
            ledger["peer_epoch"] += 1
            for rnd in ledger["rounds"]:
                rnd["peer_epoch"] = ledger["peer_epoch"]

    _ledgers(run_dir, change)


def another_host(run_dir):
    """The requester ran on sim-c, as both its journal and its ledger say (they agree)."""
    def move(event):
        for key in ("observed", "expected"):
            if isinstance(event.get(key), dict):
                event[key]["hostname"] = "sim-c"

    _events(run_dir, "requester", "identity_check", move)
    edit_json(_ledger(run_dir, "requester"), lambda ledger: ledger.update(hostname="sim-c"))


def another_build(run_dir):
    """The supervisor exec'd another build of the runner (the journal's pinned hash is not the plan's)."""
    _events(run_dir, "requester", "child_start", lambda start: _pin(start, "argv[1]").update(sha256=OTHER_SHA))


def unplanned_preload(run_dir):
    """An observer library of another build was preloaded (the journal says so; nothing else knows)."""
    _events(run_dir, "requester", "child_start", lambda start: _pin(start, "ld_preload[0]").update(sha256=OTHER_SHA))


def no_artifacts_in_plan(run_dir):
    """A plan that names no build: a PASS would qualify nothing."""
    edit_json(run_dir / "run.json", lambda plan: plan.pop("artifacts"))


RED_CHECKS = {
    "identity.plan": run_json_edited,
    "identity.processes": observer_of_another_process,
    "identity.case_files": told_another_profile,
    "identity.run": another_run,
    "identity.registration": another_case,
    "identity.defects": hidden_defect_switch,
    "identity.epochs": stale_peer,
    "identity.hosts": another_host,
    "identity.artifacts": another_build,
    "run.diagnostic": declared_defect_switch,
}
MORE_RED_CHECKS = [("identity.artifacts", unplanned_preload), ("identity.artifacts", no_artifacts_in_plan)]


def test_the_clean_run_passes_every_identity_code(baseline):
    assert [code for code in baseline if code in IDENTITY_CODES] == []


@pytest.mark.parametrize(("code", "defect"), [*RED_CHECKS.items(), *MORE_RED_CHECKS],
                         ids=[f"{code}-{defect.__name__}" for code, defect in [*RED_CHECKS.items(), *MORE_RED_CHECKS]])
def test_a_consistent_defect_fails_exactly_its_identity_code(run, baseline, code, defect):
    defect(run)
    assert _failed_beyond(run, baseline) == [code]


def test_every_identity_code_has_a_red_check():
    assert set(RED_CHECKS) == {c for c in REGISTRY.codes() if c.startswith("identity.")} | {"run.diagnostic"}
    for code in RED_CHECKS:  # the witness of each is named, and never the receipt under test alone
        assert REGISTRY[code].witness and REGISTRY[code].witness != ("runner",)


def test_the_journals_identity_without_the_plans_host_is_what_catches_another_host(run, baseline):
    # The naive check (ledger against its own journal) agrees with the defect: it is not what fails.
    another_host(run)
    findings = {f["code"]: f for f in verify_run(str(run), write=False)["cases"][0]["findings"]}
    assert findings["journal.identity"]["status"] == "PASS"
    assert "ran on host 'sim-c'" in findings["identity.hosts"]["message"]


def test_a_fqdn_and_its_short_name_are_the_same_host():
    assert identity._names_host("sim-a", "sim-a.lab.example") and identity._names_host("SIM-A.lab", "sim-a")
    assert not identity._names_host("sim-a", "sim-ab") and not identity._names_host("sim-a", None)


def test_a_replayed_generation_has_no_fresh_epoch(run):
    # A two-generation case whose second generation is the first one replayed: the epochs repeat.
    case_dir = _case(run)
    for role in ROLES:
        shutil.copytree(case_dir / role / "g1", case_dir / role / "g2")
        edit_json(case_dir / role / "g2" / "ledger.json", lambda ledger: ledger.update(generation=2))
    profile = model.validate_profile(json.loads((case_dir / "case.json").read_text())["profile"])
    workload = dict(model.derive_workload(profile), generations=2)
    problems = identity.check_epochs(case_receipts(str(case_dir), "ra", profile, workload, root=str(run)))
    assert len(problems) == 2 and all("already" in message for message, _ in problems)

    def fresh(ledger):  # both peers of generation 2 announce new epochs, agreeing with each other
        for key in ("epoch", "peer_epoch"):
            ledger[key] += 7
            for rnd in ledger["rounds"]:
                rnd[key] = ledger[key]

    for role in ROLES:
        edit_json(case_dir / role / "g2" / "ledger.json", fresh)
    assert identity.check_epochs(case_receipts(str(case_dir), "ra", profile, workload, root=str(run))) == []


def test_a_ledger_of_another_generations_process_is_caught(run):
    # Generation 2's ledger is generation 1's runner's (its pid), though the journal started another
    # runner for g2: only the journal's --output says which process was which generation's.
    case_dir = _case(run)
    for role in ROLES:
        shutil.copytree(case_dir / role / "g1", case_dir / role / "g2")
        edit_json(case_dir / role / "g2" / "ledger.json", lambda ledger: ledger.update(generation=2))
        lines = _journal(run, role).read_text().splitlines(keepends=True)
        start = json.loads(next(line for line in lines if '"child_start"' in line))
        start["argv"] = [arg.replace("/g1", "/g2") for arg in start["argv"]]
        start["pid"] += 1000
        _journal(run, role).write_text("".join(lines) + json.dumps(start) + "\n")
    profile = model.validate_profile(json.loads((case_dir / "case.json").read_text())["profile"])
    workload = dict(model.derive_workload(profile), generations=2)
    case = case_receipts(str(case_dir), "ra", profile, workload, root=str(run))
    problems = [message for message, _ in identity.check_processes(case)]
    ledgers = [message.split(":")[0] for message in problems if "the ledger is pid" in message]
    assert ledgers == ["source g2", "requester g2"]
    # The copied observer log is generation 1's process's too.
    assert [m.split(":")[0] for m in problems if "observer log" in m] in ([], ["requester g2"])
    for role in ROLES:  # each g2 ledger from the process the journal started for g2: nothing to say
        edit_json(case_dir / role / "g2" / "ledger.json", lambda ledger: ledger.update(pid=ledger["pid"] + 1000))
    case = case_receipts(str(case_dir), "ra", profile, workload, root=str(run))
    assert [m for m, _ in identity.check_processes(case) if "observer" not in m] == []


def test_a_relaunched_generation_is_not_one_runner(run, baseline):
    # Two runner starts for the requester's g1 in its journal: which one left the ledger is unknown.
    path = _journal(run, "requester")
    lines = path.read_text().splitlines(keepends=True)
    start = next(line for line in lines if '"child_start"' in line)
    path.write_text("".join([*lines[:1], start, *lines[1:]]))
    case = {f["code"]: f for f in verify_run(str(run), write=False)["cases"][0]["findings"]}
    processes = case["identity.processes"]
    assert processes["status"] == "FAIL" and "2 runner start(s)" in processes["message"]
    assert case["identity.case_files"]["status"] == case["identity.artifacts"]["status"] == "SKIP"  # masked


def test_a_runner_whose_case_file_was_not_recorded_fails(run, baseline):
    _events(run, "source", "child_start", lambda start: [pin.pop("json", None) for pin in start["pinned"]])
    assert _failed_beyond(run, baseline) == ["identity.case_files"]


# --- the plan itself --------------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "words"), [
    (lambda plan: plan.update(runner_kind="emulated"), "runner_kind='emulated': must be one of sim, native"),
    (lambda plan: plan.pop("defects"), "defects=None: must be a list"),
    (lambda plan: plan.update(defects="stale_input"), "defects='stale_input'"),
    (lambda plan: plan.update(allow_dirty="no"), "allow_dirty='no'"),
    (lambda plan: plan.pop("profiles"), "profiles=None"),
    (lambda plan: plan["artifacts"]["runner"].update(sha256="x"), "artifacts.runner.sha256='x'"),
    (lambda plan: plan["artifacts"]["runner"].update(kind="native"), "artifacts.runner.kind='native'"),
    (lambda plan: plan["artifacts"]["observers"].update(accounting=[]), "artifacts.observers.accounting=[]"),
    (lambda plan: plan.update(run_id="../x"), "run_id='../x'"),
])
def test_an_invalid_plan_is_run_plan_naming_field_value_and_rule(run, change, words):
    edit_json(run / "run.json", change)
    verdict = verify_run(str(run), write=False)
    assert verdict["failed_codes"] == ["run.plan"] and verdict["verdict"] == "FAIL"
    assert words in verdict["run_findings"][0]["message"]


# --- no-op rewrites ------------------------------------------------------------------------------


def test_no_op_rewrites_of_plan_journals_and_ledgers_still_pass(run, baseline):
    unknown = {"added by": "a no-op rewrite", "list": [1, {"deep": True}]}
    plan = reorder(json.loads((run / "run.json").read_text()))
    plan["x_unknown"] = unknown
    plan["artifacts"]["x_unknown"] = unknown
    plan["artifacts"]["runner"]["x_unknown"] = unknown
    (run / "run.json").write_text(json.dumps(plan, indent=5))
    for path in sorted(_case(run).rglob("*.json")):  # ledgers, case.json and the runner case files
        data = dict(reorder(json.loads(path.read_text())), x_unknown=unknown)
        path.write_text(json.dumps(data, indent=3))
    for role in ROLES:
        lines = [reorder(json.loads(line)) for line in _journal(run, role).read_text().splitlines()]
        for line in lines:
            for pin in line.get("pinned") or []:
                pin["x_unknown"] = unknown
        _journal(run, role).write_text("".join(json.dumps(dict(line, x_extra=[None, "]}{"]), separators=(", ", " : "))
                                               + "\n" for line in lines))
    assert _failed_beyond(run, baseline) == []


# --- the verdict names what it qualifies -------------------------------------------------------------


def test_the_verdict_names_the_artifact_hashes_in_every_format(run, tmp_path):
    plan = json.loads((run / "run.json").read_text())
    verdict = verify_run(str(run), output_dir=str(tmp_path))
    assert verdict["artifacts"] == plan["artifacts"] and verdict["runner_kind"] == "sim"
    assert json.loads((tmp_path / "verdict.json").read_text())["artifacts"] == plan["artifacts"]
    runner = plan["artifacts"]["runner"]
    markdown = (tmp_path / "verdict.md").read_text()
    assert "## Artifacts qualified" in markdown and runner["sha256"] in markdown
    assert plan["artifacts"]["observers"]["accounting"]["sha256"] in markdown
    suite = next(s for s in ET.parse(tmp_path / "verdict.xml").getroot() if s.get("name") == "run")
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert properties["artifact.runner"] == f"{runner['sha256']} {runner['path']}"
    assert properties["artifact.verbs_library"].startswith(plan["artifacts"]["verbs_library"]["sha256"])
    assert properties["defects"] == "none" and properties["runner_kind"] == "sim"


def test_a_diagnostic_run_says_so_in_every_format_and_never_passes(run, tmp_path):
    declared_defect_switch(run)
    verdict = verify_run(str(run), output_dir=str(tmp_path))
    assert verdict["verdict"] == "FAIL" and verdict["diagnostic_only"] is True
    assert verdict["defects"] == ["stale_input"] and "run.diagnostic" in verdict["failed_codes"]
    assert "stale_input" in verdict["run_findings"][1]["message"]
    title = (tmp_path / "verdict.md").read_text().splitlines()[0]
    assert title == "# Verdict: FAIL (diagnostic only: defect switches stale_input)"
    junit = ET.parse(tmp_path / "verdict.xml").getroot()
    suite = next(s for s in junit if s.get("name") == "run")
    failing = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert "run.diagnostic" in failing
    assert {p.get("name"): p.get("value") for p in suite.find("properties")}["defects"] == "stale_input"


# --- garbage where identity is read: a coded FAIL, never a traceback ---------------------------------

GARBAGE = [None, True, "../../etc", [None], {"x": [1]}]


@pytest.mark.parametrize("value", GARBAGE, ids=repr)
def test_garbage_in_any_identity_field_is_a_coded_fail_never_a_traceback(run, baseline, value):
    fields = {
        run / "run.json": ["run_id", "runner_kind", "defects", "profiles", "hosts", "artifacts"],
        _case(run) / "case.json": ["case_id", "hosts", "supervisor_run_id", "registrations"],
        _ledger(run, "requester"): ["run_id", "pid", "epoch", "peer_epoch", "registration_id", "runner"],
    }
    for path, keys in fields.items():
        original = path.read_text()
        for key in keys:
            if json.loads(original).get(key) == value:
                continue  # not garbage there (a plan without defect switches)
            edit_json(path, lambda data, key=key: data.update({key: value}))
            verdict = verify_run(str(run), write=False)  # must not raise
            assert verdict["verdict"] == "FAIL" and verdict["failed_codes"], (path.name, key)
            unreadable = [f["code"] for c in verdict["cases"] for f in c["findings"]
                          if f["code"].startswith("identity.") and "could not read" in f["message"]]
            assert unreadable == [], (path.name, key)
            path.write_text(original)
    for role in ROLES:  # and in what the journal says each runner got
        _events(run, role, "child_start", lambda start: start.update(pinned=value, argv=value))
    verdict = verify_run(str(run), write=False)
    assert {"identity.processes"} <= set(verdict["failed_codes"])
