"""installed-cleanup-failure with cleanup_kind cq, channel and pd on the simulated runner pair, end to end through
the verifier (docs/cleanup_failure.md; seed 000, "CQ, completion-channel and PD dependency failures").

Generation 1's requester runs under the REAL uverbs_fault observer in dependency mode (the profile model's env):
it injects nothing. The runner's fixture keeps a real dependent object in the loopback provider (a RESET QP on the
CQ, an extra CQ on the completion channel, a type-2 MW on the PD), so the destroy returns EBUSY by itself; the
observer logs the destroy verb's result and rejects a retry. A healthy run of each kind PASSes with its rules
applied; each defect switch fails exactly its rule (beside run.diagnostic); the rules no switch reaches are
red-checked by editing one fact (consistently, where the runner's own record could agree with itself).
Red check of the runner side: removing a switch's branch in sim/orbite_sim/cleanup_kinds.py makes its case pass.
"""

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
from helpers.cleanup_receipts import case_dir as _case
from helpers.cleanup_receipts import ledger as _ledger
from helpers.cleanup_receipts import observer_events as _events
from helpers.cleanup_receipts import one_qp_fewer_held as _one_qp_fewer
from helpers.receipts import edit_json as _edit
from helpers.receipts import edit_lines as _edit_log
from helpers.sim_restart_pair import findings_by_code, mode_profile, run_restart_pair

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import RULES
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "sim"))
import sim_harness as H

LEDGER = H.validator("runner-ledger")
SMALL = {"parents": 1, "payload": 65536, "block": 1048576, "num_lanes": 1, "mask": 1}
EBUSY, EIO = 16, 5
KINDS = ("cq", "channel", "pd")
LOG = Path("requester") / "g1" / "observer-uverbs_fault.jsonl"
# The rules each dependency kind must apply (and PASS when healthy).
APPLIED = {
    "cq": ["cleanup.charges", "cleanup.cpu_excluded", "cleanup.dependency", "cleanup.device_open",
           "cleanup.free_busy", "cleanup.grant_unresolved", "cleanup.owners", "cleanup.repeated_close",
           "cleanup.unquiesced"],
    "channel": ["cleanup.cpu_excluded", "cleanup.dependency", "cleanup.device_open", "cleanup.events",
                "cleanup.free_busy", "cleanup.grant_unresolved", "cleanup.owners", "cleanup.repeated_close",
                "cleanup.unquiesced"],
    "pd": ["cleanup.dependency", "cleanup.device_open", "cleanup.owners", "cleanup.repeated_close"],
}


def kind_profile(kind):
    return mode_profile("installed-cleanup-failure", SMALL, "requester", 2, "read", kind == "channel",
                        cleanup_kind=kind)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    runs = {}

    def get(kind):
        if kind not in runs:
            run_dir = tmp_path_factory.mktemp(f"ck-{kind}") / f"ck-{kind}"
            run_restart_pair(run_dir, "c1", kind_profile(kind))
            runs[kind] = run_dir
        return runs[kind]

    return get








@pytest.mark.parametrize("kind", KINDS)
def test_a_healthy_dependency_failure_passes_with_its_rules_applied(healthy, kind):
    verdict = verify_run(str(healthy(kind)), write=False)
    assert verdict["verdict"] == "PASS", verdict["failed_codes"]
    findings = findings_by_code(verdict)
    applied = sorted(code for code, f in findings.items() if code.startswith("cleanup.") and f["status"] == "PASS")
    assert applied == APPLIED[kind]
    for code in ("case.mode_unverified", "cleanup.fault", "cleanup.retained"):
        assert findings.get(code, {"status": "N/A"})["status"] != "PASS", (code, findings.get(code))
    for code in ("restart.kill_point", "restart.survivor", "restart.replacement", "restart.stale_refused",
                 "restart.restart_point", "restart.teardown", "journal.env", "identity.artifacts"):
        assert findings[code]["status"] == "PASS", (code, findings[code])


