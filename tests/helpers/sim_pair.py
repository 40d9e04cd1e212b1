"""Run the simulated runner pair directly (no Ansible) and lay the receipts out as a run directory.

Used by the verifier's tests: the receipts are real runner output, arranged exactly as the gate
playbooks fetch them (docs/verifier.md), without the playbooks' cost. The identity is the gate's:
run.json is the whole plan (profiles, hosts, runner kind, defects, the artifacts' sha256), the
supervisors are ``<run>-<case>``, the registrations ``<run>-<case>-<role>``; the runner is the zipapp
of sim/ run by the interpreter, the supervisor pinning it and the case file (``argv_pins``,
journaling the case, ``record_json``) and preloading the lab's observers by hash.
"""

import atexit
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fixtures" / "sim"))

import sim_harness  # noqa: E402 - the simulated runner's own harness: hosts, case files
from ansible_collections.orbite.qualification.plugins.module_utils._run import package  # noqa: E402 - as the gate
from helpers import observer_log  # noqa: E402

RUNNER = sim_harness.RUNNER
RAILS = sim_harness.RAILS
MIB = 1 << 20

BASE = {"source": "sim-a", "requester": "sim-b", "source_kind": "cpu", "requester_kind": "cpu",
        "transport": "rdma", "operation": "read", "rdma_events": False}
# Rule groups only the fault modes apply; their own tests run them (tests/unit/sim/test_sim_restart.py,
# test_sim_interruption.py, test_sim_lost_completion.py, test_sim_cleanup_failure.py, test_sim_inflight_dma.py,
# test_sim_memory_cleanup.py).
# steps: the survivors' recovery steps (installed-lost-completion, installed-inflight-dma).
FAULT_MODE_GROUPS = ("restart", "interruption", "lost_completion", "cleanup", "inflight_dma", "memory_cleanup",
                     "steps")

RAIL_ACCOUNTING = dict(BASE, mode="installed-rail-accounting", parents=16, payload=4194305, block=MIB,
                       num_lanes=1, mask=3, generations=1)
SMALL_HOST = dict(BASE, mode="installed-host", parents=6, payload=3 * 65536 + 7, block=65536, num_lanes=2,
                  mask=3, generations=1)


_ZIPAPP = []


def runner_zipapp():
    """(path, sha256) of the simulated runner as the gate deploys it: one zipapp of sim/, built once per process."""
    if not _ZIPAPP:
        out = Path(tempfile.mkdtemp(prefix="orbite-sim-runner-"))
        atexit.register(shutil.rmtree, out, True)
        target = out / "orbite-sim-runner.pyz"
        _ZIPAPP.append((target, package.runner_zipapp(str(RUNNER), str(target))[0]))
    return _ZIPAPP[0]


def sim_runner():
    """The plan's runner entry of the simulated runner (the zipapp)."""
    app, sha = runner_zipapp()
    return {"kind": "sim", "path": str(app), "sha256": sha}


def artifacts(runner=None):
    """The plan's artifacts section for runs of this harness (docs/verifier.md); ``runner`` = the plan's
    runner entry ({kind, path, sha256}; default the simulated runner, tests/helpers/reference_runner.py
    gives the native reference runner's)."""
    lab = sim_harness.native()
    return {"runner": dict(runner or sim_runner()),
            "verbs_library": dict(lab["verbs_library"]),
            "observers": {tool: dict(entry) for tool, entry in lab["observers"].items()}}


def make_hosts():
    """The two fake host roots, written once per process (see sim_harness.make_hosts)."""
    source, requester = sim_harness.make_hosts()
    return {"source": source, "requester": requester}


def _save_inventory(root, path):
    from ansible_collections.orbite.qualification.plugins.module_utils._inventory import sysfs as sysfs_inventory

    Path(path).write_text(json.dumps(sysfs_inventory.read_inventory(root), sort_keys=True))


