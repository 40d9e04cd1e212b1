"""Run the simulated runner pair directly (no Ansible) and lay the receipts out as a run directory.

Used by the verifier's tests: the receipts are real runner output, arranged exactly as the gate
playbooks fetch them (docs/verifier.md), without the playbooks' cost.
"""

import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fixtures" / "sim"))

import sim_harness  # noqa: E402 - the simulated runner's own harness: hosts, case files

RUNNER = sim_harness.RUNNER
RAILS = sim_harness.RAILS
MIB = 1 << 20

BASE = {"source": "sim-a", "requester": "sim-b", "source_kind": "cpu", "requester_kind": "cpu",
        "transport": "rdma", "operation": "read", "rdma_events": False}
RAIL_ACCOUNTING = dict(BASE, mode="installed-rail-accounting", parents=16, payload=4194305, block=MIB,
                       num_lanes=1, mask=3, generations=1)
SMALL_HOST = dict(BASE, mode="installed-host", parents=6, payload=3 * 65536 + 7, block=65536, num_lanes=2,
                  mask=3, generations=1)


def make_hosts():
    """The two fake host roots, written once per process (see sim_harness.make_hosts)."""
    source, requester = sim_harness.make_hosts()
    return {"source": source, "requester": requester}


def _save_inventory(root, path):
    from ansible_collections.orbite.qualification.plugins.module_utils._inventory import sysfs as sysfs_inventory

    Path(path).write_text(json.dumps(sysfs_inventory.read_inventory(root), sort_keys=True))


def run_pair(run_dir, case_id, profile, defects=(), timeout=120):
    """Run source then requester, each as a child of a real lock supervisor on its fake host, the
    way the gate does; return the case directory (ledgers under <role>/g1/, journals under <role>/)."""
    from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (
        SupervisorClient,
        start_supervisor,
    )

    run_dir = Path(run_dir)
    roots = make_hosts()
    case_dir = run_dir / "cases" / case_id
    observers = ["accounting"] if profile["mode"] in ("installed-rail-accounting",) else []
    clients, children, ready = {}, {}, {}
    try:
        for role in ("source", "requester"):
            out = case_dir / role / "g1"
            out.mkdir(parents=True, exist_ok=True)
            sup_dir = run_dir / "supervisors" / f"{case_id}-{role}"
            start_supervisor(str(sup_dir), f"{case_id}-{role}", [r["device"] for r in RAILS],
                             f"{roots[role]}/run/orbite/locks", root=roots[role], lease=timeout + 60)
            clients[role] = SupervisorClient(str(sup_dir))
            role_extra = {"service_address": "127.0.0.1:0"} if role == "source" else {
                "peer_address": ready["service_address"], "observers": observers}
            case = sim_harness.base_case(profile, role, roots[role], defects, **role_extra)
            (out / "case.json").write_text(json.dumps(case))
            if profile.get("discovery") == "auto":
                _save_inventory(roots[role], out / "inventory-before.json")
            argv = [sys.executable, str(RUNNER), "--case", str(out / "case.json"), "--output", str(out)]
            children[role] = clients[role].launch(argv, env={"PATH": "/usr/bin:/bin"}, cwd=str(out),
                                                  stdout_path=str(out / "runner.stdout"),
                                                  stderr_path=str(out / "runner.stderr"))
            if role == "source":
                deadline = time.monotonic() + 30
                while not (out / "ready.json").exists():
                    state = clients[role].wait(children[role]["child_id"], timeout=0)
                    if not state["timed_out"] or time.monotonic() > deadline:
                        raise RuntimeError(f"source not ready: {(out / 'runner.stderr').read_text()}")
                    time.sleep(0.01)
                ready = json.loads((out / "ready.json").read_text())
        for role, child in children.items():
            if clients[role].wait(child["child_id"], timeout=timeout)["timed_out"]:
                raise RuntimeError(f"{role} runner still running after {timeout} s")
            if profile.get("discovery") == "auto":
                _save_inventory(roots[role], case_dir / role / "g1" / "inventory-after.json")
    finally:
        for role, client in clients.items():
            client.stop(force=True)
            shutil.copy(Path(client.journal_path), case_dir / role / "journal.jsonl")
    (case_dir / "case.json").write_text(json.dumps(
        {"schema": "orbite.case", "version": 1, "case_id": case_id, "profile": profile,
         "hosts": {"source": profile["source"], "requester": profile["requester"]}}))
    run_json = run_dir / "run.json"
    cases = json.loads(run_json.read_text())["cases"] if run_json.exists() else []
    run_json.write_text(json.dumps({"schema": "orbite.run", "version": 1, "run_id": run_dir.name,
                                    "cases": sorted(set(cases) | {case_id}), "allow_dirty": False}))
    return case_dir


def exit_codes(case_dir):
    codes = {}
    for role in ("source", "requester"):
        ledger = Path(case_dir) / role / "g1" / "ledger.json"
        codes[role] = json.loads(ledger.read_text()).get("exit_code") if ledger.exists() else None
    return codes

