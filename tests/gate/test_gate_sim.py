"""The whole gate through ansible-playbook on the local simulated lab: pass, red check, killed controller, full disk."""

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import gate

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow

SMALL_HOST_PROFILE = {
    "source": "sim-a", "requester": "sim-b", "source_kind": "cpu", "requester_kind": "cpu", "transport": "rdma",
    "mode": "installed-host", "operation": "write", "rdma_events": True, "parents": 4, "payload": 200000,
    "block": 65536, "num_lanes": 2, "mask": 3,
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo_root, ansible_env):
    yield from gate.sim_lab(tmp_path_factory, repo_root, ansible_env)


def _three_formats(run_dir):
    """(verdict.json's verdict, JUnit failures and failing testcases, Markdown title) as on disk; a case not
    verified is a JUnit error, failing too."""
    verdict = json.loads((run_dir / "verdict.json").read_text())["verdict"]
    junit = ET.parse(run_dir / "verdict.xml").getroot()
    failing = {(suite.get("name"), case.get("name")) for suite in junit for case in suite
               if case.find("failure") is not None or case.find("error") is not None}
    title = (run_dir / "verdict.md").read_text().splitlines()[0]
    return verdict, int(junit.get("failures")), failing, title


def test_rail_accounting_with_discovery_passes(repo_root, ansible_env, lab, tmp_path):
    result = gate.run_gate(repo_root, ansible_env, lab, tmp_path, "rail_accounting.yml",
                           {"orbite_profile_file": str(repo_root / "profiles" / "rail_accounting_discovery.json")})
    assert result.returncode == 0, result.stdout[-4000:]
    verdict, run_dir = gate.verdict(tmp_path)
    assert verdict["verdict"] == "PASS" and verdict["complete"]
    assert [c["case"] for c in verdict["cases"]] == ["read-polling", "write-events"]
    codes = {f["code"] for c in verdict["cases"] for f in c["findings"] if f["status"] == "PASS"}
    assert {"discovery.nics", "accounting.outstanding", "journal.locks"} <= codes
    assert (run_dir / "verdict.xml").exists() and (run_dir / "verdict.md").exists()
    assert "orbite_verdict" in result.stdout or "verdict: PASS" in result.stdout
    assert gate.locks_free(lab) and not gate.supervisor_pids(lab)
    # What each supervisor journaled it exec'd is what the run plan (case.json launch) said to launch.
    assert gate.launched_as_planned(run_dir) == []
    # Red check of that comparison: a plan that differs in one ID, one generation's observers, the discovery
    # lists and the source's address is named, field by field.
    case_dir = run_dir / "cases" / "read-polling"
    launch = json.loads((case_dir / "case.json").read_text())["launch"]
    launch["roles"]["requester"]["registration_id"] = "another-registration"
    launch["roles"]["requester"]["generations"][0]["observers"] = []
    launch["roles"]["requester"]["rails_arguments"]["discovery"]["whitelist"] = ["mlx5_9"]
    launch["roles"]["source"]["service_address"] = "127.0.0.99:7471"
    events = [json.loads(line) for line in (case_dir / "requester" / "journal.jsonl").read_text().splitlines()]
    assert [line.split(":")[0] for line in gate.launch_mismatches(launch, "requester", events)] == [
        "requester g1 c1 registration_id", "requester g1 c1 observers", "requester g1 c1 ld_preload",
        "requester g1 c1 rails", "requester g1 c1 address"]


def test_defect_switch_fails_exactly_its_rule_end_to_end(repo_root, ansible_env, lab, tmp_path):
    profile = tmp_path / "small.json"
    profile.write_text(json.dumps(SMALL_HOST_PROFILE))
    result = gate.run_gate(repo_root, ansible_env, lab, tmp_path / "runs", "installed_host.yml",
                           {"orbite_profile_file": str(profile), "orbite_runner_defects": ["corrupt_byte"]})
    assert result.returncode != 0
    verdict, run_dir = gate.verdict(tmp_path / "runs")
    # A run with a defect switch is diagnostic (run.diagnostic); the case fails exactly its rule.
    assert verdict["verdict"] == "FAIL" and sorted(verdict["failed_codes"]) == ["ledger.bytes", "run.diagnostic"]
    case_codes = [f["code"] for c in verdict["cases"] for f in c["findings"] if f["status"] == "FAIL"]
    assert case_codes == ["ledger.bytes"]
    assert gate.launched_as_planned(run_dir) == []  # the switch reached the runners as the plan says
    assert "qualification verdict FAIL: failed rules" in result.stdout and "ledger.bytes" in result.stdout
    assert gate.locks_free(lab)


