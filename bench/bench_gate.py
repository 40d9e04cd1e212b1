#!/usr/bin/env python3
"""Time-to-verdict of the rail-accounting gate on the local simulated lab, against the same runner
invocations run directly (no Ansible, no supervisor), side by side in one run; prints the ratio
and where the overhead goes (per-task wall time from bench/callback_plugins/task_times.py).

    .venv/bin/python bench/bench_gate.py [--rounds N]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / ".collections"), str(ROOT / "tests")]

from helpers.sim_pair import RAIL_ACCOUNTING, RAILS, RUNNER, make_hosts  # noqa: E402


def direct_pair(base, case_id, profile):
    """The two runner invocations of one case, started as the gate starts them, without Ansible."""
    roots = make_hosts(base)
    procs, ready = {}, {}
    for role in ("source", "requester"):
        out = Path(base) / case_id / role
        out.mkdir(parents=True)
        case = {"schema": "orbite.runner-case", "version": 1, "protocol": "orbite-installed-host-v4",
                "run_id": "bench", "role": role, "generation": 1, "profile": profile, "root": roots[role],
                "registration_id": f"reg-{role}", "rails": RAILS,
                "observers": ["accounting"] if role == "requester" else []}
        if role == "source":
            case["service_address"] = "127.0.0.1:0"
        else:
            case["peer_address"] = ready["service_address"]
        (out / "case.json").write_text(json.dumps(case))
        procs[role] = subprocess.Popen([sys.executable, str(RUNNER), "--case", str(out / "case.json"),
                                        "--output", str(out)], stdout=subprocess.DEVNULL)
        while role == "source" and not (out / "ready.json").exists():
            time.sleep(0.005)
        if role == "source":
            ready = json.loads((out / "ready.json").read_text())
    return [p.wait() for p in procs.values()]


def gate(base, times_path):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "bench"
               / "callback_plugins"), ANSIBLE_CALLBACKS_ENABLED="task_times",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    timed_env = dict(env, ORBITE_TASK_TIMES=str(times_path))
    lab = Path(base) / "lab"
    common = ["-e", f"sim_lab_dir={lab}"]
    subprocess.run(["ansible-playbook", "playbooks/sim_lab.yml", *common], cwd=ROOT, env=env, check=True,
                   capture_output=True)
    started = time.monotonic()
    result = subprocess.run(["ansible-playbook", "-i", "inventories/sim", "playbooks/rail_accounting.yml", *common,
                             "-e", f"orbite_output_dir={base}/runs"], cwd=ROOT, env=timed_env, capture_output=True,
                            text=True, check=False)
    elapsed = time.monotonic() - started
    subprocess.run(["ansible-playbook", "playbooks/sim_lab.yml", *common, "-e", "sim_lab_state=absent"], cwd=ROOT,
                   env=env, check=False, capture_output=True)
    if result.returncode != 0:
        sys.exit(f"the gate failed:\n{result.stdout[-3000:]}")
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="alternating measurements of each side")
    args = parser.parse_args()
    direct_times, gate_times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        make_hosts(tmp)  # build the fake hosts outside the timed part
        for index in range(args.rounds):
            started = time.monotonic()
            for case_id, changes in (("read-polling", {}), ("write-events", {"operation": "write",
                                                                             "rdma_events": True})):
                codes = direct_pair(f"{tmp}/direct{index}", case_id, dict(RAIL_ACCOUNTING, **changes))
                assert codes == [0, 0], codes
            direct_times.append(time.monotonic() - started)
            gate_times.append(gate(f"{tmp}/gate{index}", Path(tmp) / "times.json"))
        tasks = json.loads((Path(tmp) / "times.json").read_text())
    direct, full = min(direct_times), min(gate_times)
    print(f"direct runner invocations (2 cases): {direct:.2f} s   (best of {args.rounds})")
    print(f"rail_accounting.yml to verdict:      {full:.2f} s   (best of {args.rounds})")
    print(f"ratio gate / direct:                 {full / direct:.2f}x   (goal <= 3x)")
    total = sum(row["seconds"] for row in tasks)
    print(f"where the gate's time goes (last run: {len(tasks)} distinct tasks, {total:.1f} s; top 15):")
    for row in tasks[:15]:
        print(f"  {row['seconds']:7.2f}  x{row['count']:<3} {row['task']}")


if __name__ == "__main__":
    main()
