"""Two simulated runners (real processes, loopback) against the runner contract.

The expected figures come from the profile arithmetic done here and from the profile model
(plugins/module_utils/_profile/model.py), never from the runner: the runner only counts.
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from helpers.paths import FIXTURES
from helpers.receipts import wr_rows

sys.path.insert(0, str(FIXTURES / "sim"))
import sim_harness as H

sys.path.insert(0, str(H.REPO / "sim"))
from orbite_sim import content as sim_content

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model as profile_model

LEDGER = H.validator("runner-ledger")
ZERO_PROVIDER = dict.fromkeys(("read_bytes_landed", "read_bytes_served", "write_bytes_sent", "write_bytes_landed",
                               "wr_completed", "wr_failed"), 0)
# (the requester's, the source's) provider byte counter per operation
PROVIDER_BYTES = {"read": ("read_bytes_landed", "read_bytes_served"),
                  "write": ("write_bytes_sent", "write_bytes_landed")}
OBSERVER = H.validator("observer-log")
READY = H.validator("runner-ready")
MIB = 1 << 20


def expected_slices(payload, block):
    """The gate's slicing, written out again here: max(1, payload // block) slices, last takes the rest."""
    count = max(1, payload // block)
    return [block] * (count - 1) + [payload - block * (count - 1)]


def assert_valid(result):
    for role in ("source", "requester"):
        LEDGER.validate(result[role])
    READY.validate(result["ready"])
    for line in result["observer"]:
        OBSERVER.validate(line)


def assert_healthy(result, prof):
    """Every contract fact of a healthy three-round run, against the arithmetic of ``prof``."""
    assert result["rc"] == {"source": 0, "requester": 0}, result["stderr"]
    assert_valid(result)
    src, req = result["source"], result["requester"]
    assert src["status"] == req["status"] == "complete"
    workload = profile_model.derive_workload(profile_model.validate_profile(prof))
    slices = expected_slices(prof["payload"], prof["block"])
    wrs_per_round = prof["parents"] * len(slices)
    bytes_per_round = prof["parents"] * prof["payload"]
    assert wrs_per_round == workload["wrs_per_round"]
    assert bytes_per_round == workload["bytes_per_round"]
    rails = [r for r in (0, 1) if prof["mask"] & (1 << r)]
    qps_per_peer = len(rails) * prof["num_lanes"]

    # Persistent MRs on both contexts (whatever the mask), registered before round 1.
    for ledger in (src, req):
        assert [c["rail"] for c in ledger["contexts"]] == [0, 1]
        for ctx in ledger["contexts"]:
            assert sorted(m["kind"] for m in ctx["mrs"]) == ["ctrl", "data"]
            assert all(m["registered_round"] == 0 and m["deregistered_round"] == "teardown" for m in ctx["mrs"])
        assert ledger["totals"]["persistent_mrs"] == 4
        assert len(ledger["qps"]) == qps_per_peer
        assert sorted({q["rail"] for q in ledger["qps"]}) == rails
        assert all(q["created_round"] == 1 and q["destroyed_round"] == "teardown" for q in ledger["qps"])
        assert ledger["teardown"]["retained_owners"] == 0 and ledger["teardown"]["drained"]
        assert len(ledger["rounds"]) == 3

    seeds = [r["input_seed"] for r in req["rounds"]]
    assert len(set(seeds)) == 3, "input must be fresh every round"
    assert seeds == [r["input_seed"] for r in src["rounds"]]
    wr_index = {}
    for rr, sr in zip(req["rounds"], src["rounds"]):
        assert set(map(len, sr["wrs"].values())) == {0}  # the source posts no WR: every column empty
        wrs = wr_rows(rr["wrs"])  # the columns (docs/receipts.md 1.6), one object per WR
        assert len(wrs) == wrs_per_round
        assert sum(w["bytes"] for w in wrs) == bytes_per_round
        assert all(w["status"] == "SUCCESS" for w in wrs)
        for w in wrs:
            wr_index[(w["qpn"], w["wr_id"])] = w
        for p in rr["parents"]:
            mine = sorted((w for w in wrs if w["parent"] == p["parent"]), key=lambda w: w["slice"])
            assert [w["bytes"] for w in mine] == slices
            assert {w["qpn"] for w in mine} == {p["qpn"]} and p["rail"] in rails
            assert p["completed_bytes"] == prof["payload"] and p["status"] == "Completed"
        checker = rr if prof["operation"] == "read" else sr
        for p in checker["parents"]:
            assert p["byte_check"] == {"checked_bytes": prof["payload"], "mismatched_bytes": 0,
                                       "first_mismatch": None, "ok": True}
            assert p["guard_check"]["ok"] and p["guard_check"]["guard_bytes"] == profile_model.GUARD_BYTES
        counters = rr["counters"]
        assert counters["public"]["bytes"] == counters["native"]["bytes"] == bytes_per_round
        assert sorted(counters["native"]["per_rail"]) == [str(r) for r in rails]
        for rail in rails:
            per = workload["per_rail"][str(rail)]
            assert counters["public"]["per_rail"][str(rail)] == per["bytes"]
            assert counters["native"]["per_rail"][str(rail)]["bytes"] == per["bytes"]
            assert counters["native"]["per_rail"][str(rail)]["wrs"] == per["wrs"]
        # The source posts nothing and polls nothing (one-sided operations): its native counters are 0;
        # its public bytes are what its own devices served/received (the provider's per-context counters),
        # and it holds no per-parent figure (the requester's word is not relayed).
        assert sr["counters"]["native"] == {"bytes": 0, "wrs": 0, "cqes": 0,
                                            "per_rail": {str(r): {"bytes": 0, "wrs": 0, "cqes": 0} for r in rails}}
        assert sr["counters"]["public"]["bytes"] == bytes_per_round
        assert all(p["completed_bytes"] is None for p in sr["parents"])
        mine, theirs = PROVIDER_BYTES[prof["operation"]]
        for ledger, counter in ((rr, mine), (sr, theirs)):
            assert sorted(ledger["device"]) == ["0", "1"]
            assert {rail: figures[counter] for rail, figures in ledger["device"].items()} == {
                str(r): workload["per_rail"][str(r)]["bytes"] if str(r) in workload["per_rail"] else 0
                for r in (0, 1)}
            assert all(v == 0 for figures in ledger["device"].values() for k, v in figures.items() if k != counter)
        assert sr["counters"]["public"]["per_rail"] == {
            str(r): sr["device"][str(r)][theirs] for r in rails}
        assert rr["counters"]["native"]["wrs"] == rr["counters"]["native"]["cqes"] == wrs_per_round
        # QPs created once, reused afterwards.
        first = rr["round"] == 1
        assert rr["qps_created"] == (qps_per_peer if first else 0)
        assert rr["qps_reused"] == (0 if first else qps_per_peer)
        assert sr["qps_created"] == rr["qps_created"] and sr["qps_reused"] == rr["qps_reused"]
        for usage in rr["qp_usage"]:
            assert 1 <= usage["max_inflight_wrs"] <= profile_model.SEND_QUEUE_DEPTH
        # Drain and batches.
        every = list(range(prof["parents"]))
        zero = {"drained": True, "debt_wrs": 0, "debt_bytes": 0, "debt_grants": 0, "provider_outstanding_wrs": 0}
        assert sr["drain"] == dict(zero, grants_issued=every, grants_released=every)
        assert rr["drain"] == dict(zero, grants_received=every, grants_returned=every)
        # The destination records its guard seed, and the digest of every guard window it wrote.
        assert checker["guard_seed"] is not None and (rr if checker is sr else sr)["guard_seed"] is None
        for p in checker["parents"]:
            lead, trail = sim_content.guard_bytes(checker["guard_seed"], p["parent"])
            assert (p["guard_check"]["leading_sha256"], p["guard_check"]["trailing_sha256"]) == (
                hashlib.sha256(lead).hexdigest(), hashlib.sha256(trail).hexdigest())
        assert rr["batches"][0]["state"] == "Completed" and rr["batches"][0]["free"] == "Ok"
        assert all(p["status"] == "Released" for p in sr["parents"])
        # The provider moved the payload (its own counters, both sides); rendezvous stays small and both
        # sides count the same bytes.
        assert rr["provider"] == dict(ZERO_PROVIDER, **{mine: bytes_per_round, "wr_completed": wrs_per_round})
        assert sr["provider"] == dict(ZERO_PROVIDER, **{theirs: bytes_per_round})
        assert rr["rendezvous"]["bytes_sent"] + rr["rendezvous"]["bytes_received"] < 64 * 1024
        assert rr["rendezvous"]["bytes_sent"] == sr["rendezvous"]["bytes_received"]
        assert rr["rendezvous"]["bytes_received"] == sr["rendezvous"]["bytes_sent"]
        assert rr["progress"]["mode"] == ("events" if prof["rdma_events"] else "polling")

    for ledger in (src, req):  # the provider's own count agrees with the resource table: nothing stays held
        assert ledger["teardown"]["provider_held"] == dict.fromkeys(("ctx", "pd", "mr", "mw", "cq", "channel", "qp"), 0)
        assert ledger["verbs_library"] == H.native()["verbs_library"]

    # Observer log, written by the real native `accounting` preloaded into the requester (its pid, the
    # C tool's format): every accepted payload WR joins the ledger's WR list and its own completion.
    obs = result["observer"]
    assert (obs[0]["schema"], obs[0]["tool"], obs[0]["pid"]) == ("orbite.observer-log", "accounting", req["pid"])
    assert obs[-1]["ev"] == "summary"
    wr_lines = [o for o in obs if o.get("ev") == "wr"]
    assert len(wr_lines) == 3 * wrs_per_round == obs[-1]["accepted_wrs"] == obs[-1]["joined"]
    assert obs[-1]["unjoined"] == 0
    assert {o["status_name"] for o in obs if o.get("ev") == "cqe"} == {"IBV_WC_SUCCESS"}
    devices = {r["rail"]: r["device"] for r in req["rails"]}
    for line in wr_lines:
        ledger_wr = wr_index[(line["qpn"], line["wr_id"])]
        assert line["bytes"] == ledger_wr["bytes"] and line["dev"] == devices[ledger_wr["rail"]]
        assert (line["ctx"], line["cq"]) == (ledger_wr["context"], ledger_wr["cq"])  # "%p" of the objects
        assert line["opcode"] == ("RDMA_READ" if prof["operation"] == "read" else "RDMA_WRITE")
    assert all(v <= profile_model.SEND_QUEUE_DEPTH for v in obs[-1]["max_inflight_per_qp"].values())
    return workload


@pytest.mark.slow
def test_rail_accounting_read_polling_counts_the_seed_figures(tmp_path):
    prof = H.profile("installed-rail-accounting", "read", False)
    result = H.run_pair(tmp_path, prof)
    workload = assert_healthy(result, prof)
    for rnd in result["requester"]["rounds"]:
        assert len(rnd["wrs"]["wr_id"]) == 64 == workload["wrs_per_round"]
        assert sum(rnd["wrs"]["bytes"]) == 67_108_880
        by_rail = {u["rail"]: u for u in rnd["qp_usage"]}
        assert sorted(by_rail) == [0, 1]
        for usage in by_rail.values():  # the rail-accounting rule: >= 2 parents on each rail's shared QP
            assert usage["wrs_posted"] == 32
            assert usage["max_outstanding_parents"] >= workload["min_outstanding_parents_per_rail_qp"]
    # The observer's own record shows several parents in flight on each rail's shared QP too.
    observed = H.observed_parents(result)
    assert len(observed) == 2 and min(observed.values()) >= workload["min_outstanding_parents_per_rail_qp"]


@pytest.mark.slow
def test_rail_accounting_write_events_with_discovery_auto(tmp_path):
    prof = H.profile("installed-rail-accounting", "write", True, discovery="auto")
    result = H.run_pair(tmp_path, prof)
    assert_healthy(result, prof)
    for role in ("source", "requester"):
        disc = result[role]["discovery"]
        assert disc["chosen_nic_ids"] == ["mlx5_0:1", "mlx5_1:1"]
        assert disc["excluded"] == []  # whitelist wins over the identical blacklist
        assert disc["memory_tiers"] == [{"numa_node": 0, "tiers": [["mlx5_0:1"], ["mlx5_1:1"]]},
                                        {"numa_node": 1, "tiers": [["mlx5_1:1"], ["mlx5_0:1"]]}]
        strict = disc["strict_gid_request"]
        assert strict["result"] == "Unavailable" and strict["gid_index"] == 255
        assert strict["retained_owners"] == 0 and strict["owners_acquired"] >= 1
        assert strict["error"]["error"] == "Unavailable" and strict["error"]["expected"] is True
        # The rails are the discovered NICs, on their RoCE v2 IPv4 GIDs (index 3 on the sim hosts).
        assert [(r["device"], r["gid_index"], r["gid_type"]) for r in result[role]["rails"]] == [
            ("mlx5_0", 3, "RoCE v2"), ("mlx5_1", 3, "RoCE v2")]
    assert sum(r["progress"]["cq_events"] for r in result["requester"]["rounds"]) >= 3


@pytest.mark.slow
def test_installed_host_example_counts_96_wrs_a_round(tmp_path):
    prof = H.profile("installed-host", "read", False)
    result = H.run_pair(tmp_path, prof)
    assert_healthy(result, prof)
    for rnd in result["requester"]["rounds"]:
        assert len(rnd["wrs"]["wr_id"]) == 96
        assert sum(rnd["wrs"]["bytes"]) == 100_663_312
        assert len(rnd["qp_usage"]) == 6  # 2 rails x 3 lanes
        assert {(u["rail"], u["lane"]) for u in rnd["qp_usage"]} == {(r, ln) for r in (0, 1) for ln in range(3)}


def test_one_rail_mask_still_registers_both_contexts(tmp_path):
    prof = H.profile("installed-host", "write", True, parents=3, payload=3 * 65536 + 7, block=65536, num_lanes=2,
                     mask=2)
    result = H.run_pair(tmp_path, prof)
    assert_healthy(result, prof)
    req = result["requester"]
    assert {q["rail"] for q in req["qps"]} == {1}
    assert [r["enabled"] for r in req["rails"]] == [False, True]
    assert all(len(c["mrs"]) == 2 for c in req["contexts"])


def test_protocol_flag():
    out = subprocess.run([sys.executable, str(H.RUNNER), "--protocol"], capture_output=True, text=True, check=True)
    assert out.stdout == "orbite-installed-host-v4\n"


def _run_single(tmp_path, case, env=None):
    path = H.write_case(tmp_path / "case.json", case)
    proc = subprocess.run([sys.executable, str(H.RUNNER), "--case", path, "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60, env=env, check=False)
    ledger_path = tmp_path / "out" / "ledger.json"
    ledger = json.loads(ledger_path.read_text()) if ledger_path.exists() else None
    if ledger is not None:
        LEDGER.validate(ledger)
    return proc, ledger


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda c: c.update(role="sink"), "case field role = 'sink': must be 'source' or 'requester'"),
    (lambda c: c["profile"].update(parents=33), "case field profile.parents = 33: must be <= 32"),
    (lambda c: c.update(defects=["melt"]), "case field defects[0] = 'melt': must be one of"),
    (lambda c: c.update(rails=c["rails"][:1]), "case field rails"),
    (lambda c: c.update(colour="red"), "case field colour = 'red': is not a case field"),
    (lambda c: c["profile"].update(mode="installed-inflight-dma", parents=2), "case field profile.parents = 2: must "
     "be one of [1] (installed-inflight-dma)"),
    (lambda c: c.update(defects=["inflight_full_copy"]), "case field defects[0] = 'inflight_full_copy': is an "
     "installed-inflight-dma switch"),
    (lambda c: c["profile"].update(mode="installed-interruption", fault_role="source", generations=2, payload=70000,
                                   block=65536), "case field profile.payload = 70000: must be <= profile.block"),
    (lambda c: c.update(defects=["free_busy_ok"]), "case field defects[0] = 'free_busy_ok': is an "
     "installed-interruption switch"),
    (lambda c: c.update(defects=["fabricate_cqe"]), "case field defects[0] = 'fabricate_cqe': is an "
     "installed-lost-completion switch"),
    (lambda c: c.update(timeouts={"grant_s": 0}), "case field timeouts.grant_s = 0: must be a positive number"),
    (lambda c: c.update(defects=["retry_destroy"]), "case field defects[0] = 'retry_destroy': is an "
     "installed-cleanup-failure switch"),
    (lambda c: c["profile"].update(mode="installed-cleanup-failure", fault_role="requester", generations=2, parents=1,
                                   payload=65536, num_lanes=1, mask=3, cleanup_kind="qp"),
     "case field profile.mask = 3: must be 1 or 2 (installed-cleanup-failure)"),
    (lambda c: c.pop("service_address"), "case field service_address = null: is required"),
    (lambda c: c.update(observers=["cq_fault", "cq_fault"]), "case field observers = [\"cq_fault\", \"cq_fault\"]: "
     "must not repeat a name"),
    (lambda c: c.update(verbs_library={"path": "lib.so", "sha256": "0" * 64}),
     "case field verbs_library.path = 'lib.so': must be an absolute path"),
    (lambda c: c["verbs_library"].update(sha256="ABC"),
     "case field verbs_library.sha256 = 'ABC': must be 64 lower-case"),
    (lambda c: c["verbs_library"].update(extra=1), "case field verbs_library.extra = 1: is not a verbs_library field"),
    (lambda c: c["verbs_library"].update(sha256="0" * 64), "only the pinned library is loaded"),
    (lambda c: c["verbs_library"].update(path="/nonexistent/libibverbs.so.1"),
     "case field verbs_library.path = '/nonexistent/libibverbs.so.1': cannot be opened"),
])
def test_bad_case_is_exit_2_naming_field_value_and_rule(tmp_path, mutate, needle):
    root = H.make_hosts()[0]
    case = H.base_case(H.profile(), "source", root, service_address="127.0.0.1:0")
    mutate(case)
    proc, ledger = _run_single(tmp_path, case)
    assert proc.returncode == 2
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert ledger["status"] == "case_error" and needle in ledger["errors"][0]["message"]


