"""The verifier over a run with 1,000,000 observer records: records/s, and where the time goes.

Builds one real rail-accounting case with the simulated runner pair (tests/helpers/sim_pair.py; the
requester has the real accounting observer preloaded) and first times the digest rules on it as it
is (the added time of the second witness for the bytes, goal <= 2 s). Then scales its requester
ledger and accounting observer log to N observer records: N/3 payload WRs, each posted, completed
and hashed (a wr, a cqe and a data record; ``--no-data``: N/2 WRs without data records, the
composition of the first measurement), each round's parents cut into as many slices as it has WRs
(so the hashed ranges cover every payload exactly once in the documented layout, and the digest
coverage places every one of them), at most eight in flight per QP, the ledger listing the same
WRs in its columns (docs/receipts.md 1.6) with counters to match, the log in the binary format as
the gate writes it (observer-accounting.bin; ``--format json`` for JSON lines, .jsonl), and times
result_check's verify_run over it. Prints records/s over the whole verification (goal >=
1,000,000/s), by the wall clock and by the process's CPU time (on a shared box the wall clock also
counts the time other processes held the cores), then the split: reading the log, the ledger, the
replay and each rule. The scaled run has 333,333 WRs where the frozen profile derives 192, so the
rules holding the counts against the profile fail (they still read every record) and the rules
placed after them are masked (listed; the digest coverage is timed on its own); the verdict is not
the point here.

Usage: unshare -n bash -c 'ip link set lo up && .venv/bin/python bench/bench_verifier.py [--records N]
[--format binary|json] [--no-data] [--profile] [--against GIT_REF]' (the simulated pair binds loopback
addresses; run it in a network namespace of its own). ``--against``: the same verification by the
collection at another git ref, alternated with this tree's (on a shared box, compare side by side).
"""

import argparse
import cProfile
import json
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / ".collections"))
sys.path.insert(0, str(REPO / "tests"))

from helpers import observer_log  # noqa: E402
from helpers.sim_pair import RAIL_ACCOUNTING, run_pair  # noqa: E402

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model  # noqa: E402
from ansible_collections.orbite.qualification.plugins.module_utils._verify import loader, reading  # noqa: E402
from ansible_collections.orbite.qualification.plugins.module_utils._verify.case import case_receipts  # noqa: E402
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import (  # noqa: E402
    accounting,
    digests,
)
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run  # noqa: E402

DEPTH = 8  # payload WRs in flight per QP
GUARD = 4096  # docs/content.md: the guard before and after each parent's payload
RECORD = observer_log.RECORD


def _pointer(text):
    return int(text, 16)


