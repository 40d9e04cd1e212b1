"""installed-cleanup-failure (cleanup_kind qp) on the simulated runner pair, end to end through the verifier
(docs/cleanup_failure.md).

The pair runs the restart roles (helpers/sim_restart_pair.py) with the requester as fault role: generation 1's
requester runs under the REAL uverbs_fault observer (the profile model's env arms it for qp), which withholds the
cleanup round's completion and fails the real ibv_destroy_qp with EIO through its seccomp filter on the context's
uverbs descriptor, where the loopback provider sends its destroy commands. A healthy run PASSes with every cleanup
rule applied; each defect switch of the simulated runner fails exactly its rule (beside run.diagnostic); the rule
no switch reaches (the survivor's grant) and the observer's own witness are red-checked by editing one fact.
Red check of the runner side: removing a switch's branch in sim/orbite_sim/requester.py makes its case pass.
"""

import shutil
import sys
from pathlib import Path

import pytest
from helpers.cleanup_receipts import case_dir as _case
from helpers.cleanup_receipts import ledger as _ledger
from helpers.cleanup_receipts import observer_events as _events
from helpers.cleanup_receipts import one_qp_fewer_held as _one_qp_fewer_held
from helpers.receipts import edit_json as _edit
from helpers.receipts import edit_lines as _edit_log
from helpers.sim_restart_pair import findings_by_code, mode_profile, run_restart_pair

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import RULES
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "sim"))
import sim_harness as H

LEDGER = H.validator("runner-ledger")
CODES = sorted(r.code for r in RULES if r.group == "cleanup")
# The smallest profile the seed allows: one parent of one slice, one lane, one rail.
SMALL = {"parents": 1, "payload": 65536, "block": 1048576, "num_lanes": 1, "mask": 1}
EIO = 5


def cleanup_profile(events=False, **over):
    return mode_profile("installed-cleanup-failure", SMALL, "requester", 2, "read", events,
                        **dict({"cleanup_kind": "qp"}, **over))


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("cf") / "cf-healthy"
    run_restart_pair(run_dir, "c1", cleanup_profile())
    return run_dir








def test_a_healthy_cleanup_failure_passes_with_every_rule_applied(healthy):
    verdict = verify_run(str(healthy), write=False)
    assert verdict["verdict"] == "PASS", verdict["failed_codes"]
    findings = findings_by_code(verdict)
    assert "case.mode_unverified" not in findings
    qp_codes = ["cleanup.charges", "cleanup.cpu_excluded", "cleanup.fault", "cleanup.free_busy",
                "cleanup.grant_unresolved", "cleanup.repeated_close", "cleanup.retained", "cleanup.unquiesced"]
    # the dependency kinds' rules (test_sim_cleanup_kinds.py) do not apply to qp
    assert sorted(c for c in CODES if findings.get(c, {}).get("status", "N/A") != "N/A") == qp_codes
    for code in [*qp_codes, "restart.kill_point", "restart.survivor", "restart.replacement", "restart.stale_refused",
                 "restart.restart_point", "restart.teardown", "journal.children", "journal.env", "ledger.errors",
                 "identity.processes", "identity.artifacts"]:
        assert findings[code]["status"] == "PASS", (code, findings[code])


def test_the_receipts_show_the_native_cleanup_failure_the_seed_describes(healthy):
    """The observer withheld exactly the cleanup round's completion and failed exactly one destroy (qp, EIO);
    the batch failed Unquiesced and not drained, free busy, the CPU write refused, the charges held before and
    after the handles were dropped; a weak owner and a real query still see the allocation and the QP.
    The replacement (no observer) ran three healthy rounds; the survivor refused the stale epoch."""
    for role, generation in (("source", 1), ("source", 2), ("requester", 1), ("requester", 2)):
        LEDGER.validate(_ledger(healthy, role, generation))
    events = _events(healthy)
    fault = _ledger(healthy, "requester", 1)["restart"]["cleanup"]
    withheld = [e for e in events if e["ev"] == "withheld"]
    assert [(e["qpn"], e["wr_id"]) for e in withheld] == [(fault["qpn"], fault["batch"]["wr_id"])]
    destroys = [e for e in events if e["ev"] == "destroy"]
    assert [(e["kind"], e["errno"], e["injected"], e["retry"]) for e in destroys] == [("qp", EIO, True, False)]
    # three healthy rounds' completions passed before the withheld one (WITHHOLD_SKIP from the profile model)
    assert sum(1 for e in events if e["ev"] == "cqe") == 3
    assert fault["wait"]["result"] == "Timeout" and fault["batch"]["state"] == "Failed"
    assert (fault["close"]["result"], fault["close"]["locally_drained"], fault["close"]["destroy"]) == (
        "Unquiesced", False, {"call": "ibv_destroy_qp", "errno": "EIO"})
    assert (fault["free"], fault["cpu_write"]) == ("BatchBusy", {"result": "Unquiesced", "bytes_written": 0})
    held = {"sq_slots": 1, "bytes": SMALL["payload"], "batches": 1}
    for charges in (fault["charges"], fault["retained"]["charges"]):
        assert {k: charges[k] for k in held} == held
    assert (fault["repeated_close"]["result"], fault["repeated_close"]["destroy_called"],
            fault["repeated_close"]["locally_drained"]) == ("Unquiesced", False, False)
    retained = fault["retained"]
    assert retained["weak_owner_alive"] is True
    assert retained["qp_query"] == {"qpn": fault["qpn"], "state": "ERR"}
    assert retained["provider_held"]["qp"] == 1
    replacement = _ledger(healthy, "requester", 2)
    assert replacement["restart"]["cleanup"] is None and len(replacement["rounds"]) == 3
    assert not (_case(healthy) / "requester" / "g2" / "observer-uverbs_fault.jsonl").exists()
    survivor = _ledger(healthy, "source", 2)
    assert [p["result"] for p in survivor["restart"]["stale_probes"]] == ["EpochMismatch", "EpochMismatch"]
    assert survivor["restart"]["recovery"]["grants_released"] == 1