def test_killed_controller_leaves_a_partial_verdict_and_leases_free_the_locks(repo_root, ansible_env, lab,
                                                                              tmp_path):
    # Short enough to wait out, long enough for the gap between two renewals on a loaded 2-core machine (from
    # the supervisor's ready to the runner's start, the longest gap without a renewal).
    lease = 20
    run_id = f"killed-{os.getpid()}-{int(time.time())}"  # the lab is shared with the other tests' runs
    proc = gate.run_gate(repo_root, ansible_env, lab, tmp_path, "rail_accounting.yml",
                         {"orbite_lease": str(lease), "orbite_run_id": run_id},  # survey values arrive as strings
                         start_new_session=True)
    # Case 1 done, and case 2's source listening under its supervisor: kill now.
    gate.kill_when(proc, lambda: list(Path(tmp_path).glob("*/verdict.json")) and list(
        Path(lab).glob(f"sim-a/var/tmp/orbite/{run_id}/write-events/source/g1/ready.json")), 300)
    verdict, run_dir = gate.verdict(tmp_path)
    assert verdict["complete"] is False
    # The run's first verdict, written by the preflight before any node was touched: only the final
    # verification replaces it.
    assert [(c["case"], c["verdict"]) for c in verdict["cases"]] == [("read-polling", "INCOMPLETE"),
                                                                    ("write-events", "INCOMPLETE")]
    assert (run_dir / "cases" / "read-polling" / "source" / "g1" / "ledger.json").exists()  # case 1 was fetched
    # Fail closed: the verdict left on disk is INCOMPLETE in all three formats, never PASS.
    status, failures, failing, title = _three_formats(run_dir)
    assert status == "INCOMPLETE" and title == "# Verdict: INCOMPLETE" and failures >= 1
    assert ("write-events", "verification") in failing and ("run", "run.incomplete") in failing
    assert gate.supervisor_pids(lab), "case 2's supervisors should still hold the locks right after the kill"
    deadline = time.monotonic() + lease + 30
    while time.monotonic() < deadline and (gate.supervisor_pids(lab) or not gate.locks_free(lab)):
        time.sleep(0.5)
    assert not gate.supervisor_pids(lab), "a supervisor outlived its lease"
    assert gate.locks_free(lab), "a lock outlived its supervisor's lease"
    journals = list(Path(lab).glob(f"*/run/orbite/supervisors/{run_id}-write-events/journal.jsonl"))
    assert len(journals) == 2
    for journal in journals:
        events = [json.loads(line)["ev"] for line in journal.read_text().splitlines()]
        assert "lease_expired" in events and events[-1] == "journal_close", journal
    # A rerun from the killed run (the preflight's run_origin job) verifies it first: case 1, fetched before the
    # kill, passes there and is not planned again; case 2, cut, is.
    from ansible_collections.orbite.qualification.plugins.module_utils._controller.run_origin import origin_of

    found = origin_of(str(run_dir))
    assert found["verified"] is True and found["origin"]["cases"] == ["write-events"], found
    verified = json.loads((run_dir / "verdict.json").read_text())
    assert verified["complete"] is True
    assert [(c["case"], c["verdict"]) for c in verified["cases"]] == [("read-polling", "PASS"),
                                                                     ("write-events", "FAIL")]


def test_a_held_rnic_lock_fails_the_case_by_name_and_leaves_nothing_held(repo_root, ansible_env, lab, tmp_path):
    profile = tmp_path / "small.json"
    profile.write_text(json.dumps(SMALL_HOST_PROFILE))
    lock = next(Path(lab).glob("sim-a/run/orbite/locks/mlx5_1.lock"), None) or (
        Path(lab) / "sim-a" / "run" / "orbite" / "locks" / "mlx5_1.lock")
    with open(lock, "a+") as handle:  # another owner holds sim-a's mlx5_1
        fcntl.flock(handle, fcntl.LOCK_EX)
        result = gate.run_gate(repo_root, ansible_env, lab, tmp_path / "runs", "installed_host.yml",
                               {"orbite_profile_file": str(profile), "orbite_lock_timeout": "1"})
    assert result.returncode != 0
    verdict, _ = gate.verdict(tmp_path / "runs")
    assert verdict["failed_codes"][0] == "case.node_failure"
    (finding,) = [f for f in verdict["cases"][0]["findings"] if f["code"] == "case.node_failure"]
    assert "source on sim-a" in finding["message"] and "mlx5_1" in finding["message"]
    assert "left no record" in finding["message"] or "empty lock file" in finding["message"]
    assert "Traceback" not in result.stdout
    assert gate.locks_free(lab) and not gate.supervisor_pids(lab)


