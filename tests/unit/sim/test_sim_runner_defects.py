"""Each defect switch changes exactly the ledger (and observer-log) facts it is about.

A healthy baseline and a run with one defect are reduced to the same set of facts (volatile values
such as epochs, seeds, QPNs, keys and timings are replaced by what they mean: "same seed as round 1",
"QP number k in creation order", ...). The test then requires that the facts the defect is about did
change and that nothing outside them changed. Red check: removing a defect's branch in
sim/orbite_sim (named per case below) makes its "required" assertion fail.
"""

import json
import re
import sys

import pytest
from helpers.paths import FIXTURES
from helpers.receipts import wr_rows

sys.path.insert(0, str(FIXTURES / "sim"))
import sim_harness as H

LEDGER = H.validator("runner-ledger")
OBSERVER = H.validator("observer-log")

# 8 parents x 4 slices (3 x 64 KiB + 64 KiB + 1), one lane: 16 WRs per rail QP, 4 parents per QP.
SMALL = {"parents": 8, "payload": 4 * 65536 + 1, "block": 65536, "num_lanes": 1}


def small(operation="read", events=False, mask=3):
    return H.profile("installed-host", operation, events, mask=mask, **SMALL)


def _j(value):
    return json.dumps(value, sort_keys=True)


def facts(result):
    """The run reduced to comparable facts: key -> JSON text."""
    out = {}
    req_qp_index = {q["qpn"]: i for i, q in enumerate(result["requester"]["qps"])}
    for role in ("source", "requester"):
        ledger = result[role]
        qp_index = {q["qpn"]: i for i, q in enumerate(ledger["qps"])}
        pre = role
        out[f"{pre}.status"] = ledger["status"]
        out[f"{pre}.exit_code"] = ledger["exit_code"]
        out[f"{pre}.errors"] = _j([e["error"] for e in ledger["errors"]])
        for ctx in ledger["contexts"]:
            out[f"{pre}.ctx{ctx['rail']}.mrs"] = _j(sorted(m["kind"] for m in ctx["mrs"]))
        out[f"{pre}.qps"] = _j([(q["rail"], q["lane"], q["created_round"], q["destroyed_round"], q["max_send_wr"],
                                 q["state"]) for q in ledger["qps"]])
        first_seed = ledger["rounds"][0]["input_seed"]
        for rnd in ledger["rounds"]:
            rp = f"{pre}.r{rnd['round']}"
            out[f"{rp}.seed_same_as_r1"] = _j(rnd["input_seed"] == first_seed)
            out[f"{rp}.seed_origin"] = rnd["seed_origin"]
            for p in rnd["parents"]:
                pp = f"{rp}.p{p['parent']}"
                out[f"{pp}.placement"] = _j((p["rail"], p["lane"], qp_index.get(p["qpn"])))
                out[f"{pp}.bytes"] = _j((p["requested_bytes"], p["completed_bytes"], p["slices"], p["region_offset"]))
                out[f"{pp}.status"] = p["status"]
                out[f"{pp}.byte_check"] = _j(p["byte_check"])
                # The guard windows' digests depend on the round's fresh guard seed: compared as flags.
                out[f"{pp}.guard_check"] = _j(p["guard_check"] and {k: v for k, v in p["guard_check"].items()
                                                                    if not k.endswith("_sha256")})
                out[f"{pp}.error"] = _j(p["error"] and p["error"]["error"])
            out[f"{rp}.wrs"] = _j(sorted((w["parent"], w["slice"], w["rail"], w["lane"], qp_index[w["qpn"]], w["bytes"],
                                          w["local_offset"], w["status"], w["opcode"]) for w in wr_rows(rnd["wrs"])))
            usage = sorted(rnd["qp_usage"], key=lambda u: qp_index[u["qpn"]])
            out[f"{rp}.qp_usage"] = _j([(qp_index[u["qpn"]], u["rail"], u["lane"], u["created"], u["reused"],
                                         u["wrs_posted"], u["cqes"], u["cqes_error"], u["bytes_posted"],
                                         u["bytes_completed"]) for u in usage])
            out[f"{rp}.qp_usage.max_inflight"] = _j([(qp_index[u["qpn"]], u["max_inflight_wrs"]) for u in usage])
            out[f"{rp}.qp_usage.max_parents"] = _j([(qp_index[u["qpn"]], u["max_outstanding_parents"])
                                                    for u in usage])
            out[f"{rp}.qps_created"] = rnd["qps_created"]
            out[f"{rp}.qps_reused"] = rnd["qps_reused"]
            out[f"{rp}.counters.public"] = _j(rnd["counters"]["public"])
            out[f"{rp}.counters.native"] = _j(rnd["counters"]["native"])
            out[f"{rp}.drain"] = _j(rnd["drain"])
            out[f"{rp}.batches"] = _j([(b["state"], b["free"], b["parents"]) for b in rnd["batches"]])
            out[f"{rp}.provider"] = _j(rnd["provider"])
            rv = rnd["rendezvous"]
            out[f"{rp}.rendezvous_large"] = _j(rv["bytes_sent"] + rv["bytes_received"] > 64 * 1024)
            out[f"{rp}.errors"] = _j([e["error"] for e in rnd["errors"]])
        for key, value in ledger["teardown"].items():
            out[f"{pre}.teardown.{key}"] = _j(value)
        for key, value in ledger["totals"].items():
            if not key.startswith("rendezvous_bytes"):
                out[f"{pre}.totals.{key}"] = _j(value)
    obs = result["observer"]
    summary = obs[-1]
    out["observer.wr_lines"] = sum(1 for o in obs if o.get("ev") == "wr")
    out["observer.cqe_lines"] = sum(1 for o in obs if o.get("ev") == "cqe")
    out["observer.summary"] = _j((summary["accepted_wrs"], summary["joined"], summary["unjoined"]))
    out["observer.max_inflight"] = _j(sorted((req_qp_index[int(k)], v)
                                             for k, v in summary["max_inflight_per_qp"].items()))
    out["observer.max_parents"] = _j(sorted((req_qp_index[qpn], v) for qpn, v in H.observed_parents(result).items()))
    return out


