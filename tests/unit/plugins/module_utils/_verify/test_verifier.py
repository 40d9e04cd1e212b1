"""The verifier: a healthy simulated run passes every rule, and every rule has a red check.

Receipts are real simulated-runner output (tests/helpers/sim_pair.py). A red check breaks exactly
one fact, by a runner defect switch or by mutating one receipt, and must fail exactly that rule's
code and no other (derived rules reading the same fact are masked, see Rule.after). A sweep fails
when a code of the registry has no red check.
"""

import json
import os
import shutil
import xml.etree.ElementTree as ET

import pytest
from helpers import observer_log
from helpers.receipts import edit_json, edit_lines, reorder
from helpers.consistent_defects import DEFECTS as CONSISTENT_DEFECTS
from helpers.sim_pair import FAULT_MODE_GROUPS, RAIL_ACCOUNTING, SMALL_HOST, run_pair

from ansible_collections.orbite.qualification.plugins.module_utils._verify import reading, rules
from ansible_collections.orbite.qualification.plugins.module_utils._verify.case import case_receipts
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import REGISTRY
from ansible_collections.orbite.qualification.plugins.module_utils._profile import model as profile_model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import plan as plan_rules
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules.plan import VERIFIED_MODES
from ansible_collections.orbite.qualification.plugins.module_utils._verify.reports import junit_xml
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import (
    RECEIPT_CODES,
    verify_case,
    verify_run,
)

WRITE_EVENTS_HOST = dict(SMALL_HOST, operation="write", rdma_events=True)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("healthy") / "run"
    run_pair(run_dir, "ra", RAIL_ACCOUNTING)
    run_pair(run_dir, "ih", WRITE_EVENTS_HOST)
    # The gate's observer logs are binary records (observer-<tool>.bin); JSON lines (.jsonl, for
    # debugging) are read as well: the discovery case has them.
    run_pair(run_dir, "rad", dict(RAIL_ACCOUNTING, discovery="auto"), log_format="json")
    return run_dir


def _plan(run_dir, cases, **extra):
    """The healthy run's plan (copied by _copy_case; the identity rules hold receipts against it) for ``cases``."""
    plan = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps(dict(plan, cases=cases, **extra)))


def _copy_case(healthy, tmp_path, case_id):
    run_dir = tmp_path / "run"
    shutil.copytree(healthy / "cases" / case_id, run_dir / "cases" / case_id)
    shutil.copy(healthy / "run.json", run_dir / "run.json")
    _plan(run_dir, [case_id])
    return run_dir, run_dir / "cases" / case_id


def _failed(run_dir):
    return verify_run(str(run_dir), write=False)["failed_codes"]


def test_healthy_run_passes_every_rule(healthy, tmp_path):
    verdict = verify_run(str(healthy), output_dir=str(tmp_path))
    assert verdict["verdict"] == "PASS", verdict["failed_codes"]
    assert verdict["complete"] and sorted(verdict["planned_cases"]) == ["ih", "ra", "rad"]
    statuses = {f["status"] for case in verdict["cases"] for f in case["findings"] + verdict["run_findings"]}
    assert statuses == {"PASS"}
    codes = {f["code"] for case in verdict["cases"] for f in case["findings"]}
    # The discovery rail-accounting case runs every rule but the restart roles' modes' (FAULT_MODE_GROUPS).
    assert {r.code for r in rules.RULES if r.group not in FAULT_MODE_GROUPS} <= codes
    assert json.loads((tmp_path / "verdict.json").read_text())["verdict"] == "PASS"
    junit = ET.parse(tmp_path / "verdict.xml").getroot()
    assert (junit.tag, junit.get("failures"), junit.get("skipped")) == ("testsuites", "0", "0")
    assert [suite.get("name") for suite in junit] == ["run", *verdict["planned_cases"]]
    assert (tmp_path / "verdict.md").read_text().startswith("# Verdict: PASS")


