"""installed-interruption through ansible-playbook on the local simulated lab (docs/interruption.md).

One case of playbooks/interruption.yml (the source killed twice, WRITE/events; its two 2-generation cases run
over SSH in the molecule scenario `interruption`, part of make test as root) must PASS with every interruption rule
applied, the relay's held grants journaled and the relay gone afterwards; a runner switch and the relay's
switch, each on one small case, fail exactly their rule; a controller killed while a grant is held leaves an
INCOMPLETE verdict, every lock released within the lease and no runner or relay running.
"""

import json
import os
import time
from pathlib import Path

import pytest
from helpers import gate

pytestmark = pytest.mark.slow

INTERRUPTION_CODES = {"interruption.relay_path", "interruption.grant_held", "interruption.pending",
                      "interruption.no_bytes", "interruption.no_new_qps", "interruption.batch_busy",
                      "interruption.lanes_reclaimed"}
SMALL = {
    "source": "sim-a", "requester": "sim-b", "source_kind": "cpu", "requester_kind": "cpu", "transport": "rdma",
    "mode": "installed-interruption", "operation": "read", "rdma_events": False, "parents": 2, "payload": 65536,
    "block": 65536, "num_lanes": 1, "mask": 3, "fault_role": "requester", "generations": 2,
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo_root, ansible_env):
    yield from gate.sim_lab(tmp_path_factory, repo_root, ansible_env)


def _gate(repo_root, ansible_env, lab, runs, extra, **popen):
    return gate.run_gate(repo_root, ansible_env, lab, runs, "interruption.yml", extra, timeout=1200, **popen)


def _small(tmp_path, cases=("d1",), **over):
    profile = tmp_path / "small-interruption.json"
    profile.write_text(json.dumps(dict(SMALL, **over)))
    return {"orbite_profile_file": str(profile), "orbite_case_variants": [{"id": c, "changes": {}} for c in cases]}


def _relay_pid(lab, run_id, case):
    ready = Path(lab) / "sim-a" / "var" / "tmp" / "orbite" / run_id / case / "relay" / "relay-ready.json"
    return json.loads(ready.read_text())["pid"] if ready.exists() else None


