"""installed-lost-completion on the simulated runner pair, end to end through the verifier
(docs/lost_completion.md).

The pair runs as in tests/unit/sim/test_sim_restart.py with the real cq_fault observer preloaded into every
requester process, armed by the profile model (pass a generation's rounds, withhold the next round's
completions, again in every generation). A healthy run PASSes with every lost_completion rule applied;
each defect switch of the simulated runner fails exactly its rule; a consistent defect (the runner's whole
story of the lost round rewritten as completed) and a missing preload fail by the observer's word.
Red check of the runner side: removing a switch's branch in sim/orbite_sim/ makes its case pass.
"""

import json
import shutil
import sys
from pathlib import Path

import pytest
from helpers import observer_log
from helpers.sim_restart_pair import findings_by_code, healthy_runs, mode_profile, run_restart_pair

from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import RULES
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "sim"))
import sim_harness as H

LEDGER = H.validator("runner-ledger")
CODES = sorted(r.code for r in RULES if r.group == "lost_completion")
# The smallest shape the profile model allows (seed 000): 8 parents of 1 MiB, one lane, both rails.
SHAPE = {"parents": 8, "payload": 1 << 20, "block": 1 << 20, "num_lanes": 1, "mask": 3}


def lost_profile(fault_role, generations, operation="read", events=False, **over):
    return mode_profile("installed-lost-completion", SHAPE, fault_role, generations, operation, events, **over)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return healthy_runs(tmp_path_factory, "lc", lost_profile)


@pytest.mark.parametrize("fault", ["source", "requester"])
def test_a_healthy_lost_completion_passes_with_every_rule_applied(healthy, fault):
    verdict = verify_run(str(healthy[fault]), write=False)
    assert verdict["verdict"] == "PASS", verdict["failed_codes"]
    findings = findings_by_code(verdict)
    assert "case.mode_unverified" not in findings
    assert CODES == ["lost_completion.destroy_before_drain", "lost_completion.kill_point",
                     "lost_completion.requester_failed", "lost_completion.source_released",
                     "lost_completion.withheld"]
    survivor_rule = "lost_completion.requester_failed" if fault == "source" else "lost_completion.source_released"
    applied = [c for c in CODES if c not in ("lost_completion.requester_failed", "lost_completion.source_released")]
    for code in [*applied, survivor_rule, "steps.times", "restart.kill_point", "restart.survivor",
                 "restart.replacement", "restart.stale_refused", "journal.children", "journal.env",
                 "identity.processes", "ledger.errors"]:
        assert findings[code]["status"] == "PASS", (code, findings[code])


def test_every_ledger_of_both_faults_is_valid_against_its_schema(healthy):
    """The survivor's too (either role): its recovery destroys the QPs towards the dead peer."""
    for run_dir in healthy.values():
        paths = sorted((run_dir / "cases" / "c1").glob("*/g*/ledger.json"))
        assert len(paths) >= 4
        for path in paths:
            LEDGER.validate(json.loads(path.read_text()))


def _log(path):
    return observer_log.decode(path.read_bytes())