def test_without_the_provider_in_the_plan_its_witness_is_skipped_by_name(healthy, tmp_path):
    """A real lab's plan loads the system libibverbs (artifacts.verbs_library null), which keeps no
    per-device counters: counters.source (whose witness that is) is SKIPped saying why, and the other
    rules stop reading the provider's figures, never taking the ledger's word for whether it was there."""
    run_dir, case_dir = _copy_case(healthy, tmp_path, "ra")
    plan = json.loads((run_dir / "run.json").read_text())
    _plan(run_dir, ["ra"], artifacts=dict(plan["artifacts"], verbs_library=None))
    # Consistently provider-less receipts: nothing in the provider's fields that a rule could still read.
    for role in ("source", "requester"):
        def strip(ledger):
            for rnd in ledger["rounds"]:
                rnd["provider"] = dict.fromkeys(rnd["provider"], 0)
                rnd["drain"]["provider_outstanding_wrs"] = None
            return ledger
        edit_json(case_dir / role / "g1" / "ledger.json", strip)
    verdict = verify_run(str(run_dir), write=False)
    status = {f["code"]: (f["status"], f.get("message", "")) for f in verdict["cases"][0]["findings"]}
    assert status["counters.source"][0] == "SKIP" and "no witness here" in status["counters.source"][1]
    assert status["rendezvous.no_payload"][0] == status["ledger.drain"][0] == "PASS"
    # identity.artifacts holds the plan against what the supervisors journaled (the provider was loaded).
    assert verdict["failed_codes"] == ["identity.artifacts"]


