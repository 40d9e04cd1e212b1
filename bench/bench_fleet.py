"""Parallel efficiency of the fleet (playbooks/fleet.yml) on the local simulated lab of 8 hosts: 4 disjoint
pairs in one wave against one pair, same profile and cases; prints the machine's core count, both times
to verdict, the efficiency (one pair's time / four pairs' time; 1.0 is ideal: four times the work in the
same time), the CPU seconds each run cost (every process of the run: Ansible and its forks, the modules,
the supervisors and runners, which this process reaps as their subreaper) and from them the efficiency
against what the machine's cores allow (four pairs cannot take less than one pair's time, nor less than
four pairs' CPU seconds spread over every core), and where the time goes per task
(bench/callback_plugins/task_times.py). Figures are printed, never asserted.

With --lanes (docs/fleet.md "Lanes in a fleet"), on a lab of 4 hosts of --rnics RNICs (default 4 then): the same
fleet of two disjoint pairs in one wave with orbite_case_schedule serial, then lanes, side by side (time to the
fleet verdict, CPU seconds, slots per wave) and whether the two fleet verdicts' (pair, case, code, status)
findings are identical.

    unshare -n bash -c 'ip link set lo up && .venv/bin/python bench/bench_fleet.py [--rounds N] [--profile F]'
    unshare -n bash -c 'ip link set lo up && .venv/bin/python bench/bench_fleet.py --lanes [--rnics 4] [--pairs 1]'
"""

import argparse
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOSTS = [f"sim-{c}" for c in "abcdefgh"]
ONE = [["sim-a", "sim-b"]]
FOUR = [HOSTS[i:i + 2] for i in range(0, 8, 2)]


def _env():
    return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
                ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "bench" / "callback_plugins"),
                ANSIBLE_CALLBACKS_ENABLED="task_times",
                PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")


PR_SET_CHILD_SUBREAPER = 36


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# How long processes the playbook left behind (a supervisor, a runner) may take to end after it exited.
ORPHAN_GRACE_S = 30.0


def _orphans():
    """PIDs of this process's children that are still running (the orphans it adopted as their subreaper)."""
    pids = []
    for task in Path("/proc/self/task").iterdir():
        try:
            pids += [int(pid) for pid in (task / "children").read_text().split()]
        except OSError:
            pass
    return sorted(set(pids))


def _reap_until(deadline):
    """Reap every child that ends before ``deadline`` (monotonic); True once none is left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def run_counting_cpu(argv, **kwargs):
    """Run ``argv`` to its end; its exit status, output, the CPU seconds of every process it started, and the
    PIDs of processes that outlived it past ORPHAN_GRACE_S (each then sent SIGTERM, which a supervisor takes
    as: kill and reap its children, release its locks; their CPU seconds may be missing from the figure).
    The supervisors detach from Ansible, so this process is made their subreaper and reaps every orphan
    too: a reaped process's CPU time counts in this one's RUSAGE_CHILDREN, whoever started it."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    before = _children_cpu()
    with tempfile.TemporaryFile("w+") as out:
        child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, **kwargs)
        status = None
        while status is None:
            pid, code = os.wait()  # the playbook or an orphan, whichever ends first
            if pid == child.pid:
                status = os.waitstatus_to_exitcode(code)
        child.returncode = status  # reaped above: Popen must not wait for it again
        left = []
        if not _reap_until(time.monotonic() + ORPHAN_GRACE_S):
            left = _orphans()
            for pid in left:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            _reap_until(time.monotonic() + ORPHAN_GRACE_S)
        out.seek(0)
        return status, out.read(), _children_cpu() - before, left


def fleet(lab, runs, pairs, profile, times_path, extra=None):
    """Seconds to the fleet verdict of ``pairs``, the CPU seconds it cost, and the per-task times."""
    started = time.monotonic()
    status, output, cpu, left = run_counting_cpu(
        ["ansible-playbook", "-i", str(lab / "inventory.yml"), "playbooks/fleet.yml", "-e", f"sim_lab_dir={lab}",
         "-e", json.dumps(dict({"orbite_output_dir": str(runs), "orbite_profile_file": profile,
                                "orbite_fleet_pairing": "list", "orbite_fleet_pairs": pairs}, **(extra or {})))],
        cwd=ROOT, env=dict(_env(), ORBITE_TASK_TIMES=str(times_path)))
    elapsed = time.monotonic() - started
    if status != 0:
        sys.exit(f"the fleet of {len(pairs)} pair(s) failed:\n{output[-3000:]}")
    if left:
        sys.exit(f"the fleet of {len(pairs)} pair(s) left processes running {ORPHAN_GRACE_S:.0f} s after its end "
                 f"(PIDs {left}, sent SIGTERM): a supervisor or runner that did not stop is a bug, not a figure")
    return elapsed, cpu, {row["task"]: row for row in json.loads(times_path.read_text())}


