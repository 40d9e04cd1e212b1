"""installed-memory-cleanup on the simulated runner pair, end to end through the verifier (docs/memory_cleanup.md).

Each role is one process with two engines. The fault role runs under the REAL uverbs_fault observer (the profile
model arms it for the cleanup kind): after the old engines' three healthy rounds its first real ibv_dereg_mr (mr)
or ibv_dealloc_mw (mw, the source's grant window) fails with EIO through the seccomp filter on the context's uverbs
descriptor, where the loopback provider sends the command. The rail's real PD destroy still fails EBUSY in the
provider. Fresh engines at the same addresses refuse the old epochs and pass three rounds; the quarantine lasts until
exit. A healthy run of each (kind, role) PASSes with every memory_cleanup rule applied; each defect switch fails
exactly its rule (beside run.diagnostic); the rules no switch reaches are red-checked by editing receipts.
Red check of the runner side: removing a switch's branch in sim/orbite_sim/memory_cleanup.py makes its case pass.
"""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from helpers.cleanup_receipts import case_dir as _case
from helpers.cleanup_receipts import ledger as _pair_ledger
from helpers.receipts import edit_json, edit_lines
from helpers.sim_restart_pair import findings_by_code, mode_profile, run_restart_pair

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import RULES
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "sim"))
import sim_harness as H

LEDGER = H.validator("runner-ledger")
CODES = sorted(r.code for r in RULES if r.group == "memory_cleanup")
# The frozen shape: one parent of 64 KiB, one slice, one lane, one rail.
SMALL = {"parents": 1, "payload": 65536, "block": 65536, "num_lanes": 1, "mask": 1}
EIO = 5
# (kind, fault role, operation, events): the three combinations, each in one of the seed's two directions.
COMBOS = {"mr-requester": ("mr", "requester", "read", False), "mr-source": ("mr", "source", "write", True),
          "mw-source": ("mw", "source", "write", True)}


def memory_profile(kind="mr", role="requester", operation="read", events=False, **over):
    return mode_profile("installed-memory-cleanup", SMALL, role, 1, operation, events,
                        **dict({"cleanup_kind": kind}, **over))


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    runs = {}
    for name, (kind, role, operation, events) in COMBOS.items():
        run_dir = tmp_path_factory.mktemp("mc") / f"mc-{name}"
        run_restart_pair(run_dir, "c1", memory_profile(kind, role, operation, events))
        runs[name] = run_dir
    return runs


def _ledger_path(run_dir, role):
    return _case(run_dir) / role / "g1" / "ledger.json"


def _ledger(run_dir, role):
    return _pair_ledger(run_dir, role, 1)


def _log_path(run_dir, role):
    return _case(run_dir) / role / "g1" / "observer-uverbs_fault.jsonl"


def _destroys(run_dir, role):
    lines = [json.loads(line) for line in _log_path(run_dir, role).read_text().splitlines()[1:]]
    return [e for e in lines if e.get("ev") == "destroy"]


@pytest.mark.parametrize("name", sorted(COMBOS))
def test_a_healthy_memory_cleanup_passes_with_every_rule_applied(healthy, name):
    verdict = verify_run(str(healthy[name]), write=False)
    assert verdict["verdict"] == "PASS", verdict["failed_codes"]
    findings = findings_by_code(verdict)
    assert "case.mode_unverified" not in findings
    kind = COMBOS[name][0]
    applied = [c for c in CODES if c != ("memory_cleanup.window" if kind == "mr" else "memory_cleanup.registration")]
    for code in [*applied, "ledger.errors", "journal.env", "identity.artifacts", "ledger.rounds"]:
        assert findings[code]["status"] == "PASS", (code, findings[code])


