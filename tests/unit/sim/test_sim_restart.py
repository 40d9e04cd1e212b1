"""installed-restart on the simulated runner pair, end to end through the verifier (docs/restart.md).

The pair runs under real lock supervisors the way roles/runner does it (helpers/sim_restart_pair.py):
the survivor once, the fault role killed by its supervisor at each restart point and replaced. A
healthy run PASSes with every restart rule applied; each defect switch of the simulated runner fails
exactly its rule (beside run.diagnostic, which every run with a switch fails); the rules no runner
switch can break (the controller's kill, the replacement's address, the final teardown, the journal's
kills) are red-checked by editing one fact of a healthy run's receipts.
Red check of the runner side: removing a switch's branch in sim/orbite_sim/engine.py makes its case pass.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from helpers.sim_restart_pair import RESTART_POINT, findings_by_code, healthy_runs, mode_profile, run_restart_pair

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify import reading
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import RULES
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "sim"))
import sim_harness as H

LEDGER = H.validator("runner-ledger")
RESTART_POINT_SCHEMA = H.validator("runner-restart-point")
RESTART_CODES = sorted(r.code for r in RULES if r.group == "restart")
SMALL = {"parents": 4, "payload": 2 * 65536 + 3, "block": 65536, "num_lanes": 2, "mask": 3}


def restart_profile(fault_role, generations, operation="read", events=False, **over):
    return mode_profile("installed-restart", SMALL, fault_role, generations, operation, events, **over)


_findings = findings_by_code


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return healthy_runs(tmp_path_factory, "rs", restart_profile)


@pytest.mark.parametrize("fault", ["source", "requester"])
def test_a_healthy_restart_passes_with_every_restart_rule_applied(healthy, fault):
    verdict = verify_run(str(healthy[fault]), write=False)
    assert verdict["verdict"] == "PASS", verdict["failed_codes"]
    findings = _findings(verdict)
    assert "case.mode_unverified" not in findings
    assert RESTART_CODES == ["restart.kill_point", "restart.replacement", "restart.restart_point",
                             "restart.retired", "restart.stale_no_effect", "restart.stale_refused",
                             "restart.survivor", "restart.teardown"]
    for code in [*RESTART_CODES, "journal.children", "identity.processes", "identity.epochs", "qps.reuse",
                 "ledger.exit", "ledger.errors"]:
        assert findings[code]["status"] == "PASS", (code, findings[code])


def _grown(data, per_wr_part, wrs, most):
    """(bytes, JSON values) of a receipt whose ``per_wr_part`` (bytes) grows with the payload WRs, from ``wrs`` to
    ``most``; the rest stays as it is."""
    values = reading.measure(data, lines=True)[1]
    part_values = reading.measure(per_wr_part, lines=True)[1]
    scale = most / wrs
    return len(data) + len(per_wr_part) * (scale - 1), values + part_values * (scale - 1)


def test_the_verifiers_caps_hold_the_largest_case_the_gate_allows_with_room(healthy):
    """The verifier's side of MAX_WRS_PER_ROUND: the receipts that grow with the WRs (a ledger's WR columns, the
    survivor's three observer records per WR, JSON lines: the larger format) grown from this run's to the bound in
    every round one process lives (the most generations, 3 rounds each) stay within 3/4 of each cap."""
    case = healthy["source"] / "cases" / "c1"
    profile = json.loads((case / "case.json").read_text())["profile"]
    assert profile["generations"] == 3  # the most any mode allows
    most = model.MAX_WRS_PER_ROUND * model.ROUNDS_PER_GENERATION * profile["generations"]
    case_bytes = case_values = 0
    for path in sorted(p for p in case.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".jsonl" and path.name.startswith("observer-"):
            lines = data.splitlines(keepends=True)
            per_wr = b"".join(line for line in lines if json.loads(line).get("ev") in ("wr", "cqe", "data"))
            wrs = sum(json.loads(line).get("ev") == "wr" for line in lines)
            size, values = _grown(data, per_wr, wrs, most)
            assert size <= 0.75 * reading.MAX_LOG_BYTES and values <= 0.75 * reading.MAX_VALUES, (path, size, values)
        elif path.name == "ledger.json" and json.loads(data).get("rounds"):
            rounds = json.loads(data)["rounds"]
            per_wr = "".join(json.dumps(r["wrs"], separators=(",", ":")) for r in rounds).encode()
            wrs = sum(len(r["wrs"]["wr_id"]) for r in rounds)
            size, values = _grown(data, per_wr, wrs, most / profile["generations"]) if wrs else (len(data), 0)
            assert size <= 0.75 * reading.MAX_DOCUMENT_BYTES and values <= 0.75 * reading.MAX_VALUES, (path, size)
        else:
            size, values = len(data), 0
        case_bytes, case_values = case_bytes + size, case_values + values
    assert case_bytes <= 0.75 * reading.MAX_CASE_BYTES and case_values <= 0.75 * reading.MAX_CASE_VALUES


def test_the_receipts_show_the_restart_the_seed_describes(healthy):
    """Survivor: one pid, epoch and MR set; fault role: a new pid and epoch per generation, killed by SIGKILL;
    every earlier epoch refused in both operations with no effect; each ledger valid against its schema."""
    case_dir = healthy["source"] / "cases" / "c1"
    ledgers = {(role, g): json.loads((case_dir / role / f"g{g}" / "ledger.json").read_text())
               for role in ("source", "requester") for g in (1, 2, 3)}
    for ledger in ledgers.values():
        LEDGER.validate(ledger)
    survivor = [ledgers[("requester", g)] for g in (1, 2, 3)]
    assert len({(s["pid"], s["epoch"], s["registration_id"]) for s in survivor}) == 1
    assert [s["status"] for s in survivor] == ["idle", "idle", "complete"]
    mrs = [sorted((m["mr"], m["rkey"]) for c in s["contexts"] for m in c["mrs"]) for s in survivor]
    assert mrs[0] == mrs[1] == mrs[2] and len(mrs[0]) == 4
    fault = [ledgers[("source", g)] for g in (1, 2, 3)]
    assert len({f["pid"] for f in fault}) == 3 and len({f["epoch"] for f in fault}) == 3
    assert len({f["service_address"] for f in fault}) == 1
    assert [f["status"] for f in fault] == ["idle", "idle", "complete"]
    probes = survivor[2]["restart"]["stale_probes"]
    assert sorted((p["peer_epoch"], p["operation"]) for p in probes) == sorted(
        (f["epoch"], op) for f in fault[:2] for op in ("open_segment", "submit"))
    assert {(p["result"], p["qps_created"], p["wrs_posted"], p["bytes"], p["remote_effect"], p["locally_drained"])
            for p in probes} == {("EpochMismatch", 0, 0, 0, "None", True)}
    # The survivor retired the dead peer's QPs and created rails x lanes new ones per generation.
    assert len(survivor[1]["restart"]["retired_qps"]) == 4 and len(survivor[1]["qps"]) == 4
    for g in (1, 2):
        point = json.loads((case_dir / "source" / f"g{g}" / RESTART_POINT).read_text())
        RESTART_POINT_SCHEMA.validate(point)
        assert (point["pid"], point["generation"], point["epoch"]) == (fault[g - 1]["pid"], g, fault[g - 1]["epoch"])
    events = [json.loads(line) for line in (case_dir / "source" / "journal.jsonl").read_text().splitlines()]
    kills = [(e["pid"], e["signal_name"]) for e in events if e.get("ev") == "signal"]
    exits = {e["pid"]: e.get("exit_signal_name") for e in events if e.get("ev") == "child_exit"}
    assert kills == [(fault[0]["pid"], "SIGKILL"), (fault[1]["pid"], "SIGKILL")]
    assert [exits[f["pid"]] for f in fault] == ["SIGKILL", "SIGKILL", None]
    requester_events = (case_dir / "requester" / "journal.jsonl").read_text()
    assert '"ev": "signal"' not in requester_events and requester_events.count('"ev": "child_start"') == 1


_DEFECT_CASES = [
    pytest.param("stale_epoch_accepted", "source", "restart.stale_refused", id="stale_epoch_accepted"),
    pytest.param("stale_epoch_qp", "requester", "restart.stale_no_effect", id="stale_epoch_qp"),
    # the survivor's accounting observer sees the WR its ledger does not record (survivor: requester, then source)
    pytest.param("stale_epoch_wr", "source", "restart.stale_no_effect", id="stale_epoch_wr_requester_survivor"),
    pytest.param("stale_epoch_wr", "requester", "restart.stale_no_effect", id="stale_epoch_wr_source_survivor"),
    pytest.param("survivor_reregisters", "source", "restart.survivor", id="survivor_reregisters"),
    pytest.param("reuse_epoch", "requester", "identity.epochs", id="reuse_epoch"),
    pytest.param("drop_cached_qps", "source", "restart.restart_point", id="drop_cached_qps"),
    # the survivor's own receipts agree with what it retired; the previous generation's say what it left live
    pytest.param("keep_a_dead_peers_qp", "source", "restart.retired", id="keep_a_dead_peers_qp_requester_survivor"),
    pytest.param("keep_a_dead_peers_qp", "requester", "restart.retired", id="keep_a_dead_peers_qp_source_survivor"),
]


@pytest.mark.parametrize(("defect", "fault", "code"), _DEFECT_CASES)
def test_each_restart_defect_fails_exactly_its_rule(tmp_path, defect, fault, code):
    run_dir = tmp_path / f"rs-{defect}"
    run_restart_pair(run_dir, "c1", restart_profile(fault, 2), defects=[defect])
    verdict = verify_run(str(run_dir), write=False)
    assert sorted(verdict["failed_codes"]) == sorted(["run.diagnostic", code]), verdict["failed_codes"]
    # a defect changes what the runner did, never the receipts' shape (drop_cached_qps: QPs destroyed "restart")
    for path in sorted((run_dir / "cases" / "c1").glob("*/g*/ledger.json")):
        LEDGER.validate(json.loads(path.read_text()))
    if defect == "drop_cached_qps":
        ledger = json.loads((run_dir / "cases" / "c1" / "source" / "g1" / "ledger.json").read_text())
        assert {q["destroyed_round"] for q in ledger["qps"]} == {"restart"}


def test_the_restart_defect_table_covers_every_restart_switch():
    sys.path.insert(0, str(H.REPO / "sim"))
    from orbite_sim.case import RESTART_DEFECTS

    tested = {params.values[0] for params in _DEFECT_CASES}
    assert tested == set(RESTART_DEFECTS)
    doc = (H.REPO / "docs" / "runner-contract.md").read_text()
    for defect in RESTART_DEFECTS:
        assert f"| `{defect}` |" in doc, f"{defect} is not documented in docs/runner-contract.md section 7"


def _edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _edit_journal(path, change):
    events = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(e) + "\n" for e in change(events)))


def _first(events, ev, **match):
    return next(e for e in events if e.get("ev") == ev and all(e.get(k) == v for k, v in match.items()))


def _kill_named_another_start_time(events):
    _first(events, "signal")["start_time"] += 1
    return events


def _survivor_signalled(events):
    start = _first(events, "child_start")
    signal = {"seq": 10_000, "ev": "signal", "t": start["t"], "child_id": start["child_id"], "pid": start["pid"],
              "start_time": start["start_time"], "signal": 15, "signal_name": "SIGTERM", "reason": "request"}
    return [*events, signal]


@pytest.mark.parametrize(("code", "mutate"), [
    # The kill came before the killed runner's restart point (its own node's clock).
    ("restart.kill_point", lambda case: _edit(case / "requester" / "g1" / "ledger.json",
                                              lambda d: d["restart"]["restart_point"].update(at=4e9))),
    ("restart.kill_point", lambda case: _edit_journal(case / "requester" / "journal.jsonl",
                                                      _kill_named_another_start_time)),
    # The replacement requester was pointed at another address than the source serves.
    ("restart.replacement", lambda case: _edit_journal(case / "requester" / "journal.jsonl", lambda events: [
        _retarget(e) if e.get("ev") == "child_start" and "/g2" in json.dumps(e.get("argv")) else e for e in events])),
    ("restart.teardown", lambda case: _edit(case / "source" / "g2" / "ledger.json",
                                            lambda d: d["teardown"].update(retained_owners=1))),
    ("journal.children", lambda case: _edit_journal(case / "source" / "journal.jsonl", _survivor_signalled)),
])
def test_rules_no_runner_switch_reaches_fail_on_one_edited_fact(healthy, tmp_path, code, mutate):
    run_dir = tmp_path / "rs-edited"
    shutil.copytree(healthy["requester"], run_dir)
    mutate(run_dir / "cases" / "c1")
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["failed_codes"] == [code], verdict["failed_codes"]


def _retarget(start):
    for pin in start.get("pinned") or []:
        if isinstance(pin.get("json"), dict) and "peer_address" in pin["json"]:
            host, _sep, port = pin["json"]["peer_address"].rpartition(":")
            pin["json"]["peer_address"] = f"{host}:{int(port) + 1}"
    return start


def test_a_restart_point_nobody_acts_on_ends_in_typed_timeouts(tmp_path):
    """No kill within timeouts.restart_s: the fault role gives up with a typed Timeout (its generation's
    ledger then says failed), the survivor sees it go and waits for a replacement that never comes."""
    prof = restart_profile("requester", 2)
    root_a, root_b = H.make_hosts()
    # The fault role gives up first; the survivor waits longer, then for its replacement as long again.
    timeouts = {"source": {"restart_s": 4.0, "connect_s": 10.0}, "requester": {"restart_s": 1.0, "connect_s": 10.0}}
    out_a, out_b = tmp_path / "source" / "g1", tmp_path / "requester" / "g1"
    out_a.mkdir(parents=True)
    out_b.mkdir(parents=True)
    rng_ip = f"127.{os.getpid() % 250 + 1}.9.{os.getpid() % 200 + 1}"
    source_case = H.write_case(tmp_path / "source.json", H.base_case(
        prof, "source", root_a, service_address=f"{rng_ip}:0", timeouts=timeouts["source"]))
    source = H.start(source_case, out_a, observers=())
    ready = H.wait_ready(source, out_a)
    requester_case = H.write_case(tmp_path / "requester.json", H.base_case(
        prof, "requester", root_b, peer_address=ready["service_address"], peer_registration_id="reg-source",
        timeouts=timeouts["requester"]))
    requester = H.start(requester_case, out_b, observers=())
    codes = {"source": H.reap(source, 60)[0], "requester": H.reap(requester, 60)[0]}
    assert codes == {"source": 4, "requester": 4}
    fault = json.loads((out_b / "ledger.json").read_text())
    assert fault["status"] == "failed" and fault["restart"]["restart_point"] is not None
    assert [(e["error"], e["operation"]) for e in fault["errors"]] == [("Timeout", "restart")]
    assert (out_b / RESTART_POINT).exists()
    survivor_idle = json.loads((out_a / "ledger.json").read_text())
    assert survivor_idle["status"] == "idle"
    survivor = json.loads((tmp_path / "source" / "g2" / "ledger.json").read_text())
    assert (survivor["status"], survivor["pid"]) == ("failed", survivor_idle["pid"])
    assert [(e["error"], e["operation"]) for e in survivor["errors"]] == [("Timeout", "accept")]
    assert survivor["teardown"]["retained_owners"] == 0
