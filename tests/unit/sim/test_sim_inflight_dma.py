"""installed-inflight-dma on the simulated runner pair, end to end through the verifier (docs/inflight_dma.md).

The pair (helpers/sim_pair.py) runs one generation: the requester under the REAL inflight_fault observer, armed by
the profile model's env, which lets the fault round's one WR start, waits until the loopback provider moved the
stall bytes and moves the QP to ERR with the real ibv_modify_qp. A healthy run PASSes with every inflight_dma rule
applied (READ/polling and WRITE/events: the destination is the requester's, then the source's); each defect switch
fails exactly its rule (beside run.diagnostic); the rule no switch reaches (the QP moved by a port change) and a
consistent defect (every receipt of the runner rewritten as a completed copy) are red-checked by editing facts.
Red check of the runner side: removing a switch's branch in sim/orbite_sim/inflight.py makes its case pass.
"""

import hashlib
import shutil
import sys
from pathlib import Path

import pytest
from helpers import observer_log, sim_pair
from helpers.cleanup_receipts import case_dir as _case
from helpers.cleanup_receipts import ledger as _pair_ledger
from helpers.receipts import edit_json as _edit
from helpers.sim_restart_pair import findings_by_code

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import RULES
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "sim"))
import sim_harness as H

LEDGER = H.validator("runner-ledger")
CODES = sorted(r.code for r in RULES if r.group == "inflight_dma")
MIB = 1 << 20
# The mode's shape at 1 MiB (the frozen 4 and 16 MiB cases run in the gate): one parent, one lane, one rail, one WR.
SMALL = {"parents": 1, "payload": MIB, "block": MIB, "num_lanes": 1, "mask": 1, "generations": 1}
POISON = 0xA5


def inflight_profile(operation="read", events=False, **over):
    return dict(sim_pair.BASE, mode="installed-inflight-dma", operation=operation, rdma_events=events,
                **dict(SMALL, **over))


def _run(run_dir, profile, defects=(), preload=True):
    sim_pair.run_pair(run_dir, "c1", profile, defects=defects, preload=preload)
    return run_dir


@pytest.fixture(scope="module")
def healthy_read(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("inf") / "inf-read", inflight_profile())


@pytest.fixture(scope="module")
def healthy_write(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("inf") / "inf-write", inflight_profile("write", True, mask=2))


def _ledger_path(run_dir, role):
    return _case(run_dir) / role / "g1" / "ledger.json"


def _ledger(run_dir, role):
    return _pair_ledger(run_dir, role, 1)


def _log_path(run_dir):
    return observer_log.find(_case(run_dir) / "requester" / "g1", "inflight_fault")


def _events(run_dir):
    return observer_log.decode(_log_path(run_dir).read_bytes())[1:]  # the header left out


@pytest.mark.parametrize("which", ["healthy_read", "healthy_write"])
def test_a_healthy_inflight_dma_case_passes_with_every_rule_applied(request, which):
    run_dir = request.getfixturevalue(which)
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["verdict"] == "PASS", verdict["failed_codes"]
    findings = findings_by_code(verdict)
    assert "case.mode_unverified" not in findings
    assert CODES == ["inflight_dma.batch_failed", "inflight_dma.destination", "inflight_dma.destroy_before_drain",
                     "inflight_dma.error_cqe", "inflight_dma.fault", "inflight_dma.qp_error", "inflight_dma.survival"]
    for code in [*CODES, "steps.times", "journal.env", "identity.artifacts", "ledger.errors", "ledger.rounds",
                 "qps.reuse"]:
        assert findings[code]["status"] == "PASS", (code, findings[code])