# --lanes: two disjoint pairs of 4 hosts in one wave; the frozen profile's two cases (one slot of two in lanes).
LANE_PAIRS = [["sim-a", "sim-c"], ["sim-d", "sim-b"]]
LANE_VARIANTS = [{"id": "read-polling", "changes": {"operation": "read", "rdma_events": False}},
                 {"id": "write-events", "changes": {"operation": "write", "rdma_events": True}},
                 {"id": "write-polling", "changes": {"operation": "write", "rdma_events": False}},
                 {"id": "read-events", "changes": {"operation": "read", "rdma_events": True}}]


def _findings(fleet_dir):
    """Every (pair, case, code, status) of a fleet's pairs' verdicts, and the fleet verdict."""
    verdict = json.loads((fleet_dir / "fleet-verdict.json").read_text())
    found = set()
    for pair in verdict["pairs"]:
        run = json.loads((Path(pair["run_dir"]) / "verdict.json").read_text())
        found |= {(pair["id"], c["case"], f["code"], f["status"]) for c in run["cases"] for f in c["findings"]}
    return verdict["verdict"], found


def _slots(fleet_dir):
    """Slots per pair, from each pair's schedule.json."""
    return {path.parent.name.rsplit("-", 1)[-1]: len(json.loads(path.read_text())["slots"])
            for path in sorted(fleet_dir.glob("*/schedule.json"))}


