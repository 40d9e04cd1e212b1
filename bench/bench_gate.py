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
sys.path[:0] = [str(ROOT / ".collections"), str(ROOT / "tests" / "fixtures" / "sim")]

import sim_harness  # noqa: E402 - the simulated runner's harness: the same two invocations, no Ansible

RAIL_ACCOUNTING = sim_harness.profile("installed-rail-accounting")  # the frozen profile


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
    parser.add_argument("--top", type=int, default=25, help="how many tasks of the breakdown to print (0: all)")
    parser.add_argument("--times", type=Path, help="also keep the last run's per-task times (JSON) here")
    args = parser.parse_args()
    direct_times, gate_times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        sim_harness.make_hosts()  # build the fake hosts outside the timed part
        for index in range(args.rounds):
            started = time.monotonic()
            for case_id, changes in (("read-polling", {}), ("write-events", {"operation": "write",
                                                                             "rdma_events": True})):
                result = sim_harness.run_pair(f"{tmp}/direct{index}/{case_id}", dict(RAIL_ACCOUNTING, **changes))
                assert result["rc"] == {"source": 0, "requester": 0}, result["stderr"]
            direct_times.append(time.monotonic() - started)
            gate_times.append(gate(f"{tmp}/gate{index}", Path(tmp) / "times.json"))
        tasks = json.loads((Path(tmp) / "times.json").read_text())
        if args.times:
            args.times.write_text(json.dumps(tasks, indent=1) + "\n")
    direct, full = min(direct_times), min(gate_times)
    print(f"direct runner invocations (2 cases): {direct:.2f} s   (best of {args.rounds})")
    print(f"rail_accounting.yml to verdict:      {full:.2f} s   (best of {args.rounds})")
    print(f"ratio gate / direct:                 {full / direct:.2f}x   (goal <= 3x)")
    total = sum(row["seconds"] for row in tasks)
    runs = sum(row["count"] for row in tasks)
    shown = tasks[:args.top] if args.top > 0 else tasks
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (1 min) at the end")
    print(f"where the gate's time goes (last run: {len(tasks)} distinct tasks started {runs} times, {total:.1f} s; "
          f"{'top ' + str(len(shown)) if len(shown) < len(tasks) else 'all'}):")
    for row in shown:
        print(f"  {row['seconds']:7.2f}  x{row['count']:<3} {row['task']}")


if __name__ == "__main__":
    main()
