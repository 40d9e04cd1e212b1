"""Fleet verdict and slice merge: one row per pair and case, PASS only when every planned pair and case passed;
a pair without a verdict, a missing or killed slice, or a pair no slice ran is INCOMPLETE, never PASS."""

import json

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._fleet import run as fleet_run
from ansible_collections.orbite.qualification.plugins.module_utils._fleet.plan import FleetPlanError, plan_fleet
from ansible_collections.orbite.qualification.plugins.module_utils._fleet.verdict import (
    fleet_verdict,
    merge_verdicts,
    render_markdown,
)

HOSTS = ["h0", "h1", "h2", "h3"]
CASES = ["read-polling", "write-events"]


def _run_verdict(statuses, complete=True, planned=CASES):
    """A pair's run verdict as the verifier writes it (only the fields the fleet reads)."""
    cases = [{"case": c, "verdict": s, "findings": [{"code": "wr.count", "status": "FAIL"}] if s == "FAIL" else []}
             for c, s in zip(planned, statuses)]
    passed = complete and all(s == "PASS" for s in statuses)
    overall = "FAIL" if "FAIL" in statuses else "PASS" if passed else "INCOMPLETE"
    return {"verdict": overall, "complete": complete, "planned_cases": list(planned), "cases": cases,
            "failed_codes": ["wr.count"] if overall == "FAIL" else [], "run_id": "r", "run_dir": "/r"}


def _plan(hosts=HOSTS, pairing="ring", fleet_hosts=None):
    return plan_fleet(hosts, pairing, fleet_hosts=fleet_hosts, fleet_id="fleet-1")


def test_every_pair_and_case_passed_is_pass_with_a_row_each():
    plan = _plan()
    got = fleet_verdict(plan, CASES, {p["id"]: _run_verdict(["PASS", "PASS"]) for p in plan["pairs"]})
    assert got["verdict"] == "PASS" and got["complete"]
    assert [(r["pair"], r["case"]) for r in got["rows"]] == [(p["id"], c) for p in plan["pairs"] for c in CASES]
    assert got["counts"] == {"rows": 8, "passed": 8, "failed": 0, "incomplete": 0}


@pytest.mark.parametrize("change, verdict, code", [
    (lambda v: v.pop("p3"), "INCOMPLETE", "fleet.pair_incomplete"),                     # a pair never verified
    (lambda v: v.update(p3=_run_verdict(["PASS", "PASS"], complete=False)), "INCOMPLETE", "fleet.pair_incomplete"),
    (lambda v: v.update(p3=_run_verdict(["PASS"], planned=CASES[:1])), "INCOMPLETE", "fleet.pair_incomplete"),
    (lambda v: v.update(p3=_run_verdict(["PASS", "FAIL"])), "FAIL", "wr.count"),
    (lambda v: v.update(p3=dict(_run_verdict(["PASS", "PASS"]), verdict="FAIL", failed_codes=["run.plan"])),
     "FAIL", "fleet.pair_failed"),
    (lambda v: v.update(p3=dict(_run_verdict(["PASS", "PASS"]), verdict="MAYBE")), "FAIL", "fleet.pair_verdict"),
])
def test_one_bad_pair_keeps_the_fleet_from_pass(change, verdict, code):
    plan = _plan()
    verdicts = {p["id"]: _run_verdict(["PASS", "PASS"]) for p in plan["pairs"]}
    change(verdicts)
    got = fleet_verdict(plan, CASES, verdicts)
    assert got["verdict"] == verdict
    assert code in got["failed_codes"] + [f["code"] for f in got["findings"]]
    assert len(got["rows"]) == 8  # still one row per planned pair and case


def test_the_markdown_shows_a_pair_verdicts_text_as_text_never_markup():
    plan = _plan()
    verdicts = {p["id"]: _run_verdict(["PASS", "PASS"]) for p in plan["pairs"]}
    verdicts["p3"] = dict(_run_verdict(["PASS", "FAIL"]), verdict="<img src=x>", run_dir="/r/<script>x</script>",
                          failed_codes=["<script>alert(1)</script>"])
    verdicts["p3"]["cases"][1]["findings"][0]["code"] = "![p](http://x/p.png)"
    text = render_markdown(fleet_verdict(plan, CASES, verdicts))
    assert "<" not in text and "](" not in text.replace("\\](", ""), text
    assert "&lt;img src=x&gt;" in text and "\\[p\\]" in text  # shown, as text