def test_the_receipts_show_the_lost_round_the_seed_describes(healthy):
    """Source killed twice: the one requester process's cq_fault log withheld exactly the two lost rounds'
    WRs and delivered every other completion; at each kill point the engine owned the debt while the provider
    had moved the bytes; the surviving requester destroyed both QPs, then drained and failed its batches."""
    case_dir = healthy["source"] / "cases" / "c1"
    ledgers = {(role, g): json.loads((case_dir / role / f"g{g}" / "ledger.json").read_text())
               for role in ("source", "requester") for g in (1, 2, 3)}
    for ledger in ledgers.values():
        LEDGER.validate(ledger)
    events = _log(case_dir / "requester" / "g1" / "observer-cq_fault.jsonl")
    assert events[0]["tool"] == "cq_fault" and events[-1]["ev"] == "summary"
    withheld = [(e["qpn"], e["wr_id"]) for e in events if e.get("ev") == "withheld"]
    lost = [(w["qpn"], w["wr_id"]) for g in (1, 2) for w in ledgers[("requester", g)]["restart"]["lost"]["wrs"]]
    assert sorted(withheld) == sorted(lost) and len(lost) == 16
    assert len([e for e in events if e.get("ev") == "cqe"]) == 3 * 3 * 8  # every healthy round's completion
    for g in (1, 2):
        state = ledgers[("requester", g)]["restart"]["lost"]
        assert [(b["state"], b["wait"]["result"], b["free"]) for b in state["batches"]] == [
            ("Running", "Timeout", "BatchBusy")] * 2
        assert sum(state["sq_debt"].values()) == 8 and set(state["provider_outstanding"].values()) == {0}
        assert state["grants_held"] == list(range(8)) and len(state["loans"]) == 8 and state["reported_bytes"] == 0
        assert state["after"]["provider_bytes"] - state["before"]["provider_bytes"] == 8 << 20
        assert state["after"]["native_bytes"] == state["before"]["native_bytes"]
        recovery = ledgers[("requester", g + 1)]["restart"]["recovery"]
        assert [s["action"] for s in recovery["steps"]] == ["destroy_qp", "destroy_qp", "drain"]
        assert recovery["steps"][-1]["provider_qps"] == 0
        assert [(b["state"], b["bytes"], b["remote_effect"], b["free"]) for b in recovery["batches"]] == [
            ("Failed", 0, "Unknown", "Ok")] * 2  # WRITE: what the dead source saw is unknown
    assert ledgers[("requester", 3)]["restart"]["lost"] is None


def test_a_killed_requester_log_ends_at_the_kill_and_the_source_releases_its_grants(healthy):
    case_dir = healthy["requester"] / "cases" / "c1"
    killed = _log(case_dir / "requester" / "g1" / "observer-cq_fault.jsonl")
    assert killed[-1]["ev"] == "withheld"  # SIGKILLed: no summary line, every record up to the kill
    assert len([e for e in killed if e.get("ev") == "withheld"]) == 8
    last = _log(case_dir / "requester" / "g2" / "observer-cq_fault.jsonl")
    assert last[-1]["ev"] == "summary" and not [e for e in last if e.get("ev") == "withheld"]
    recovery = json.loads((case_dir / "source" / "g2" / "ledger.json").read_text())["restart"]["recovery"]
    assert recovery["steps"][-1]["grants_released"] == 8
    errors = json.loads((case_dir / "requester" / "g1" / "ledger.json").read_text())["errors"]
    # READ: a lost READ changed nothing at the source, its waits time out with RemoteEffect None.
    assert [(e["error"], e["remote_effect"]) for e in errors if e["round"] == 4] == [
        ("Timeout", "None"), ("BatchBusy", "None")] * 2


_DEFECT_CASES = [
    pytest.param("fabricate_cqe", "requester", "lost_completion.withheld", id="fabricate_cqe"),
    pytest.param("lost_debt_cleared", "requester", "lost_completion.kill_point", id="lost_debt_cleared"),
    pytest.param("lost_reports_bytes", "source", "lost_completion.requester_failed", id="lost_reports_bytes"),
    pytest.param("drain_before_destroy", "source", "lost_completion.destroy_before_drain", id="drain_before_destroy"),
    pytest.param("source_keeps_grants", "requester", "lost_completion.source_released", id="source_keeps_grants"),
    # numbered as if the destroys came first: only the steps' own times say otherwise (both survivors)
    pytest.param("drain_first_renumbered", "source", "steps.times", id="drain_first_renumbered_requester_survivor"),
    pytest.param("drain_first_renumbered", "requester", "steps.times", id="drain_first_renumbered_source_survivor"),
]


