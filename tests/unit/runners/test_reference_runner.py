"""The native reference runner (runners/reference) against the loopback verbs provider.

Two real processes of the release build, each a child of a real lock supervisor on its fake host
(tests/helpers/sim_pair.py, the gate's way: binary pinned as argv[0] and run from its sealed copy,
case file pinned and journaled, the real accounting observer preloaded into the requester), and the
receipts judged by the project's verifier with the same rules as the simulated runner's: no
special case. Both dialects of the data path: the shipped build (ibv_post_send / ibv_poll_cq) and
the extended build (cargo feature verbs-ex: ibv_wr_* / ibv_start_poll), with the same receipts and
observer logs; observers that see only the classic calls fail the extended build's accounting by
name. Plus the contract's edges (exit codes, case errors, a killed runner's checkpoint).
Loopback only: run in a network namespace of its own (unshare -n).
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import observer_log, sim_pair
from helpers.reference_runner import CRATE, REPO, cargo_available, reference_runner
from helpers.sim_pair import FAULT_MODE_GROUPS, RAIL_ACCOUNTING, SMALL_HOST, exit_codes, run_pair

from ansible_collections.orbite.qualification.plugins.module_utils._common.files import sha256_file
from ansible_collections.orbite.qualification.plugins.module_utils._verify import rules
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "sim"))
import sim_harness as H

pytestmark = pytest.mark.skipif(not cargo_available(), reason="needs cargo and a C compiler")
WRITE_EVENTS_HOST = dict(SMALL_HOST, operation="write", rdma_events=True)
WRITE_EVENTS_ACCOUNTING = dict(RAIL_ACCOUNTING, operation="write", rdma_events=True)
# Each dialect's pairs: read/polling and write/events, with the accounting observer preloaded
# (rail accounting) and without (installed-host); discovery once.
PAIRS = {"classic": {"ra": RAIL_ACCOUNTING, "raw": WRITE_EVENTS_ACCOUNTING, "ih": WRITE_EVENTS_HOST,
                     "rad": dict(RAIL_ACCOUNTING, discovery="auto")},
         "extended": {"ra": RAIL_ACCOUNTING, "raw": WRITE_EVENTS_ACCOUNTING, "ih": WRITE_EVENTS_HOST}}


@pytest.fixture(scope="module")
def runner():
    return reference_runner()


@pytest.fixture(scope="module")
def extended_runner():
    return reference_runner(extended=True)


def _run_pairs(run_dir, dialect, runner):
    for case_id, profile in PAIRS[dialect].items():
        run_pair(run_dir, case_id, profile, runner=runner)
    return run_dir


@pytest.fixture(scope="module")
def healthy(tmp_path_factory, runner):
    return _run_pairs(tmp_path_factory.mktemp("native") / "run", "classic", runner)


@pytest.fixture(scope="module")
def extended(tmp_path_factory, extended_runner):
    return _run_pairs(tmp_path_factory.mktemp("native-ex") / "run", "extended", extended_runner)


@pytest.mark.parametrize("dialect", ["classic", "extended"])
def test_native_pair_passes_every_rule(request, dialect):
    run_dir = request.getfixturevalue("healthy" if dialect == "classic" else "extended")
    runner = request.getfixturevalue("runner" if dialect == "classic" else "extended_runner")
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["verdict"] == "PASS", verdict["failed_codes"]
    assert verdict["runner_kind"] == "native"
    codes = {f["code"] for case in verdict["cases"] for f in case["findings"]}
    # Discovery's rules need the discovery pair, which the classic dialect runs (it opens no data path).
    left_out = FAULT_MODE_GROUPS + (() if "rad" in PAIRS[dialect] else ("discovery",))
    assert {r.code for r in rules.RULES if r.group not in left_out} <= codes
    for case in PAIRS[dialect]:
        assert exit_codes(run_dir / "cases" / case) == {"source": 0, "requester": 0}
        ledger = json.loads((run_dir / "cases" / case / "requester" / "g1" / "ledger.json").read_text())
        assert ledger["runner"]["kind"] == "native" and ledger["runner"]["defects"] == []
        assert ledger["verbs_library"]["dialect"] == dialect
        # The supervisor ran the pinned binary from its sealed copy, never the installed file.
        journal = (run_dir / "cases" / case / "requester" / "journal.jsonl").read_text()
        assert runner["sha256"] in journal
        _second_witnesses(run_dir / "cases" / case)


@pytest.mark.parametrize("case", ["ra", "raw"])
def test_observer_logs_equal_between_dialects(healthy, extended, case):
    """The same workload leaves the same observer log in both dialects: every WR, completion and digested
    range, QPs named by (rail, lane), WRs by (round, parent, slice) and objects by device (their addresses, QPNs
    and WR IDs are the run's)."""
    classic, ext = (_comparable_log(run_dir / "cases" / case / "requester" / "g1") for run_dir in (healthy, extended))
    assert classic["wr"] and len(classic["wr"]) == len(classic["cqe"]) == len(classic["data"])
    assert classic == ext


def _comparable_log(out):
    """An observer log as multisets of events without what differs between two runs of one workload."""
    ledger = json.loads((out / "ledger.json").read_text())
    lanes = {q["qpn"]: (q["rail"], q["lane"]) for q in ledger["qps"]}
    # WR IDs follow the order the send queues freed up: a WR is its round's (parent, slice).
    slices = {wr_id: (number, parent, piece) for number, rnd in enumerate(ledger["rounds"], 1)
              for wr_id, parent, piece in zip(rnd["wrs"]["wr_id"], rnd["wrs"]["parent"], rnd["wrs"]["slice"])}
    events = {"wr": [], "cqe": [], "data": [], "summary": []}
    for event in observer_log.read(observer_log.find(out))[1:]:
        e = dict(event)
        e["qp"] = lanes.get(e.pop("qpn", None))
        if "wr_id" in e:
            e["wr_id"] = slices[e["wr_id"]]
        for field in ("ctx", "cq"):  # addresses; a WR's device names its context
            e.pop(field, None)
        if e["ev"] == "data":
            # Fresh content per round: the digest is the verifier's to recompute; that one was taken is kept.
            e["hashed"] = e.pop("sha256") is not None
        if e["ev"] == "summary":
            for field in ("max_inflight_per_qp", "max_outstanding_parents_per_qp"):
                e[field] = sorted((lanes[int(q)], n) for q, n in e[field].items())
        events[e.pop("ev")].append(json.dumps(e, sort_keys=True))
    return {kind: sorted(lines) for kind, lines in events.items()}


MISSED_EXTENDED_CALLS = ["accounting.both_rails", "accounting.ledger_join", "accounting.native_bytes",
                         "accounting.outstanding"]


@pytest.fixture(scope="module")
def classic_only_observers(tmp_path_factory):
    """The observers built blind to the extended verbs (OBS_RED_NO_EXTENDED: they wrap only the classic ops)."""
    out = tmp_path_factory.mktemp("classic-only-observers")
    done = subprocess.run(["make", "-s", "-C", str(REPO / "observers"), f"OUT={out}",
                           "OBS_CFLAGS=-DOBS_RED_NO_EXTENDED", "all"], capture_output=True, text=True, timeout=240,
                          check=False)
    assert done.returncode == 0, done.stderr
    return {tool: {"path": str(out / f"liborbite_{tool}.so"), "sha256": sha256_file(str(out / f"liborbite_{tool}.so"))}
            for tool in ("accounting", "cq_fault", "uverbs_fault")}


@pytest.mark.parametrize("dialect, failed", [("classic", []), ("extended", MISSED_EXTENDED_CALLS)])
def test_observers_blind_to_extended_calls_fail_the_case_by_name(request, monkeypatch, tmp_path,
                                                                  classic_only_observers, dialect, failed):
    """Red check: observers that wrap only ops.post_send / ops.poll_cq see every WR of the classic build
    and none of the extended build's, and the verifier names the accounting rules that lost their witness."""
    runner = request.getfixturevalue("runner" if dialect == "classic" else "extended_runner")
    real = sim_pair.artifacts
    monkeypatch.setattr(sim_pair, "artifacts", lambda r=None: dict(real(r), observers=classic_only_observers))
    run_pair(tmp_path / "run", "ra", RAIL_ACCOUNTING, runner=runner)
    verdict = verify_run(str(tmp_path / "run"), write=False)
    assert sorted(verdict["failed_codes"]) == failed


def _second_witnesses(case_dir):
    """The source's figures are its provider's per-context counters (never the requester's word), both
    peers' grant lists are their own, and every round's guard seed is fresh."""
    source, requester = (json.loads((case_dir / role / "g1" / "ledger.json").read_text())
                         for role in ("source", "requester"))
    for ledger in (source, requester):
        assert ledger["verbs_library"]["provider_hooks"] == {"orbite_provider_ctx_counter": True,
                                                             "orbite_provider_qp_outstanding": True}
    moved = "read_bytes_served" if source["operation"] == "read" else "write_bytes_landed"
    destination = requester if source["operation"] == "read" else source
    assert len({rnd["guard_seed"] for rnd in destination["rounds"]}) == 3
    for mine, peer in zip(source["rounds"], requester["rounds"]):
        assert all(p["completed_bytes"] is None for p in mine["parents"])
        # Two counts of the provider: per context (device) and per process (provider).
        assert sum(d[moved] for d in mine["device"].values()) == mine["provider"][moved] > 0
        assert mine["counters"]["public"]["per_rail"] == {r: d[moved] for r, d in mine["device"].items()
                                                          if r in mine["counters"]["public"]["per_rail"]}
        assert mine["drain"]["grants_issued"] == peer["drain"]["grants_received"]
        assert peer["drain"]["grants_returned"] == mine["drain"]["grants_released"]
        assert len(peer["wrs"]["wr_id"]) == peer["counters"]["native"]["wrs"]


def test_rdma_core_offers_no_provider_hooks(runner, tmp_path):
    """The system's rdma-core exports no orbite_provider_* symbol: dlsym finds none, the ledger says so
    (a round would then have no `device` and a drain no `provider_outstanding_wrs`). No RNIC here: exit 3."""
    out = tmp_path / "out"
    done = _run(runner, "--case", _case(tmp_path, verbs_library=None), "--output", str(out))
    assert done.returncode == 3, done.stderr
    ledger = _ledger(out)
    assert ledger["verbs_library"] == {"path": "libibverbs.so.1", "sha256": None, "dialect": "classic",
                                       "provider_hooks": {"orbite_provider_ctx_counter": False,
                                                          "orbite_provider_qp_outstanding": False}}
    assert ledger["errors"][0]["error"] == "Unavailable"


def _case(tmp_path, role="source", **over):
    roots = H.make_hosts()
    extra = {"service_address": "127.0.0.1:0"} if role == "source" else {"peer_address": "127.0.0.1:9"}
    case = H.base_case(H.profile("installed-rail-accounting"), role, roots[0], **extra)
    case.update(over)
    return H.write_case(tmp_path / "case.json", case)


def _run(runner, *argv, env=None, timeout=60):
    return subprocess.run([runner["path"], *argv], capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else {"PATH": "/usr/bin:/bin"}, check=False)


def _ledger(out):
    return json.loads((Path(out) / "ledger.json").read_text())


def test_protocol(runner):
    done = _run(runner, "--protocol")
    assert (done.returncode, done.stdout) == (0, "orbite-installed-host-v4\n")


@pytest.mark.parametrize("over, field", [
    ({"colour": 1}, "colour"),
    ({"profile": dict(H.profile("installed-restart"), fault_role="source", generations=2)}, "profile.mode"),
    ({"defects": ["corrupt_byte"]}, "defects"),
    ({"verbs_library": "wrong sha256"}, "verbs_library.sha256"),
    ({"verbs_library": {"path": "relative.so", "sha256": "0" * 64}}, "verbs_library.path"),
    ({"rails": [{"device": "mlx5_0", "port": 1, "gid_index": 3}]}, "rails"),
    ({"generation": 2}, "generation"),
    # One payload WR past the gate's bound (the profile model's MAX_WRS_PER_ROUND): refused on the runner's side too.
    ({"profile": H.profile(parents=16, payload=2049, block=1)}, "profile.block"),
])
def test_case_errors_exit_2_naming_the_field(runner, tmp_path, over, field):
    if over.get("verbs_library") == "wrong sha256":  # the lab's provider, another hash: never loaded
        over = {"verbs_library": dict(H.native()["verbs_library"], sha256="0" * 64)}
    out = tmp_path / "out"
    done = _run(runner, "--case", _case(tmp_path, **over), "--output", str(out))
    assert done.returncode == 2, done.stderr
    assert f"case field {field} = " in done.stderr
    ledger = _ledger(out)
    assert (ledger["status"], ledger["exit_code"], ledger["errors"][0]["error"]) == ("case_error", 2, "InvalidArgument")
    assert "rails" not in ledger  # nothing was opened


def test_bad_invocations_exit_2(runner, tmp_path):
    assert _run(runner, "--case", "x").returncode == 2
    assert _run(runner, "--frobnicate").returncode == 2
    env = {"PATH": "/usr/bin:/bin", "RDMAV_ALLOW_DISASSOC_DESTROY": "1"}
    done = _run(runner, "--case", _case(tmp_path), "--output", str(tmp_path / "o"), env=env)
    assert done.returncode == 2 and "RDMAV_ALLOW_DISASSOC_DESTROY" in done.stderr


def test_missing_device_is_unavailable_exit_3(runner, tmp_path):
    rails = [{"device": "mlx5_9", "port": 1, "gid_index": 3}, {"device": "mlx5_1", "port": 1, "gid_index": 3}]
    out = tmp_path / "out"
    done = _run(runner, "--case", _case(tmp_path, rails=rails), "--output", str(out))
    assert done.returncode == 3, done.stderr
    ledger = _ledger(out)
    assert ledger["status"] == "failed" and ledger["errors"][0]["error"] == "Unavailable"
    assert "mlx5_9" in ledger["errors"][0]["message"]
    assert ledger["teardown"]["retained_owners"] == 0


def test_unreachable_source_exit_4(runner, tmp_path):
    out = tmp_path / "out"
    done = _run(runner, "--case", _case(tmp_path, "requester", timeouts={"connect_s": 0.5}), "--output", str(out))
    assert done.returncode == 4, done.stderr
    ledger = _ledger(out)
    assert (ledger["status"], ledger["errors"][0]["error"]) == ("failed", "Timeout")
    assert ledger["teardown"]["retained_owners"] == 0 and ledger["teardown"]["contexts_closed"] == 2


def test_killed_runner_leaves_its_checkpoint(runner, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([runner["path"], "--case", _case(tmp_path), "--output", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"})
    try:
        H.wait_ready(proc, out)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ledger = _ledger(out)
    assert (ledger["status"], ledger["exit_code"], ledger["teardown"]) == ("running", None, None)
    assert len(ledger["contexts"]) == 2 and ledger["service_address"].startswith("127.0.0.1:")
    ready = json.loads((out / "ready.json").read_text())
    assert ready["pid"] == proc.pid and ready["service_address"] == ledger["service_address"]


def test_crate_unit_tests_and_format():
    target = Path(CRATE).parents[1] / "tests" / "output" / "reference-runner" / "unit"
    env = dict(os.environ, CARGO_TARGET_DIR=str(target))
    for argv in (["cargo", "fmt", "--check"], ["cargo", "test", "--offline", "--locked", "--quiet"]):
        done = subprocess.run(argv, cwd=CRATE, capture_output=True, text=True, env=env, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


# --- red checks: defects compiled into the test build only (cargo feature test-defects) ----------

NATIVE_DEFECTS = [
    ("overwrite_guard", RAIL_ACCOUNTING, "ledger.guards", {"requester": 1, "source": 0}),
    ("corrupt_byte", WRITE_EVENTS_HOST, "ledger.bytes", {"requester": 0, "source": 1}),
    ("skip_guard_check", RAIL_ACCOUNTING, "ledger.guards", {"requester": 0, "source": 0}),
    ("exceed_sq_depth", RAIL_ACCOUNTING, "qps.sq_depth", {"requester": 0, "source": 0}),
]


@pytest.mark.parametrize(("defect", "profile", "code", "codes"), NATIVE_DEFECTS,
                         ids=[f"{d}-{p['operation']}" for d, p, _c, _e in NATIVE_DEFECTS])
def test_test_build_defect_fails_exactly_its_rule(tmp_path, defect, profile, code, codes):
    run_dir = tmp_path / "run"
    case_dir = run_pair(run_dir, "case", profile, defects=[defect], runner=reference_runner(defects=True))
    assert exit_codes(case_dir) == codes
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["failed_codes"] == ["run.diagnostic", code]  # a run with a defect switch is never a PASS