_BASELINES = {}


def baseline(tmp_path_factory, prof):
    key = _j(prof)
    if key not in _BASELINES:
        result = H.run_pair(tmp_path_factory.mktemp("baseline"), prof)
        assert result["rc"] == {"source": 0, "requester": 0}, result["stderr"]
        _BASELINES[key] = facts(result)
    return _BASELINES[key]


def changed_keys(base, run):
    return {k for k in set(base) | set(run) if base.get(k) != run.get(k)}


R = r"(source|requester)"
RN = r"r[123]"

# defect -> (profile, required changed keys (regexes that must each match a changed key), allowed
# changed keys (regexes every changed key must match)). The comment names the line the case guards.
CASES = {
    # engine.py Engine.spoil_landed (READ: the requester, at parent 0 slice 0's CQE): arena[start] ^= 0xFF
    "corrupt_byte/read": (small("read"), "corrupt_byte",
                          [r"requester\.r1\.p0\.byte_check", r"requester\.exit_code"],
                          [r"requester\.r1\.p0\.(byte_check|status|error)", r"requester\.(exit_code|status)"]),
    # engine.py Engine.spoil_landed (WRITE: the source, before its ROUND_DONE check): arena[start] ^= 0xFF
    "corrupt_byte/write": (small("write", True), "corrupt_byte",
                           [r"source\.r1\.p0\.byte_check", r"source\.exit_code"],
                           [r"source\.r1\.p0\.(byte_check|status|error)", r"source\.(exit_code|status)"]),
    # engine.py Engine.spoil_landed (READ, at the last slice's CQE): arena[start + payload] ^= 0xFF
    "overwrite_guard/read": (small("read"), "overwrite_guard",
                             [r"requester\.r1\.p0\.guard_check", r"requester\.exit_code"],
                             [r"requester\.r1\.p0\.(guard_check|status|error)", r"requester\.(exit_code|status)"]),
    # engine.py Engine.spoil_landed (WRITE, before the source's check): arena[start + payload] ^= 0xFF
    "overwrite_guard/write": (small("write", True), "overwrite_guard",
                              [r"source\.r1\.p0\.guard_check", r"source\.exit_code"],
                              [r"source\.r1\.p0\.(guard_check|status|error)", r"source\.(exit_code|status)"]),
    # requester.py ensure_qps: wanted.append((self.enabled_rails[0], self.lanes))
    "extra_qp": (small("read"), "extra_qp",
                 [r"requester\.qps", r"source\.qps", r"requester\.r1\.qps_created", r"requester\.r2\.qps_reused"],
                 [rf"{R}\.qps", rf"{R}\.{RN}\.(qps_created|qps_reused|qp_usage|qp_usage\.max_inflight|"
                  r"qp_usage\.max_parents)", rf"{R}\.totals\.qps_created", rf"{R}\.teardown\.qps_destroyed"]),
    # requester.py ensure_qps: the no_qp_reuse branch destroying live QPs
    "no_qp_reuse": (small("read"), "no_qp_reuse",
                    [r"requester\.qps", r"requester\.r2\.qps_created", r"requester\.r3\.qps_reused",
                     r"requester\.totals\.qps_created"],
                    [rf"{R}\.qps", rf"{R}\.r[23]\..*", rf"{R}\.totals\.qps_created",
                     rf"{R}\.teardown\.qps_destroyed", r"observer\.max_(inflight|parents)"]),
    # engine.py native_counters: per_rail[str(skew_rail)]["bytes"] += 1
    "skew_native_counter": (small("read"), "skew_native_counter",
                            [r"requester\.r1\.counters\.native", r"requester\.totals\.native_bytes"],
                            [r"requester\.r1\.counters\.native", r"requester\.totals\.native_bytes"]),
    # source.py finish_round: the skip_drain branch keeping self.grants
    "skip_drain": (small("read"), "skip_drain",
                   [rf"source\.{RN}\.drain", rf"requester\.{RN}\.drain"],
                   [rf"{R}\.{RN}\.drain", rf"source\.{RN}\.p\d+\.status"]),
    # engine.py open: registering only on enabled rails' contexts
    "mr_one_context": (small("read", mask=1), "mr_one_context",
                       [r"requester\.ctx1\.mrs", r"source\.ctx1\.mrs", r"requester\.totals\.persistent_mrs"],
                       [rf"{R}\.ctx1\.mrs", rf"{R}\.totals\.persistent_mrs", rf"{R}\.teardown\.mrs_deregistered"]),
    # engine.py Engine.ship_payload_over_rendezvous (source.py begin_round / requester.py run_round call
    # it): the data side also sends the payload on the rendezvous; the provider still moves it
    "payload_over_rendezvous/read": (small("read"), "payload_over_rendezvous",
                                     [rf"requester\.{RN}\.rendezvous_large", rf"source\.{RN}\.rendezvous_large"],
                                     [rf"{R}\.{RN}\.rendezvous_large"]),
    "payload_over_rendezvous/write": (small("write", True), "payload_over_rendezvous",
                                      [rf"source\.{RN}\.rendezvous_large", rf"requester\.{RN}\.rendezvous_large"],
                                      [rf"{R}\.{RN}\.rendezvous_large"]),
    # engine.py slice_plan: the wrong (ceil) branch
    "wrong_slicing": (small("read"), "wrong_slicing",
                      [r"requester\.r1\.wrs", r"requester\.r1\.p0\.bytes", r"observer\.wr_lines"],
                      [rf"requester\.{RN}\.(wrs|qp_usage|counters\.native|provider)",
                       rf"requester\.{RN}\.p\d+\.bytes", rf"{R}\.totals\.(wrs_posted|cqes|provider)",
                       r"observer\.(wr_lines|cqe_lines|summary)"]),
    # engine.py local_input: the stale_input branch (round 1's seed, no fill_input)
    "stale_input/read": (small("read"), "stale_input",
                         [r"source\.r2\.seed_same_as_r1", r"requester\.r3\.seed_same_as_r1"],
                         [rf"{R}\.r[23]\.seed_same_as_r1"]),
    "stale_input/write": (small("write", True), "stale_input",
                          [r"requester\.r2\.seed_same_as_r1", r"source\.r3\.seed_same_as_r1"],
                          [rf"{R}\.r[23]\.seed_same_as_r1"]),
    # requester.py RequesterEngine.__init__: sq_depth = EXCEEDED_DEPTH (QPs of 9 send WRs, 9 posted)
    "exceed_sq_depth": (small("read"), "exceed_sq_depth",
                        [r"requester\.qps", rf"requester\.{RN}\.qp_usage\.max_inflight", r"observer\.max_inflight"],
                        [r"requester\.qps", rf"requester\.{RN}\.qp_usage\.max_inflight", r"observer\.max_inflight"]),
    # requester.py: understated (QPs of 9 send WRs, 9 posted, each QP record and maximum stating 8)
    "understate_sq_depth": (small("read"), "understate_sq_depth", [r"observer\.max_inflight"],
                            [r"observer\.max_(inflight|parents)", rf"requester\.{RN}\.qp_usage\.max_parents"]),
    # requester.py placement: rails[:1]
    "single_rail": (small("read"), "single_rail",
                    [r"requester\.r1\.p1\.placement", r"requester\.r1\.counters\.public"],
                    [rf"{R}\.{RN}\.(p\d+\.placement|wrs|qp_usage.*|counters\.(public|native))",
                     r"observer\.max_(inflight|parents)"]),
    # requester.py transfer: the serial order and the "one parent in flight" break
    # requester.py transfer: serial in round 2 only (the whole run's maxima unchanged)
    "serial_round_two": (small("read"), "serial_round_two", [r"requester\.r2\.qp_usage\.max_parents"],
                         [r"requester\.r2\.qp_usage\.max_(parents|inflight)"]),
    "serial_parents": (small("read"), "serial_parents",
                       [rf"requester\.{RN}\.qp_usage\.max_parents", r"observer\.max_parents"],
                       # one parent's slices (4) are all a QP can then have in flight
                       [rf"requester\.{RN}\.qp_usage\.max_(parents|inflight)", r"observer\.max_(parents|inflight)"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_defect_changes_exactly_its_facts(tmp_path_factory, name):
    prof, defect, required, allowed = CASES[name]
    base = baseline(tmp_path_factory, prof)
    result = H.run_pair(tmp_path_factory.mktemp(defect), prof, defects=[defect])
    for role in ("source", "requester"):
        LEDGER.validate(result[role])
        assert result[role]["runner"]["defects"] == [defect]
    for line in result["observer"]:
        OBSERVER.validate(line)
    changed = changed_keys(base, facts(result))
    for pattern in required:
        assert any(re.fullmatch(pattern, k) for k in changed), f"{defect}: expected a change matching {pattern}"
    stray = sorted(k for k in changed if not any(re.fullmatch(p, k) for p in allowed))
    assert not stray, f"{defect} changed facts it is not about: {stray}"


def test_defect_table_covers_every_switch():
    sys.path.insert(0, str(H.REPO / "sim"))
    from orbite_sim.case import DEFECTS

    assert {CASES[name][1] for name in CASES} == set(DEFECTS)
    doc = (H.REPO / "docs" / "runner-contract.md").read_text()
    for defect in DEFECTS:
        assert f"| `{defect}` |" in doc, f"{defect} is not documented in docs/runner-contract.md section 7"


def test_two_healthy_runs_have_equal_facts(tmp_path_factory):
    """The fact reduction is stable, so a difference above is the defect's and not noise."""
    prof = small("read")
    base = baseline(tmp_path_factory, prof)
    again = facts(H.run_pair(tmp_path_factory.mktemp("again"), prof))
    assert changed_keys(base, again) == set()