@pytest.mark.parametrize("kind", KINDS)
def test_the_receipts_show_the_seed_table(healthy, kind):
    """The observer injected nothing and logged the real EBUSY of the kind's destroy (cq, pd: after the uverbs
    command went through the descriptor); the provider's live objects after the handles dropped are the table's:
    cq keeps CQ, PD and the allocation (its QP released, the RESET QP kept); channel keeps channel and context (QPs
    and the engine CQ released); pd keeps PD and device only (QPs, MRs, CQ and the allocation released)."""
    run_dir = healthy(kind)
    for role, generation in (("source", 1), ("source", 2), ("requester", 1), ("requester", 2)):
        LEDGER.validate(_ledger(run_dir, role, generation))
    events = _events(run_dir)
    destroys = [e for e in events if e["ev"] == "destroy"]
    target = [e for e in destroys if e["kind"] == kind]
    assert [(e["errno"], e["injected"], e["retry"], e["dependency"]) for e in target] == [(EBUSY, False, False, True)]
    assert target[0]["command"] is (kind != "channel")
    assert not any(e["injected"] for e in destroys)
    assert not [e for e in events if e["ev"] == "context_close"]
    record = _ledger(run_dir, "requester", 1)["restart"]["cleanup"]
    withheld = [(e["qpn"], e["wr_id"]) for e in events if e["ev"] == "withheld"]
    before, after = record["before"]["provider_held"], record["retained"]["provider_held"]
    if kind == "pd":
        assert withheld == [] and record["round"] is None
        assert record["retained"]["weak_owner_alive"] is False
        assert (after["pd"], after["ctx"], after["mw"], after["mr"], after["qp"], after["cq"]) == (2, 2, 1, 2, 0, 1)
        assert _ledger(run_dir, "source", 1)["restart"]["cleanup"]["grants_pending"] == 0
    else:
        assert withheld == [(record["qpn"], record["batch"]["wr_id"])]
        assert (record["wait"]["result"], record["close"]["result"], record["close"]["locally_drained"]) == (
            "Timeout", "Unquiesced", False)
        assert record["retained"]["weak_owner_alive"] is True
        assert _ledger(run_dir, "source", 1)["restart"]["cleanup"]["grants_pending"] == 1
    if kind == "cq":
        assert (before["qp"], after["qp"], after["cq"], after["pd"]) == (2, 1, 2, 2)
        # the dependent QP, queried for real before and after the handles dropped, is in RESET
        assert record["blocker"]["query"]["state"] == record["retained"]["blocker_query"]["state"] == "RESET"
    if kind == "channel":
        assert record["wait"]["progress"]["cq_arms"] >= 1
        assert (before["cq"], after["cq"], after["qp"], after["channel"]) == (3, 2, 0, 2)
    assert record["close"]["destroy"]["errno"] == "EBUSY"
    assert record["repeated_close"]["destroy_called"] is False


@pytest.mark.parametrize("kind", KINDS)
def test_the_profile_model_arms_the_observer_for_a_dependency(kind):
    _, workload = model.load_and_derive(dict(kind_profile(kind)))
    env = {"ORBITE_UVERBS_FAULT_KIND": kind, "ORBITE_UVERBS_FAULT_DEPENDENCY": "1"}
    if kind != "pd":
        env["ORBITE_UVERBS_FAULT_WITHHOLD_SKIP"] = "3"
    assert workload["observers"] == [{"tool": "uverbs_fault", "role": "requester", "generation": 1, "env": env}]


KIND_DEFECT_CASES = [
    pytest.param("cq", "retry_destroy", "cleanup.repeated_close", id="cq-retry_destroy"),
    pytest.param("pd", "retry_destroy", "cleanup.repeated_close", id="pd-retry_destroy"),
    pytest.param("cq", "drain_after_eio", "cleanup.repeated_close", id="cq-drain_after_ebusy"),
    pytest.param("cq", "release_quarantined", "cleanup.owners", id="cq-release_quarantined"),
    pytest.param("pd", "keep_released", "cleanup.owners", id="pd-keep_released"),
    pytest.param("channel", "keep_released", "cleanup.owners", id="channel-keep_released"),
    pytest.param("pd", "premature_device_close", "cleanup.device_open", id="pd-premature_device_close"),
]