def _noop_rewrite(case_dir):
    """Rewrite every receipt the way a tool might without changing a fact: keys reordered, documents
    re-indented, unknown fields added (to documents and to every log line)."""
    for path in sorted(case_dir.rglob("*.json")):
        data = reorder(json.loads(path.read_text()))
        data["x_unknown_field"] = {"added by": "a no-op rewrite", "list": [1, 2, {"deep": True}]}
        path.write_text(json.dumps(data, indent=7) + "\n")
    for path in sorted(case_dir.rglob("*.jsonl")):
        lines = [reorder(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
        path.write_text("".join(json.dumps(dict(line, x_extra=[None, "]}{"]), separators=(", ", " : ")) + "\n"
                                for line in lines))
    for path in sorted(case_dir.rglob("*.bin")):  # a binary observer log: its JSON header line
        header, body = path.read_bytes().split(b"\n", 1)
        header = dict(reorder(json.loads(header)), x_extra=[None, "]}{"])
        path.write_bytes(json.dumps(header, separators=(", ", " : ")).encode() + b"\n" + body)


def test_the_healthy_run_has_logs_in_both_formats(healthy):
    logs = sorted(path.name for path in healthy.rglob("observer-*"))
    assert logs == ["observer-accounting.bin", "observer-accounting.jsonl"]  # ra (the gate's), rad (JSON lines)


@pytest.mark.parametrize("case_id", ["ra", "ih", "rad"])
def test_no_op_rewrites_still_pass(healthy, tmp_path, case_id):
    run_dir, case_dir = _copy_case(healthy, tmp_path, case_id)
    _plan(run_dir, [case_id], x_unknown_field=True, runner_kind="sim")
    _noop_rewrite(case_dir)
    assert "x_unknown_field" in (case_dir / "requester" / "g1" / "ledger.json").read_text()
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["verdict"] == "PASS", [(f["code"], f["message"]) for c in verdict["cases"] for f in c["findings"]
                                          if f["status"] != "PASS"]


# --- red checks through the simulated runner's defect switches --------------------------------

DEFECTS = [
    ("corrupt_byte", RAIL_ACCOUNTING, "ledger.bytes"),
    ("corrupt_byte", WRITE_EVENTS_HOST, "ledger.bytes"),  # write: the source checks
    ("overwrite_guard", RAIL_ACCOUNTING, "ledger.guards"),
    ("extra_qp", RAIL_ACCOUNTING, "qps.bound"),
    ("no_qp_reuse", RAIL_ACCOUNTING, "qps.reuse"),
    ("skew_native_counter", RAIL_ACCOUNTING, "counters.native_public"),
    ("skip_drain", RAIL_ACCOUNTING, "ledger.drain"),
    ("mr_one_context", dict(SMALL_HOST, mask=2), "mrs.persistent"),
    ("payload_over_rendezvous", SMALL_HOST, "rendezvous.no_payload"),
    ("wrong_slicing", RAIL_ACCOUNTING, "counters.slicing"),
    ("stale_input", RAIL_ACCOUNTING, "ledger.fresh_input"),
    ("exceed_sq_depth", RAIL_ACCOUNTING, "qps.sq_depth"),
    # no observer: the engine's WR order says what its stated maxima do not (three parents of a QP)
    ("understate_sq_depth", dict(SMALL_HOST, num_lanes=1), "qps.inflight_order"),
    ("understate_sq_depth", RAIL_ACCOUNTING, "accounting.sq_depth"),  # with an observer: its word
    ("single_rail", RAIL_ACCOUNTING, "counters.rails"),
    ("serial_parents", RAIL_ACCOUNTING, "accounting.outstanding"),
    ("serial_round_two", RAIL_ACCOUNTING, "accounting.outstanding"),  # per round, not over the run
]


@pytest.mark.slow
@pytest.mark.parametrize(("defect", "profile", "code"), DEFECTS,
                         ids=[f"{d}-{p['mode'][10:]}-{p['operation']}" for d, p, _ in DEFECTS])
def test_defect_switch_fails_exactly_its_rule(tmp_path, defect, profile, code):
    run_dir = tmp_path / "run"
    run_pair(run_dir, "case", profile, defects=[defect])
    assert _failed(run_dir) == ["run.diagnostic", code]  # a run with a defect switch is diagnostic, never a PASS


# --- red checks by mutating one receipt -------------------------------------------------------


def _requester_ledger(case_dir):
    return case_dir / "requester" / "g1" / "ledger.json"


def _observer_log(case_dir):
    return observer_log.find(case_dir / "requester" / "g1")


def _first_round(ledger):
    return ledger["rounds"][0]


def _completions_last(lines):
    """Every completion after every post: all WRs in flight at once, as the log tells it."""
    header, *events, summary = lines
    return [header, *[e for e in events if e["ev"] != "cqe"], *[e for e in events if e["ev"] == "cqe"], summary]


def _lead_guard_changed(events):
    """The observer saw parent 1's leading guard change while its first range landed (round 1)."""
    first = next(e for e in events if e.get("ev") == "data" and e["off"] == 1 * (4194305 + 8192) + 4096)
    first["flags"] |= 1
    return events


def _swap_dev(lines):
    devs = sorted({line["dev"] for line in lines if line.get("ev") == "wr"})
    first = next(line for line in lines if line.get("ev") == "wr")
    first["dev"] = devs[1] if first["dev"] == devs[0] else devs[0]
    return lines


def _journal(case_dir, role):
    return case_dir / role / "journal.jsonl"


def _identity_of(case_dir, role):
    lines = [json.loads(x) for x in _journal(case_dir, role).read_text().splitlines()]
    return next(e for e in lines if e.get("ev") == "identity_check")["observed"]


def _set_identity(lines, identity):
    for line in lines:
        if line.get("ev") == "identity_check":
            line["observed"] = dict(line["observed"], **identity)
    return lines


def _same_node(d):
    """The requester claims to be the source's node, consistently in its journal and ledger."""
    source = _identity_of(d, "source")
    edit_lines(_journal(d, "requester"), lambda lines: _set_identity(lines, source))
    edit_json(_requester_ledger(d), lambda x: x.update(hostname=source["hostname"], boot_id=source["boot_id"]))


def _inventory(case_dir, when):
    return case_dir / "requester" / "g1" / f"inventory-{when}.json"


def _port_down(inventory):
    inventory["devices"]["mlx5_1"]["ports"]["1"]["state"] = {"name": "DOWN", "num": 1}


def _libibverbs_checked(inventory, drop=(), **change):
    """The verbs record as the module writes it when libibverbs enumerated the node, listing the
    inventory's devices but ``drop``, each updated with ``change``; the module's own verdict on it
    (count, mismatches) is made to agree, so only a re-comparison sees the defect."""
    listed = [dict({"name": name, "uverbs": dev["uverbs"], "node_guid": dev["node_guid"],
                    "node_type": dev["node_type"], "opened": False, "open_error": "ENOENT (No such file or directory)"},
                   **change)
              for name, dev in sorted(inventory["devices"].items()) if name not in drop]
    inventory["verbs"].update(status="checked", reason=None, sysfs="/sys", enumerated=listed, devices=len(listed),
                              comparisons=1 + 3 * len(listed), mismatches=[])


def _both_inventories(case_dir, change):
    """The same change before and after the child (the inventory itself stays unchanged across it)."""
    for when in ("before", "after"):
        edit_json(_inventory(case_dir, when), change)


def _swap_tiers(ledger):
    for entry in ledger["discovery"]["memory_tiers"]:
        entry["tiers"].reverse()


MUTATIONS = {
    "discovery.inventory_unchanged": ("rad", lambda d: edit_json(_inventory(d, "after"), _port_down)),
    "discovery.candidates": ("rad", lambda d: [edit_json(_inventory(d, w), _port_down) for w in ("before", "after")]),
    "discovery.nics": ("rad", lambda d: edit_json(_requester_ledger(d), lambda x: x["discovery"][
        "chosen_nic_ids"].reverse())),
    "discovery.tiers": ("rad", lambda d: edit_json(_requester_ledger(d), _swap_tiers)),
    "discovery.verbs": ("rad", lambda d: _both_inventories(d, lambda x: _libibverbs_checked(x, drop=("mlx5_1",)))),
    "discovery.strict_pin": ("rad", lambda d: edit_json(_requester_ledger(d), lambda x: x["discovery"][
        "strict_gid_request"].update(retained_owners=1))),
    "journal.identity": ("ra", lambda d: edit_lines(_journal(d, "source"), lambda lines: _set_identity(
        lines, {"hostname": "elsewhere"}))),
    "journal.distinct_nodes": ("ra", _same_node),
    "journal.locks": ("ra", lambda d: edit_lines(_journal(d, "source"), lambda lines: [
        e for e in lines if not (e.get("ev") == "lock_release" and e.get("rnic") == "mlx5_1")])),
    "journal.children": ("ra", lambda d: edit_lines(_journal(d, "requester"), lambda lines: [
        dict(e, exit_code=None, exit_signal=9, exit_signal_name="SIGKILL") if e.get("ev") == "child_exit" else e
        for e in lines])),
    "journal.env": ("ra", lambda d: edit_lines(_journal(d, "requester"), lambda lines: [
        dict(e, env_keys=[*e["env_keys"], "RDMAV_ALLOW_DISASSOC_DESTROY"]) if e.get("ev") == "child_start" else e
        for e in lines])),
    "receipt.missing": ("ra", lambda d: _requester_ledger(d).unlink()),
    "receipt.unsafe": ("ra", lambda d: (_requester_ledger(d).unlink(), os.mkfifo(_requester_ledger(d)))),
    "receipt.oversize": ("ra", lambda d: os.truncate(_requester_ledger(d), reading.MAX_DOCUMENT_BYTES + 1)),  # sparse
    "receipt.nesting": ("ra", lambda d: _requester_ledger(d).write_text("[" * 2000 + "]" * 2000)),
    "receipt.malformed": ("ra", lambda d: _requester_ledger(d).write_text("[1, 2, 3]")),
    "receipt.schema": ("ra", lambda d: edit_json(_requester_ledger(d), lambda x: x.update(version=99))),
    "receipt.truncated": ("ra", lambda d: edit_json(_requester_ledger(d), lambda x: x.update(status="running"))),
    "receipt.shape": ("ra", lambda d: edit_json(_requester_ledger(d), lambda x: _first_round(x).pop("drain"))),
    # binary records under the JSON-lines name
    "receipt.format": ("ra", lambda d: _observer_log(d).rename(_observer_log(d).with_suffix(".jsonl"))),
    "case.meta": ("ra", lambda d: (d / "case.json").unlink()),
    "case.missing": ("ra", shutil.rmtree),
    "run.plan": ("ra", lambda d: (d.parent.parent / "run.json").unlink()),
    "case.profile": ("ra", lambda d: edit_json(d / "case.json", lambda x: x["profile"].update(parents=99))),
    "case.node_failure": ("ra", lambda d: (d / "source" / "node-failure.json").write_text(json.dumps(
        {"host": "sim-a", "task": "Start the lock supervisor", "message": "lock held by run x"}))),
    "ledger.identity": ("ra", lambda d: edit_json(_requester_ledger(d), lambda x: x.update(operation="write"))),
    "ledger.exit": ("ra", lambda d: (  # a peer failure (exit 4), as both the ledger and the supervisor saw it
        edit_json(_requester_ledger(d), lambda x: x.update(status="failed", exit_code=4)),
        edit_lines(_journal(d, "requester"), lambda lines: [
            dict(e, exit_code=4) if e.get("ev") == "child_exit" else e for e in lines]))),
    "ledger.rounds": ("ra", lambda d: edit_json(_requester_ledger(d), lambda x: x["rounds"][2].update(round=4))),
    "ledger.parents": ("ra", lambda d: edit_json(_requester_ledger(d), lambda x: _first_round(x)["parents"][3]
                                                  .update(completed_bytes=0, status="Failed"))),
    "ledger.errors": ("ra", lambda d: edit_json(_requester_ledger(d), lambda x: x["errors"].append(
        {"error": "PeerLost", "expected": False}))),
    "counters.wrs": ("ra", lambda d: edit_json(_requester_ledger(d), lambda x: _first_round(x)["counters"]
                                                ["native"].update(cqes=63))),
    "counters.bytes": ("ra", lambda d: edit_json(_requester_ledger(d), lambda x: (
        _first_round(x)["counters"]["public"].update(bytes=1),
        _first_round(x)["counters"]["native"].update(bytes=1)))),
    "accounting.ledger_join": ("ra", lambda d: observer_log.edit(_observer_log(d), lambda lines: [
        dict(line, opcode="RDMA_WRITE") if line.get("ev") == "wr" and line["wr_id"] == 1 else line
        for line in lines])),
    "accounting.native_bytes": ("ra", lambda d: observer_log.edit(_observer_log(d), _swap_dev)),
    "accounting.sq_depth": ("ra", lambda d: observer_log.edit(_observer_log(d), _completions_last)),
    "digests.coverage": ("ra", lambda d: observer_log.edit(_observer_log(d), lambda events: [
        e for e in events if not (e.get("ev") == "data" and e["wr_id"] == 7)])),
    "digests.content": ("ra", lambda d: observer_log.edit(_observer_log(d), lambda events: [
        dict(e, sha256=f"{int(e['sha256'], 16) ^ 1:064x}") if e.get("ev") == "data" and e["wr_id"] == 7 else e
        for e in events])),
    "digests.guards": ("ra", lambda d: observer_log.edit(_observer_log(d), _lead_guard_changed)),
}


@pytest.mark.parametrize("code", sorted(MUTATIONS))
def test_mutated_receipt_fails_exactly_its_rule(healthy, tmp_path, code):
    case_id, mutate = MUTATIONS[code]
    run_dir, case_dir = _copy_case(healthy, tmp_path, case_id)
    mutate(case_dir)
    assert _failed(run_dir) == [code]


def test_every_mode_of_the_profile_model_has_its_fault_rules():
    assert set(VERIFIED_MODES) == set(profile_model.MODES)


def test_a_mode_without_fault_rules_fails_by_name(healthy, tmp_path, monkeypatch):
    # The next mode the profile model learns, before its rules land: here installed-host taken off the list.
    run_dir, _case_dir = _copy_case(healthy, tmp_path, "ih")
    monkeypatch.setattr(plan_rules, "VERIFIED_MODES", tuple(m for m in VERIFIED_MODES if m != "installed-host"))
    assert _failed(run_dir) == ["case.mode_unverified"]


@pytest.mark.parametrize(("change", "failed"), [
    (_libibverbs_checked, []),  # libibverbs listed exactly the inventory's devices
    (lambda x: _libibverbs_checked(x, node_guid="0c42:a103:00ff:0010"), ["discovery.verbs"]),
    (lambda x: _libibverbs_checked(x, node_type={"num": 4, "name": "RNIC"}), ["discovery.verbs"]),
    (lambda x: (_libibverbs_checked(x), x["verbs"]["enumerated"].append(x["verbs"]["enumerated"][0])),
     ["discovery.verbs"]),  # one device listed twice: same names, another count
    (lambda x: x["verbs"].update(status="failed", reason="libibverbs enumeration died of SIGSEGV"),
     ["discovery.verbs"]),
])
def test_the_libibverbs_enumeration_is_compared_again(healthy, tmp_path, change, failed):
    run_dir, case_dir = _copy_case(healthy, tmp_path, "rad")
    _both_inventories(case_dir, change)
    assert _failed(run_dir) == failed


def test_a_case_planned_but_absent_is_a_fail(healthy, tmp_path):
    run_dir, _ = _copy_case(healthy, tmp_path, "ra")
    _plan(run_dir, ["ra", "never-ran"])
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["failed_codes"] == ["case.missing"]
    assert verdict["verdict"] == "FAIL"
    assert [(c["case"], c["verdict"]) for c in verdict["cases"]] == [("ra", "PASS"), ("never-ran", "FAIL")]


def test_an_empty_run_is_a_fail_not_a_pass(tmp_path):
    verdict = verify_run(str(tmp_path), write=False)
    assert verdict["verdict"] == "FAIL" and verdict["failed_codes"] == ["run.plan"]


def test_a_partial_run_is_incomplete(healthy, tmp_path):
    run_dir, _ = _copy_case(healthy, tmp_path, "ra")
    assert verify_run(str(run_dir), write=False, partial=True)["failed_codes"] == ["run.incomplete"]


def test_observer_log_without_summary_is_truncated(healthy, tmp_path):
    run_dir, case_dir = _copy_case(healthy, tmp_path, "ra")
    observer_log.edit(_observer_log(case_dir), lambda lines: lines[:-1])
    assert _failed(run_dir) == ["receipt.truncated"]


def test_every_registered_code_has_a_red_check():
    by_defect = {code for _, _, code in DEFECTS}
    # Masked rules (Rule.after) are red-checked one level down, on their check function;
    # run.incomplete by test_a_partial_run_is_incomplete (and test_fail_closed.py beside this file).
    # verdict.unwritable by test_fail_closed.py (a full output disk).
    elsewhere = {"accounting.exact_counts", "accounting.both_rails", "run.incomplete", "verdict.unwritable",
                 "case.mode_unverified"}  # test_a_mode_without_fault_rules_fails_by_name
    # identity.* and run.diagnostic: consistent defects in test_identity.py (which sweeps its codes).
    elsewhere |= {code for code in REGISTRY.codes() if code.startswith("identity.")} | {"run.diagnostic"}
    # Codes red-checked by a consistent defect (test_consistent_defects.py).
    elsewhere |= {defect.code for defect in CONSISTENT_DEFECTS.values()}
    # restart.*: restart defect switches and edited restart receipts (tests/unit/sim/test_sim_restart.py).
    elsewhere |= {code for code in REGISTRY.codes() if code.startswith("restart.")}
    # interruption.*: interruption defect switches (the relay's too) and edited receipts
    # (tests/unit/sim/test_sim_interruption.py).
    elsewhere |= {code for code in REGISTRY.codes() if code.startswith("interruption.")}
    # lost_completion.*: its defect switches, a consistent defect and edited receipts
    # (tests/unit/sim/test_sim_lost_completion.py).
    elsewhere |= {code for code in REGISTRY.codes() if code.startswith("lost_completion.")}
    # steps.*: the lost-completion switch drain_first_renumbered and an edited receipt (same file).
    elsewhere |= {code for code in REGISTRY.codes() if code.startswith("steps.")}
    # cleanup.*: cleanup-failure defect switches and edited receipts (tests/unit/sim/test_sim_cleanup_failure.py and
    # test_sim_cleanup_kinds.py, whose test_every_cleanup_code_and_switch_has_a_red_check covers every cleanup code).
    elsewhere |= {code for code in REGISTRY.codes() if code.startswith("cleanup.")}
    # memory_cleanup.*: memory-cleanup defect switches and edited receipts (tests/unit/sim/test_sim_memory_cleanup.py,
    # whose test_every_memory_cleanup_code_has_a_red_check_here holds each code to one of them).
    elsewhere |= {code for code in REGISTRY.codes() if code.startswith("memory_cleanup.")}
    # inflight_dma.*: its defect switches, a consistent defect and edited receipts
    # (tests/unit/sim/test_sim_inflight_dma.py).
    elsewhere |= {code for code in REGISTRY.codes() if code.startswith("inflight_dma.")}
    assert set(RECEIPT_CODES) <= set(MUTATIONS)
    assert set(REGISTRY.codes()) - (by_defect | set(MUTATIONS) | elsewhere) == set()


# --- masked rules: red-checked on their check function -----------------------------------------


def _case(case_dir):
    from ansible_collections.orbite.qualification.plugins.module_utils._profile import model

    profile = model.validate_profile(json.loads((case_dir / "case.json").read_text())["profile"])
    return case_receipts(str(case_dir), case_dir.name, profile, model.derive_workload(profile))


def test_exact_counts_sees_a_missing_parent_in_the_observer_log(healthy, tmp_path):
    _, case_dir = _copy_case(healthy, tmp_path, "ra")
    assert rules.accounting.check_observer_exact_counts(_case(case_dir)) == []
    observer_log.edit(_observer_log(case_dir), lambda lines: [line for line in lines if line.get("wr_id") != 1])
    problems = rules.accounting.check_observer_exact_counts(_case(case_dir))
    assert len(problems) == 1 and "191 payload WRs" in problems[0][0]


def test_both_rails_sees_a_rail_without_observed_payload(healthy, tmp_path):
    _, case_dir = _copy_case(healthy, tmp_path, "ra")
    assert rules.accounting.check_observer_rails(_case(case_dir)) == []
    devs = sorted({event.get("dev") for event in observer_log.read(_observer_log(case_dir))} - {None})
    observer_log.edit(_observer_log(case_dir), lambda lines: [dict(line, dev=devs[0]) if "dev" in line else line
                                                        for line in lines])
    problems = rules.accounting.check_observer_rails(_case(case_dir))
    assert len(problems) == 1 and "[1]" in problems[0][0]


def _json_lines_named_bin(case_dir):
    """A JSON-lines log under the binary name."""
    path = _observer_log(case_dir)
    assert path.suffix == ".bin"
    path.write_bytes(observer_log.encode(observer_log.read(path), "json"))


FORMAT_MISMATCHES = {
    "binary records named .jsonl": (lambda d: _observer_log(d).rename(_observer_log(d).with_suffix(".jsonl")),
                                    "header format 'binary', but the file name says 'json'"),
    "JSON lines named .bin": (_json_lines_named_bin, "header format 'json', but the file name says 'binary'"),
    "both names": (lambda d: shutil.copy(_observer_log(d), _observer_log(d).with_suffix(".jsonl")),
                   "both observer-accounting.bin and observer-accounting.jsonl are present"),
}


def _only_failure(run_dir, code):
    """The message of ``code``, which must be the one code the run fails."""
    verdict = verify_run(str(run_dir), write=False)
    assert verdict["failed_codes"] == [code]
    (found,) = [f for f in verdict["cases"][0]["findings"] if f["code"] == code]
    return found["message"]


@pytest.mark.parametrize("name", sorted(FORMAT_MISMATCHES))
def test_an_observer_log_whose_name_and_format_disagree_is_refused(healthy, tmp_path, name):
    change, words = FORMAT_MISMATCHES[name]
    run_dir, case_dir = _copy_case(healthy, tmp_path, "ra")
    change(case_dir)
    message = _only_failure(run_dir, "receipt.format")
    assert words in message, message


def test_a_missing_observer_log_names_both_names(healthy, tmp_path):
    run_dir, case_dir = _copy_case(healthy, tmp_path, "ra")
    _observer_log(case_dir).unlink()
    assert "neither observer-accounting.bin and observer-accounting.jsonl" in _only_failure(run_dir, "receipt.missing")


def _column(name, change):
    """Edit column ``name`` of round 1's WRs of the requester's ledger with ``change(columns)``."""
    return lambda d: edit_json(_requester_ledger(d), lambda x: change(_first_round(x)["wrs"], name))


# A round's WRs are columns (docs/receipts.md 1.6), checked whole: each bad shape names the round,
# the column, the WR and the value.
BAD_COLUMNS = {
    "ragged": (_column("bytes", lambda c, n: c[n].pop()), "columns of different lengths"),
    "a string in an int column": (_column("qpn", lambda c, n: c[n].__setitem__(3, "4660")),
                                  "$.rounds[0].wrs.qpn[3]: '4660' is not int >= 0"),
    "a bool in an int column": (_column("parent", lambda c, n: c[n].__setitem__(0, True)),
                                "$.rounds[0].wrs.parent[0]: True is not int >= 0"),
    "a negative offset": (_column("local_offset", lambda c, n: c[n].__setitem__(5, -4096)),
                          "$.rounds[0].wrs.local_offset[5]: -4096 is not int >= 0"),
    "a null where null is not allowed": (_column("posted_seq", lambda c, n: c[n].__setitem__(1, None)),
                                         "$.rounds[0].wrs.posted_seq[1]: None is not int >= 0"),
    "an int in a string column": (_column("context", lambda c, n: c[n].__setitem__(2, 5)),
                                  "$.rounds[0].wrs.context[2]: 5 is not str"),
    "an unknown column": (_column("x_lane2", lambda c, n: c.__setitem__(n, list(c["lane"]))),
                          "columns [] missing, ['x_lane2'] unknown"),
    "a missing column": (_column("status", lambda c, n: c.pop(n)), "columns ['status'] missing, [] unknown"),
    "a column that is not a list": (_column("bytes", lambda c, n: c.__setitem__(n, 64)),
                                    "$.rounds[0].wrs.bytes: expected a list (one value per WR), found int"),
    "WR objects instead of columns": (lambda d: edit_json(_requester_ledger(d), lambda x: _first_round(x).update(
        wrs=[{"wr_id": 1}])), "$.rounds[0].wrs: expected dict, found list"),
    "null instead of columns": (lambda d: edit_json(_requester_ledger(d), lambda x: _first_round(x).update(
        wrs=None)), "$.rounds[0].wrs: expected the WR columns (an object), found NoneType"),
}


@pytest.mark.parametrize("name", sorted(BAD_COLUMNS))
def test_bad_wr_columns_are_a_coded_shape_failure(healthy, tmp_path, name):
    change, words = BAD_COLUMNS[name]
    run_dir, case_dir = _copy_case(healthy, tmp_path, "ra")
    change(case_dir)
    message = _only_failure(run_dir, "receipt.shape")
    assert words in message, message


def test_wr_columns_allow_null_only_for_a_completion_never_reaped(healthy, tmp_path):
    run_dir, case_dir = _copy_case(healthy, tmp_path, "ra")
    edit_json(_requester_ledger(case_dir), lambda x: _first_round(x)["wrs"]["completed_seq"].__setitem__(0, None))
    assert "receipt.shape" not in _failed(run_dir)


# --- robustness ----------------------------------------------------------------------------------


@pytest.mark.parametrize("garbage", ["", "{", "null", '{"schema": "orbite.runner-ledger", "version": 1}',
                                     '{"schema": "orbite.runner-ledger", "version": 1, "rounds": "x"}'])
def test_garbage_ledgers_are_coded_fails_never_tracebacks(healthy, tmp_path, garbage):
    run_dir, case_dir = _copy_case(healthy, tmp_path, "ra")
    _requester_ledger(case_dir).write_text(garbage)
    failed = _failed(run_dir)
    assert len(failed) == 1 and failed[0].startswith("receipt.")


def test_verdict_is_written_when_it_starts_and_after_each_case(healthy, tmp_path):
    seen = []
    from ansible_collections.orbite.qualification.plugins.module_utils._verify import verdict as verdict_mod

    original = verdict_mod.write_reports

    def spy(verdict, output_dir, plots=None):
        seen.append((verdict["verdict"], verdict["complete"], [c["verdict"] for c in verdict["cases"]]))
        return original(verdict, output_dir, plots)

    verdict_mod.write_reports = spy
    try:
        verify_run(str(healthy), output_dir=str(tmp_path))
    finally:
        verdict_mod.write_reports = original
    assert seen == [
        ("INCOMPLETE", False, ["INCOMPLETE", "INCOMPLETE", "INCOMPLETE"]),
        ("INCOMPLETE", False, ["PASS", "INCOMPLETE", "INCOMPLETE"]),
        ("INCOMPLETE", False, ["PASS", "PASS", "INCOMPLETE"]),
        ("INCOMPLETE", False, ["PASS", "PASS", "PASS"]),  # every case done, the run not yet closed
        ("PASS", True, ["PASS", "PASS", "PASS"]),
    ]


def test_junit_has_one_testcase_per_finding_of_each_case(healthy):
    _, findings = verify_case(str(healthy / "cases" / "ra"))
    root = ET.fromstring(junit_xml({"run_id": "t", "cases": [{"case": "ra", "verdict": "PASS", "findings": findings}],
                                    "run_findings": []}))
    (suite,) = root
    assert [(case.get("classname"), case.get("name")) for case in suite] == [(f"ra.{f['group']}", f["code"])
                                                                            for f in findings]
    assert all(float(case.get("time")) >= 0 for case in suite)