def test_the_receipts_show_the_failure_and_replacement_the_seed_describes(healthy):
    """mr/requester: exactly one injected destroy (the data MR's dereg, EIO), no retry, the PD destroy reached the
    descriptor and failed EBUSY in the provider, the registration and backing kept until exit; fresh engines at
    the same address refused the old epoch with nothing created and ran three rounds."""
    run_dir = healthy["mr-requester"]
    for role in ("source", "requester"):
        LEDGER.validate(_ledger(run_dir, role))
    destroys = _destroys(run_dir, "requester")
    injected = [e for e in destroys if e["injected"]]
    assert [(e["kind"], e["errno"], e["retry"]) for e in injected] == [("mr", EIO, False)]
    after = destroys[destroys.index(injected[0]) + 1:]
    assert next(e for e in after if e["kind"] == "pd")["errno"] == 0  # the provider's own EBUSY, not the filter's
    record = _ledger(run_dir, "requester")["memory_cleanup"]
    close = record["close"]
    assert close["release"] == {"call": "ibv_dereg_mr", "errno": "EIO"}
    assert close["repeated_close"] == {"result": "Unquiesced", "release_called": False, "release": None}
    assert close["pd_destroy"] == {"call": "ibv_dealloc_pd", "errno": "EBUSY", "result": "Busy"}
    backing = model.backing_per_peer(1, SMALL["payload"])
    for point in (record["retained"], record["at_exit"]):
        assert point["weak_owner_alive"] is True
        assert point["charges"] == {"registrations": 1, "registered_bytes": backing}
        assert (point["key_query"]["kind"], point["key_query"]["length"]) == ("mr", backing)
        assert point["provider_held"] == {"ctx": 1, "pd": 1, "mr": 1, "mw": 0, "cq": 0, "channel": 0, "qp": 0}
    for role in ("source", "requester"):
        fresh = _ledger(run_dir, role)["memory_cleanup"]["replacement"]
        assert [p["result"] for p in fresh["restart"]["stale_probes"]] == ["EpochMismatch", "EpochMismatch"]
        assert all(p["qps_created"] == 0 for p in fresh["restart"]["stale_probes"])
        assert len(fresh["rounds"]) == 3 and fresh["teardown"]["retained_owners"] == 0
    source = _ledger(run_dir, "source")
    assert source["memory_cleanup"]["replacement"]["service_address"] == source["service_address"]


def test_an_mw_failure_keeps_borrow_grant_loan_quota_and_key_domain(healthy):
    run_dir = healthy["mw-source"]
    injected = [e for e in _destroys(run_dir, "source") if e["injected"]]
    assert [(e["kind"], e["errno"]) for e in injected] == [("mw", EIO)]
    record = _ledger(run_dir, "source")["memory_cleanup"]
    assert record["close"]["release"] == {"call": "ibv_dealloc_mw", "errno": "EIO"}
    backing = model.backing_per_peer(1, SMALL["payload"])
    for point in (record["retained"], record["at_exit"]):
        assert point["charges"] == {"borrows": 1, "grants_pending": 1, "loan_bytes": backing, "windows": 1}
        assert (point["key_query"]["kind"], point["key_query"]["windows"]) == ("mw", 1)
        assert (point["parent_query"]["kind"], point["parent_query"]["windows"]) == ("mr", 1)
        assert (point["provider_held"]["mw"], point["provider_held"]["mr"]) == (1, 1)


def test_the_profile_model_arms_the_observer_in_the_fault_role():
    for kind, role in (("mr", "requester"), ("mr", "source"), ("mw", "source")):
        _, workload = model.load_and_derive(memory_profile(kind, role))
        assert workload["observers"] == [{"tool": "uverbs_fault", "role": role,
                                          "env": {"ORBITE_UVERBS_FAULT_KIND": kind}}]


def test_the_runner_refuses_an_mw_failure_of_the_requester_by_name():
    sys.path.insert(0, str(H.REPO / "sim"))
    from orbite_sim.case import validate_case
    from orbite_sim.errors import CaseError

    root_a, _root_b = H.make_hosts()
    case = H.base_case(memory_profile("mw", "requester"), "requester", root_a, peer_address="127.0.0.1:9",
                       peer_registration_id="reg-source")
    with pytest.raises(CaseError, match=re.escape("profile.fault_role = 'requester': must be 'source' with "
                                                  "cleanup_kind 'mw'")):
        validate_case(case)


_DEFECT_CASES = [
    pytest.param("retry_dereg", "mr-requester", "memory_cleanup.no_retry", id="retry_dereg"),
    pytest.param("release_registration", "mr-source", "memory_cleanup.registration", id="release_registration"),
    pytest.param("release_window", "mw-source", "memory_cleanup.window", id="release_window"),
    pytest.param("pd_destroy_ok", "mr-requester", "memory_cleanup.pd_busy", id="pd_destroy_ok"),
    pytest.param("free_quarantine_early", "mw-source", "memory_cleanup.until_exit", id="free_quarantine_early"),
    pytest.param("stale_epoch_accepted", "mr-requester", "memory_cleanup.old_epochs", id="stale_epoch_accepted"),
]