def test_a_source_that_did_not_start_in_case_2_leaves_its_requester_no_peer_of_case_1(repo_root, ansible_env, lab,
                                                                                        tmp_path):
    """Case 2's source node fails before its runner starts (its RNIC lock is taken once case 1's receipts are
    fetched): the requester of case 2 must not be pointed at case 1's source, whose start result its node still
    holds. Its start fails naming the missing peer address, and no runner starts there."""
    runs = tmp_path / "runs"
    run_id = f"stale-{os.getpid()}-{int(time.time())}"  # the lab is shared with the other tests' runs
    case_1_fetched = runs / run_id / "cases" / "read-polling" / "source" / "journal.jsonl"
    lock = Path(lab) / "sim-a" / "run" / "orbite" / "locks" / "mlx5_1.lock"
    play = gate.run_gate(repo_root, ansible_env, lab, runs, "rail_accounting.yml",
                         {"orbite_run_id": run_id, "orbite_lock_timeout": "1"}, start_new_session=True)
    try:
        while not case_1_fetched.exists() and play.poll() is None:
            time.sleep(0.005)
        with open(lock, "a+") as handle:  # another owner takes sim-a's mlx5_1 before case 2's supervisor
            fcntl.flock(handle, fcntl.LOCK_EX)
            play.wait(timeout=600)
    finally:
        if play.poll() is None:
            play.kill()
            play.wait()
    assert play.returncode != 0
    verdict, run_dir = gate.verdict(runs)
    case_1, case_2 = verdict["cases"]
    assert case_1["verdict"] == "PASS"
    findings = [f for f in case_2["findings"] if f["code"] == "case.node_failure"]
    assert any("source on sim-a" in f["message"] and "mlx5_1" in f["message"] for f in findings), findings
    assert any("requester on sim-b" in f["message"] and "peer_address" in f["message"] for f in findings), findings
    journal = [json.loads(line) for line in (run_dir / "cases" / "write-events" / "requester" / "journal.jsonl")
               .read_text().splitlines()]
    assert not [e for e in journal if e["ev"] == "child_start"]
    assert gate.locks_free(lab) and not gate.supervisor_pids(lab)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare (a tmpfs)")
def test_a_full_output_disk_in_case_2_leaves_a_fail_never_a_pass(repo_root, ansible_env, lab, tmp_path):
    """The output directory is a small tmpfs (in a mount namespace of the gate's own), filled to the
    last byte once case 2 has started: case 2's receipts cannot be fetched, the final verdict cannot
    be written in full. The gate still verifies; the verdict on disk is FAIL in all three formats
    (the short form, written where the older partial verdict was), and the play fails naming why."""
    runs, seen = tmp_path / "runs", tmp_path / "seen"
    runs.mkdir()
    run_id = f"full-{os.getpid()}-{int(time.time())}"  # the lab is shared with the other tests' runs
    started = Path(lab) / f"sim-a/var/tmp/orbite/{run_id}/write-events/source/g1/ready.json"
    cmd = [str(BIN / "ansible-playbook"), "-i", "inventories/sim", "playbooks/rail_accounting.yml",
           "-e", f"sim_lab_dir={lab}", "-e", f"orbite_output_dir={runs}", "-e", json.dumps({"orbite_run_id": run_id})]
    script = f"""
mount -t tmpfs -o size=8m orbite-full-runs {runs} || exit 99
( while [ ! -e {started} ]; do sleep 0.05; done; cat /dev/zero > {runs}/filler 2>/dev/null; touch {tmp_path}/filled ) &
filler=$!
"$@" > {tmp_path}/gate.log 2>&1
rc=$?
kill $filler 2>/dev/null
cp -r {runs}/{run_id} {seen} 2>/dev/null
exit $rc
"""
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "gate", *cmd],
                          cwd=repo_root, env=ansible_env, capture_output=True, text=True, timeout=600, check=False)
    output = (tmp_path / "gate.log").read_text()
    assert done.returncode not in (0, 99), output[-4000:]
    assert (tmp_path / "filled").exists(), "the disk was never filled: case 2 never started"
    assert "verdict.unwritable" in output and "No space left on device" in output, output[-4000:]
    assert "Traceback" not in output
    status, failures, _failing, title = _three_formats(seen)
    assert status == "FAIL" and title == "# Verdict: FAIL" and failures >= 1
    short = json.loads((seen / "verdict.json").read_text())
    assert "verdict.unwritable" in short["failed_codes"]
    assert [c["case"] for c in short["cases"]] == ["read-polling", "write-events"]
    assert short["cases"][1]["verdict"] == "FAIL"  # its receipts never arrived: a coded receipt.* FAIL
    assert {f["code"] for f in short["cases"][1]["findings"]} & {"receipt.missing", "receipt.truncated",
                                                                  "receipt.malformed"}
    assert gate.locks_free(lab) and not gate.supervisor_pids(lab)