@pytest.mark.parametrize(("kind", "defect", "code"), KIND_DEFECT_CASES)
def test_each_dependency_defect_fails_exactly_its_rule(tmp_path, kind, defect, code):
    run_dir = tmp_path / f"ck-{kind}-{defect}"
    run_restart_pair(run_dir, "c1", kind_profile(kind), defects=[defect])
    verdict = verify_run(str(run_dir), write=False)
    assert sorted(verdict["failed_codes"]) == sorted(["run.diagnostic", code]), verdict["failed_codes"]
    events = _events(run_dir)
    if defect == "retry_destroy":  # the observer's own witness: the retry rejected, never forwarded
        retries = [e for e in events if e["ev"] == "destroy" and e["retry"]]
        assert [(e["kind"], e["errno"]) for e in retries] == [(kind, EIO)]
    if defect == "premature_device_close":
        assert [e["ev"] for e in events if e["ev"] == "context_close"] == ["context_close"]






def _destroyed_after_all(kind):
    """A consistent defect: the observer's log and the runner's record both say the destroy succeeded."""
    def change(events):
        for event in events:
            if event.get("ev") == "destroy" and event.get("kind") == kind:
                event["errno"] = 0
        return events
    return change



def _no_arming(ledger):
    ledger["restart"]["cleanup"]["wait"]["progress"].update(cq_arms=0)


def _mutate_dependency(case):
    _edit_log(case / LOG, _destroyed_after_all("cq"))
    _edit(case / "requester" / "g1" / "ledger.json",
          lambda d: d["restart"]["cleanup"]["close"]["destroy"].update(errno=None))


EDITED = [
    # The destroy never failed (observer and record agree): the EBUSY the seed asks for is missing.
    pytest.param("cq", "cleanup.dependency", _mutate_dependency, id="dependency"),
    # The provider's QP count lowered alike before and after (the RESET QP gone, the record self-consistent):
    # the profile model's table is the expectation.
    pytest.param("cq", "cleanup.owners", lambda case: _edit(case / "requester" / "g1" / "ledger.json",
                                                            _one_qp_fewer), id="owners-consistent"),
    # The channel case's wait never armed its CQ (polled instead of event progress).
    pytest.param("channel", "cleanup.events", lambda case: _edit(case / "requester" / "g1" / "ledger.json",
                                                                 _no_arming), id="events"),
]


@pytest.mark.parametrize(("kind", "code", "mutate"), EDITED)
def test_rules_no_switch_reaches_fail_on_one_edited_fact(healthy, tmp_path, kind, code, mutate):
    run_dir = tmp_path / "ck-edited"
    shutil.copytree(healthy(kind), run_dir)
    mutate(_case(run_dir))
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["failed_codes"] == [code], verdict["failed_codes"]


def _qp_file():
    path = Path(__file__).with_name("test_sim_cleanup_failure.py")
    spec = importlib.util.spec_from_file_location("_cleanup_qp_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_cleanup_code_and_switch_has_a_red_check():
    """Every cleanup.* code fails in a red check of this file or of the qp file, and every cleanup switch is run
    (the verifier's meta-test leaves cleanup.* to these two files); the switches are documented."""
    qp = _qp_file()
    codes = {r.code for r in RULES if r.group == "cleanup"}
    reached = {p.values[1] for p in qp._DEFECT_CASES} | {"cleanup.grant_unresolved", "cleanup.fault",
                                                         "cleanup.retained", "cleanup.unquiesced"}
    reached |= {p.values[2] for p in KIND_DEFECT_CASES} | {p.values[1] for p in EDITED}
    assert codes - reached == set()
    sys.path.insert(0, str(H.REPO / "sim"))
    from orbite_sim.case import CLEANUP_DEFECTS

    switches = {p.values[0] for p in qp._DEFECT_CASES} | {p.values[1] for p in KIND_DEFECT_CASES}
    assert switches == set(CLEANUP_DEFECTS)
    doc = (H.REPO / "docs" / "runner-contract.md").read_text()
    for defect in CLEANUP_DEFECTS:
        assert f"| `{defect}` |" in doc, f"{defect} is not documented in docs/runner-contract.md section 7"


def test_a_channel_case_without_event_progress_is_refused_by_name():
    sys.path.insert(0, str(H.REPO / "sim"))
    from orbite_sim.case import validate_case
    from orbite_sim.errors import CaseError

    profile = kind_profile("channel")
    profile["rdma_events"] = False
    root_a, _root_b = H.make_hosts()
    case = H.base_case(profile, "requester", root_a, peer_address="127.0.0.1:9", peer_registration_id="reg-source")
    with pytest.raises(CaseError, match=r"profile\.rdma_events = false: must be true when cleanup_kind is channel"):
        validate_case(case)
