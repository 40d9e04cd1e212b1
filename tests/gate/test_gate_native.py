"""The native path end to end on the local simulated lab (issue 17): the reference runner crate
(runners/reference) built by build_installed (package, offline and locked, fmt, clippy, release build,
the real observers) into a manifest, checked by installation_check, and run by the rail-accounting
gate as orbite_runner_kind=native on the lab's loopback verbs provider with the real observers
preloaded: the same verifier and rules as the simulated runner, to PASS, in both dialects of the data
path (the shipped build's ibv_post_send / ibv_poll_cq, and with cargo feature verbs-ex ibv_wr_* /
ibv_start_poll, which the observers must see as well). And one red check end to end: a test build
(cargo feature test-defects) with a defect switch fails exactly its rule.

One case per gate run (read/polling, the playbook's first variant) keeps the wall time down; the
unit pair (tests/unit/runners/test_reference_runner.py) covers write/events and discovery, and the
observers that miss the extended calls.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import gate
from helpers.reference_runner import CRATE, cargo_available

BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not cargo_available() or not shutil.which("git"),
                                                   reason="needs git, cargo with clippy and rustfmt, a C compiler")]
READ_POLLING = [{"id": "read-polling", "changes": {"operation": "read", "rdma_events": False}}]


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo_root, ansible_env):
    yield from gate.sim_lab(tmp_path_factory, repo_root, ansible_env)


@pytest.fixture(scope="module")
def engine_repo(tmp_path_factory):
    """The crate as committed in a git work tree of its own (build_installed builds clean commits only)."""
    repo = tmp_path_factory.mktemp("native") / "reference"
    shutil.copytree(CRATE, repo, ignore=shutil.ignore_patterns("target"))
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "reference runner"]):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
                       check=True, capture_output=True)
    return repo


def _build(repo_root, ansible_env, engine_repo, root, features):
    done = subprocess.run([str(BIN / "ansible-playbook"), "playbooks/build.yml", "-e", f"orbite_source={engine_repo}",
                           "-e", f"orbite_build_root={root}", "-e", json.dumps({"orbite_features": features})],
                          cwd=repo_root, env=ansible_env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    out = Path(root) / "stable"
    observers = {tool: str(out / "observers" / f"liborbite_{tool}.so") for tool in ("accounting", "cq_fault",
                                                                                     "uverbs_fault")}
    return {"orbite_runner_kind": "native", "orbite_installation": str(out / "manifest.json"),
            "orbite_binary": str(out / "installed" / "bin" / "orbite-rdma-host"), "orbite_observer_paths": observers,
            "orbite_case_variants": READ_POLLING}


@pytest.fixture(scope="module")
def shipped(repo_root, ansible_env, engine_repo, tmp_path_factory):
    return _build(repo_root, ansible_env, engine_repo, tmp_path_factory.mktemp("shipped"), ["rdma"])


@pytest.fixture(scope="module")
def extended(repo_root, ansible_env, engine_repo, tmp_path_factory):
    """The build that posts and polls with the extended verbs: chosen by build_installed's features alone."""
    return _build(repo_root, ansible_env, engine_repo, tmp_path_factory.mktemp("extended"), ["rdma", "verbs-ex"])


@pytest.mark.parametrize("build, dialect", [("shipped", "classic"), ("extended", "extended")])
def test_native_rail_accounting_passes(request, repo_root, ansible_env, lab, tmp_path, build, dialect):
    shipped = request.getfixturevalue(build)
    result = gate.run_gate(repo_root, ansible_env, lab, tmp_path, "rail_accounting.yml", shipped)
    assert result.returncode == 0, result.stdout[-4000:]
    verdict, run_dir = gate.verdict(tmp_path)
    assert (verdict["verdict"], verdict["runner_kind"], verdict["complete"]) == ("PASS", "native", True)
    plan = json.loads((run_dir / "run.json").read_text())
    manifest = json.loads(Path(shipped["orbite_installation"]).read_text())
    # The run's plan names the installed build, the lab's provider and the manifest's observers.
    assert plan["artifacts"]["runner"]["sha256"] == manifest["binary"]["sha256"]
    assert plan["artifacts"]["verbs_library"]["sha256"] == json.loads(
        (lab / "native" / "manifest.json").read_text())["verbs_library"]["sha256"]
    assert plan["artifacts"]["observers"]["accounting"]["sha256"] == manifest["observers"]["accounting"]["sha256"]
    ledger = json.loads((run_dir / "cases" / "read-polling" / "requester" / "g1" / "ledger.json").read_text())
    assert (ledger["runner"]["kind"], ledger["status"], ledger["exit_code"]) == ("native", "complete", 0)
    assert ledger["verbs_library"]["dialect"] == dialect
    assert manifest["features"] == (["rdma"] if dialect == "classic" else ["rdma", "verbs-ex"])
    assert (run_dir / "cases" / "read-polling" / "requester" / "g1" / "observer-accounting.bin").stat().st_size
    assert gate.locks_free(lab) and not gate.supervisor_pids(lab)


def test_native_test_build_defect_fails_exactly_its_rule(repo_root, ansible_env, lab, engine_repo,
                                                          tmp_path_factory, tmp_path):
    test_build = _build(repo_root, ansible_env, engine_repo, tmp_path_factory.mktemp("test-build"),
                        ["rdma", "test-defects"])
    result = gate.run_gate(repo_root, ansible_env, lab, tmp_path, "rail_accounting.yml",
                           dict(test_build, orbite_runner_defects=["overwrite_guard"]))
    assert result.returncode != 0
    verdict, _ = gate.verdict(tmp_path)
    assert verdict["verdict"] == "FAIL" and sorted(verdict["failed_codes"]) == ["ledger.guards", "run.diagnostic"]
    assert [f["code"] for c in verdict["cases"] for f in c["findings"] if f["status"] == "FAIL"] == ["ledger.guards"]
    assert gate.locks_free(lab)
