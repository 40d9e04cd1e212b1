"""Run an installed-restart case on the simulated runner pair directly (no Ansible), the way
roles/runner does it, and lay the receipts out as a run directory (see helpers/sim_pair.py).

The flow (docs/restart.md): the source then the requester start in generation 1 under their node's
lock supervisor; the survivor lives across every generation. At the end of each nonfinal generation
both runners write ``restart-point.json`` (three rounds drained, cached QPs and MRs live); only then
the fault role's supervisor SIGKILLs that one child (pid and start time checked) and reaps it, and the
replacement starts in the next generation's directory with the same service address and registration.
"""

import json
import random
import shutil
import sys
import time
from pathlib import Path

from helpers import sim_pair

RESTART_POINT = "restart-point.json"
# installed-interruption: how long each held batch's wait lasts here (short: it always times out).
GRANT_S = 0.3


def _wait_file(client, child, path, timeout, what):
    deadline = time.monotonic() + timeout
    while not path.exists():
        state = client.wait(child["child_id"], timeout=0)
        if not state["timed_out"]:
            raise RuntimeError(f"{what}: the runner exited first ({state}); stderr: "
                               f"{(Path(child['out']) / 'runner.stderr').read_text()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: no {path} within {timeout} s")
        time.sleep(0.01)
    return json.loads(path.read_text())