def test_a_fleet_still_running_is_incomplete():
    plan = _plan()
    got = fleet_verdict(plan, CASES, {p["id"]: _run_verdict(["PASS", "PASS"]) for p in plan["pairs"]}, final=False)
    assert got["verdict"] == "INCOMPLETE" and not got["complete"]


def _slices(fleet_hosts, parts, pairing="all", statuses=("PASS", "PASS")):
    """The fleet verdict of each AWX slice (round robin over the hosts), every pair passing."""
    out = {}
    for number, hosts in enumerate(parts):
        plan = dict(plan_fleet(hosts, pairing, fleet_hosts=fleet_hosts, fleet_id="fleet-1"), slice=f"job-{number}")
        verdicts = {p["id"]: _run_verdict(list(statuses)) for p in plan["pairs"]}
        out[f"job-{number}"] = fleet_verdict(plan, CASES, verdicts)
    return out


def _expected(fleet_hosts, pairing="all", pairs=None):
    return plan_fleet(fleet_hosts, pairing, pairs=pairs, fleet_id="fleet-1")["pairs"]


def test_merge_of_complete_slices_covering_every_pair_is_pass():
    pairs = [["h0", "h2"], ["h2", "h0"], ["h1", "h3"]]
    slices = {}
    for number, hosts in enumerate([["h0", "h2"], ["h1", "h3"]]):
        plan = plan_fleet(hosts, "list", pairs=pairs, fleet_hosts=HOSTS, fleet_id="fleet-1")
        slices[f"job-{number}"] = fleet_verdict(plan, CASES, {p["id"]: _run_verdict(["PASS", "PASS"])
                                                              for p in plan["pairs"]})
    merged = merge_verdicts("fleet-1", _expected(HOSTS, "list", pairs), 2, slices)
    assert merged["verdict"] == "PASS" and merged["complete"], merged["findings"]
    assert [(r["pair"], r["slice"]) for r in merged["rows"]][::2] == [("p1", "job-0"), ("p2", "job-0"), ("p3", "job-1")]


def test_killed_slice_leaves_the_merge_incomplete_never_pass():
    pairs = [["h0", "h2"], ["h1", "h3"]]
    slices = {}
    for number, hosts in enumerate([["h0", "h2"], ["h1", "h3"]]):
        plan = plan_fleet(hosts, "list", pairs=pairs, fleet_hosts=HOSTS, fleet_id="fleet-1")
        # Slice 1 was killed mid-run: its last verdict on disk is the one written before the end.
        final = number == 0
        slices[f"job-{number}"] = fleet_verdict(plan, CASES, {p["id"]: _run_verdict(["PASS", "PASS"], complete=final)
                                                              for p in plan["pairs"]}, final=final)
    expected = _expected(HOSTS, "list", pairs)
    merged = merge_verdicts("fleet-1", expected, 2, slices)
    assert merged["verdict"] == "INCOMPLETE" and not merged["complete"]
    assert "fleet.slice_incomplete" in [f["code"] for f in merged["findings"]]
    # Killed before it wrote anything: its directory exists without a verdict, or nothing exists at all.
    for gone in ({"job-0": slices["job-0"], "job-1": None}, {"job-0": slices["job-0"]}):
        merged = merge_verdicts("fleet-1", expected, 2, gone)
        assert merged["verdict"] == "INCOMPLETE", merged
        assert "fleet.slice_missing" in [f["code"] for f in merged["findings"]]
        assert {r["verdict"] for r in merged["rows"] if r["pair"] == "p2"} == {"INCOMPLETE"}


def test_a_pair_no_slice_ran_is_incomplete():
    # 'all' over 4 hosts in 2 round-robin slices: the pairs across slices run nowhere.
    merged = merge_verdicts("fleet-1", _expected(HOSTS), 2, _slices(HOSTS, [HOSTS[0::2], HOSTS[1::2]]))
    assert merged["verdict"] == "INCOMPLETE"
    assert merged["counts"]["rows"] == 12 * 2 and merged["counts"]["passed"] == 4 * 2