def test_interruption_playbook_passes_its_cases(repo_root, ansible_env, lab, tmp_path):
    # The shipped profile with the playbook's own variant of the case that holds most (two kills, two held
    # grants); the playbook's 2-generation cases run over SSH in the molecule scenario `interruption`.
    variant = {"id": "source-g3-write-events",
               "changes": {"fault_role": "source", "generations": 3, "operation": "write", "rdma_events": True}}
    result = _gate(repo_root, ansible_env, lab, tmp_path, {"orbite_case_variants": [variant]})
    assert result.returncode == 0, result.stdout[-4000:]
    verdict, run_dir = gate.verdict(tmp_path)
    assert verdict["verdict"] == "PASS" and verdict["complete"]
    assert [c["case"] for c in verdict["cases"]] == [variant["id"]]
    for case in verdict["cases"]:
        statuses = {f["code"]: f["status"] for f in case["findings"]}
        assert all(statuses[code] == "PASS" for code in INTERRUPTION_CODES), (case["case"], statuses)
        survivor = "interruption.requester_failed" if case["case"].startswith("source") else "interruption.source_drain"
        assert statuses[survivor] == "PASS", (case["case"], statuses)
        assert "case.mode_unverified" not in statuses
    relay = [json.loads(line) for line in
             (run_dir / "cases" / "source-g3-write-events" / "source" / "relay.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["round"]) for e in relay if e.get("action") == "held"] == [("ROUND_READY", 4)] * 2
    assert relay[-1]["ev"] == "stop" and relay[-1]["reason"] == "stop"
    pid = _relay_pid(lab, run_dir.name, variant["id"])
    assert pid is not None and not gate.process_alive(pid), pid
    assert gate.locks_free(lab)
    assert gate.launched_as_planned(run_dir) == []  # the runners as the run plan (case.json launch) says


# The runner's switch for the whole run (orbite_runner_defects); the relay's as a case variant's own `defects:`
# (the preflight takes the relay's switches as installed-interruption's, whatever the runner).
@pytest.mark.parametrize(("switch", "code", "per_case"), [("free_busy_ok", "interruption.batch_busy", False),
                                                          ("leak_grant", "interruption.grant_held", True)])
def test_a_defect_fails_exactly_its_rule_end_to_end(repo_root, ansible_env, lab, tmp_path, switch, code, per_case):
    extra = _small(tmp_path)
    if per_case:
        extra["orbite_case_variants"] = [dict(variant, defects=[switch]) for variant in extra["orbite_case_variants"]]
    else:
        extra["orbite_runner_defects"] = [switch]
    result = _gate(repo_root, ansible_env, lab, tmp_path / "runs", extra)
    assert result.returncode != 0
    verdict, run_dir = gate.verdict(tmp_path / "runs")
    assert verdict["verdict"] == "FAIL"
    assert set(verdict["failed_codes"]) == {"run.diagnostic", code}, verdict["failed_codes"]
    plan = json.loads((run_dir / "run.json").read_text())
    assert (plan.get("case_defects"), plan["defects"]) == (({"d1": [switch]}, []) if per_case else (None, [switch]))
    assert gate.locks_free(lab)


def test_a_controller_killed_while_a_grant_is_held_leaves_incomplete_and_nothing_running(repo_root, ansible_env,
                                                                                         lab, tmp_path):
    """Killed while case 2's relay holds its grant (the kill of the requester not sent yet): the verdict left
    is INCOMPLETE; within the lease both supervisors kill their runners and release every lock, and the relay,
    which watches its node's supervisor, ends too."""
    # Long enough for a loaded host's deploy steps (only the waits renew the lease), short for the test.
    lease = 30
    run_id = f"in-killed-{os.getpid()}-{int(time.time())}"
    extra = dict(_small(tmp_path, cases=("k1", "k2")), orbite_lease=str(lease), orbite_run_id=run_id)
    proc = _gate(repo_root, ansible_env, lab, tmp_path / "runs", extra, start_new_session=True)
    node = Path(lab) / "sim-a" / "var" / "tmp" / "orbite" / run_id / "k2"
    points = [Path(lab) / host / "var" / "tmp" / "orbite" / run_id / "k2" / role / "g1" / "restart-point.json"
              for host, role in (("sim-a", "source"), ("sim-b", "requester"))]

    def held():
        journal = node / "relay" / "relay.jsonl"
        return journal.exists() and '"action":"held"' in journal.read_text() and all(p.exists() for p in points)

    gate.kill_when(proc, lambda: list((tmp_path / "runs").glob("*/verdict.json")) and held(), 600)
    runners = [json.loads(p.read_text())["pid"] for p in points]
    relay_pid = _relay_pid(lab, run_id, "k2")
    verdict, _run_dir = gate.verdict(tmp_path / "runs")
    assert verdict["complete"] is False and verdict["verdict"] == "INCOMPLETE"
    # The run's first verdict (the preflight's): only the final verification replaces it.
    assert [(c["case"], c["verdict"]) for c in verdict["cases"]] == [("k1", "INCOMPLETE"), ("k2", "INCOMPLETE")]
    deadline = time.monotonic() + lease + 30
    while time.monotonic() < deadline and (gate.supervisor_pids(lab) or not gate.locks_free(lab)
                                           or any(gate.process_alive(pid) for pid in [*runners, relay_pid])):
        time.sleep(0.5)
    assert not gate.supervisor_pids(lab), "a supervisor outlived its lease"
    assert gate.locks_free(lab), "a lock outlived its supervisor's lease"
    assert not [pid for pid in runners if gate.process_alive(pid)], "a runner outlived its supervisor"
    assert relay_pid is not None and not gate.process_alive(relay_pid), "the relay outlived its node's supervisor"
    records = [json.loads(line) for line in (node / "relay" / "relay.jsonl").read_text().splitlines()]
    assert records[-1]["ev"] == "stop" and records[-1]["reason"] == "watched_process_gone", records[-1]


def test_a_failed_case_still_stops_the_relay(repo_root, ansible_env, lab, tmp_path):
    """A node step fails (the wait for the restart point runs out of time): the case's always: section stops the
    relay (a stop request, not its lease or its supervisor's end), and the verdict fails the case by name."""
    run_id = f"in-failed-{os.getpid()}-{int(time.time())}"
    extra = dict(_small(tmp_path), orbite_runner_timeout="0.5", orbite_run_id=run_id)
    result = _gate(repo_root, ansible_env, lab, tmp_path / "runs", extra)
    assert result.returncode != 0
    verdict, run_dir = gate.verdict(tmp_path / "runs")
    assert verdict["verdict"] == "FAIL" and "case.node_failure" in verdict["failed_codes"], verdict["failed_codes"]
    pid = _relay_pid(lab, run_id, "d1")
    assert pid is not None and not gate.process_alive(pid)
    records = [json.loads(line) for line in
               (run_dir / "cases" / "d1" / "source" / "relay.jsonl").read_text().splitlines()]
    assert records[-1]["ev"] == "stop" and records[-1]["reason"] == "stop", records[-1]
    assert gate.locks_free(lab)