def test_the_profile_model_scopes_and_arms_the_observer():
    _, workload = model.load_and_derive(dict(cleanup_profile()))
    assert workload["observers"] == [{"tool": "uverbs_fault", "role": "requester", "generation": 1, "env": {
        "ORBITE_UVERBS_FAULT_KIND": "qp", "ORBITE_UVERBS_FAULT_WITHHOLD_SKIP": "3"}}]


_DEFECT_CASES = [
    pytest.param("retry_destroy", "cleanup.repeated_close", id="retry_destroy"),
    pytest.param("drain_after_eio", "cleanup.repeated_close", id="drain_after_eio"),
    pytest.param("free_unquiesced_ok", "cleanup.free_busy", id="free_unquiesced_ok"),
    pytest.param("cpu_write_ok", "cleanup.cpu_excluded", id="cpu_write_ok"),
    pytest.param("release_quarantined", "cleanup.retained", id="release_quarantined"),
    pytest.param("drop_charges", "cleanup.charges", id="drop_charges"),
]


@pytest.mark.parametrize(("defect", "code"), _DEFECT_CASES)
def test_each_cleanup_defect_fails_exactly_its_rule(tmp_path, defect, code):
    run_dir = tmp_path / f"cf-{defect}"
    run_restart_pair(run_dir, "c1", cleanup_profile(), defects=[defect])
    verdict = verify_run(str(run_dir), write=False)
    assert sorted(verdict["failed_codes"]) == sorted(["run.diagnostic", code]), verdict["failed_codes"]
    if defect == "retry_destroy":  # the observer's own witness of the retry, not only the runner's word
        retries = [e for e in _events(run_dir) if e["ev"] == "destroy" and e["retry"]]
        assert [(e["kind"], e["errno"]) for e in retries] == [("qp", EIO)]


def test_the_cleanup_defect_table_covers_every_switch():
    """The qp kind's switches; with the dependency kinds' (keep_released, premature_device_close) every cleanup
    switch is run (test_sim_cleanup_kinds.py::test_every_cleanup_code_and_switch_has_a_red_check)."""
    sys.path.insert(0, str(H.REPO / "sim"))
    from orbite_sim.case import CLEANUP_DEFECTS

    assert {params.values[0] for params in _DEFECT_CASES} == set(CLEANUP_DEFECTS) - {"keep_released",
                                                                                   "premature_device_close"}






def _not_injected(events):
    for event in events:
        if event.get("ev") == "destroy":
            event.update(errno=0, injected=False)
    return events


def _refused_to_arm(events):
    """The log of an observer that refused to arm: its reason, no withheld completion, no destroy."""
    kept = [e for e in events if e.get("ev") not in ("withheld", "destroy")]
    return [kept[0], {"ev": "not_armed", "reason": "RDMAV_ALLOW_DISASSOC_DESTROY is set"}, *kept[1:]]



@pytest.mark.parametrize(("code", "mutate"), [
    # The survivor released the grant before the requester died (nothing pending at its restart point).
    ("cleanup.grant_unresolved", lambda case: _edit(case / "source" / "g1" / "ledger.json",
                                                    lambda d: d["restart"]["cleanup"].update(grants_pending=0))),
    # The observer never failed the destroy (a filter that did not see the descriptor): its log is the witness.
    ("cleanup.fault", lambda case: _edit_log(case / "requester" / "g1" / "observer-uverbs_fault.jsonl",
                                             _not_injected)),
    # A consistent defect: the provider's QP count lowered alike before and after (the QP gone, the record
    # self-consistent); the profile model's count is the expectation.
    ("cleanup.retained", lambda case: _edit(case / "requester" / "g1" / "ledger.json", _one_qp_fewer_held)),
    # The requester's word against the source's: its quarantined batch holds no grant while the source counts
    # one pending (the peer's record, not the source's own, is the second witness).
    ("cleanup.grant_unresolved", lambda case: _edit(case / "requester" / "g1" / "ledger.json",
                                                    lambda d: d["restart"]["cleanup"]["batch"].update(grants=[]))),
    # The batch claimed a local drain after the EIO.
    ("cleanup.unquiesced", lambda case: _edit(case / "requester" / "g1" / "ledger.json",
                                              lambda d: d["restart"]["cleanup"]["close"].update(locally_drained=True))),
])
def test_rules_no_switch_reaches_fail_on_one_edited_fact(healthy, tmp_path, code, mutate):
    run_dir = tmp_path / "cf-edited"
    shutil.copytree(healthy, run_dir)
    mutate(_case(run_dir))
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["failed_codes"] == [code], verdict["failed_codes"]


def test_an_observer_that_refused_to_arm_is_named(healthy, tmp_path):
    run_dir = tmp_path / "cf-refused"
    shutil.copytree(healthy, run_dir)
    _edit_log(_case(run_dir) / "requester" / "g1" / "observer-uverbs_fault.jsonl", _refused_to_arm)
    verdict = verify_run(str(run_dir), write=False)
    # the runner's record still claims the EIO (a consistent defect would need the observer's own word)
    assert "cleanup.fault" in verdict["failed_codes"], verdict["failed_codes"]
    message = findings_by_code(verdict)["cleanup.fault"]["message"]
    assert "refused to arm (RDMAV_ALLOW_DISASSOC_DESTROY is set)" in message