def run_pair(run_dir, case_id, profile, defects=(), timeout=120, runner=None, log_format="binary", preload=True):
    """Run source then requester, each as a child of a real lock supervisor on its fake host, the
    way the gate does; return the case directory (ledgers under <role>/g1/, journals under <role>/).
    ``runner``: the plan's runner entry (default the simulated runner's zipapp run by the interpreter;
    kind native: the binary itself, pinned as argv[0])."""
    from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (
        SupervisorClient,
        start_supervisor,
    )

    run_dir = Path(run_dir)
    run_id = run_dir.name
    roots = make_hosts()
    case_dir = run_dir / "cases" / case_id
    observers = ["accounting"] if profile["mode"] in ("installed-rail-accounting",) else []
    armed = {}
    if profile["mode"] == "installed-inflight-dma":  # the profile model's observer and how it arms it
        from ansible_collections.orbite.qualification.plugins.module_utils._profile import model

        chosen = [o for o in model.derive_workload(profile)["observers"] if o["role"] == "requester"]
        observers = [o["tool"] for o in chosen] if preload else []
        armed = {k: v for o in chosen for k, v in o.get("env", {}).items()}
    registrations = {role: f"{run_id}-{case_id}-{role}" for role in ("source", "requester")}
    runner = dict(runner or sim_runner())
    plan_artifacts = artifacts(runner)
    clients, children, ready = {}, {}, {}
    try:
        for role in ("source", "requester"):
            out = case_dir / role / "g1"
            out.mkdir(parents=True, exist_ok=True)
            sup_dir = run_dir / "supervisors" / f"{case_id}-{role}"
            start_supervisor(str(sup_dir), f"{run_id}-{case_id}", [r["device"] for r in RAILS],
                             f"{roots[role]}/run/orbite/locks", root=roots[role], lease=timeout + 60)
            clients[role] = SupervisorClient(str(sup_dir))
            role_extra = {"service_address": "127.0.0.1:0"} if role == "source" else {
                "peer_address": ready["service_address"], "observers": observers,
                "peer_registration_id": registrations["source"]}
            case = sim_harness.base_case(profile, role, roots[role], defects, run_id=run_id,
                                         registration_id=registrations[role], **role_extra)
            (out / "case.json").write_text(json.dumps(case))
            if profile.get("discovery") == "auto":
                _save_inventory(roots[role], out / "inventory-before.json")
            tools = case.get("observers") or []
            env = {"PATH": "/usr/bin:/bin"}
            if tools:  # the real observers, preloaded by hash by the supervisor (docs/observers.md)
                # As the gate does (_run/launch.py): binary records by default, the name saying the format.
                env["ORBITE_OBSERVER_LOG"] = str(out / observer_log.file_name(tools[0], log_format))
                env["ORBITE_OBSERVER_LOG_FORMAT"] = log_format
                env.update(armed)
            argv = [runner["path"], "--case", str(out / "case.json"), "--output", str(out)]
            if runner["kind"] == "sim":
                argv.insert(0, sys.executable)
            at = argv.index("--case")  # the runner is pinned at argv[at - 1], its case file at argv[at + 1]
            children[role] = clients[role].launch(
                argv, env=env, cwd=str(out), stdout_path=str(out / "runner.stdout"),
                stderr_path=str(out / "runner.stderr"), argv_pins={at - 1: runner["sha256"], at + 1: None},
                record_json=[at + 1],
                ld_preload=[plan_artifacts["observers"][tool] for tool in tools])
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
        stop_supervisors(clients, case_dir)
    write_case(run_dir, case_id, profile, registrations, defects, runner)
    return case_dir


def stop_supervisors(clients, case_dir):
    """Stop each role's supervisor and keep its journal beside the role's receipts."""
    for role, client in clients.items():
        client.stop(force=True)
        shutil.copy(Path(client.journal_path), case_dir / role / "journal.jsonl")


def write_case(run_dir, case_id, profile, registrations, defects=(), runner=None):
    """The case's own case.json (hosts, supervisor run id, registrations) and the run's run.json."""
    run_dir = Path(run_dir)
    hosts = {"source": profile["source"], "requester": profile["requester"]}
    (run_dir / "cases" / case_id / "case.json").write_text(json.dumps(
        {"schema": "orbite.case", "version": 1, "case_id": case_id, "profile": profile, "hosts": hosts,
         "supervisor_run_id": f"{run_dir.name}-{case_id}", "registrations": registrations}))
    write_plan(run_dir, case_id, profile, defects, runner)


def write_plan(run_dir, case_id, profile, defects=(), runner=None):
    """Add the case to run_dir's run.json (made if missing): the whole plan, as run_plan writes it."""
    run_json = Path(run_dir) / "run.json"
    plan = json.loads(run_json.read_text()) if run_json.exists() else {}
    runner = runner or sim_runner()
    plan.update(schema="orbite.run", version=1, run_id=Path(run_dir).name, allow_dirty=False,
                runner_kind=runner["kind"], artifacts=artifacts(runner),
                cases=sorted(set(plan.get("cases", [])) | {case_id}),
                profiles=dict(plan.get("profiles", {}), **{case_id: profile}),
                hosts=dict(plan.get("hosts", {}), **{case_id: {"source": profile["source"],
                                                               "requester": profile["requester"]}}),
                defects=sorted(set(plan.get("defects", [])) | set(defects)))
    run_json.write_text(json.dumps(plan))


def exit_codes(case_dir):
    codes = {}
    for role in ("source", "requester"):
        ledger = Path(case_dir) / role / "g1" / "ledger.json"
        codes[role] = json.loads(ledger.read_text()).get("exit_code") if ledger.exists() else None
    return codes