def test_a_symlinked_verbs_library_is_refused(tmp_path):
    """The pinned library is opened without following a symlink: what is hashed is what is named."""
    link = tmp_path / "libibverbs.so.1"
    link.symlink_to(H.native()["verbs_library"]["path"])
    case = H.base_case(H.profile(), "source", H.make_hosts()[0], service_address="127.0.0.1:0")
    case["verbs_library"]["path"] = str(link)
    proc, ledger = _run_single(tmp_path, case)
    assert proc.returncode == 2 and "cannot be opened" in proc.stderr and "not a symlink" in proc.stderr
    assert ledger["status"] == "case_error"


def test_a_verbs_library_that_is_not_the_provider_is_named(tmp_path):
    """rdma-core's own libibverbs lacks the exported forms of the inline verbs the runner calls."""
    system = Path("/usr/lib/x86_64-linux-gnu/libibverbs.so.1")
    if not system.exists():
        pytest.skip("rdma-core's libibverbs.so.1 is not installed here")
    real = system.resolve()
    case = H.base_case(H.profile(), "source", H.make_hosts()[0], service_address="127.0.0.1:0")
    case["verbs_library"] = {"path": str(real), "sha256": hashlib.sha256(real.read_bytes()).hexdigest()}
    proc, ledger = _run_single(tmp_path, case)
    assert proc.returncode == 2 and "is not the loopback verbs provider (no orbite_" in proc.stderr, proc.stderr
    assert ledger["status"] == "case_error"


