"""installed-cleanup-failure through ansible-playbook on the local simulated lab (docs/cleanup_failure.md).

One run of playbooks/cleanup_failure.yml with its frozen cases (cleanup_kind qp on rail 0 READ/polling and on
rail 1 WRITE/events, the smallest profile the seed allows) must PASS with every cleanup rule applied: the role
preloads the real uverbs_fault observer, armed by the profile model's env, into generation 1's requester only,
and the supervisors end with every lock free. The defect switches and the rules' red checks run on direct
runner pairs (tests/unit/sim/test_sim_cleanup_failure.py), not here: CI time.
"""

import json

import pytest
from helpers import gate

pytestmark = pytest.mark.slow

CASES = ["qp-rail0-read-polling", "qp-rail1-write-events"]
CLEANUP_CODES = {"cleanup.fault", "cleanup.unquiesced", "cleanup.repeated_close", "cleanup.free_busy",
                 "cleanup.cpu_excluded", "cleanup.retained", "cleanup.charges", "cleanup.grant_unresolved"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo_root, ansible_env):
    yield from gate.sim_lab(tmp_path_factory, repo_root, ansible_env)


def test_cleanup_failure_playbook_passes_its_cases(repo_root, ansible_env, lab, tmp_path):
    result = gate.run_gate(repo_root, ansible_env, lab, tmp_path, "cleanup_failure.yml", {}, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:]
    verdict, run_dir = gate.verdict(tmp_path)
    assert verdict["verdict"] == "PASS" and verdict["complete"]
    assert [c["case"] for c in verdict["cases"]] == CASES
    for case in verdict["cases"]:
        statuses = {f["code"]: f["status"] for f in case["findings"]}
        assert all(statuses[code] == "PASS" for code in CLEANUP_CODES | {"journal.env", "journal.children"}), (
            case["case"], statuses)
        assert "case.mode_unverified" not in statuses
        journal = [json.loads(line) for line in
                   (run_dir / "cases" / case["case"] / "requester" / "journal.jsonl").read_text().splitlines()]
        starts = [e for e in journal if e.get("ev") == "child_start"]
        # generation 1 under the armed observer, the replacement without it
        assert [len(s.get("ld_preload") or []) for s in starts] == [1, 0]
        assert "ORBITE_UVERBS_FAULT_KIND" in starts[0]["env_keys"]
        assert "ORBITE_UVERBS_FAULT_KIND" not in starts[1]["env_keys"]
        ledger = json.loads((run_dir / "cases" / case["case"] / "requester" / "g1" / "ledger.json").read_text())
        assert ledger["restart"]["cleanup"]["close"]["destroy"] == {"call": "ibv_destroy_qp", "errno": "EIO"}
    assert gate.locks_free(lab)
