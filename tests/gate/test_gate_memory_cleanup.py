"""installed-memory-cleanup through ansible-playbook on the local simulated lab (docs/memory_cleanup.md).

One case of playbooks/memory_cleanup.yml (orbite_case_only: mw-source-write-events, the source's window failure)
must PASS with every memory_cleanup rule applied: the role preloads the real uverbs_fault observer, armed by the
profile model's env, into the fault role only, and the supervisors end with every lock free. The other five cases,
the defect switches and the rules' red checks run on direct runner pairs (tests/unit/sim/test_sim_memory_cleanup.py),
not here: CI time.
"""

import json

import pytest
from helpers import gate

pytestmark = pytest.mark.slow

CASE = "mw-source-write-events"
CODES = {"memory_cleanup.fault", "memory_cleanup.no_retry", "memory_cleanup.window", "memory_cleanup.pd_busy",
         "memory_cleanup.until_exit", "memory_cleanup.old_epochs", "memory_cleanup.replacement"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo_root, ansible_env):
    yield from gate.sim_lab(tmp_path_factory, repo_root, ansible_env)


def test_memory_cleanup_playbook_passes_one_case(repo_root, ansible_env, lab, tmp_path):
    result = gate.run_gate(repo_root, ansible_env, lab, tmp_path, "memory_cleanup.yml", {"orbite_case_only": CASE},
                           timeout=900)
    assert result.returncode == 0, result.stdout[-4000:]
    verdict, run_dir = gate.verdict(tmp_path)
    assert verdict["verdict"] == "PASS" and verdict["complete"]
    assert [c["case"] for c in verdict["cases"]] == [CASE]
    statuses = {f["code"]: f["status"] for f in verdict["cases"][0]["findings"]}
    assert all(statuses[code] == "PASS" for code in CODES | {"journal.env", "journal.children"}), statuses
    assert "case.mode_unverified" not in statuses
    case_dir = run_dir / "cases" / CASE
    for role, preloaded in (("source", 1), ("requester", 0)):
        journal = [json.loads(line) for line in (case_dir / role / "journal.jsonl").read_text().splitlines()]
        (start,) = [e for e in journal if e.get("ev") == "child_start"]
        assert len(start.get("ld_preload") or []) == preloaded
        assert ("ORBITE_UVERBS_FAULT_KIND" in start["env_keys"]) == bool(preloaded)
    ledger = json.loads((case_dir / "source" / "g1" / "ledger.json").read_text())
    assert ledger["memory_cleanup"]["close"]["release"] == {"call": "ibv_dealloc_mw", "errno": "EIO"}
    assert gate.locks_free(lab)


def test_every_memory_switch_fails_exactly_its_code_end_to_end(repo_root, ansible_env, lab, tmp_path):
    """One run, one case per switch, each on the kind, fault role and progress mode the direct-pair table gives it
    (tests/unit/sim/test_sim_memory_cleanup.py COMBOS): each case fails exactly its code and run.diagnostic."""
    pairs = gate.direct_pair_module("test_sim_memory_cleanup")
    table = gate.direct_pair_table("test_sim_memory_cleanup")
    variants = []
    for switch, combo, _code in table:
        kind, role, operation, events = pairs.COMBOS[combo]
        variants.append({"id": switch, "defects": [switch], "changes": {
            "cleanup_kind": kind, "fault_role": role, "operation": operation, "rdma_events": events}})
    gate.run_defect_matrix(repo_root, ansible_env, lab, tmp_path, "memory_cleanup.yml", variants,
                           {switch: ([switch], [code]) for switch, _combo, code in table})