def scale(case_dir, records, fmt="binary", with_data=True):
    """Rewrite the requester's ledger and observer log to ``records`` observer records (consistent)."""
    ledger_path = case_dir / "requester" / "g1" / "ledger.json"
    original = observer_log.find(case_dir / "requester" / "g1")
    log_path = original.parent / observer_log.file_name("accounting", fmt)
    ledger = json.loads(ledger_path.read_text())
    header = dict(observer_log.read(original)[0], format="binary", record_bytes=RECORD.size)
    qps = ledger["qps"]
    devices = {rail["rail"]: rail["device"] for rail in ledger["rails"]}
    dev_index = {dev: index for index, dev in enumerate(sorted(set(devices.values())))}
    template = {name: values[0] for name, values in ledger["rounds"][0]["wrs"].items()}
    total_wrs = records // (3 if with_data else 2)
    per_round = [total_wrs // 3 + (1 if i < total_wrs % 3 else 0) for i in range(3)]
    out = [json.dumps(header, separators=(",", ":")).encode() + b"\n"]
    out += [observer_log.text_records({"ev": "dev", "index": i, "dev": dev}) for dev, i in dev_index.items()]
    inflight = {qp["qpn"]: [] for qp in qps}
    ids = {qp["qpn"]: (_pointer(qp["context"]), _pointer(qp["cq"])) for qp in qps}
    wr_id = 0
    max_inflight = {str(qp["qpn"]): 0 for qp in qps}
    digest = bytes(range(32))
    pack = RECORD.pack

    payload, stride = RAIL_ACCOUNTING["payload"], RAIL_ACCOUNTING["payload"] + 2 * GUARD
    arena = RAIL_ACCOUNTING["parents"] * stride
    ranges = {}  # wr_id: (MR offset, length) of its slice

    def complete(qp, key):
        ctx, cq = ids[qp["qpn"]]
        out.append(pack(observer_log.CQE, 0, 0, qp["qpn"], key, ctx, cq, 0, b""))
        if with_data:
            off, size = ranges.pop(key)
            out.append(pack(observer_log.DATA, 0, 0, qp["qpn"], key, off, arena, size, digest))

    for index, count in enumerate(per_round):
        rnd = ledger["rounds"][index]
        wrs, per_rail = [], {}
        parents = len(rnd["parents"])
        for n in range(count):
            wr_id += 1
            qp = qps[n % len(qps)]
            parent, piece = n % parents, n // parents
            pieces = count // parents + (1 if parent < count % parents else 0)  # slices of this parent
            step = payload // pieces
            size = step if piece < pieces - 1 else payload - step * (pieces - 1)
            offset = parent * stride + GUARD + piece * step
            ranges[wr_id] = (offset, size)
            wrs.append(dict(template, wr_id=wr_id, parent=parent, slice=piece, rail=qp["rail"],
                            lane=qp["lane"], qpn=qp["qpn"], context=qp["context"], cq=qp["cq"], bytes=size,
                            status="SUCCESS", local_offset=offset, remote_offset=offset,
                            posted_seq=2 * wr_id, completed_seq=2 * wr_id + 1))  # numbers of a real run's size
            per_rail[str(qp["rail"])] = per_rail.get(str(qp["rail"]), 0) + size
            ctx, cq = ids[qp["qpn"]]
            out.append(pack(observer_log.WR, 1 if template["opcode"] == "RDMA_READ" else 2,
                            dev_index[devices[qp["rail"]]], qp["qpn"], wr_id, ctx, cq, size, b""))
            queue = inflight[qp["qpn"]]
            queue.append(wr_id)
            max_inflight[str(qp["qpn"])] = max(max_inflight[str(qp["qpn"])], len(queue))
            if len(queue) == DEPTH:
                complete(qp, queue.pop(0))
        for qp in qps:  # drain at the end of the round
            while inflight[qp["qpn"]]:
                complete(qp, inflight[qp["qpn"]].pop(0))
        moved = sum(per_rail.values())
        rnd["wrs"] = {name: [wr[name] for wr in wrs] for name in template}  # columns (docs/receipts.md 1.6)
        rnd["counters"]["public"] = {"bytes": moved, "per_rail": per_rail}
        rnd["counters"]["native"] = {"bytes": moved, "wrs": count, "cqes": count, "per_rail": {
            rail: {"bytes": value, "wrs": 0, "cqes": 0} for rail, value in per_rail.items()}}
        rnd["provider"]["read_bytes_landed"] = moved
    out.append(observer_log.text_records({"ev": "summary", "accepted_wrs": total_wrs, "joined": total_wrs,
                                           "unjoined": 0, "max_inflight_per_qp": max_inflight,
                                           "max_outstanding_parents_per_qp": {}}))
    ledger_path.write_text(json.dumps(ledger, separators=(",", ":")))
    data = b"".join(out)
    if fmt == "json":
        data = observer_log.encode(observer_log.decode(data), "json")
    original.unlink()
    log_path.write_bytes(data)
    return log_path, total_wrs * (3 if with_data else 2)  # wr, cqe (and data) events: no header, device, summary


def _timed(function, *args, repeat=1):
    """(result, best seconds of ``repeat`` calls): the best, as other work on the box only adds time.
    The best CPU seconds of this process go to ``CPU`` (by the phase's function name)."""
    best = cpu_best = None
    for _ in range(repeat):
        started, cpu = time.perf_counter(), time.process_time()
        result = function(*args)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        best = elapsed if best is None else min(best, elapsed)
        cpu_best = cpu if cpu_best is None else min(cpu_best, cpu)
    CPU[getattr(function, "__name__", str(function))] = cpu_best
    return result, best


# Best CPU seconds per timed function: on a shared box (other processes holding the cores) the wall
# clock of a phase can be several times its CPU time; the CPU time is what the code itself costs.
CPU = {}


def _digests_over(case_dir, root):
    """Seconds of the digest coverage rule over the case as it is (the Witnessed placement of every range),
    best of 3, with the collector paused as verify_case pauses it (with it running, each of the rule's
    allocations would rescan the million-object receipts: what the bench once reported as 1-4.8 s)."""
    profile = model.validate_profile(json.loads((case_dir / "case.json").read_text())["profile"])
    case = case_receipts(str(case_dir), "ra", profile, model.derive_workload(profile), root=root)
    case.ledger("requester", 1)  # loaded before the clock starts: only the rule is timed
    assert ("requester", 1, "accounting") in case.observer_logs

    def check_coverage():
        case.memo.clear()
        with reading.no_gc():
            return digests.check_coverage(case)

    problems, seconds = _timed(check_coverage, repeat=3)
    assert not problems, problems[:3]  # the scaled ranges tile every payload: the whole walk runs
    return seconds


_ONE_RUN = """
import sys, tempfile, time
sys.path.insert(0, sys.argv[1])
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run
started, cpu = time.perf_counter(), time.process_time()
verdict = verify_run(sys.argv[2], tempfile.mkdtemp())
print(time.process_time() - cpu, time.perf_counter() - started, verdict["verdict"])
"""

# The digest coverage rule alone over the scaled case (masked in the scaled verdict), GC paused as in verify_case.
_ONE_COVERAGE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify import reading
from ansible_collections.orbite.qualification.plugins.module_utils._verify.case import case_receipts
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import digests
case_dir = sys.argv[2] + "/cases/ra"
profile = model.validate_profile(json.load(open(case_dir + "/case.json"))["profile"])
case = case_receipts(case_dir, "ra", profile, model.derive_workload(profile), root=sys.argv[2])
case.ledger("requester", 1)
with reading.no_gc():
    started, cpu = time.perf_counter(), time.process_time()
    problems = digests.check_coverage(case)
    print(time.process_time() - cpu, time.perf_counter() - started, len(problems))
"""


def _tree_of(ref, tmp):
    """A collections path holding the collection's plugins at git ``ref`` (git archive), for ``--against``."""
    tree = Path(tmp) / "against"
    (tree / "ansible_collections" / "orbite").mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "plugins"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree.parent)], input=archive.stdout, check=True)
    (tree / "ansible_collections" / "orbite" / "qualification").symlink_to(tree.parent)
    return tree


