"""The operator's view through ansible-playbook on the local simulated lab (docs/reports.md): progress lines
while the runners run, the HTML verdict and the runs index, set_stats, a rerun of exactly the case that
failed whose verdict names its origin, and the compare playbook between the two runs."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import gate, observer_log

from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo_root, ansible_env):
    yield from gate.sim_lab(tmp_path_factory, repo_root, ansible_env)


def test_progress_rerun_index_and_compare(repo_root, ansible_env, lab, tmp_path):
    runs = tmp_path / "runs"
    env = dict(ansible_env, ANSIBLE_SHOW_CUSTOM_STATS="1")
    # Polled five times a second (a survey's text), so each wait is several polls in its one task.
    first = gate.run_gate(repo_root, env, lab, runs, "rail_accounting.yml",
                          {"orbite_run_id": "op-1", "orbite_runner_poll": "0.2"})
    assert first.returncode == 0, first.stdout[-4000:]
    # One line per poll of each runner, naming case, role, generation, round and WRs.
    for case in ("read-polling", "write-events"):
        assert re.search(rf"\[sim-b\] case {case} requester g1 round [1-3]/3, "
                         r"(drained, \d+ of|\d+ posted, \d+ completed of) 64 WRs", first.stdout)
        assert re.search(rf"\[sim-a\] case {case} source g1 round [1-3]/3", first.stdout)
    # A healthy wait is one ok result per host, however many polls it took.
    assert "FAILED - RETRYING" not in first.stdout
    assert max(first.stdout.count(f"[sim-a] case {case} source g1") for case in ("read-polling", "write-events")) > 1
    assert "orbite_verdict_summary" in first.stdout and "PASS: 2 of 2 case(s) passed" in first.stdout
    assert (runs / "op-1" / "verdict.html").read_text().count('class="plot"') >= 6

    # write-events loses a receipt after the fact: verified again, that case alone fails.
    observer_log.find(runs / "op-1" / "cases" / "write-events" / "requester" / "g1").unlink()
    again = verify_run(str(runs / "op-1"), index_dir=str(runs))
    assert [(c["case"], c["verdict"]) for c in again["cases"]] == [("read-polling", "PASS"), ("write-events", "FAIL")]

    second = gate.run_gate(repo_root, env, lab, runs, "rail_accounting.yml",
                           {"orbite_run_id": "op-2", "orbite_rerun_from": "op-1"})
    assert second.returncode == 0, second.stdout[-4000:]
    assert "case read-polling" not in second.stdout  # exactly the case that failed ran
    plan = json.loads((runs / "op-2" / "run.json").read_text())
    origin = {"run_id": "op-1", "run_dir": str(runs / "op-1"), "cases": ["write-events"]}
    assert plan["cases"] == ["write-events"] and plan["origin"] == origin
    assert plan["profiles"]["write-events"] == json.loads((runs / "op-1" / "run.json").read_text())["profiles"][
        "write-events"]
    verdict = json.loads((runs / "op-2" / "verdict.json").read_text())
    assert verdict["verdict"] == "PASS" and verdict["origin"] == origin
    assert "Rerun of `op-1`" in (runs / "op-2" / "verdict.md").read_text()
    assert "rerun of op-1: write-events" in second.stdout

    index = json.loads((runs / "index.json").read_text())
    assert [(r["run_id"], r["verdict"]) for r in index["runs"]] == [("op-1", "FAIL"), ("op-2", "PASS")]
    assert 'href="op-2/verdict.html"' in (runs / "index.html").read_text()

    compared = subprocess.run([str(BIN / "ansible-playbook"), "playbooks/compare.yml", "-e", "a=op-1",
                               "-e", "b=op-2", "-e", f"orbite_work_dir={tmp_path}"], cwd=repo_root, env=env,
                              capture_output=True, text=True, timeout=300, check=False)
    assert compared.returncode == 0, compared.stdout[-3000:]
    assert "newly passing: write-events:receipt.missing" in compared.stdout
    assert "newly failing: none" in compared.stdout
    assert gate.locks_free(lab) and not gate.supervisor_pids(lab)
