"""What a lab pays for a whole qualification: the time to verdict of playbooks/qualification.yml on the local
simulated lab, against the runners' own spans (first child start to last child exit of each case, from the
supervisor journals the run fetched) and against the critical path of the schedule the run followed (the wall time
during which at least one case's runners ran); with where each case's fixed cost goes (inside its supervisors but
outside its runners, and between one case's supervisors and the next's) and the playbook's costliest tasks.

    .venv/bin/python bench/bench_qualification.py [--only ID,ID,...] [--top N] [--keep DIR]

Run it in a network namespace of its own with its own ORBITE_WORK_DIR when anything else uses the sim lab's
loopback addresses (the README's developer notes).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_RATIO = 1.25  # issue 34: time to verdict at most 1.25x the runners' own spans on a 2-core machine


def _env(**extra):
    return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
                PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", **extra)


def _playbook(args, env, check=True):
    return subprocess.run(["ansible-playbook", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=check)


def qualification(base, only):
    """(seconds to verdict, run directory, per-task times): one qualification.yml run on a fresh sim lab."""
    lab, runs, times = Path(base) / "lab", Path(base) / "runs", Path(base) / "times.json"
    common = ["-e", f"sim_lab_dir={lab}"]
    env = _env(ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "bench" / "callback_plugins"),
               ANSIBLE_CALLBACKS_ENABLED="task_times")
    _playbook(["playbooks/sim_lab.yml", *common], env)
    extra = ["-e", f"orbite_output_dir={runs}"] + (["-e", f"orbite_case_only={only}"] if only else [])
    started = time.monotonic()
    result = _playbook(["-i", "inventories/sim", "playbooks/qualification.yml", *common, *extra],
                       dict(env, ORBITE_TASK_TIMES=str(times)), check=False)
    elapsed = time.monotonic() - started
    _playbook(["playbooks/sim_lab.yml", *common, "-e", "sim_lab_state=absent"], env, check=False)
    if result.returncode != 0:
        sys.exit(f"qualification.yml failed (rc {result.returncode}):\n{result.stdout[-3000:]}")
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    return elapsed, run_dir, json.loads(times.read_text())


def _events(path):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def case_windows(run_dir):
    """{case: {"supervisors": (first journal_open, last journal_close), "runners": (first child_start, last
    child_exit)}} in journal time (time.time() on the lab's hosts: one clock on one machine)."""
    windows = {}
    for case_dir in sorted((run_dir / "cases").iterdir()):
        events = [e for journal in case_dir.rglob("journal*.jsonl") for e in _events(journal)]
        starts = [e["t"] for e in events if e["ev"] == "child_start"]
        exits = [e["t"] for e in events if e["ev"] == "child_exit"]
        opened = [e["t"] for e in events if e["ev"] == "journal_open"]
        closed = [e["t"] for e in events if e["ev"] in ("journal_close", "supervisor_killed")]
        if not (starts and exits and opened and closed):
            sys.exit(f"case {case_dir.name}: its journals lack child_start/child_exit/journal_open/journal_close")
        windows[case_dir.name] = {"supervisors": (min(opened), max(closed)), "runners": (min(starts), max(exits))}
    return windows


def busy_time(intervals):
    """Wall time covered by at least one of the (start, end) intervals."""
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="orbite_case_only: some of the cases, by ID (default: all)")
    parser.add_argument("--top", type=int, default=15, help="how many of the costliest tasks to print (0: none)")
    parser.add_argument("--keep", type=Path, help="copy the run directory and the task times here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        elapsed, run_dir, tasks = qualification(tmp, args.only)
        windows = case_windows(run_dir)
        if args.keep:
            shutil.copytree(run_dir, args.keep / run_dir.name, dirs_exist_ok=True)
            (args.keep / "times.json").write_text(json.dumps(tasks, indent=1) + "\n")
    spans = {case: w["runners"][1] - w["runners"][0] for case, w in windows.items()}
    runners = sum(spans.values())
    critical = busy_time(w["runners"] for w in windows.values())
    inside = sum((w["supervisors"][1] - w["supervisors"][0]) - spans[case] for case, w in windows.items())
    ordered = sorted(windows.values(), key=lambda w: w["supervisors"][0])
    between = sum(max(0.0, b["supervisors"][0] - a["supervisors"][1]) for a, b in zip(ordered, ordered[1:]))
    supervised = busy_time(w["supervisors"] for w in windows.values())
    outside = elapsed - supervised - between
    count = len(windows)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (1 min) at the end")
    print(f"qualification.yml, {count} cases, to verdict:  {elapsed:7.2f} s")
    print(f"runners' own spans, summed:                 {runners:7.2f} s   ratio {elapsed / runners:.2f}x "
          f"(goal <= {GOAL_RATIO}x)")
    print(f"critical path of the schedule (runners busy): {critical:6.2f} s   ratio {elapsed / critical:.2f}x "
          f"({'cases overlapped' if critical < runners - 0.01 else 'serial: no two cases overlapped'})")
    print(f"fixed cost per case: {(elapsed - runners) / count:.2f} s, of which")
    print(f"  inside its supervisors, outside its runners: {inside / count:.2f} s  (start, launch, wait, fetch, stop)")
    print(f"  between one case's supervisors and the next: {between / max(1, count - 1):.2f} s  (controller: plan, "
          "deploy check, identity, the next supervisor's start)")
    print(f"  before the first and after the last (preflight, build, deploy, verify, reports), spread over the "
          f"cases: {outside / count:.2f} s ({outside:.2f} s in all)")
    slowest = sorted(spans.items(), key=lambda item: -item[1])[:5]
    print("longest runner spans: " + ", ".join(f"{case} {span:.2f} s" for case, span in slowest))
    if args.top > 0:
        print(f"the playbook's costliest tasks (all hosts, all cases; top {args.top}):")
        for row in tasks[:args.top]:
            print(f"  {row['seconds']:7.2f}  x{row['count']:<4} {row['task']}")


if __name__ == "__main__":
    main()