def test_without_the_preload_no_observer_log_exists(tmp_path):
    """The runner writes no observer log of its own: without the native observer preloaded there is none,
    and the run itself is unchanged (the provider still moves every byte)."""
    prof = H.profile(parents=2, payload=3 * 65536, block=65536, num_lanes=1)
    result = H.run_pair(tmp_path, prof, observers=())
    assert result["rc"] == {"source": 0, "requester": 0}, result["stderr"]
    assert result["observer"] == [] and not list((tmp_path / "out-requester").glob("observer-*"))
    assert [r["provider"]["read_bytes_landed"] for r in result["requester"]["rounds"]] == [2 * 3 * 65536] * 3


def test_unpopulated_gid_is_exit_3_unavailable(tmp_path):
    root = H.make_hosts()[0]
    case = H.base_case(H.profile(), "source", root, service_address="127.0.0.1:0")
    case["rails"] = [dict(H.RAILS[0], gid_index=200), H.RAILS[1]]
    proc, ledger = _run_single(tmp_path, case)
    assert proc.returncode == 3, proc.stderr
    assert ledger["status"] == "failed"
    assert ledger["errors"][0]["error"] == "Unavailable" and "GID index 200" in ledger["errors"][0]["message"]
    assert not (tmp_path / "out" / "ready.json").exists()


