"""installed-interruption on the simulated runner pair, end to end through the verifier (docs/interruption.md).

The pair runs as in tests/unit/sim/test_sim_restart.py, the requester reaching the source through the
control relay (plugins/module_utils/_run/relay.py), which holds the READY of the round after each
nonfinal generation's three. A healthy run PASSes with every interruption rule applied; each defect
switch of the simulated runner (and the relay's leak_grant) fails exactly its rule; the rules no switch
reaches are red-checked by editing one fact of a healthy run's receipts.
Red check of the runner side: removing a switch's branch in sim/orbite_sim/ makes its case pass.
"""

import json
import shutil
import sys
from pathlib import Path

import pytest
from helpers.sim_restart_pair import findings_by_code, healthy_runs, mode_profile, run_restart_pair

from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import RULES
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "sim"))
import sim_harness as H

LEDGER = H.validator("runner-ledger")
CODES = sorted(r.code for r in RULES if r.group == "interruption")
SMALL = {"parents": 4, "payload": 65536, "block": 65536, "num_lanes": 1, "mask": 3}


def interruption_profile(fault_role, generations, operation="read", events=False, **over):
    return mode_profile("installed-interruption", SMALL, fault_role, generations, operation, events, **over)


_findings = findings_by_code


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return healthy_runs(tmp_path_factory, "in", interruption_profile)


@pytest.mark.parametrize("fault", ["source", "requester"])
def test_a_healthy_interruption_passes_with_every_rule_applied(healthy, fault):
    verdict = verify_run(str(healthy[fault]), write=False)
    assert verdict["verdict"] == "PASS", verdict["failed_codes"]
    findings = _findings(verdict)
    assert "case.mode_unverified" not in findings
    assert CODES == ["interruption.batch_busy", "interruption.grant_held", "interruption.lanes_reclaimed",
                     "interruption.no_bytes", "interruption.no_new_qps", "interruption.pending",
                     "interruption.relay_path", "interruption.requester_failed", "interruption.source_drain"]
    survivor_rule = "interruption.requester_failed" if fault == "source" else "interruption.source_drain"
    applied = [c for c in CODES if c not in ("interruption.requester_failed", "interruption.source_drain")]
    for code in [*applied, survivor_rule, "restart.kill_point", "restart.survivor", "restart.replacement",
                 "restart.stale_refused", "journal.children", "ledger.errors"]:
        assert findings[code]["status"] == "PASS", (code, findings[code])


def test_the_receipts_show_the_held_authorization_the_seed_describes(healthy):
    """Source killed: per nonfinal generation the relay held one READY (round 4), both peers pending with
    nothing moved; the surviving requester failed its batches with no effect and reclaimed its lanes."""
    case_dir = healthy["source"] / "cases" / "c1"
    ledgers = {(role, g): json.loads((case_dir / role / f"g{g}" / "ledger.json").read_text())
               for role in ("source", "requester") for g in (1, 2, 3)}
    for ledger in ledgers.values():
        LEDGER.validate(ledger)
    relay = [json.loads(line) for line in (case_dir / "source" / "relay.jsonl").read_text().splitlines()]
    held = [e for e in relay if e.get("action") == "held"]
    assert [(e["kind"], e["round"]) for e in held] == [("ROUND_READY", 4), ("ROUND_READY", 4)]
    assert [e["epoch"] for e in held] == [ledgers[("source", 1)]["epoch"], ledgers[("source", 2)]["epoch"]]
    assert not [e for e in relay if e.get("kind") == "PAYLOAD"]
    for g in (1, 2):
        src = ledgers[("source", g)]["restart"]["interruption"]
        req = ledgers[("requester", g)]["restart"]["interruption"]
        assert (src["grants_pending"], src["mw"]["bind"], src["completion_receive"]["pending"]) == (4, "SUCCESS", 1)
        assert [(b["state"], b["wait"]["result"], b["free"]) for b in req["batches"]] == [
            ("Running", "Timeout", "BatchBusy")] * 2
        for snap in (src, req):
            assert snap["before"]["provider_bytes"] == snap["after"]["provider_bytes"]
            assert snap["before"]["qps_created"] == snap["after"]["qps_created"]
        recovery = ledgers[("requester", g + 1)]["restart"]["recovery"]
        assert [(b["state"], b["bytes"], b["remote_effect"], b["free"]) for b in recovery["batches"]] == [
            ("Failed", 0, "None", "Ok")] * 2
        assert recovery["cqs_empty"] and {lane["state"] for lane in recovery["lanes"]} == {"ERR"}
        typed = [(e["error"], e["operation"], e["round"]) for e in ledgers[("requester", g)]["errors"]]
        # Generation 2 first records how generation 1's held batches failed when the source died.
        failed = [("PeerLost", "wait", 4)] * 2 if g > 1 else []
        stale = [("EpochMismatch", op, None) for op in ("open_segment", "submit")] * (g - 1)
        assert sorted(typed, key=str) == sorted(failed + stale + [("Timeout", "wait", 4), ("BatchBusy", "free", 4)] * 2,
                                                key=str)
    assert ledgers[("requester", 3)]["restart"]["interruption"] is None  # the last generation holds nothing


