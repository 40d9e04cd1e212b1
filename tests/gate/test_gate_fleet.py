"""The fleet through ansible-playbook on a local simulated lab of 4 hosts (docs/fleet.md): bad pairing input
stops before any host is touched; two disjoint pairs run at once (their lock intervals overlap) and reach PASS
with a row per pair, each pair an ordinary verified run directory; the merge playbook, told to expect two
slices, leaves INCOMPLETE when one never wrote its verdict. On 4-RNIC hosts (docs/fleet.md "Lanes in a fleet"),
each pair's cases run on its lanes inside the wave, with the serial switch's verdict; the verifier's
locks.exclusive catches two cases of a fleet pair on the same RNICs at once."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import consistent_defects as cd
from helpers import gate, node_root

from ansible_collections.orbite.qualification.plugins.module_utils._fleet import run as fleet_run

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
    # A bad case schedule switch: refused by name before any host is touched, nothing written.
    bad = gate.run_gate(repo_root, ansible_env, lab, runs, "fleet.yml",
                        {"orbite_profile_file": str(profile), "orbite_fleet_pairing": "list",
                         "orbite_fleet_pairs": PAIRS, "orbite_case_schedule": "parallel"}, inventory=inventory)
    assert bad.returncode != 0 and "Traceback" not in bad.stdout + bad.stderr
    assert "schedule.invalid: orbite_case_schedule='parallel': must be one of lanes, serial" in " ".join(
        bad.stdout.split()), bad.stdout[-3000:]
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


# Three cases a pair: two side by side in one slot on 4-RNIC hosts, then the third (its hosts reversed).
VARIANTS = [{"id": "write-events"}, {"id": "read-polling", "changes": {"operation": "read", "rdma_events": False}},
            {"id": "rv-write-polling", "reverse_hosts": True, "changes": {"rdma_events": False}}]
CASES = [v["id"] for v in VARIANTS]


@pytest.fixture(scope="module")
def lab4(tmp_path_factory, repo_root, ansible_env):
    yield from gate.sim_lab(tmp_path_factory, repo_root, ansible_env, count=4, rnics=4)


def _fleet(repo_root, ansible_env, lab, tmp_path, schedule):
    """One fleet of PAIRS on ``lab`` (fleet ID fleet-<schedule>: each run its own node directories); its
    directory, fleet verdict and, by pair, the run directory."""
    tmp_path.mkdir()
    profile = tmp_path / "small.json"
    profile.write_text(json.dumps(PROFILE))
    fleet_id = f"fleet-{schedule.strip().lower()}"
    result = gate.run_gate(repo_root, ansible_env, lab, tmp_path / "runs", "fleet.yml",
                           {"orbite_profile_file": str(profile), "orbite_fleet_id": fleet_id,
                            "orbite_fleet_pairing": "list", "orbite_fleet_pairs": PAIRS,
                            "orbite_case_variants": VARIANTS, "orbite_case_schedule": schedule},
                           inventory=lab / "inventory.yml", timeout=900)
    assert result.returncode == 0, result.stdout[-5000:]
    fleet = tmp_path / "runs" / fleet_id
    return fleet, json.loads((fleet / "fleet-verdict.json").read_text()), {
        pair: fleet / f"{fleet_id}-{pair}" for pair in ("p1", "p2")}


def _findings(run_dirs):
    return {(pair, c["case"], f["code"], f["status"]) for pair, run_dir in run_dirs.items()
            for c in json.loads((run_dir / "verdict.json").read_text())["cases"] for f in c["findings"]}


def _supervisor(run_dir, case, role):
    events = node_root.journal(run_dir / "cases" / case / role / "journal.jsonl")
    times = {e["ev"]: e["t"] for e in events}
    return next(e for e in events if e["ev"] == "supervisor_start"), (times["journal_open"], times["journal_close"])


def test_fleet_pairs_run_their_cases_on_lanes_with_the_serial_verdict(repo_root, ansible_env, lab4, tmp_path):
    _lanes, lanes_verdict, lanes_dirs = _fleet(repo_root, ansible_env, lab4, tmp_path / "lanes", "lanes")
    serial, serial_verdict, serial_dirs = _fleet(repo_root, ansible_env, lab4, tmp_path / "serial", " Serial ")
    for verdict in (lanes_verdict, serial_verdict):
        assert verdict["verdict"] == "PASS" and verdict["complete"] and verdict["waves"] == [["p1", "p2"]]
        assert [(r["pair"], r["case"], r["verdict"]) for r in verdict["rows"]] == [
            (pair, case, "PASS") for pair in ("p1", "p2") for case in CASES]
    assert _findings(lanes_dirs) == _findings(serial_dirs) and len(_findings(lanes_dirs)) > 100

    for (source, requester), pair in zip(PAIRS, ("p1", "p2")):
        plan = json.loads((lanes_dirs[pair] / "schedule.json").read_text())
        assert plan["mode"] == "lanes"
        assert [[(e["id"], e["lane"]) for e in slot] for slot in plan["slots"]] == [
            [("write-events", 0), ("read-polling", 1)], [("rv-write-polling", 0)]]
        serial_plan = json.loads((serial_dirs[pair] / "schedule.json").read_text())
        assert serial_plan["mode"] == "serial"
        assert [[(e["id"], e["lane"]) for e in slot] for slot in serial_plan["slots"]] == [[(c, 0)] for c in CASES]
        # run.json and each case's launch name the case's lane hosts, as a single pair's gate writes them.
        for run_dir, schedule in ((lanes_dirs[pair], plan), (serial_dirs[pair], serial_plan)):
            for entry in (e for slot in schedule["slots"] for e in slot):
                launch = json.loads((run_dir / "cases" / entry["id"] / "case.json").read_text())["launch"]["roles"]
                assert {role: launch[role]["host"] for role in launch} == entry["hosts"]
            hosts = json.loads((run_dir / "run.json").read_text())["hosts"]
            assert hosts["rv-write-polling"] == {"source": requester, "requester": source}  # reversed on each pair
        for role in ("source", "requester"):
            # The slot's two cases: each its own supervisor, on disjoint RNICs of one lock directory, at once.
            (first, (a0, a1)), (second, (b0, b1)) = (_supervisor(lanes_dirs[pair], c, role) for c in CASES[:2])
            assert first["run_id"] != second["run_id"] and first["lock_dir"] == second["lock_dir"]
            assert not set(first["locks"]) & set(second["locks"]), (first, second)
            assert a0 < b1 and b0 < a1, (pair, role)
            spans = sorted(_supervisor(serial_dirs[pair], c, role)[1] for c in CASES)
            assert all(x[1] <= y[0] for x, y in zip(spans, spans[1:])), (pair, role)  # serial: one at a time
    assert gate.locks_free(lab4) and not gate.supervisor_pids(lab4)

    # Red check: p1's read-polling moved onto write-events' RNICs at once, locked in a lock directory of its own
    # (a lane alias's), every instant of its journals and ledgers moved together: locks.exclusive alone fails,
    # on that pair's case alone.
    case = cd.CaseFiles(serial_dirs["p1"] / "cases" / "read-polling")
    other = {role: node_root.journal(serial_dirs["p1"] / "cases" / "write-events" / role / "journal.jsonl")
             for role in cd.ROLES}
    begin = max(cd._acquired(other[role], rnic) for role in cd.ROLES for rnic in ("mlx5_0", "mlx5_1")) + 0.005
    delta = begin - min(line["t"] for role in cd.ROLES for line in case.journals[role])
    for role in cd.ROLES:
        for line in case.journals[role]:
            cd._shift_record(line, delta)
            if line.get("ev") == "supervisor_start":
                line["lock_dir"] += "-lane1"
            if line.get("ev") in ("lock_acquire", "lock_release"):
                line["path"] = line["path"].replace("/locks/", "/locks-lane1/")
            if line.get("ev") == "lock_acquire":
                line.update(previous_state="none", previous_owner=None, previous_owner_gone=None)
        cd._shift_ledger(case.ledgers[role], delta)
        case.touched.add(role)
    case.save()
    broken, _paths = fleet_run.verify(str(serial))
    assert broken["verdict"] == "FAIL" and broken["failed_codes"] == ["locks.exclusive"], broken["failed_codes"]
    assert [(r["pair"], r["case"]) for r in broken["rows"] if r["verdict"] != "PASS"] == [("p1", "read-polling")]
    assert next(r for r in broken["rows"] if r["verdict"] != "PASS")["failed_codes"] == ["locks.exclusive"]