@pytest.mark.parametrize(("defect", "fault", "code"), _DEFECT_CASES)
def test_each_lost_completion_defect_fails_exactly_its_rule(tmp_path, defect, fault, code):
    run_dir = tmp_path / f"lc-{defect}"
    run_restart_pair(run_dir, "c1", lost_profile(fault, 2, "write"), defects=[defect])
    verdict = verify_run(str(run_dir), write=False)
    assert sorted(verdict["failed_codes"]) == sorted(["run.diagnostic", code]), verdict["failed_codes"]


def test_the_defect_table_covers_every_lost_completion_switch():
    sys.path.insert(0, str(H.REPO / "sim"))
    from orbite_sim.case import LOST_DEFECTS

    assert {params.values[0] for params in _DEFECT_CASES} == set(LOST_DEFECTS)
    doc = (H.REPO / "docs" / "runner-contract.md").read_text()
    for defect in LOST_DEFECTS:
        assert f"| `{defect}` |" in doc, f"{defect} is not documented in docs/runner-contract.md section 7"


def test_without_the_cq_fault_preload_the_case_fails_by_name(tmp_path):
    run_dir = tmp_path / "lc-no-preload"
    run_restart_pair(run_dir, "c1", lost_profile("requester", 2), preload=False)
    verdict = verify_run(str(run_dir), write=False)
    findings = findings_by_code(verdict)
    assert verdict["verdict"] == "FAIL"
    assert "the mode loads ['cq_fault'] into the requester" in findings["journal.env"]["message"]
    assert "observer-cq_fault" in findings["receipt.missing"]["message"]
    # Without the observer nothing was withheld: the engine saw every completion, nothing was lost.
    assert findings["lost_completion.kill_point"]["status"] == "FAIL"


def _edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_a_consistent_completed_story_still_fails_by_the_observer(healthy, tmp_path):
    """Consistent defect: the requester's ledger says the lost round completed in full (every WR SUCCESS, no
    debt, no loans, batches Completed and freed, the bytes reported and counted natively). Only the observer,
    which withheld those completions, contradicts it."""
    run_dir = tmp_path / "lc-consistent"
    shutil.copytree(healthy["requester"], run_dir)
    path = run_dir / "cases" / "c1" / "requester" / "g1" / "ledger.json"

    def completed(doc):
        lost = doc["restart"]["lost"]
        for seq, wr in enumerate(lost["wrs"]):
            wr.update(status="SUCCESS", completed_seq=1000 + seq)
        lost.update(sq_debt={}, loans=[], grants_held=[], reported_bytes=8 << 20)
        lost["after"]["native_bytes"] = lost["before"]["native_bytes"] + (8 << 20)
        for batch in lost["batches"]:
            batch.update(state="Completed", free="Ok", wait=dict(batch["wait"], result="Ok", state_after="Completed"))
        doc["errors"] = [e for e in doc["errors"] if e.get("round") != 4]

    _edit(path, completed)
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["failed_codes"] == ["lost_completion.withheld"], verdict["failed_codes"]


def test_a_survivor_log_without_its_summary_is_truncated(healthy, tmp_path):
    """Only a process the profile kills may end its log without a summary (the loader's ``killed``)."""
    run_dir = tmp_path / "lc-truncated"
    shutil.copytree(healthy["source"], run_dir)
    log = run_dir / "cases" / "c1" / "requester" / "g1" / "observer-cq_fault.jsonl"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:-1]))
    verdict = verify_run(str(run_dir), write=False)
    assert "receipt.truncated" in verdict["failed_codes"], verdict["failed_codes"]


def test_recovery_steps_outside_the_survivors_journaled_life_fail(healthy, tmp_path):
    """The steps in order, numbered and timed consistently, but an hour after the survivor's supervisor
    reaped it: the journal's clock is the second witness of when they were taken."""
    run_dir = tmp_path / "run"
    shutil.copytree(healthy["source"], run_dir)

    def later(doc):
        for step in doc["restart"]["recovery"]["steps"]:
            step["at"] += 3600

    _edit(run_dir / "cases" / "c1" / "requester" / "g2" / "ledger.json", later)
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["failed_codes"] == ["steps.times"]