def test_the_surviving_source_drains_its_completion_receive(healthy):
    case_dir = healthy["requester"] / "cases" / "c1"
    held = json.loads((case_dir / "source" / "g1" / "ledger.json").read_text())["restart"]["interruption"]
    recovery = json.loads((case_dir / "source" / "g2" / "ledger.json").read_text())["restart"]["recovery"]
    receive = held["completion_receive"]
    assert {"qpn": receive["qpn"], "wr_id": receive["wr_id"], "kind": "recv",
            "status": "WR_FLUSH_ERR"} in recovery["flushed"]
    assert (recovery["mw_released"], recovery["grants_released"]) == (True, 4)


_DEFECT_CASES = [
    pytest.param("free_busy_ok", "requester", (), "interruption.batch_busy", id="free_busy_ok"),
    pytest.param("bytes_while_held", "requester", (), "interruption.no_bytes", id="bytes_while_held"),
    pytest.param("qp_while_held", "source", (), "interruption.no_new_qps", id="qp_while_held"),
    pytest.param("skip_rq_drain", "requester", (), "interruption.source_drain", id="skip_rq_drain"),
    pytest.param("survivor_reports_bytes", "source", (), "interruption.requester_failed",
                 id="survivor_reports_bytes"),
]


@pytest.mark.parametrize(("defect", "fault", "relay_defects", "code"), _DEFECT_CASES)
def test_each_interruption_defect_fails_exactly_its_rule(tmp_path, defect, fault, relay_defects, code):
    run_dir = tmp_path / f"in-{defect}"
    run_restart_pair(run_dir, "c1", interruption_profile(fault, 2), defects=[defect], relay_defects=relay_defects)
    verdict = verify_run(str(run_dir), write=False)
    assert sorted(verdict["failed_codes"]) == sorted(["run.diagnostic", code]), verdict["failed_codes"]


def test_a_relay_that_leaks_the_grant_fails_grant_held(tmp_path):
    """The relay's switch: READY goes through, the round runs (its payload moves); only grant_held names it,
    the rules that presuppose a held grant are masked by it."""
    run_dir = tmp_path / "in-leak"
    run_restart_pair(run_dir, "c1", interruption_profile("requester", 2), relay_defects=["leak_grant"])
    verdict = verify_run(str(run_dir), write=False)
    assert sorted(verdict["failed_codes"]) == ["interruption.grant_held", "run.diagnostic"], verdict["failed_codes"]
    findings = _findings(verdict)
    assert "let 1 grant(s) through" in findings["interruption.grant_held"]["message"]
    for code in ("interruption.no_bytes", "interruption.batch_busy", "interruption.pending"):
        assert findings[code]["status"] != "PASS", (code, findings[code])


def test_the_interruption_defect_table_covers_every_switch():
    sys.path.insert(0, str(H.REPO / "sim"))
    from orbite_sim.case import INTERRUPTION_DEFECTS

    assert {params.values[0] for params in _DEFECT_CASES} == set(INTERRUPTION_DEFECTS)
    doc = (H.REPO / "docs" / "runner-contract.md").read_text()
    for defect in (*INTERRUPTION_DEFECTS, "leak_grant"):
        assert f"| `{defect}` |" in doc, f"{defect} is not documented in docs/runner-contract.md section 7"


def _edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _edit_lines(path, change):
    records = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in change(records)))


def _payload_through_relay(records):
    frame = next(r for r in records if r.get("ev") == "frame")
    return [*records, dict(frame, seq=10_000, kind="PAYLOAD", round=1)]


@pytest.mark.parametrize(("code", "mutate"), [
    # The source says it posted no completion receive (the relay still held a grant).
    ("interruption.pending", lambda case: _edit(case / "source" / "g1" / "ledger.json", lambda d: d["restart"][
        "interruption"]["completion_receive"].update(pending=0))),
    # The restart point came before the held state.
    ("interruption.pending", lambda case: _edit(case / "requester" / "g1" / "ledger.json", lambda d: d["restart"][
        "interruption"]["after"].update(at=4e9))),
    ("interruption.relay_path", lambda case: _edit_lines(case / "source" / "relay.jsonl", _payload_through_relay)),
    # The relay ran a switch the plan does not name.
    ("identity.defects", lambda case: _edit_lines(case / "source" / "relay.jsonl", lambda records: [
        dict(r, defects=["leak_grant"]) if r.get("ev") == "start" else r for r in records])),
    ("interruption.lanes_reclaimed", lambda case: _edit(case / "source" / "g2" / "ledger.json", lambda d: d["restart"][
        "recovery"].update(cqs_empty=False))),
])
def test_rules_no_switch_reaches_fail_on_one_edited_fact(healthy, tmp_path, code, mutate):
    run_dir = tmp_path / "in-edited"
    shutil.copytree(healthy["requester"], run_dir)
    mutate(run_dir / "cases" / "c1")
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["failed_codes"] == [code], verdict["failed_codes"]


def test_a_missing_relay_journal_is_a_receipt_failure(healthy, tmp_path):
    run_dir = tmp_path / "in-no-relay"
    shutil.copytree(healthy["requester"], run_dir)
    (run_dir / "cases" / "c1" / "source" / "relay.jsonl").unlink()
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["verdict"] == "FAIL"
    findings = _findings(verdict)
    assert findings["interruption.grant_held"]["status"] == "SKIP", findings["interruption.grant_held"]
    assert any(code.startswith("receipt.") for code in verdict["failed_codes"]), verdict["failed_codes"]
