"""installed-restart through ansible-playbook on the local simulated lab (docs/restart.md).

One run of playbooks/restart.yml with its frozen cases (both fault roles, 2 and 3 generations,
READ/polling and WRITE/events) must PASS with every restart rule applied, the kills journaled and
every lock free afterwards; one defect switch, on a small profile, must fail exactly its rule.
"""

import json
import os
import time
from pathlib import Path

import pytest
from helpers import gate

pytestmark = pytest.mark.slow

CASES = ["source-g2-read-polling", "requester-g2-write-events", "source-g3-write-events", "requester-g3-read-polling"]
RESTART_CODES = {"restart.restart_point", "restart.kill_point", "restart.survivor", "restart.replacement",
                 "restart.stale_refused", "restart.stale_no_effect", "restart.teardown"}
SMALL_RESTART_PROFILE = {
    "source": "sim-a", "requester": "sim-b", "source_kind": "cpu", "requester_kind": "cpu", "transport": "rdma",
    "mode": "installed-restart", "operation": "read", "rdma_events": False, "parents": 4, "payload": 200000,
    "block": 65536, "num_lanes": 2, "mask": 3, "fault_role": "source", "generations": 2,
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo_root, ansible_env):
    yield from gate.sim_lab(tmp_path_factory, repo_root, ansible_env)


def _gate(repo_root, ansible_env, lab, runs, extra, **popen):
    return gate.run_gate(repo_root, ansible_env, lab, runs, "restart.yml", extra, timeout=1500, **popen)


def test_restart_playbook_passes_its_frozen_cases(repo_root, ansible_env, lab, tmp_path):
    # The playbook's four case variants on the small profile: the frozen 16 x 4 MiB profile's 2-generation
    # cases run over SSH in the molecule scenario `restart` (make molecule, part of make test as root).
    profile = tmp_path / "small-restart.json"
    profile.write_text(json.dumps(SMALL_RESTART_PROFILE))
    result = _gate(repo_root, ansible_env, lab, tmp_path, {"orbite_profile_file": str(profile)})
    assert result.returncode == 0, result.stdout[-4000:]
    verdict, run_dir = gate.verdict(tmp_path)
    assert verdict["verdict"] == "PASS" and verdict["complete"]
    assert [c["case"] for c in verdict["cases"]] == CASES
    for case in verdict["cases"]:
        statuses = {f["code"]: f["status"] for f in case["findings"]}
        assert all(statuses[code] == "PASS" for code in RESTART_CODES), (case["case"], statuses)
        assert "case.mode_unverified" not in statuses
    # The kills, in the fault role's journal: one SIGKILL per nonfinal generation, reaped killed.
    journal = run_dir / "cases" / "source-g3-write-events" / "source" / "journal.jsonl"
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [e["signal_name"] for e in events if e.get("ev") == "signal"] == ["SIGKILL", "SIGKILL"]
    assert [e.get("exit_signal_name") for e in events if e.get("ev") == "child_exit"] == ["SIGKILL", "SIGKILL", None]
    assert gate.locks_free(lab)
    # Each generation's runners, replacements included, were exec'd as the run plan (case.json launch) says.
    assert gate.launched_as_planned(run_dir) == []


def test_a_restart_defect_fails_exactly_its_rule_end_to_end(repo_root, ansible_env, lab, tmp_path):
    profile = tmp_path / "small-restart.json"
    profile.write_text(json.dumps(SMALL_RESTART_PROFILE))
    result = _gate(repo_root, ansible_env, lab, tmp_path / "runs",
                   {"orbite_profile_file": str(profile), "orbite_runner_defects": ["stale_epoch_accepted"],
                    "orbite_case_variants": [{"id": "defect", "changes": {}}]})  # one case is enough here
    assert result.returncode != 0
    verdict, _ = gate.verdict(tmp_path / "runs")
    assert verdict["verdict"] == "FAIL"
    assert set(verdict["failed_codes"]) - {"run.diagnostic"} == {"restart.stale_refused"}, verdict["failed_codes"]
    assert gate.locks_free(lab)


def test_a_controller_killed_at_a_restart_point_leaves_incomplete_and_nothing_running(repo_root, ansible_env,
                                                                                      lab, tmp_path):
    """Killed while case 2's runners idle at their restart point (its kill not sent yet): the verdict left
    is INCOMPLETE, and within the lease both supervisors kill their runners, release every lock and close
    their journals."""
    # Long enough for a loaded host's deploy steps (only the waits renew the lease), short for the test.
    lease = 20
    run_id = f"rs-killed-{os.getpid()}-{int(time.time())}"
    profile = tmp_path / "small-restart.json"
    profile.write_text(json.dumps(SMALL_RESTART_PROFILE))
    proc = _gate(repo_root, ansible_env, lab, tmp_path / "runs",
                 {"orbite_profile_file": str(profile), "orbite_lease": str(lease), "orbite_run_id": run_id},
                 start_new_session=True)
    points = [Path(lab) / host / "var" / "tmp" / "orbite" / run_id / CASES[1] / role / "g1" / "restart-point.json"
              for host, role in (("sim-a", "source"), ("sim-b", "requester"))]
    gate.kill_when(proc, lambda: list((tmp_path / "runs").glob("*/verdict.json")) and all(
        p.exists() for p in points), 600)
    runners = [json.loads(p.read_text())["pid"] for p in points]
    verdict, _run_dir = gate.verdict(tmp_path / "runs")
    assert verdict["complete"] is False and verdict["verdict"] == "INCOMPLETE"
    # The run's first verdict (the preflight's): only the final verification replaces it.
    assert [(c["case"], c["verdict"]) for c in verdict["cases"]] == [(case, "INCOMPLETE") for case in CASES]
    deadline = time.monotonic() + lease + 30
    while time.monotonic() < deadline and (gate.supervisor_pids(lab) or not gate.locks_free(lab)
                                           or any(gate.process_alive(pid) for pid in runners)):
        time.sleep(0.5)
    assert not gate.supervisor_pids(lab), "a supervisor outlived its lease"
    assert gate.locks_free(lab), "a lock outlived its supervisor's lease"
    assert not [pid for pid in runners if gate.process_alive(pid)], "a runner outlived its supervisor"
    journals = list(Path(lab).glob(f"*/run/orbite/supervisors/{run_id}-{CASES[1]}/journal.jsonl"))
    assert len(journals) == 2
    for journal in journals:
        events = [json.loads(line) for line in journal.read_text().splitlines()]
        assert "lease_expired" in [e["ev"] for e in events] and events[-1]["ev"] == "journal_close", journal
        assert not [e for e in events if e["ev"] == "signal" and e.get("reason") == "request"], journal