@pytest.mark.parametrize("which", ["healthy_read", "healthy_write"])
def test_the_receipts_show_the_interrupted_copy_the_seed_describes(request, which):
    """One WR stopped part way: the observer's stall point is the profile model's, the QP went RTS -> ERR by
    modify_qp with the port ACTIVE throughout, one flush completion joined by CQ/QPN/WR ID, the QP destroyed after
    it; the destination holds exactly the copied prefix then the sentinel; both engines ran rounds 5..7."""
    run_dir = request.getfixturevalue(which)
    read = which == "healthy_read"
    requester, source = _ledger(run_dir, "requester"), _ledger(run_dir, "source")
    for ledger in (requester, source):
        LEDGER.validate(ledger)
        assert [r["round"] for r in ledger["rounds"]] == [1, 2, 3]
        assert [r["round"] for r in ledger["inflight"]["survival"]] == [5, 6, 7]
    stall = model.inflight_stall_bytes(MIB)
    assert 0 < stall < MIB and stall % 4096
    events = _events(run_dir)
    (fault,) = [e for e in events if e["ev"] == "inflight_fault"]
    wr = requester["inflight"]["wr"]
    assert (fault["qpn"], fault["wr_id"], fault["stall_bytes"], fault["modify_qp"]) == (wr["qpn"], wr["wr_id"],
                                                                                        stall, 0)
    assert (fault["state_before"], fault["state_after"], fault["port_state_before"], fault["port_state_after"]) == (
        3, 6, 4, 4)
    (cqe,) = [e for e in events if e["ev"] == "inflight_cqe"]
    assert (cqe["qpn"], cqe["wr_id"], cqe["status"]) == (wr["qpn"], wr["wr_id"], 5) and wr["status"] == "WR_FLUSH_ERR"
    (destroy,) = [e for e in events if e["ev"] == "inflight_destroy"]
    assert (destroy["qpn"], destroy["ret"], destroy["after_cqe"]) == (wr["qpn"], 0, 1)
    # the destination side's region, byte for byte: the copied prefix, then the untouched sentinel
    dest = (requester if read else source)["inflight"]["destination"]
    assert (dest["copied_bytes"], dest["untouched_bytes"], dest["other_changed"]) == (stall, MIB - stall, 0)
    data = (source if read else requester)["inflight"]
    stream = hashlib.shake_128(b"orbite-sim-input" + data["input_seed"].to_bytes(8, "little")).digest(MIB)
    assert dest["sha256"] == hashlib.sha256(stream[:stall] + bytes([POISON]) * (MIB - stall)).hexdigest()
    if read:  # the observer hashed the same bytes at the error completion
        assert cqe["dest_sha256"] == dest["sha256"] and fault["landed_local"] == stall
    batch = requester["inflight"]["batch"]
    assert (batch["state"], batch["bytes"], batch["remote_effect"], batch["locally_drained"]) == (
        "Failed", 0, "None" if read else "Unknown", True)
    assert [s["action"] for s in requester["inflight"]["recovery"]["steps"]] == ["destroy_qp", "drain"]
    survival_qps = {p["qpn"] for r in requester["inflight"]["survival"] for p in r["parents"]}
    assert len(survival_qps) == 1 and wr["qpn"] not in survival_qps


def test_the_profile_model_arms_the_observer_at_the_stall_point():
    _, workload = model.load_and_derive(dict(inflight_profile(payload=4 * MIB, block=4 * MIB)))
    assert workload["observers"] == [{"tool": "inflight_fault", "role": "requester", "env": {
        "ORBITE_INFLIGHT_FAULT_ARMED": "1", "ORBITE_INFLIGHT_FAULT_SKIP": "3",
        "ORBITE_INFLIGHT_FAULT_BYTES": str(2 * MIB + 4099)}}]
    assert model.provoked_errors(dict(inflight_profile())) == (("TransferFailed", "wait"),)


_DEFECT_CASES = [
    pytest.param("inflight_fabricate_success", "inflight_dma.error_cqe", "read", id="fabricate_success"),
    pytest.param("inflight_reports_bytes", "inflight_dma.batch_failed", "write", id="reports_bytes"),
    pytest.param("inflight_drain_first", "inflight_dma.destroy_before_drain", "read", id="drain_first"),
    pytest.param("inflight_full_copy", "inflight_dma.destination", "write", id="full_copy"),
    pytest.param("inflight_untouched", "inflight_dma.destination", "read", id="untouched"),
    pytest.param("inflight_no_survival", "inflight_dma.survival", "read", id="no_survival"),
]


