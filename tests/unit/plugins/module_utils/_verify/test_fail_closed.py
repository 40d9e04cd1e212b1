"""Fail closed: PASS only for a finished run whose planned cases all passed, in JSON, JUnit and Markdown.

An unfinished run is INCOMPLETE (never PASS), a missing or invalid run.json is the FAIL run.plan
(the planned cases never come from the directories found), and a full output disk leaves a verdict
that is not PASS, or none at all, never an older PASS.
"""

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import observer_log
from junitparser import JUnitXml
from helpers.sim_pair import RAIL_ACCOUNTING, SMALL_HOST, run_pair

from ansible_collections.orbite.qualification.plugins.module_utils._verify.reports import render
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

REPO = Path(__file__).resolve().parents[5]


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("healthy") / "run"
    run_pair(run_dir, "ra", RAIL_ACCOUNTING)
    run_pair(run_dir, "ih", dict(SMALL_HOST, operation="write", rdma_events=True))
    return run_dir


@pytest.fixture
def run(healthy, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(healthy, run_dir, ignore=shutil.ignore_patterns("supervisors"))
    return run_dir


def _plan(run_dir, **fields):
    """The healthy run's plan (the identity rules hold the receipts against it) with ``fields`` changed."""
    plan = dict(json.loads((run_dir / "run.json").read_text()), cases=["ra", "ih"])
    (run_dir / "run.json").write_text(json.dumps(dict(plan, **fields)))


def _formats(directory):
    """(verdict.json's verdict, JUnit root, Markdown title) as written on disk; verdict.html says the same."""
    verdict = json.loads((directory / "verdict.json").read_text())["verdict"]
    page = (directory / "verdict.html").read_text()
    assert f'id="verdict">{verdict}</span>' in page and page.count('id="verdict"') == 1
    junit = ET.parse(directory / "verdict.xml").getroot()
    title = (directory / "verdict.md").read_text().splitlines()[0]
    return verdict, junit, title


def _testcases(junit):
    return {(suite.get("name"), case.get("name")): case for suite in junit for case in suite}


def test_a_partial_verification_is_incomplete_in_all_three_formats(run, tmp_path):
    _plan(run)
    verdict = verify_run(str(run), output_dir=str(tmp_path / "out"), cases=["ra"], partial=True)
    assert (verdict["verdict"], verdict["complete"], verdict["failed_codes"]) == ("INCOMPLETE", False,
                                                                                  ["run.incomplete"])
    assert [(c["case"], c["verdict"]) for c in verdict["cases"]] == [("ra", "PASS"), ("ih", "INCOMPLETE")]
    status, junit, title = _formats(tmp_path / "out")
    assert status == "INCOMPLETE" and title == "# Verdict: INCOMPLETE"
    # run.incomplete fails; the case not verified is an error (it never ran)
    assert (junit.get("failures"), junit.get("errors")) == ("1", "1")
    cases = _testcases(junit)
    assert cases[("ih", "verification")].find("error").get("type") == "run.incomplete"
    assert cases[("run", "run.incomplete")].find("failure") is not None
    assert "INCOMPLETE, not a PASS" in (tmp_path / "out" / "verdict.md").read_text()


def test_a_partial_verification_of_every_case_is_still_incomplete(run):
    _plan(run)
    verdict = verify_run(str(run), write=False, partial=True)
    assert verdict["verdict"] == "INCOMPLETE" and [c["verdict"] for c in verdict["cases"]] == ["PASS", "PASS"]


def test_a_failure_in_an_unfinished_run_is_a_fail(run):
    _plan(run)
    (run / "cases" / "ra" / "requester" / "g1" / "ledger.json").unlink()
    verdict = verify_run(str(run), write=False, cases=["ra"], partial=True)
    assert verdict["verdict"] == "FAIL" and verdict["failed_codes"] == ["run.incomplete", "receipt.missing"]


def test_cases_are_planned_by_run_json_never_by_the_directories_found(run):
    _plan(run, cases=["ra"])  # ih is on disk but not planned: it is not read
    verdict = verify_run(str(run), write=False)
    assert verdict["verdict"] == "PASS" and [c["case"] for c in verdict["cases"]] == ["ra"]
    _plan(run, cases=["ra", "ih", "lost"])
    assert verify_run(str(run), write=False)["failed_codes"] == ["case.missing"]


@pytest.mark.parametrize(("change", "words"), [
    (lambda run: (run / "run.json").unlink(), "receipt is missing"),
    (lambda run: _plan(run, cases=[]), "non-empty list"),
    (lambda run: _plan(run, cases=["ra", "../ih"]), "each must be"),
    (lambda run: _plan(run, cases=["ra", "ra"]), "planned twice"),
    (lambda run: _plan(run, schema="orbite.other"), "schema 'orbite.other'"),
    (lambda run: (run / "run.json").write_text('{"schema": "orbite.run", "version": 1, "cases": ["ra"'), "not valid"),
])
def test_a_missing_or_invalid_plan_is_run_plan_in_all_three_formats(run, tmp_path, change, words):
    change(run)
    verdict = verify_run(str(run), output_dir=str(tmp_path / "out"))
    assert (verdict["verdict"], verdict["failed_codes"], verdict["cases"]) == ("FAIL", ["run.plan"], [])
    assert words in verdict["run_findings"][0]["message"]
    status, junit, title = _formats(tmp_path / "out")
    assert status == "FAIL" and title == "# Verdict: FAIL" and junit.get("failures") == "1"
    assert _testcases(junit)[("run", "run.plan")].find("failure").get("type") == "run.plan"


def test_a_case_given_to_verify_must_be_planned(run):
    _plan(run)
    verdict = verify_run(str(run), write=False, cases=["ra", "ih", "stray"])
    assert verdict["verdict"] == "FAIL" and verdict["failed_codes"] == ["run.plan"]


def _junit_read_back(path):
    """{(suite, testcase): outcome} and the totals, as a JUnit consumer (junitparser) reads verdict.xml."""
    xml = JUnitXml.fromfile(str(path))
    outcomes = {}
    for suite in xml:
        for case in suite:
            kinds = {type(result).__name__ for result in case.result}
            outcomes[(suite.name, case.name)] = kinds.pop().lower() if kinds else "pass"
    return outcomes, {"tests": xml.tests, "failures": xml.failures, "errors": xml.errors, "skipped": xml.skipped}


def test_junit_counts_are_the_verdicts_as_a_junit_reader_sees_them(run, tmp_path):
    _plan(run)
    observer_log.find(run / "cases" / "ra" / "requester" / "g1").unlink()
    verdict = verify_run(str(run), output_dir=str(tmp_path))
    counts = json.loads((tmp_path / "verdict.json").read_text())["counts"]
    assert counts["skip"] > 0 and counts["fail"] > 0
    outcomes, totals = _junit_read_back(tmp_path / "verdict.xml")
    assert totals == {"tests": counts["pass"] + counts["fail"] + counts["skip"], "failures": counts["fail"],
                      "errors": 0, "skipped": counts["skip"]}
    # One testcase per finding, named by its code, each with its finding's outcome.
    findings = {("run", f["code"]): f for f in verdict["run_findings"]}
    findings |= {(case["case"], f["code"]): f for case in verdict["cases"] for f in case["findings"]}
    status = {"PASS": "pass", "FAIL": "failure", "SKIP": "skipped"}
    assert outcomes == {key: status[f["status"]] for key, f in findings.items()}
    junit = ET.parse(tmp_path / "verdict.xml").getroot()
    assert all(element.get("time") is not None for element in junit.iter()
               if element.tag not in {"failure", "skipped", "error", "properties", "property"})
    assert float(next(s for s in junit if s.get("name") == "ra").get("time")) > 0


def test_a_skipped_finding_beside_passing_ones_of_its_group_is_skipped_in_junit(run):
    """The group-level JUnit of before showed a group with one pass and two skips as passed: skipped="0"."""
    _plan(run)
    verdict = verify_run(str(run), write=False)
    case = verdict["cases"][0]
    groups = [f["group"] for f in case["findings"]]
    group = next(g for g in reversed(groups) if groups.count(g) >= 3)  # a group of three rules at least
    members = [f for f in case["findings"] if f["group"] == group]
    assert len(members) >= 3, group
    for found in members[1:3]:
        found.update(status="SKIP", message="skipped: masked")
    junit = ET.fromstring(render(verdict)["junit"])
    suite = next(s for s in junit if s.get("name") == case["case"])
    assert suite.get("skipped") == junit.get("skipped") == "2"
    skipped = [c.get("name") for c in suite if c.find("skipped") is not None]
    assert skipped == [f["code"] for f in members[1:3]]
    assert {c.get("classname") for c in suite if c.get("name") in skipped} == {f"{case['case']}.{group}"}


def test_an_older_pass_never_survives_a_new_verdict(run, tmp_path):
    _plan(run)
    out = tmp_path / "out"
    assert verify_run(str(run), output_dir=str(out))["verdict"] == "PASS"
    (run / "run.json").unlink()
    verify_run(str(run), output_dir=str(out))
    assert _formats(out)[0] == "FAIL"


# --- a full output disk: a real tmpfs in a mount namespace of its own -----------------------------

FULL_DISK = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import (
    VerdictWriteError, verify_run)
run_dir, out, older, partial = sys.argv[2], sys.argv[3], sys.argv[4] == "older", sys.argv[5] == "partial"
if older:
    assert verify_run(run_dir, output_dir=out)["verdict"] == "PASS"
filler = os.open(os.path.join(out, "filler"), os.O_WRONLY | os.O_CREAT)  # fill the disk to the last byte
try:
    while True:
        os.write(filler, b"\0" * 4096)
except OSError:
    os.close(filler)
result = {"error": None}
try:
    result["write_error"] = verify_run(run_dir, output_dir=out, partial=partial).get("write_error")
except VerdictWriteError as error:
    result["error"] = [error.code, str(error), error.verdict["verdict"]]
result["files"] = sorted(name for name in os.listdir(out) if name != "filler")
print(json.dumps(result))
"""


def _on_a_full_disk(run, tmp_path, older, partial=False):
    out = tmp_path / "out"
    out.mkdir()
    script = (f"mount -t tmpfs -o size=1m orbite-full {out} && {sys.executable} -c \"$0\" "
              f"{REPO / '.collections'} {run} {out} {'older' if older else 'none'} "
              f"{'partial' if partial else 'final'} && "
              f"cp -r {out} {tmp_path}/seen && rm -f {tmp_path}/seen/filler")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, FULL_DISK],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1]), tmp_path / "seen"


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="needs root and unshare (a tmpfs in a mount namespace)")


@needs_root
def test_a_full_disk_replaces_an_older_pass_by_a_short_verdict_that_is_not_pass(run, tmp_path):
    _plan(run)
    result, seen = _on_a_full_disk(run, tmp_path, older=True)
    code, message, computed = result["error"]
    assert (code, computed) == ("verdict.unwritable", "PASS")  # computed PASS, but not written in full
    assert "No space left" in message and "short form" in message
    assert result["files"] == ["verdict.html", "verdict.json", "verdict.md", "verdict.xml"]
    status, junit, title = _formats(seen)
    assert status == "FAIL" and title == "# Verdict: FAIL" and int(junit.get("failures")) >= 1
    short = json.loads((seen / "verdict.json").read_text())
    assert "No space left" in short["reports_cut"] and short["failed_codes"] == ["verdict.unwritable"]


@needs_root
def test_a_disk_full_from_the_start_leaves_no_verdict_and_says_why(run, tmp_path):
    _plan(run)
    result, _ = _on_a_full_disk(run, tmp_path, older=False)
    code, message, _computed = result["error"]
    assert code == "verdict.unwritable" and "No space left" in message and "no verdict file is left" in message
    assert result["files"] == []


@needs_root
def test_a_partial_verification_on_a_full_disk_warns_and_leaves_no_pass(run, tmp_path):
    _plan(run)
    result, seen = _on_a_full_disk(run, tmp_path, older=True, partial=True)
    assert result["error"] is None and "No space left" in result["write_error"]  # the final one decides
    assert _formats(seen)[0] == "INCOMPLETE"
