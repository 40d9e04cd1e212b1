"""installed-inflight-dma through ansible-playbook on the local simulated lab (docs/inflight_dma.md).

One run of playbooks/inflight_dma.yml with its cheaper frozen case (4 MiB READ/polling, rail 0; orbite_case_only)
must PASS with every inflight_dma rule applied: the runner role preloads the hash-pinned inflight_fault into the
requester only, armed by the profile model's environment, and the verifier reconciles the interrupted WR with the
ledgers, the provider's counters and its own recomputation of the destination. The defect switches are red-checked
on direct runner pairs (tests/unit/sim/test_sim_inflight_dma.py), which cost a fraction of a gate run each.
"""

import json

import pytest
from helpers import gate

pytestmark = pytest.mark.slow

CASE = "read-4m-polling"


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo_root, ansible_env):
    yield from gate.sim_lab(tmp_path_factory, repo_root, ansible_env)


def test_inflight_dma_playbook_passes_with_inflight_fault_armed_in_the_requester(repo_root, ansible_env, lab,
                                                                               tmp_path):
    result = gate.run_gate(repo_root, ansible_env, lab, tmp_path, "inflight_dma.yml", {"orbite_case_only": [CASE]},
                           timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:]
    verdict, run_dir = gate.verdict(tmp_path)
    assert verdict["verdict"] == "PASS" and verdict["complete"]
    assert [c["case"] for c in verdict["cases"]] == [CASE]
    statuses = {f["code"]: f["status"] for f in verdict["cases"][0]["findings"]}
    inflight = {code: status for code, status in statuses.items() if code.startswith("inflight_dma.")}
    assert len(inflight) == 7 and set(inflight.values()) == {"PASS"}, inflight
    assert "case.mode_unverified" not in statuses
    starts = {}
    for role in ("source", "requester"):
        journal = run_dir / "cases" / CASE / role / "journal.jsonl"
        starts[role] = [e for e in map(json.loads, journal.read_text().splitlines()) if e.get("ev") == "child_start"]
    # inflight_fault armed by the role from the profile model, in the requester only.
    (start,) = starts["requester"]
    assert {"LD_PRELOAD", "ORBITE_INFLIGHT_FAULT_ARMED", "ORBITE_INFLIGHT_FAULT_BYTES"} <= set(start["env_keys"])
    assert not [s for s in starts["source"] if "LD_PRELOAD" in s["env_keys"]]
    assert (run_dir / "cases" / CASE / "requester" / "g1" / "observer-inflight_fault.bin").exists()
    assert gate.locks_free(lab)


def test_every_inflight_switch_fails_exactly_its_code_end_to_end(repo_root, ansible_env, lab, tmp_path):
    """One run, one case per switch on the shipped 4 MiB profile (polling, rail 0), READ or WRITE as the direct-pair
    table gives it: each case fails exactly its code and run.diagnostic, the others' codes PASS in it."""
    table = gate.direct_pair_table("test_sim_inflight_dma")
    variants = [{"id": switch, "defects": [switch], "changes": {"operation": operation}}
                for switch, _code, operation in table]
    gate.run_defect_matrix(repo_root, ansible_env, lab, tmp_path, "inflight_dma.yml", variants,
                           {switch: ([switch], [code]) for switch, code, _op in table})
