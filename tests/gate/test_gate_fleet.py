"""The fleet through ansible-playbook on a local simulated lab of 4 hosts (docs/fleet.md): bad pairing input
stops before any host is touched; two disjoint pairs run at once (their lock intervals overlap) and reach PASS
with a row per pair, each pair an ordinary verified run directory; the merge playbook, told to expect two
slices, leaves INCOMPLETE when one never wrote its verdict."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import gate, node_root

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow

# The smallest installed-host profile (tests/gate/test_gate_sim.py); source and requester are each pair's.
PROFILE = {
    "source": "sim-a", "requester": "sim-b", "source_kind": "cpu", "requester_kind": "cpu", "transport": "rdma",
    "mode": "installed-host", "operation": "write", "rdma_events": True, "parents": 4, "payload": 200000,
    "block": 65536, "num_lanes": 2, "mask": 3,
}
PAIRS = [["sim-a", "sim-c"], ["sim-d", "sim-b"]]


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo_root, ansible_env):
    yield from gate.sim_lab(tmp_path_factory, repo_root, ansible_env, count=4)


def _lock_interval(journal):
    """(first lock_acquire, last lock_release) wall times of one supervisor journal."""
    events = node_root.journal(journal)
    acquired = [e["t"] for e in events if e["ev"] == "lock_acquire"]
    released = [e["t"] for e in events if e["ev"] == "lock_release"]
    assert acquired and len(released) == len(acquired), events
    return min(acquired), max(released)


def test_fleet_of_two_disjoint_pairs_passes_with_a_row_per_pair(repo_root, ansible_env, lab, tmp_path):
    runs = tmp_path / "runs"
    inventory = lab / "inventory.yml"
    profile = tmp_path / "small.json"
    profile.write_text(json.dumps(PROFILE))

    # A host paired with itself: refused by name before any host is touched.
    bad = gate.run_gate(repo_root, ansible_env, lab, runs, "fleet.yml",
                        {"orbite_profile_file": str(profile), "orbite_fleet_pairing": "list",
                         "orbite_fleet_pairs": [["sim-a", "sim-c"], ["sim-b", "sim-b"]]}, inventory=inventory)
    assert bad.returncode != 0
    assert "pairs[1]=['sim-b', 'sim-b']: a host cannot be paired with itself" in bad.stdout, bad.stdout[-3000:]
    assert not runs.exists() and not list(lab.glob("*/var/tmp/orbite"))

    result = gate.run_gate(repo_root, ansible_env, lab, runs, "fleet.yml",
                           {"orbite_profile_file": str(profile), "orbite_fleet_id": "fleet-t",
                            "orbite_fleet_pairing": "list", "orbite_fleet_pairs": PAIRS}, inventory=inventory)
    assert result.returncode == 0, result.stdout[-5000:]
    fleet = runs / "fleet-t"
    verdict = json.loads((fleet / "fleet-verdict.json").read_text())
    assert verdict["verdict"] == "PASS" and verdict["complete"] and verdict["waves"] == [["p1", "p2"]]
    assert [(r["pair"], r["source"], r["requester"], r["case"], r["verdict"]) for r in verdict["rows"]] == [
        ("p1", "sim-a", "sim-c", "write-events", "PASS"), ("p2", "sim-d", "sim-b", "write-events", "PASS")]
    assert "| p2 | sim-d | sim-b | write-events | PASS | - |" in (fleet / "fleet-verdict.md").read_text()
    intervals = {}
    for pair, (source, requester) in zip(("p1", "p2"), PAIRS):
        run_dir = fleet / f"fleet-t-{pair}"
        # Each pair is the gate's run directory for its hosts, verified by the verifier.
        plan = json.loads((run_dir / "run.json").read_text())
        assert plan["hosts"] == {"write-events": {"source": source, "requester": requester}}
        assert json.loads((run_dir / "verdict.json").read_text())["verdict"] == "PASS"
        for role in ("source", "requester"):
            intervals[pair, role] = _lock_interval(run_dir / "cases" / "write-events" / role / "journal.jsonl")
    # One wave: the two pairs held their RNIC locks at the same time.
    assert max(intervals["p1", "source"][0], intervals["p2", "source"][0]) < min(
        intervals["p1", "source"][1], intervals["p2", "source"][1]), intervals
    assert gate.locks_free(lab) and not gate.supervisor_pids(lab)

    # AWX slicing: the merge expects two slices of this fleet; only one left its verdict -> INCOMPLETE.
    (fleet / "slices" / "job-1").mkdir(parents=True)
    shutil.copy(fleet / "fleet-verdict.json", fleet / "slices" / "job-1" / "fleet-verdict.json")
    merged = subprocess.run(
        [str(BIN / "ansible-playbook"), "playbooks/fleet_merge.yml", "-e", json.dumps(
            {"orbite_output_dir": str(runs), "orbite_fleet_id": "fleet-t", "orbite_fleet_slices": 2,
             "orbite_fleet_hosts": "sim-a,sim-b,sim-c,sim-d", "orbite_fleet_pairing": "list",
             "orbite_fleet_pairs": PAIRS})],
        cwd=repo_root, env=ansible_env, capture_output=True, text=True, timeout=300, check=False)
    assert merged.returncode != 0
    assert "merged fleet verdict INCOMPLETE" in merged.stdout, merged.stdout[-3000:]
    assert "1 of 2 slice(s) left a fleet verdict" in merged.stdout
    assert json.loads((fleet / "fleet-verdict.json").read_text())["verdict"] == "INCOMPLETE"
