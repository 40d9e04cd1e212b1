"""What a lab pays for a whole qualification: the time to verdict of playbooks/qualification.yml on the local
simulated lab, against the runners' own spans (first child start to last child exit of each case, from the
supervisor journals the run fetched) and against the critical path of the schedule the run followed (the wall time
during which at least one case's runners ran); with where each case's fixed cost goes (inside its supervisors but
outside its runners, and between one case's supervisors and the next's) and the playbook's costliest tasks.

    .venv/bin/python bench/bench_qualification.py [--only ID,ID,...] [--top N] [--keep DIR] [--rnics 4] [--lanes]

--rnics 4 runs on a lab of 4-RNIC hosts (two lanes a host pair, docs/qualification.md "Concurrent cases"); --lanes
runs the qualification twice on that one lab, orbite_case_schedule serial then lanes, and prints both side by side.

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


def _lab(base, rnics, state="present"):
    """Create (or destroy) the bench's sim lab; its inventory: the generated one, or inventories/sim's."""
    lab = Path(base) / "lab"
    extra = ["-e", f"sim_lab_rnics={rnics}"] if rnics != 2 else []
    _playbook(["playbooks/sim_lab.yml", "-e", f"sim_lab_dir={lab}", "-e", f"sim_lab_state={state}", *extra], _env(),
              check=state == "present")
    return lab, (lab / "inventory.yml") if rnics != 2 else "inventories/sim"


def qualification(base, lab, inventory, only, schedule=None):
    """(seconds to verdict, run directory, per-task times): one qualification.yml run on the bench's lab."""
    runs, times = Path(base) / "runs", Path(base) / "times.json"
    env = _env(ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "bench" / "callback_plugins"),
               ANSIBLE_CALLBACKS_ENABLED="task_times")
    extra = ["-e", f"orbite_output_dir={runs}"] + (["-e", f"orbite_case_only={only}"] if only else [])
    extra += ["-e", f"orbite_case_schedule={schedule}"] if schedule else []
    started = time.monotonic()
    result = _playbook(["-i", str(inventory), "playbooks/qualification.yml", "-e", f"sim_lab_dir={lab}", *extra],
                       dict(env, ORBITE_TASK_TIMES=str(times)), check=False)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        _lab(Path(lab).parent, 2, "absent")
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


def figures(elapsed, run_dir, tasks):
    """What one run cost: its time to verdict, the runners' spans, the critical paths and the fixed costs."""
    windows = case_windows(run_dir)
    spans = {case: w["runners"][1] - w["runners"][0] for case, w in windows.items()}
    ordered = sorted(windows.values(), key=lambda w: w["supervisors"][0])
    schedule_path = run_dir / "schedule.json"
    plan = json.loads(schedule_path.read_text()) if schedule_path.is_file() else None
    verdict = json.loads((run_dir / "verdict.json").read_text())
    return {
        "elapsed": elapsed, "count": len(windows), "spans": spans, "runners": sum(spans.values()),
        "critical": busy_time(w["runners"] for w in windows.values()),
        "inside": sum((w["supervisors"][1] - w["supervisors"][0]) - spans[case] for case, w in windows.items()),
        "between": sum(max(0.0, b["supervisors"][0] - a["supervisors"][1]) for a, b in zip(ordered, ordered[1:])),
        "supervised": busy_time(w["supervisors"] for w in windows.values()),
        "plan": plan, "tasks": tasks, "verdict": verdict["verdict"],
        "findings": {(c["case"], f["code"], f["status"]) for c in verdict["cases"] for f in c["findings"]},
    }


