"""Time-to-verdict of the rail-accounting gate on the local simulated lab, against the same runner
invocations run directly (no Ansible, no supervisor), side by side in one run; prints the ratio,
Ansible's own floor on this machine (what a playbook start, a module call and a skipped task cost on
the lab's two hosts) and where the overhead goes (per-task wall time from
bench/callback_plugins/task_times.py).

    .venv/bin/python bench/bench_gate.py [--rounds N] [--floor-tasks N]
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


def _env(**extra):
    return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
                PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", **extra)


def gate(base, times_path):
    env = _env(ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "bench" / "callback_plugins"),
               ANSIBLE_CALLBACKS_ENABLED="task_times")
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


# Ansible's floor: playbooks of N identical tasks on the lab's two hosts (local connection, as the gate).
FLOOR_TASKS = {
    "start": None,  # no task: ansible-playbook's start, one play, exit
    "module": "ansible.builtin.ping: {}",  # one module execution per host
    "skipped": "ansible.builtin.ping: {}\n      when: false",  # a conditional task skipped on both hosts
    "action": "ansible.builtin.set_fact: {orbite_floor: 1}",  # a controller-side action, no module
}


def floor(base, count):
    """Seconds of each FLOOR_TASKS playbook (``count`` tasks; "start" has none)."""
    env = _env()
    seconds = {}
    for kind, task in FLOOR_TASKS.items():
        tasks = "".join(f"    - name: {kind} {i}\n      {task}\n" for i in range(count)) if task else "    []\n"
        book = Path(base) / f"floor-{kind}.yml"
        book.write_text(f"- hosts: sim\n  gather_facts: false\n  tasks:\n{tasks}", encoding="utf-8")
        started = time.monotonic()
        subprocess.run(["ansible-playbook", "-i", "inventories/sim", str(book)], cwd=ROOT, env=env, check=True,
                       capture_output=True)
        seconds[kind] = time.monotonic() - started
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="alternating measurements of each side")
    parser.add_argument("--top", type=int, default=25, help="how many tasks of the breakdown to print (0: all)")
    parser.add_argument("--times", type=Path, help="also keep the last run's per-task times (JSON) here")
    parser.add_argument("--floor-tasks", type=int, default=10, help="tasks per floor playbook (0: no floor)")
    args = parser.parse_args()
    direct_times, gate_times, floors = [], [], []
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
            if args.floor_tasks > 0:
                floors.append(floor(tmp, args.floor_tasks))
        tasks = json.loads((Path(tmp) / "times.json").read_text())
        if args.times:
            args.times.write_text(json.dumps(tasks, indent=1) + "\n")
    direct, full = min(direct_times), min(gate_times)
    print(f"direct runner invocations (2 cases): {direct:.2f} s   (best of {args.rounds})")
    print(f"rail_accounting.yml to verdict:      {full:.2f} s   (best of {args.rounds})")
    print(f"ratio gate / direct:                 {full / direct:.2f}x   (goal <= 3x)")
    if floors:
        best = {kind: min(f[kind] for f in floors) for kind in FLOOR_TASKS}
        per = {kind: (best[kind] - best["start"]) / args.floor_tasks for kind in FLOOR_TASKS if kind != "start"}
        print(f"Ansible's floor here (2 hosts, local connection, best of {len(floors)}): playbook start and exit "
              f"{best['start']:.2f} s; per task on both hosts: module call {per['module']:.3f} s, "
              f"skipped task {per['skipped']:.3f} s, controller action (set_fact) {per['action']:.3f} s")
        skips = sum(row.get("skipped", 0) for row in tasks)
        print(f"  the gate's last run: {sum(row['count'] for row in tasks) - skips} task starts ran on some host, "
              f"{skips} were skipped on every host (about {skips * per['skipped']:.2f} s at the floor)")
    total = sum(row["seconds"] for row in tasks)
    runs = sum(row["count"] for row in tasks)
    shown = tasks[:args.top] if args.top > 0 else tasks
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (1 min) at the end")
    print(f"where the gate's time goes (last run: {len(tasks)} distinct tasks started {runs} times, {total:.1f} s; "
          f"{'top ' + str(len(shown)) if len(shown) < len(tasks) else 'all'}):")
    for row in shown:
        skipped = f" (skipped x{row['skipped']})" if row.get("skipped") else ""
        print(f"  {row['seconds']:7.2f}  x{row['count']:<3} {row['task']}{skipped}")


if __name__ == "__main__":
    main()