def _side_by_side(run_dir, events, ref, tmp, rounds=3):
    """verify_run, then the digest coverage alone, of this tree and of ``ref``, alternated in fresh processes
    over the same run: best CPU and wall seconds of each (the box's other load falls on both alike), and the
    ratios this tree / ``ref``."""
    trees = {"this tree": REPO / ".collections", ref: _tree_of(ref, tmp)}
    for title, script, what in (("verify_run", _ONE_RUN, "verdict"),
                                ("digests.coverage alone", _ONE_COVERAGE, "problems")):
        best = {name: [None, None, None] for name in trees}
        for _ in range(rounds):
            for name, tree in trees.items():
                out = subprocess.run([sys.executable, "-c", script, str(tree), str(run_dir)], capture_output=True,
                                     text=True, check=True).stdout.split()
                cpu, wall = float(out[0]), float(out[1])
                old = best[name]
                best[name] = [min(cpu, old[0] or cpu), min(wall, old[1] or wall), out[2]]
        print(f"side by side, {title} (best of {rounds}, alternated, fresh processes):")
        for name, (cpu, wall, answer) in best.items():
            print(f"  {name:20s} CPU {cpu:5.2f} s ({events / cpu:,.0f} records/s)   wall {wall:5.2f} s "
                  f"({events / wall:,.0f} records/s)   {what} {answer}")
        (cpu, wall, _), (ref_cpu, ref_wall, _) = best.values()
        print(f"  this tree / {ref}: CPU x{cpu / ref_cpu:.2f}, wall x{wall / ref_wall:.2f}")