@pytest.mark.parametrize(("defect", "combo", "code"), _DEFECT_CASES)
def test_each_memory_defect_fails_exactly_its_rule(tmp_path, defect, combo, code):
    run_dir = tmp_path / f"mc-{defect}"
    run_restart_pair(run_dir, "c1", memory_profile(*COMBOS[combo]), defects=[defect])
    verdict = verify_run(str(run_dir), write=False)
    assert sorted(verdict["failed_codes"]) == sorted(["run.diagnostic", code]), verdict["failed_codes"]
    if defect == "retry_dereg":  # the observer's own witness of the retry, not only the runner's word
        retries = [e for e in _destroys(run_dir, "requester") if e["retry"]]
        assert [(e["kind"], e["errno"]) for e in retries] == [("mr", EIO)]


def test_the_memory_defect_table_covers_every_switch():
    sys.path.insert(0, str(H.REPO / "sim"))
    from orbite_sim.case import MEMORY_DEFECTS

    assert {params.values[0] for params in _DEFECT_CASES} - {"stale_epoch_accepted"} == set(MEMORY_DEFECTS)
    doc = (H.REPO / "docs" / "runner-contract.md").read_text()
    for defect in MEMORY_DEFECTS:
        assert f"| `{defect}` |" in doc, f"{defect} is not documented in docs/runner-contract.md section 7"


def _not_injected(events):
    for event in events:
        if event.get("ev") == "destroy":
            event.update(errno=0, injected=False)
    return events


def _drop_fresh_round(case_dir):
    """A consistent defect: both fresh engines' last round gone alike (the peers still agree with each other)."""
    for role in ("source", "requester"):
        edit_json(case_dir / role / "g1" / "ledger.json",
              lambda d: d["memory_cleanup"]["replacement"]["rounds"].pop())


def _one_mr_fewer_held(case_dir):
    """A consistent defect: the provider's MR count lowered alike at every point it was read (the quarantined MR
    gone, the record self-consistent); the profile model's quarantine is the expectation."""
    def change(ledger):
        record = ledger["memory_cleanup"]
        for point in (record["close"], record["retained"], record["at_exit"]):
            point["provider_held"]["mr"] -= 1
    edit_json(case_dir / "requester" / "g1" / "ledger.json", change)


def _refused_to_arm(events):
    """The log of an observer that refused to arm: its reason, no injected destroy."""
    kept = [e for e in events if not (e.get("ev") == "destroy" and e.get("injected"))]
    return [kept[0], {"ev": "not_armed", "reason": "RDMAV_ALLOW_DISASSOC_DESTROY is set"}, *kept[1:]]


def test_an_observer_that_refused_to_arm_is_named(healthy, tmp_path):
    run_dir = tmp_path / "mc-refused"
    shutil.copytree(healthy["mr-requester"], run_dir)
    edit_lines(_log_path(run_dir, "requester"), _refused_to_arm)
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["failed_codes"] == ["memory_cleanup.fault"], verdict["failed_codes"]
    message = findings_by_code(verdict)["memory_cleanup.fault"]["message"]
    assert "refused to arm (RDMAV_ALLOW_DISASSOC_DESTROY is set)" in message


@pytest.mark.parametrize(("code", "mutate"), [
    ("memory_cleanup.until_exit", _one_mr_fewer_held),
    # The observer never failed the release (a filter that did not see the descriptor): its log is the witness
    # against the runner's record of an EIO.
    ("memory_cleanup.fault", lambda case: edit_lines(case / "requester" / "g1" / "observer-uverbs_fault.jsonl",
                                                    _not_injected)),
    ("memory_cleanup.replacement", _drop_fresh_round),
])
def test_rules_no_switch_reaches_fail_on_edited_facts(healthy, tmp_path, code, mutate):
    run_dir = tmp_path / "mc-edited"
    shutil.copytree(healthy["mr-requester"], run_dir)
    mutate(_case(run_dir))
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["failed_codes"] == [code], verdict["failed_codes"]


def test_the_observer_preload_removed_fails_the_case_by_name(tmp_path):
    run_dir = tmp_path / "mc-no-preload"
    run_restart_pair(run_dir, "c1", memory_profile(), preload=False)
    verdict = verify_run(str(run_dir), write=False)
    findings = findings_by_code(verdict)
    assert verdict["verdict"] == "FAIL"
    assert "the mode loads ['uverbs_fault'] into the requester" in findings["journal.env"]["message"]
    assert "observer-uverbs_fault" in findings["receipt.missing"]["message"]
    # Without the observer the dereg succeeded: nothing was quarantined, nothing is retained.
    assert findings["memory_cleanup.registration"]["status"] == "FAIL"
    assert findings["memory_cleanup.until_exit"]["status"] == "FAIL"


def test_every_memory_cleanup_code_has_a_red_check_here():
    reached = {params.values[2] for params in _DEFECT_CASES} | {"memory_cleanup.fault", "memory_cleanup.replacement"}
    assert set(CODES) == reached