@pytest.mark.parametrize(("defect", "code", "operation"), _DEFECT_CASES)
def test_each_inflight_defect_fails_exactly_its_rule(tmp_path, defect, code, operation):
    run_dir = _run(tmp_path / f"inf-{defect}", inflight_profile(operation), defects=[defect])
    verdict = verify_run(str(run_dir), write=False)
    assert sorted(verdict["failed_codes"]) == sorted(["run.diagnostic", code]), verdict["failed_codes"]


def test_the_inflight_defect_table_covers_every_switch():
    sys.path.insert(0, str(H.REPO / "sim"))
    from orbite_sim.case import INFLIGHT_DEFECTS

    assert {params.values[0] for params in _DEFECT_CASES} == set(INFLIGHT_DEFECTS)
    doc = (H.REPO / "docs" / "runner-contract.md").read_text()
    for defect in INFLIGHT_DEFECTS:
        assert f"| `{defect}` |" in doc, f"{defect} is not documented in docs/runner-contract.md section 7"


def test_without_the_observer_preload_the_case_fails_by_name(tmp_path):
    run_dir = _run(tmp_path / "inf-no-preload", inflight_profile(), preload=False)
    verdict = verify_run(str(run_dir), write=False)
    failed = set(verdict["failed_codes"])
    # the plan loads inflight_fault into the requester: the journal and the missing log name it; nothing was
    # interrupted, so the batch completed (its rule fails) and the runner's own destination check failed (exit 1)
    named = {"journal.env", "receipt.missing", "identity.artifacts", "inflight_dma.batch_failed", "ledger.exit"}
    assert named <= failed, failed
    findings = findings_by_code(verdict)
    assert "['inflight_fault'] into the requester" in findings["journal.env"]["message"]
    assert findings["inflight_dma.fault"]["status"] == "SKIP"  # masked by the missing log, named above


def _edit_log(run_dir, change):
    path = _log_path(run_dir)
    events = observer_log.decode(path.read_bytes())
    path.write_bytes(observer_log.encode(change(events)))


def _port_moved(events):
    """The QP went to ERR because its port went down (a physical fault), not through ibv_modify_qp."""
    for event in events:
        if event.get("ev") == "inflight_fault":
            event.update(modify_qp=-1, port_state_after=1)
    return events


def _as_completed(run_dir):
    """A consistent defect: the source's (a WRITE's destination) whole story of the fault round rewritten as a
    completed copy, the sha256 right for the full content, the provider's landed count raised alike."""

    def change(ledger):
        section = ledger["inflight"]
        seed = _ledger(run_dir, "requester")["inflight"]["input_seed"]
        full = hashlib.shake_128(b"orbite-sim-input" + seed.to_bytes(8, "little")).digest(MIB)
        section["destination"].update(sha256=hashlib.sha256(full).hexdigest(), copied_bytes=MIB, untouched_bytes=0,
                                      other_changed=0, ok=True)
        section["device"]["1"]["write_bytes_landed"] = MIB

    _edit(_ledger_path(run_dir, "source"), change)


@pytest.mark.parametrize(("code", "mutate"), [
    ("inflight_dma.qp_error", lambda run_dir: _edit_log(run_dir, _port_moved)),
    ("inflight_dma.destination", _as_completed),
])
def test_rules_no_switch_reaches_fail_on_edited_facts(healthy_write, tmp_path, code, mutate):
    run_dir = tmp_path / "inf-edited"
    shutil.copytree(healthy_write, run_dir)
    mutate(run_dir)
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["failed_codes"] == [code], verdict["failed_codes"]


@pytest.mark.parametrize(("over", "field"), [
    ({"parents": 2}, "profile.parents"),
    ({"num_lanes": 2}, "profile.num_lanes"),
    ({"mask": 3}, "profile.mask"),
    ({"payload": MIB, "block": 2 * MIB}, "profile.block"),
    ({"payload": 32 * MIB, "block": 32 * MIB}, "profile.block"),
])
def test_the_runner_refuses_shapes_the_mode_forbids_by_name(over, field):
    sys.path.insert(0, str(H.REPO / "sim"))
    from orbite_sim.case import validate_case
    from orbite_sim.errors import CaseError

    case = H.base_case(inflight_profile(**over), "requester", "/", (), peer_address="127.0.0.1:9")
    with pytest.raises(CaseError, match=field.replace(".", r"\.")):
        validate_case(case)
