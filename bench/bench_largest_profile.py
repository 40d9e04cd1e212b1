"""The largest work the preflight accepts, end to end on the local simulated lab: the installed-host gate (or the
peer-restart gate's three-generation case) with the most parents, the largest payload the backing bound leaves them,
the most lanes, both rails and the smallest block the bound on WRs per round allows; prints the time to verdict, the
runners' own spans (from the supervisor journals), and the verifier's time and peak memory measured again on its own
over the run's receipts (a fresh process).

Goals (issue 34): it completes with PASS; the verifier stays within 5% of the time to verdict and under 1 GiB.

    .venv/bin/python bench/bench_largest_profile.py [--mode host|restart] [--operation read|write] [--keep DIR]

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
sys.path[:0] = [str(ROOT / ".collections"), str(Path(__file__).resolve().parent)]

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model as pm  # noqa: E402
from bench_qualification import _env, _playbook, case_windows  # noqa: E402 - the same journal reading

VERIFIER_SHARE_GOAL = 0.05
VERIFIER_MEMORY_GOAL = 1 << 30

# Verifies a run directory in a fresh interpreter: prints seconds, peak RSS in bytes, the verdict.
VERIFY = (
    "import json, resource, sys, time\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run\n"
    "started = time.perf_counter()\n"
    "result = verify_run(sys.argv[2], output_dir=sys.argv[3], write=True)\n"
    "seconds = time.perf_counter() - started\n"
    "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024\n"
    "print(json.dumps([seconds, peak, result['verdict'], result['failed_codes']]))\n"
)


# Each --mode: its playbook, the case it runs (None: the playbook's one case) and the profile fields of the mode.
MODES = {
    "host": ("installed_host.yml", None, {"mode": "installed-host"}),
    "restart": ("restart.yml", "requester-g3-read-polling",
                {"mode": "installed-restart", "fault_role": "requester", "generations": 3}),
}


def largest_profile(mode, operation):
    """The profile of ``mode`` with the most work the preflight accepts (checked with the profile model)."""
    parents, lanes = pm.MAX_PARENTS, pm.MAX_LANES
    low, high = pm.MIN_PAYLOAD, pm.MAX_PAYLOAD  # the largest payload the backing bound leaves (it grows with it)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if pm.backing_per_peer(parents, middle) <= pm.MAX_BACKING_PER_PEER else (
            low, middle - 1)
    payload = low
    # The smallest block whose slices (ceil(payload / block) per parent, as the preflight counts) keep to the bound.
    block = -(-payload // (pm.MAX_WRS_PER_ROUND // parents))
    profile = {"source": "sim-a", "requester": "sim-b", "source_kind": "cpu", "requester_kind": "cpu",
               "transport": "rdma", "operation": operation, "rdma_events": False,
               "parents": parents, "payload": payload, "block": block, "num_lanes": lanes, "mask": 3, **MODES[mode][2]}
    pm.validate_profile(profile)  # raises, naming the field, when the bounds above are not the preflight's
    return profile


def gate(base, profile_path, mode):
    """(seconds to verdict, run directory): the mode's gate on a fresh sim lab."""
    playbook, case, _fields = MODES[mode]
    lab, runs = Path(base) / "lab", Path(base) / "runs"
    common = ["-e", f"sim_lab_dir={lab}"]
    env = _env()
    _playbook(["playbooks/sim_lab.yml", *common], env)
    started = time.monotonic()
    only = ["-e", f"orbite_case_only={case}"] if case else []
    result = _playbook(["-i", "inventories/sim", f"playbooks/{playbook}", *common, *only,
                        "-e", f"orbite_output_dir={runs}", "-e", f"orbite_profile_file={profile_path}"], env,
                       check=False)
    elapsed = time.monotonic() - started
    _playbook(["playbooks/sim_lab.yml", *common, "-e", "sim_lab_state=absent"], env, check=False)
    if result.returncode != 0:
        sys.exit(f"{playbook} failed (rc {result.returncode}):\n{result.stdout[-3000:]}")
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    return elapsed, run_dir


def verify_alone(run_dir, out_dir):
    done = subprocess.run([sys.executable, "-c", VERIFY, str(ROOT / ".collections"), str(run_dir), str(out_dir)],
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="host")
    parser.add_argument("--operation", choices=("read", "write"), default="read")
    parser.add_argument("--keep", type=Path, help="copy the run directory here")
    args = parser.parse_args()
    profile = largest_profile(args.mode, args.operation)
    workload = pm.derive_workload(pm.validate_profile(profile))
    with tempfile.TemporaryDirectory() as tmp:
        profile_path = Path(tmp) / "largest.json"
        profile_path.write_text(json.dumps(profile, indent=1) + "\n")
        elapsed, run_dir = gate(tmp, profile_path, args.mode)
        windows = case_windows(run_dir)
        seconds, peak, verdict, failed = verify_alone(run_dir, Path(tmp) / "verify-alone")
        receipts = sum(p.stat().st_size for p in (run_dir / "cases").rglob("*") if p.is_file())
        if args.keep:
            shutil.copytree(run_dir, args.keep / run_dir.name, dirs_exist_ok=True)
    runners = sum(w["runners"][1] - w["runners"][0] for w in windows.values())
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (1 min) at the end")
    print(f"profile: {profile['mode']}, {profile.get('generations', 1)} generation(s), {profile['parents']} parents "
          f"x {profile['payload']} B, block {profile['block']} B, "
          f"{profile['num_lanes']} lanes, mask {profile['mask']}, {profile['operation']}: "
          f"{workload['wrs_per_round']} WRs and {workload['bytes_per_round'] / (1 << 20):.0f} MiB a round, "
          f"{workload['total_rounds']} rounds")
    print(f"to verdict ({MODES[args.mode][0]}):".ljust(33) + f"{elapsed:8.2f} s")
    print(f"runners' own spans:              {runners:8.2f} s")
    print(f"receipts fetched:                {receipts / (1 << 20):8.1f} MiB")
    print(f"verifier alone (fresh process):  {seconds:8.2f} s = {100 * seconds / elapsed:.1f}% of the time to "
          f"verdict (goal <= {100 * VERIFIER_SHARE_GOAL:.0f}%)")
    print(f"verifier peak memory:            {peak / (1 << 20):8.0f} MiB (goal < {VERIFIER_MEMORY_GOAL >> 20} MiB)")
    print(f"verdict: {verdict}" + (f" ({', '.join(failed)})" if failed else ""))
    if verdict != "PASS":
        sys.exit(1)


if __name__ == "__main__":
    main()
