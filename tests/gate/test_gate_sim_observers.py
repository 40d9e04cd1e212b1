"""The sim gate preloads the real native observers into the simulated runner, pinned by hash.

Through ansible-playbook on a local simulated lab (sim_lab builds the loopback verbs provider and
the observers): (a) the requester's observer log is written by the C `accounting` library the
supervisor preloaded (its pid is the runner's, the runner's zipapp has no observer of its own), and
(b) a run without the preload, or with an observer that is not its pin, fails the case by name.
The lab binds loopback addresses: run these in a network namespace of their own
(``unshare -n bash -c 'ip link set lo up && .venv/bin/pytest tests/gate/test_gate_sim_observers.py'``).
"""

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow
ONE_CASE = [{"id": "read-polling", "changes": {"operation": "read", "rdma_events": False}}]


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo_root, ansible_env):
    lab_dir = tmp_path_factory.mktemp("lab") / "sim-lab"
    cmd = [str(BIN / "ansible-playbook"), "playbooks/sim_lab.yml", "-e", f"sim_lab_dir={lab_dir}"]
    done = subprocess.run(cmd, cwd=repo_root, env=ansible_env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    yield lab_dir
    subprocess.run([*cmd, "-e", "sim_lab_state=absent"], cwd=repo_root, env=ansible_env, check=False,
                   capture_output=True, timeout=300)


def _gate(repo_root, ansible_env, lab, runs, **extra):
    cmd = [str(BIN / "ansible-playbook"), "-i", "inventories/sim", "playbooks/rail_accounting.yml",
           "-e", f"sim_lab_dir={lab}", "-e", f"orbite_output_dir={runs}",
           "-e", json.dumps(dict({"orbite_case_variants": ONE_CASE}, **extra))]
    return subprocess.run(cmd, cwd=repo_root, env=ansible_env, capture_output=True, text=True, timeout=900,
                          check=False)


def _run_dir(runs):
    (run_dir,) = [p for p in Path(runs).iterdir() if p.is_dir()]
    return run_dir


def _child_start(journal):
    starts = [json.loads(line) for line in journal.read_text().splitlines()]
    (start,) = [e for e in starts if e.get("ev") == "child_start"]
    return start


def test_the_observer_log_is_written_by_the_preloaded_native_library(repo_root, ansible_env, lab, tmp_path):
    result = _gate(repo_root, ansible_env, lab, tmp_path)
    run_dir = _run_dir(tmp_path)
    assert (run_dir / "verdict.json").exists(), result.stdout[-4000:]
    manifest = json.loads((lab / "native" / "manifest.json").read_text())
    requester = run_dir / "cases" / "read-polling" / "requester"
    ledger = json.loads((requester / "g1" / "ledger.json").read_text())
    start = _child_start(requester / "journal.jsonl")
    # The supervisor preloaded exactly the lab's accounting library (a sealed copy of the pinned bytes)...
    preloaded = [p for p in start["pinned"] if p["what"].startswith("ld_preload[")]
    assert [p["sha256"] for p in preloaded] == [manifest["observers"]["accounting"]["sha256"]]
    # ...into the runner process, which loaded the pinned verbs provider...
    assert start["pid"] == ledger["pid"] and ledger["status"] == "complete", ledger["errors"]
    assert ledger["verbs_library"]["sha256"] == manifest["verbs_library"]["sha256"]
    # ...and the log's header says it is the native tool's, written in that very process, in the binary
    # records the gate asks for (ORBITE_OBSERVER_LOG_FORMAT), under the name that says so.
    assert sorted(path.name for path in (requester / "g1").glob("observer-*")) == ["observer-accounting.bin"]
    assert "ORBITE_OBSERVER_LOG_FORMAT" in start["env_keys"], start["env_keys"]
    header = json.loads((requester / "g1" / "observer-accounting.bin").read_bytes().split(b"\n", 1)[0])
    assert header["schema"] == "orbite.observer-log" and header["tool"] == "accounting"
    assert (header["format"], header["record_bytes"]) == ("binary", 80)
    assert header["pid"] == ledger["pid"]
    # The runner has no observer of its own left to write one.
    with zipfile.ZipFile(run_dir / "orbite-sim-runner.pyz") as runner:  # deflated: read each member
        members = {name: runner.read(name) for name in runner.namelist()}
    assert "orbite_sim/verbs.py" in members and not [n for n, data in members.items() if b"orbite.observer-log" in data]
    plan = json.loads((run_dir / "run.json").read_text())
    assert plan["artifacts"]["observers"]["accounting"]["sha256"] == manifest["observers"]["accounting"]["sha256"]
    assert plan["artifacts"]["verbs_library"]["sha256"] == manifest["verbs_library"]["sha256"]


def test_without_the_preload_the_case_fails_naming_the_missing_log(repo_root, ansible_env, lab, tmp_path):
    """An extra var that empties the generation's preloads (extra vars win over the role's task vars): the
    runner runs without LD_PRELOAD, writes no observer log itself, and the case fails by name."""
    result = _gate(repo_root, ansible_env, lab, tmp_path, runner_gen_preloads=[])
    assert result.returncode != 0
    run_dir = _run_dir(tmp_path)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["verdict"] == "FAIL"
    requester = run_dir / "cases" / "read-polling" / "requester"
    assert not list(requester.glob("g1/observer-*"))
    assert not [p for p in _child_start(requester / "journal.jsonl")["pinned"] if p["what"].startswith("ld_preload[")]
    failed = [f for c in verdict["cases"] for f in c["findings"] if f["status"] == "FAIL"]
    assert any(f["code"] == "receipt.missing" and "observer-accounting.bin" in f["message"] for f in failed), failed


def test_an_observer_that_is_not_its_pin_never_runs(repo_root, ansible_env, lab, tmp_path):
    """The lab's accounting library changed after the lab pinned it: the node refuses the copy, the
    requester never starts, and the case fails naming the library and both hashes."""
    library = lab / "native" / "liborbite_accounting.so"
    saved = tmp_path / "saved.so"
    shutil.copy2(library, saved)
    try:
        with open(library, "ab") as handle:
            handle.write(b"\0")
        result = _gate(repo_root, ansible_env, lab, tmp_path / "runs")
    finally:
        shutil.copy2(saved, library)
    assert result.returncode != 0
    verdict = json.loads((_run_dir(tmp_path / "runs") / "verdict.json").read_text())
    assert verdict["verdict"] == "FAIL" and verdict["failed_codes"][0] == "case.node_failure"
    (finding,) = [f for f in verdict["cases"][0]["findings"] if f["code"] == "case.node_failure"]
    pin = json.loads((lab / "native" / "manifest.json").read_text())["observers"]["accounting"]["sha256"]
    assert "accounting" in finding["message"] and pin in finding["message"], finding
    assert not (_run_dir(tmp_path / "runs") / "cases" / "read-polling" / "requester" / "g1" / "ledger.json").exists()