def _rule_times(verdict, prefix):
    return {f["code"]: f["time"] for case in verdict["cases"] for f in case["findings"]
            if f["code"].startswith(prefix) and "time" in f}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--format", choices=("binary", "json"), default="binary")
    parser.add_argument("--no-data", action="store_true", help="no data records (wr and cqe only)")
    parser.add_argument("--profile", action="store_true", help="also print the top of a cProfile of verify_run")
    parser.add_argument("--against", metavar="GIT_REF", help="also time verify_run of the collection at this git ref "
                        "(e.g. main, HEAD~2) over the same run, alternated with this tree's")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        case_dir = run_pair(run_dir, "ra", RAIL_ACCOUNTING)
        verdict, seconds = _timed(verify_run, str(run_dir), str(Path(tmp) / "out"), repeat=3)
        digests = _rule_times(verdict, "digests.")
        print(f"frozen rail-accounting run ({RAIL_ACCOUNTING['parents']} x {RAIL_ACCOUNTING['payload']:,} B, 3 "
              f"rounds): verify_run {seconds:.2f} s, verdict {verdict['verdict']}; digest checks "
              f"{sum(digests.values()):.2f} s (goal <= 2 s): "
              + ", ".join(f"{code} {t:.3f} s" for code, t in digests.items()))

        started = time.perf_counter()
        log_path, events = scale(case_dir, args.records, args.format, not args.no_data)
        size = log_path.stat().st_size
        print(f"scaled run: {events:,} observer records ({size / 1e6:.1f} MB log, {args.format}"
              f"{', no data records' if args.no_data else ''}) in {time.perf_counter() - started:.1f} s")

        cpu = time.process_time()
        verdict, seconds = _timed(verify_run, str(run_dir), str(Path(tmp) / "out"))
        cpu = time.process_time() - cpu
        print(f"verify_run: {seconds:.2f} s for {events:,} observer records: {events / seconds:,.0f} records/s "
              f"(goal >= 1,000,000/s); verdict {verdict['verdict']}, failed {verdict['failed_codes']}")
        # The process's own CPU time: what the figure would be on a box with a core to itself (on a
        # shared one the wall time also counts the time other processes held the cores).
        print(f"  CPU time {cpu:.2f} s: {events / cpu:,.0f} records/s of CPU time")
        masked = sorted(f["code"] for case in verdict["cases"] for f in case["findings"] if f["status"] == "SKIP")
        if masked:
            print(f"  not run (masked by a failed rule, or not applicable): {', '.join(masked)}")

        _, read_s = _timed(reading.read_bounded, str(log_path), str(run_dir), reading.MAX_LOG_BYTES, repeat=3)
        log, load_s = _timed(loader.load_observer_log, str(log_path), str(run_dir), repeat=3)
        assert log.ok, log.problem
        ledger_path = case_dir / "requester" / "g1" / "ledger.json"
        ledger, ledger_s = _timed(loader.load_ledger, str(ledger_path), str(run_dir), repeat=3)
        def replay():  # what the replay derives from the loaded columns, derived again each time
            for key in ("flow", "wrs", "qp_masks", "inflight"):
                log._cache.pop(key, None)
            return accounting.Replay(log, ledger.data)

        _, replay_s = _timed(replay, repeat=3)
        wrs = log.count(loader.WR)
        print("where the time goes (best of 3 each):")
        print(f"  load the observer log       {load_s:6.2f} s   ({events / load_s:,.0f} records/s; bounded read "
              f"{read_s:.2f} s; CPU {CPU['load_observer_log']:.2f} s)")
        print(f"  load the requester ledger   {ledger_s:6.2f} s   ({ledger_path.stat().st_size / 1e6:.1f} MB, "
              f"{wrs:,} WRs listed in columns, json.loads-bound; CPU {CPU['load_ledger']:.2f} s)")
        print(f"  replay the log              {replay_s:6.2f} s   ({events / replay_s:,.0f} records/s; read by "
              f"every accounting rule; CPU {CPU['replay']:.2f} s)")
        digests_s = _digests_over(case_dir, str(run_dir))
        print(f"  digest coverage over the scaled log {digests_s:.2f} s (CPU {CPU['check_coverage']:.2f} s; in the "
              "verdict it is masked by counters.slicing: 333,333 slices where the profile derives 192)")
        findings = [f for case in verdict["cases"] for f in case["findings"] if "time" in f]
        rules_s = sum(f["time"] for f in findings)
        print(f"  rules                       {rules_s:6.2f} s   (the replay included, once)")
        for found in sorted(findings, key=lambda f: -f["time"])[:8]:
            print(f"    {found['code']:28s}{found['time']:6.2f} s  {found['status']}")
        print(f"  rest (other receipts, reports) {seconds - load_s - ledger_s - rules_s:6.2f} s")
        print(f"without the ledger's share: {events / max(1e-9, seconds - ledger_s):,.0f} records/s (CPU time: "
              f"{events / max(1e-9, cpu - CPU['load_ledger']):,.0f} records/s)")
        if args.against:
            _side_by_side(run_dir, events, args.against, tmp)
        if args.profile:
            profiler = cProfile.Profile()
            profiler.runcall(verify_run, str(run_dir), str(Path(tmp) / "out"))
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
