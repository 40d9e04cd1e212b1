"""installed-lost-completion through ansible-playbook on the local simulated lab (docs/lost_completion.md).

One run of playbooks/lost_completion.yml with one of its cases on the shipped profile (8 x 1 MiB, the smallest
the seed allows) must PASS with every lost_completion rule applied: the role preloads
the hash-pinned cq_fault into the requester only, armed by the profile model's environment, and the verifier
reconciles what it withheld with the ledgers and journals. The defect switches are red-checked on direct
runner pairs (tests/unit/sim/test_sim_lost_completion.py), which cost a fraction of a gate run each, and again
end to end in one defect-matrix run (one case per switch, the expected code from that module's table).
"""

import json

import pytest
from helpers import gate

pytestmark = pytest.mark.slow

# One case (a gate case costs about a minute and a half of Ansible on a loaded CI host): the source killed, so
# the surviving requester fails its lost WRITE batches with effects Unknown. The other survivor, READ, polling,
# three generations and the 16 x 3-lane shape run on direct pairs.
CASES = {"source-g2-write-events": {"fault_role": "source", "generations": 2, "operation": "write",
                                    "rdma_events": True}}
LOST_CODES = {"lost_completion.withheld", "lost_completion.kill_point", "lost_completion.destroy_before_drain"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo_root, ansible_env):
    yield from gate.sim_lab(tmp_path_factory, repo_root, ansible_env)


def test_lost_completion_playbook_passes_with_cq_fault_armed_in_the_requester(repo_root, ansible_env, lab,
                                                                              tmp_path):
    extra = {"orbite_case_variants": [{"id": case, "changes": changes} for case, changes in CASES.items()]}
    result = gate.run_gate(repo_root, ansible_env, lab, tmp_path, "lost_completion.yml", extra, timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:]
    verdict, run_dir = gate.verdict(tmp_path)
    assert verdict["verdict"] == "PASS" and verdict["complete"]
    assert [c["case"] for c in verdict["cases"]] == list(CASES)
    for case in verdict["cases"]:
        statuses = {f["code"]: f["status"] for f in case["findings"]}
        survivor = ("lost_completion.requester_failed" if case["case"].startswith("source")
                    else "lost_completion.source_released")
        assert all(statuses[code] == "PASS" for code in {*LOST_CODES, survivor}), (case["case"], statuses)
        assert "case.mode_unverified" not in statuses
    for case in CASES:
        starts = {}
        for role in ("source", "requester"):
            journal = run_dir / "cases" / case / role / "journal.jsonl"
            events = map(json.loads, journal.read_text().splitlines())
            starts[role] = [e for e in events if e.get("ev") == "child_start"]
        # cq_fault armed by the role from the profile model, in every requester process and never in the source.
        for start in starts["requester"]:
            assert {"LD_PRELOAD", "ORBITE_CQ_FAULT_ARMED", "ORBITE_CQ_FAULT_REPEAT"} <= set(start["env_keys"])
        assert not [s for s in starts["source"] if "LD_PRELOAD" in s["env_keys"]]
        withheld = run_dir / "cases" / case / "requester" / "g1" / "observer-cq_fault.bin"
        assert withheld.exists()
    assert gate.locks_free(lab)


def test_every_lost_completion_switch_fails_exactly_its_code_end_to_end(repo_root, ansible_env, lab, tmp_path):
    """One run, one case per switch (each a variant's own defects, on the cheapest shipped shape: 8 x 1 MiB, one
    lane, two generations, WRITE/events; the fault role the direct-pair table gives): each case fails exactly its
    code and run.diagnostic, the other cases' codes PASS in it, and nothing is left held or running. A last case
    leaves cq_fault out of the deploy and preload (a diagnostic variant): it fails by the observer's name."""
    table = gate.direct_pair_table("test_sim_lost_completion")
    shape = {"generations": 2, "operation": "write", "rdma_events": True}
    # A switch the table gives for both fault roles is a case per role (case IDs are unique in a run).
    switches = [switch for switch, _fault, _code in table]
    ids = [switch if switches.count(switch) == 1 else f"{switch}-{fault}" for switch, fault, _code in table]
    variants = [{"id": case, "defects": [switch], "changes": dict(shape, fault_role=fault)}
                for case, (switch, fault, _code) in zip(ids, table)]
    variants.append({"id": "no-cq-fault", "leave_out": ["cq_fault"], "changes": dict(shape, fault_role="source")})
    verdict, run_dir = gate.run_defect_matrix(repo_root, ansible_env, lab, tmp_path, "lost_completion.yml", variants,
                                              {case: ([switch], [code]) for case, (switch, _, code) in zip(ids, table)})
    assert verdict["diagnostic_only"] and sorted(verdict["defects"]) == sorted(set(switches))
    # Without the preload: the run says so, the observer's log is missing by name, the journal shows the requester
    # ran without it, and nothing was withheld, so the kill point is not the mode's.
    plan = json.loads((run_dir / "run.json").read_text())
    assert plan["case_left_out"] == {"no-cq-fault": ["cq_fault"]}
    (case,) = [c for c in verdict["cases"] if c["case"] == "no-cq-fault"]
    findings = {f["code"]: f for f in case["findings"]}
    assert case["verdict"] == "FAIL"
    assert "left cq_fault out of the preload" in findings["run.diagnostic"]["message"]
    assert "the mode loads ['cq_fault'] into the requester" in findings["journal.env"]["message"]
    assert "observer-cq_fault" in findings["receipt.missing"]["message"]
    assert findings["lost_completion.kill_point"]["status"] == "FAIL"
    assert findings["lost_completion.withheld"]["status"] != "PASS"
    journal = run_dir / "cases" / "no-cq-fault" / "requester" / "journal.jsonl"
    starts = [e for e in map(json.loads, journal.read_text().splitlines()) if e.get("ev") == "child_start"]
    assert starts and not [s for s in starts if "LD_PRELOAD" in s["env_keys"]]
