"""installed-cleanup-failure through ansible-playbook on the local simulated lab (docs/cleanup_failure.md).

One run of playbooks/cleanup_failure.yml with its two qp cases (cleanup_kind qp on rail 0 READ/polling and on
rail 1 WRITE/events, the smallest profile the seed allows) must PASS with every cleanup rule applied: the role
preloads the real uverbs_fault observer, armed by the profile model's env, into generation 1's requester only,
and the supervisors end with every lock free. A controller killed in the middle of a cq case's fault leaves
nothing armed: once the lease ends the supervisors, a healthy pd case on the same nodes passes. The defect
switches and the rules' red checks run on direct runner pairs (tests/unit/sim/test_sim_cleanup_failure.py,
test_sim_cleanup_kinds.py); each switch once more end to end in one defect-matrix run (one case per switch, its
code from those modules' tables).
"""

import json
import os
import time
from pathlib import Path

import pytest
from helpers import gate

pytestmark = pytest.mark.slow

CASES = ["qp-rail0-read-polling", "qp-rail1-write-events"]
KILLED, HEALTHY = "cq-rail0-read-polling", "pd-rail0-write-polling"
DEPENDENCY_CODES = {"cleanup.dependency", "cleanup.device_open", "cleanup.owners", "cleanup.repeated_close"}
CLEANUP_CODES = {"cleanup.fault", "cleanup.unquiesced", "cleanup.repeated_close", "cleanup.free_busy",
                 "cleanup.cpu_excluded", "cleanup.retained", "cleanup.charges", "cleanup.grant_unresolved"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo_root, ansible_env):
    yield from gate.sim_lab(tmp_path_factory, repo_root, ansible_env)


def test_cleanup_failure_playbook_passes_its_cases(repo_root, ansible_env, lab, tmp_path):
    result = gate.run_gate(repo_root, ansible_env, lab, tmp_path, "cleanup_failure.yml",
                           {"orbite_case_only": CASES}, timeout=900)
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


def test_a_controller_killed_mid_fault_leaves_nothing_armed(repo_root, ansible_env, lab, tmp_path):
    """Killed while the cq case's generation-1 requester idles at its restart point with its CQ quarantined
    (EBUSY) and uverbs_fault armed: within the lease the supervisors kill that runner, release the locks and close
    their journals; then a healthy case (pd) on the same nodes passes every cleanup rule that applies."""
    lease = 20  # as the restart gate's killed-controller test: a loaded host's deploy steps fit, the test waits
    run_id = f"cf-killed-{os.getpid()}-{int(time.time())}"
    proc = gate.run_gate(repo_root, ansible_env, lab, tmp_path / "killed", "cleanup_failure.yml",
                         {"orbite_case_only": [KILLED], "orbite_lease": str(lease), "orbite_run_id": run_id},
                         start_new_session=True)
    point = Path(lab) / "sim-b" / "var" / "tmp" / "orbite" / run_id / KILLED / "requester" / "g1" / "restart-point.json"
    gate.kill_when(proc, point.exists, 600)
    runner = json.loads(point.read_text())["pid"]
    deadline = time.monotonic() + lease + 30
    while time.monotonic() < deadline and (gate.supervisor_pids(lab) or not gate.locks_free(lab)
                                           or gate.process_alive(runner)):
        time.sleep(0.5)
    assert not gate.process_alive(runner), "the faulted requester outlived its supervisor's lease"
    assert not gate.supervisor_pids(lab) and gate.locks_free(lab)
    verdict, _ = gate.verdict(tmp_path / "killed")
    assert verdict["verdict"] == "INCOMPLETE"

    result = gate.run_gate(repo_root, ansible_env, lab, tmp_path / "healthy", "cleanup_failure.yml",
                           {"orbite_case_only": [HEALTHY]}, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:]
    verdict, run_dir = gate.verdict(tmp_path / "healthy")
    assert verdict["verdict"] == "PASS" and [c["case"] for c in verdict["cases"]] == [HEALTHY]
    statuses = {f["code"]: f["status"] for f in verdict["cases"][0]["findings"]}
    assert all(statuses[code] == "PASS" for code in DEPENDENCY_CODES), statuses
    ledger = json.loads((run_dir / "cases" / HEALTHY / "requester" / "g1" / "ledger.json").read_text())
    assert ledger["restart"]["cleanup"]["close"]["destroy"] == {"call": "ibv_dealloc_pd", "errno": "EBUSY"}
    assert gate.locks_free(lab)


def test_every_cleanup_switch_fails_exactly_its_code_end_to_end(repo_root, ansible_env, lab, tmp_path):
    """One run, one case per switch: the qp table's switches on the qp kind (rail 0, READ/polling, as the direct
    pairs), then the switches only a dependency kind reaches (keep_released, premature_device_close) on the first
    kind the dependency table gives them; each case fails exactly its code and run.diagnostic."""
    matrix = {switch: ("qp", code) for switch, code in gate.direct_pair_table("test_sim_cleanup_failure")}
    for kind, switch, code in gate.direct_pair_table("test_sim_cleanup_kinds", "KIND_DEFECT_CASES"):
        matrix.setdefault(switch, (kind, code))
    variants = [{"id": switch, "defects": [switch],
                 "changes": {"cleanup_kind": kind, "mask": 1, "operation": "read", "rdma_events": kind == "channel"}}
                for switch, (kind, _code) in matrix.items()]
    gate.run_defect_matrix(repo_root, ansible_env, lab, tmp_path, "cleanup_failure.yml", variants,
                           {switch: ([switch], [code]) for switch, (_kind, code) in matrix.items()})