def lanes_side_by_side(args):
    """Serial then lanes, the same fleet on one lab of 4-RNIC hosts (best of the rounds each), printed side by side."""
    with tempfile.TemporaryDirectory() as tmp:
        lab = Path(tmp) / "lab"
        common = ["ansible-playbook", "playbooks/sim_lab.yml", "-e", f"sim_lab_dir={lab}", "-e", "sim_lab_count=4",
                  "-e", f"sim_lab_rnics={args.rnics}"]
        subprocess.run(common, cwd=ROOT, env=_env(), check=True, capture_output=True)
        try:
            best, seen = {}, {}
            for index in range(args.rounds):
                for mode in ("serial", "lanes"):
                    runs = Path(tmp) / f"runs-{mode}-{index}"
                    fleet_id = f"fleet-{mode}-{index}"
                    times = Path(tmp) / f"times-{mode}-{index}.json"
                    got = fleet(lab, runs, LANE_PAIRS[:args.pairs], args.profile, times,
                                {"orbite_fleet_id": fleet_id, "orbite_case_schedule": mode,
                                 "orbite_case_variants": LANE_VARIANTS})
                    seen[mode] = (*_findings(runs / fleet_id), _slots(runs / fleet_id))
                    if mode not in best or got[0] < best[mode][0]:
                        best[mode] = got
        finally:
            subprocess.run([*common, "-e", "sim_lab_state=absent"], cwd=ROOT, env=_env(), check=False,
                           capture_output=True)
    print(f"machine: {os.cpu_count()} core(s) (os.cpu_count); load average now {os.getloadavg()[0]:.1f}")
    print(f"profile {args.profile}, {len(LANE_VARIANTS)} cases a pair, pairs {LANE_PAIRS[:args.pairs]} in one wave, "
          f"{args.rnics} RNICs a host; best of {args.rounds} round(s)")
    print(f"{'':8} {'to verdict':>11} {'CPU s':>8}  slots per pair")
    for mode in ("serial", "lanes"):
        elapsed, cpu, _tasks = best[mode]
        print(f"{mode:8} {elapsed:10.2f}s {cpu:8.2f}  {seen[mode][2]}")
    ratio = best["lanes"][0] / best["serial"][0]
    print(f"lanes / serial time to verdict: {ratio:.2f}; verdicts {seen['serial'][0]} and {seen['lanes'][0]}; "
          f"findings identical: {seen['serial'][1] == seen['lanes'][1]} "
          f"({len(seen['lanes'][1])} (pair, case, code, status))")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="alternating measurements of each side (best kept)")
    parser.add_argument("--profile", default="rail_accounting.json", help="profile file (default the frozen one)")
    parser.add_argument("--lanes", action="store_true",
                        help="serial against lanes inside the pairs of a fleet of 4 hosts, side by side")
    parser.add_argument("--rnics", type=int, choices=(2, 4), default=4, help="with --lanes: RNICs a host (default 4)")
    parser.add_argument("--pairs", type=int, choices=(1, 2), default=2,
                        help="with --lanes: pairs in the wave (default 2; 1 leaves the cores to one pair's lanes)")
    args = parser.parse_args()
    if args.lanes:
        lanes_side_by_side(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        lab = Path(tmp) / "lab"
        common = ["ansible-playbook", "playbooks/sim_lab.yml", "-e", f"sim_lab_dir={lab}", "-e", "sim_lab_count=8"]
        subprocess.run(common, cwd=ROOT, env=_env(), check=True, capture_output=True)
        try:
            best = {}
            for index in range(args.rounds):
                for name, pairs in (("one", ONE), ("four", FOUR)):
                    got = fleet(lab, Path(tmp) / f"runs-{name}-{index}", pairs, args.profile,
                                Path(tmp) / f"times-{name}-{index}.json")
                    if name not in best or got[0] < best[name][0]:
                        best[name] = got
        finally:
            subprocess.run([*common, "-e", "sim_lab_state=absent"], cwd=ROOT, env=_env(), check=False,
                           capture_output=True)
    (one, one_cpu, one_tasks), (four, four_cpu, four_tasks) = best["one"], best["four"]
    cores = os.cpu_count()
    # The fleet cannot verdict before one pair alone does, nor before its own CPU seconds, spread over every
    # core, are done: the ideal this machine allows for that work.
    bound = max(one, four_cpu / cores)
    print(f"machine: {cores} core(s) (os.cpu_count); load average now {os.getloadavg()[0]:.1f}")
    print(f"profile {args.profile}; best of {args.rounds} round(s)")
    print(f"fleet of 1 pair  (2 hosts):          {one:.2f} s to the fleet verdict, {one_cpu:.2f} CPU s "
          f"(every process of the run)")
    print(f"fleet of 4 disjoint pairs (8 hosts): {four:.2f} s to the fleet verdict (one wave), {four_cpu:.2f} CPU s; "
          f"each pair beyond the first adds {(four_cpu - one_cpu) / 3:.2f} CPU s")
    print(f"parallel efficiency 1-pair time / 4-pair time: {one / four:.2f} (ideal 1.0 needs two free cores per "
          f"pair; speedup {4 * one / four:.2f}x over 4 pairs one after the other)")
    print(f"efficiency against what {cores} core(s) allow: {bound / four:.2f} (goal >= 0.8; ideal max(1-pair time, "
          f"{four_cpu:.2f} CPU s / {cores} cores) = {bound:.2f} s)")
    print("where the time goes (seconds per task name, all hosts in lockstep; 4 pairs, 1 pair, growth), top 15:")
    rows = sorted(four_tasks.values(), key=lambda r: -r["seconds"])[:15]
    for row in rows:
        single = one_tasks.get(row["task"], {}).get("seconds", 0.0)
        grown = row["seconds"] - single
        print(f"  {row['seconds']:7.2f} {single:7.2f} {grown:+7.2f}  x{row['count']:<3} {row['task']}")
    for label, tasks, total in (("1 pair", one_tasks, one), ("4 pairs", four_tasks, four)):
        phases = {"plan, preflight and run.json per pair (controller)": 0.0, "waves (hosts)": 0.0, "verdict": 0.0}
        for name, row in tasks.items():
            if name.startswith(("orbite.qualification.runner", "Run one",
                                "Take this lane host", "Set this lane host", "Touch no node")):
                phases["waves (hosts)"] += row["seconds"]
            elif name.startswith(("Verify", "Publish", "Show", "Fail")):
                phases["verdict"] += row["seconds"]
            else:
                phases["plan, preflight and run.json per pair (controller)"] += row["seconds"]
        print(f"{label}: " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
              + f"; ansible-playbook start and exit {total - sum(phases.values()):.1f} s")
    runner = sum(r["seconds"] for name, r in four_tasks.items() if "Wait for the runner" in name)
    print(f"waiting for the runners: {runner:.2f} s of {four:.2f} s (4 pairs); the rest is Ansible's own work")


if __name__ == "__main__":
    main()