def test_unreachable_peer_is_exit_4_and_releases_everything(tmp_path):
    root = H.make_hosts()[1]
    case = H.base_case(H.profile(parents=1, payload=1000, block=1000), "requester", root,
                       peer_address="127.0.0.1:9", timeouts={"connect_s": 0.3})
    proc, ledger = _run_single(tmp_path, case)
    assert proc.returncode == 4, proc.stderr
    assert ledger["errors"][0]["error"] == "Timeout" and ledger["errors"][0]["operation"] == "connect"
    assert ledger["teardown"]["retained_owners"] == 0


def test_disassoc_destroy_env_is_refused(tmp_path):
    root = H.make_hosts()[0]
    case = H.base_case(H.profile(), "source", root, service_address="127.0.0.1:0")
    env = H.env_without()
    env["RDMAV_ALLOW_DISASSOC_DESTROY"] = "1"
    proc = _run_single(tmp_path, case, env=env)[0]
    assert proc.returncode == 2 and "RDMAV_ALLOW_DISASSOC_DESTROY" in proc.stderr


def test_case_schema_accepts_the_harness_cases():
    case_schema = H.validator("runner-case")
    roots = H.make_hosts()
    case_schema.validate(H.base_case(H.profile(), "source", roots[0], service_address="127.0.0.1:0"))
    case_schema.validate(H.base_case(H.profile("installed-rail-accounting", discovery="auto"), "requester",
                                     roots[1], peer_address="127.0.0.1:4000", observers=["accounting"]))
    with pytest.raises(jsonschema.ValidationError):  # pins and discovery together
        case_schema.validate(H.base_case(H.profile(discovery="auto"), "source", roots[0],
                                         service_address="127.0.0.1:0", rails=H.RAILS))