def report(fig, top, label=""):
    runners, critical, count, elapsed = fig["runners"], fig["critical"], fig["count"], fig["elapsed"]
    outside = elapsed - fig["supervised"] - fig["between"]
    plan = fig["plan"]
    head = f"[{label}] " if label else ""
    print(f"{head}qualification.yml, {count} cases, to verdict:  {elapsed:7.2f} s   verdict {fig['verdict']}")
    print(f"runners' own spans, summed:                 {runners:7.2f} s   ratio {elapsed / runners:.2f}x "
          f"(goal <= {GOAL_RATIO}x)")
    print(f"critical path of the schedule (runners busy): {critical:6.2f} s   ratio {elapsed / critical:.2f}x "
          f"({'cases overlapped' if critical < runners - 0.01 else 'serial: no two cases overlapped'})")
    if plan:
        print(f"schedule: {plan['mode']}, {len(plan['lanes'])} lane(s), {len(plan['slots'])} slot(s); estimated "
              f"critical path {plan['critical_path']:.2f} of {plan['total']:.2f} (sum of the cases' estimates)")
    # Overlapping cases: the wall time no runner ran, not the summed spans, is what the schedule leaves to pay.
    print(f"fixed cost per case (time to verdict less the runners' busy time): {(elapsed - critical) / count:.2f} s, "
          "of which")
    print(f"  inside its supervisors, outside its runners: {fig['inside'] / count:.2f} s  (start, launch, wait, "
          "fetch, stop)")
    print(f"  between one case's supervisors and the next: {fig['between'] / max(1, count - 1):.2f} s  (controller: "
          "plan, deploy check, identity, the next supervisor's start)")
    print(f"  before the first and after the last (preflight, build, deploy, verify, reports), spread over the "
          f"cases: {outside / count:.2f} s ({outside:.2f} s in all)")
    slowest = sorted(fig["spans"].items(), key=lambda item: -item[1])[:5]
    print("longest runner spans: " + ", ".join(f"{case} {span:.2f} s" for case, span in slowest))
    if top > 0:
        print(f"the playbook's costliest tasks (all hosts, all cases; top {top}):")
        for row in fig["tasks"][:top]:
            print(f"  {row['seconds']:7.2f}  x{row['count']:<4} {row['task']}")


def compare(serial, lanes):
    """serial against lanes, one line each, and whether the verdicts are the same finding by finding."""
    print("schedule   to verdict   runners summed   runners busy   ratio to spans")
    for label, fig in (("serial", serial), ("lanes", lanes)):
        print(f"{label:<9} {fig['elapsed']:9.2f} s {fig['runners']:13.2f} s {fig['critical']:12.2f} s "
              f"{fig['elapsed'] / fig['runners']:13.2f}x")
    print(f"lanes' time to verdict: {lanes['elapsed'] / serial['elapsed']:.2f}x serial's; verdicts "
          f"{serial['verdict']} / {lanes['verdict']}, findings "
          f"{'identical' if serial['findings'] == lanes['findings'] else 'DIFFERENT'} "
          f"({len(serial['findings'])} (case, code, status))")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="orbite_case_only: some of the cases, by ID (default: all)")
    parser.add_argument("--top", type=int, default=15, help="how many of the costliest tasks to print (0: none)")
    parser.add_argument("--keep", type=Path, help="copy the run directory and the task times here")
    parser.add_argument("--rnics", type=int, choices=(2, 4), default=2, help="RNICs a host of the lab (4: two lanes)")
    parser.add_argument("--lanes", action="store_true", help="run serial, then lanes, on the one lab, side by side")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (1 min) at the start")
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        lab, inventory = _lab(tmp, args.rnics)
        for label in (("serial", "lanes") if args.lanes else ("",)):
            base = Path(tmp) / (label or "run")
            base.mkdir()
            elapsed, run_dir, tasks = qualification(base, lab, inventory, args.only, label or None)
            runs[label] = figures(elapsed, run_dir, tasks)
            if args.keep:
                shutil.copytree(run_dir, args.keep / run_dir.name, dirs_exist_ok=True)
                (args.keep / f"times{'-' + label if label else ''}.json").write_text(json.dumps(tasks, indent=1) + "\n")
        _lab(tmp, args.rnics, "absent")
    for label, fig in runs.items():
        report(fig, args.top, label)
    if args.lanes:
        compare(runs["serial"], runs["lanes"])
    print(f"machine: load average {os.getloadavg()[0]:.1f} (1 min) at the end")


if __name__ == "__main__":
    main()