def run_restart_pair(run_dir, case_id, profile, defects=(), timeout=120, relay_defects=(), preload=True):
    """Run every generation of the restart case; return the case directory. installed-interruption: the
    requester reaches the source through the control relay (docs/interruption.md), started after the
    source listens and always stopped; each kill also waits for the relay to hold that generation's grant;
    its journal is laid out as ``<case>/source/relay.jsonl``. ``preload=False`` starts the runners without
    the observers the profile model loads (the plan still expects them)."""
    from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (
        SupervisorClient,
        start_supervisor,
    )
    from ansible_collections.orbite.qualification.plugins.module_utils._run import relay as relay_ctl
    from ansible_collections.orbite.qualification.plugins.module_utils._profile import model

    run_dir = Path(run_dir)
    run_id = run_dir.name
    roots = sim_pair.make_hosts()
    case_dir = run_dir / "cases" / case_id
    registrations = {role: f"{run_id}-{case_id}-{role}" for role in ("source", "requester")}
    app, app_sha = sim_pair.runner_zipapp()
    plan_artifacts = sim_pair.artifacts()
    observers = model.derive_workload(profile)["observers"]  # installed-restart: accounting in the survivor
    fault = profile["fault_role"]
    generations = profile["generations"]
    clients, current, service = {}, {}, None
    interruption = profile["mode"] == "installed-interruption"
    cleanup = profile["mode"] == "installed-cleanup-failure"
    relay_dir = str(run_dir / "relay-state" / case_id)
    peer = {}
    # A loopback address of this run's own: between the kill and the replacement the source's port is
    # free, and another run binding port 0 on the same address could take it (the survivor would then
    # reconnect to a stranger). The gate's inventory gives each source a fixed address instead.
    rng = random.SystemRandom()
    own_ip = f"127.{rng.randrange(1, 255)}.{rng.randrange(0, 256)}.{rng.randrange(1, 255)}"

    def launch(role, generation):
        nonlocal service
        out = case_dir / role / f"g{generation}"
        out.mkdir(parents=True, exist_ok=True)
        extra = {"service_address": service or f"{own_ip}:0"} if role == "source" else {
            "peer_address": peer.get("address", service), "peer_registration_id": registrations["source"]}
        # installed-cleanup-failure: uverbs_fault only in generation 1, armed by the workload's env for it.
        chosen = [o for o in observers
                  if o["role"] == role and o.get("generation", generation) == generation and preload]
        tools = [o["tool"] for o in chosen]
        if interruption or cleanup or profile["mode"] == "installed-lost-completion":
            extra["timeouts"] = {"grant_s": GRANT_S}
        case = sim_pair.sim_harness.base_case(profile, role, roots[role], defects, run_id=run_id,
                                              registration_id=registrations[role], generation=generation,
                                              observers=tools, **extra)
        (out / "case.json").write_text(json.dumps(case))
        argv = [sys.executable, str(app), "--case", str(out / "case.json"), "--output", str(out)]
        env = {"PATH": "/usr/bin:/bin"}
        if tools:  # the real observers of the profile model, preloaded by hash by the supervisor
            env["ORBITE_OBSERVER_LOG"] = str(out / f"observer-{tools[0]}.jsonl")
            for observer in chosen:  # how the profile model arms them (docs/lost_completion.md, cleanup_failure.md)
                env.update(observer.get("env", {}))
        child = clients[role].launch(argv, env=env, cwd=str(out),
                                     stdout_path=str(out / "runner.stdout"), stderr_path=str(out / "runner.stderr"),
                                     argv_pins={1: app_sha, 3: None}, record_json=[3],
                                     ld_preload=[plan_artifacts["observers"][tool] for tool in tools])
        child["out"] = str(out)
        current[role] = child
        if role == "source":
            ready = _wait_file(clients[role], child, out / "ready.json", 30, "source ready")
            service = service or ready["service_address"]  # the replacement reuses generation 1's

    try:
        for role in ("source", "requester"):
            sup_dir = run_dir / "supervisors" / f"{case_id}-{role}"
            start_supervisor(str(sup_dir), f"{run_id}-{case_id}", [r["device"] for r in sim_pair.RAILS],
                             f"{roots[role]}/run/orbite/locks", root=roots[role], lease=timeout + 60)
            clients[role] = SupervisorClient(str(sup_dir))
        launch("source", 1)
        if interruption:
            peer.update(relay_ctl.start_relay({
                "listen": f"{own_ip}:0", "upstream": service, "state_dir": relay_dir, "hold_after_round": 3,
                "lease_s": timeout * generations + 60, "defects": list(relay_defects), "run_id": run_id}))
        launch("requester", 1)
        for generation in range(2, generations + 1):
            if interruption:  # the held state first: the relay holds this generation's grant
                relay_ctl.wait_held(relay_dir, generation - 1 if not relay_defects else 0, timeout)
            # The documented kill point: both runners reached the previous generation's restart point.
            for role in ("source", "requester"):
                _wait_file(clients[role], current[role], case_dir / role / f"g{generation - 1}" / RESTART_POINT,
                           timeout, f"{role} restart point g{generation - 1}")
            victim = current[fault]
            state = clients[fault].signal(victim["child_id"], victim["pid"], victim["start_time"])
            if state.get("exit_signal") != 9:
                raise RuntimeError(f"the killed {fault} ended with {state}")
            launch(fault, generation)
        for role in ("source", "requester"):
            if clients[role].wait(current[role]["child_id"], timeout=timeout)["timed_out"]:
                raise RuntimeError(f"{role} runner still running after {timeout} s")
    finally:
        if interruption:
            relay_ctl.stop_relay(relay_dir)
            if Path(relay_dir, relay_ctl.JOURNAL_NAME).exists():
                (case_dir / "source").mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(relay_dir, relay_ctl.JOURNAL_NAME), case_dir / "source" / "relay.jsonl")
        sim_pair.stop_supervisors(clients, case_dir)
    # The plan names every switch, the relay's too (it records its own in its journal).
    sim_pair.write_case(run_dir, case_id, profile, registrations, [*defects, *relay_defects])
    return case_dir


def mode_profile(mode, small, fault_role, generations, operation="read", events=False, **over):
    """A restart-roles profile of ``mode`` (installed-restart, installed-interruption) on the ``small`` shape."""
    return dict(sim_pair.BASE, mode=mode, operation=operation, rdma_events=events, fault_role=fault_role,
                generations=generations, **dict(small, **over))


def healthy_runs(tmp_path_factory, prefix, profile_of):
    """The two healthy runs the restart-roles tests share: the source killed twice (3 generations,
    WRITE/events) and the requester once (READ/polling); {fault role: run directory}."""
    runs = {}
    for fault, generations, operation, events in (("source", 3, "write", True), ("requester", 2, "read", False)):
        run_dir = tmp_path_factory.mktemp(f"{prefix}-{fault}") / f"{prefix}-{fault}"
        run_restart_pair(run_dir, "c1", profile_of(fault, generations, operation, events))
        runs[fault] = run_dir
    return runs


def findings_by_code(verdict):
    return {f["code"]: f for c in verdict["cases"] for f in c["findings"]}