def test_wrong_registration_is_refused_by_the_source(tmp_path):
    result = H.run_pair(tmp_path, H.profile(parents=2, payload=4096, block=4096),
                        requester_extra={"peer_registration_id": "reg-somebody-else"})
    assert result["rc"] == {"source": 3, "requester": 3}
    for role in ("source", "requester"):
        LEDGER.validate(result[role])
        assert result[role]["errors"][0]["error"] == "Unavailable"
        assert result[role]["rounds"] == [] and result[role]["teardown"]["retained_owners"] == 0


def test_source_killed_mid_run_gives_peer_lost_not_a_hang(tmp_path):
    roots = H.make_hosts()
    prof = H.profile("installed-rail-accounting")
    source = H.start(H.write_case(tmp_path / "s.json", H.base_case(prof, "source", roots[0],
                                                                   service_address="127.0.0.1:0")), tmp_path / "a")
    procs = [source]
    try:
        ready = H.wait_ready(source, tmp_path / "a")
        req = H.base_case(prof, "requester", roots[1], peer_address=ready["service_address"],
                          timeouts={"round_s": 30})
        requester = H.start(H.write_case(tmp_path / "r.json", req), tmp_path / "b")
        procs.append(requester)
        ledger_a = tmp_path / "a" / "ledger.json"
        while not json.loads(ledger_a.read_text())["rounds"]:  # round 1 checkpointed: kill during round 2
            assert source.poll() is None
        source.kill()
        source.wait()
        rc, _out, err = H.reap(requester, 60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert rc == 4, err
    ledger = json.loads((tmp_path / "b" / "ledger.json").read_text())
    LEDGER.validate(ledger)
    assert ledger["status"] == "failed" and ledger["errors"][0]["error"] == "PeerLost"
    assert ledger["errors"][0]["round"] in (2, 3) and ledger["teardown"]["retained_owners"] == 0
    killed = json.loads((tmp_path / "a" / "ledger.json").read_text())
    assert killed["status"] == "running" and len(killed["rounds"]) >= 1  # the last checkpoint stays


EXAMPLES = FIXTURES / "sim" / "examples"


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir()))
def test_example_receipts_match_the_schemas(name):
    """tests/fixtures/sim/examples (made by make_examples.py from real runs) stay valid receipts."""
    for role in ("source", "requester"):
        LEDGER.validate(json.loads((EXAMPLES / name / f"{role}-ledger.json").read_text()))
    for line in (EXAMPLES / name / "observer-accounting.jsonl").read_text().splitlines():
        OBSERVER.validate(json.loads(line))


def test_the_defect_table_the_preflight_asks_for_is_the_runners_own_check():
    """orbite-sim-runner --defect-table (what the preflight checks a case's own switches against) prints the table
    the runner's case check refuses by: a mode takes the mode-free switches and its own, never another mode's."""
    from orbite_sim import case as sim_case

    sim = Path(sim_case.__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(sim), "--defect-table"], capture_output=True, text=True, check=True)
    table = json.loads(out.stdout)
    assert table == sim_case.defect_table() and set(table) == set(sim_case.SUPPORTED_MODES)
    free = set(sim_case.ALL_DEFECTS) - set(sim_case.SWITCH_MODES)
    assert free == set(sim_case.DEFECTS + sim_case.RESTART_DEFECTS)
    assert set(table[sim_case.LOST_MODE]) == free | set(sim_case.LOST_DEFECTS)
    assert set(table["installed-host"]) == free