@pytest.mark.parametrize("tamper, code", [
    (lambda s: s.update({"job-9": s["job-0"]}), "fleet.merge_conflict"),                  # one more slice than expected
    (lambda s: s["job-1"].update(fleet_id="fleet-2"), "fleet.merge_conflict"),           # another fleet's verdict
    (lambda s: s["job-1"]["pairs"][0].update(source="h3", requester="h1"), "fleet.merge_conflict"),
    (lambda s: s["job-1"]["rows"][0].update(verdict="FAIL"), None),                      # a failed row fails it
])
def test_contradicting_slices_fail_the_merge(tamper, code):
    pairs = [["h0", "h2"], ["h1", "h3"]]
    slices = {}
    for number, hosts in enumerate([["h0", "h2"], ["h1", "h3"]]):
        plan = plan_fleet(hosts, "list", pairs=pairs, fleet_hosts=HOSTS, fleet_id="fleet-1")
        slices[f"job-{number}"] = fleet_verdict(plan, CASES, {p["id"]: _run_verdict(["PASS", "PASS"])
                                                              for p in plan["pairs"]})
    tamper(slices)
    merged = merge_verdicts("fleet-1", _expected(HOSTS, "list", pairs), 2, slices)
    assert merged["verdict"] == "FAIL"
    if code:
        assert code in merged["failed_codes"]


def test_merge_reads_slice_directories_and_writes_the_merged_verdict(tmp_path):
    pairs = [["h0", "h2"], ["h1", "h3"]]
    for number, hosts in enumerate([["h0", "h2"], ["h1", "h3"]]):
        plan = fleet_run.attach_runs(plan_fleet(hosts, "list", pairs=pairs, fleet_hosts=HOSTS, fleet_id="fleet-1"),
                                     str(tmp_path))
        fleet_run.start(str(tmp_path), plan, CASES, slice_name=f"job-{number}")
    # Both slices wrote their plan and INCOMPLETE verdict, then were killed: never PASS.
    merged, written = fleet_run.merge(str(tmp_path), "fleet-1", _expected(HOSTS, "list", pairs), 2)
    assert merged["verdict"] == "INCOMPLETE" and written["json"] == str(tmp_path / "fleet-verdict.json")
    assert json.loads((tmp_path / "fleet-verdict.json").read_text())["verdict"] == "INCOMPLETE"
    assert "| p2 | h1 | h3 | write-events | INCOMPLETE |" in (tmp_path / "fleet-verdict.md").read_text()
    # A slice's verdict that is not JSON counts as missing.
    (tmp_path / "slices" / "job-1" / "fleet-verdict.json").write_text("{not json")
    merged = fleet_run.merge(str(tmp_path), "fleet-1", _expected(HOSTS, "list", pairs), 2)[0]
    assert merged["verdict"] == "INCOMPLETE" and "fleet.slice_missing" in [f["code"] for f in merged["findings"]]
    with pytest.raises(FleetPlanError, match="expected_slices=0: must be a whole number >= 1"):
        fleet_run.merge(str(tmp_path), "fleet-1", [], 0)


def test_fleet_verify_without_any_pair_run_is_incomplete(tmp_path):
    plan = fleet_run.attach_runs(plan_fleet(HOSTS, "ring", fleet_id="fleet-1"), str(tmp_path))
    out = fleet_run.start(str(tmp_path), plan, CASES)[0]
    assert json.loads((tmp_path / "fleet-verdict.json").read_text())["verdict"] == "INCOMPLETE"
    got = fleet_run.verify(out)[0]
    assert got["verdict"] == "INCOMPLETE" and got["counts"]["incomplete"] == 8


def test_a_slice_without_pairs_is_never_pass_and_adds_no_case_to_the_merge(tmp_path):
    pairs = [["h0", "h2"]]
    slices = {}
    for number, hosts in enumerate([["h0", "h2"], ["h1", "h3"]]):
        plan = fleet_run.attach_runs(plan_fleet(hosts, "list", pairs=pairs, fleet_hosts=HOSTS, fleet_id="fleet-1"),
                                     str(tmp_path))
        cases = CASES if plan["pairs"] else []
        slices[f"job-{number}"] = fleet_verdict(plan, cases, {p["id"]: _run_verdict(["PASS", "PASS"])
                                                              for p in plan["pairs"]})
        fleet_run.start(str(tmp_path), plan, cases, slice_name=f"job-{number}")
    assert slices["job-1"]["verdict"] == "INCOMPLETE"
    assert [f["code"] for f in slices["job-1"]["findings"]] == ["fleet.no_pairs"]
    merged = merge_verdicts("fleet-1", _expected(HOSTS, "list", pairs), 2, slices)
    assert merged["verdict"] == "PASS" and merged["planned_cases"] == CASES and merged["counts"]["rows"] == 2
