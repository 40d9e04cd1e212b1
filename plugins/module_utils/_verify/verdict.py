# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Run the verifier's rules over a run directory and decide the verdict (reports.py writes it).

Fail closed. The planned cases come from ``run.json`` alone, never from the case directories
found; a plan that is missing or invalid is the FAIL ``run.plan``. The verdict is

- ``PASS`` only when the run finished and every planned case was verified and passed every rule
  that applies to it;
- ``INCOMPLETE`` when nothing failed but the run did not finish (a partial verification, or a
  controller stopped before its last case): ``run.incomplete`` names the cases not verified;
- ``FAIL`` otherwise.

The verdict is rewritten atomically when verification starts and after every case (INCOMPLETE
until the last), so a killed controller or verifier leaves the verdict so far, and an older
verdict never outlives a new attempt to write one (reports.write_reports). Layout of a run
directory: docs/verifier.md.
"""

from __future__ import annotations

import os
import time

from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.case import ROLES, case_receipts
from ansible_collections.orbite.qualification.plugins.module_utils._verify.loader import (
    CASE_SCHEMA,
    RUN_SCHEMA,
    load_json,
)
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import REGISTRY
from ansible_collections.orbite.qualification.plugins.module_utils._verify.reports import (
    FAIL,
    INCOMPLETE,
    PASS,
    SKIP,
    VerdictWriteError,
    write_reports,
)
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import RECEIPT_CODES, RULES

VERDICT_SCHEMA = ("orbite.verdict", 1)
# A file the verifier could not trust as read is named by its receipt.* code wherever it lies
# (run.json, case.json, a gate note), so one code always names an unsafe file.
BOUNDS_CODES = ("receipt.unsafe", "receipt.oversize", "receipt.nesting")
__all__ = ("FAIL", "INCOMPLETE", "PASS", "RECEIPT_CODES", "SKIP", "VerdictWriteError", "verify_case", "verify_run")


def finding(code, status, message="", evidence=None, seconds=None):
    """One finding of a registered code (its group and meaning come from the registry)."""
    entry = REGISTRY[code]
    found = {"code": code, "group": entry.group, "meaning": entry.meaning, "status": status,
             "message": message, "evidence": evidence}
    if seconds is not None:
        found["time"] = round(seconds, 6)
    return found


def _file_finding(problem, code):
    """A plan file that cannot be read: its bounds code when it broke one, else ``code``."""
    return finding(problem.code if problem.code in BOUNDS_CODES else code, FAIL,
                   f"{os.path.basename(problem.path)}: {problem.message}", problem.path)


def _node_failures(case_dir, root):
    """(messages, receipt problems) of the gate's notes of a failed node step."""
    messages, bounds = [], []
    for role in ROLES:
        note = load_json(os.path.join(case_dir, role, "node-failure.json"), root=root)
        if note.ok:
            data = note.data
            messages.append(f"{role} on {data.get('host')}: task {data.get('task')!r} failed: {data.get('message')}")
        elif note.problem.code in BOUNDS_CODES:
            bounds.append(note.problem)
        elif note.problem.code != "receipt.missing":  # a note that exists says a step failed, readable or not
            messages.append(f"{role}: a node step failed, and its note cannot be read ({note.problem.message})")
    return messages, bounds


def verify_case(case_dir, root=None):
    """(case id, findings) of one case directory; never raises on bad receipts.

    ``root`` is the run directory: no file outside it is read (default: the case directory).
    """
    root = root if root is not None else case_dir
    case_id = os.path.basename(os.path.normpath(case_dir))
    meta = load_json(os.path.join(case_dir, "case.json"), CASE_SCHEMA, root=root)
    if not meta.ok:
        return case_id, [_file_finding(meta.problem, "case.meta")]
    try:
        profile = model.validate_profile(meta.data.get("profile"))
    except model.ProfileError as error:
        return case_id, [finding("case.profile", FAIL, str(error), meta.path)]
    workload = model.derive_workload(profile)
    findings = []
    if REGISTRY["case.mode_unverified"].applies_to(profile, workload):
        findings.append(finding("case.mode_unverified", FAIL,
                                f"mode {profile['mode']} has no fault-specific rules yet: it cannot pass", meta.path))

    messages, bounds = _node_failures(case_dir, root)
    findings.append(finding("case.node_failure", FAIL if messages else PASS, "; ".join(messages),
                            os.path.join(case_dir, "<role>", "node-failure.json") if messages else None))

    case = case_receipts(case_dir, case_id, profile, workload, root=root)
    problems = bounds + case.problems()
    for code in RECEIPT_CODES:
        mine = [p for p in problems if p.code == code]
        message = "; ".join(f"{p.path}: {p.message}" for p in mine[:5])
        findings.append(finding(code, FAIL if mine else PASS, message, mine[0].path if mine else None))

    usable = case.usable()
    failed = set()
    for rule in RULES:
        if not rule.applies_to(profile, workload):
            continue
        masked_by = [code for code in rule.after if code in failed]
        if masked_by:
            findings.append(finding(rule.code, SKIP,
                                    f"masked by {', '.join(masked_by)}: the same fact already failed there"))
            continue
        missing = [need for need in rule.needs if not usable[need]]
        if missing:
            why = f"skipped: unusable {', '.join(missing)} (see the receipt findings)"
            findings.append(finding(rule.code, SKIP, why))
            continue
        started = time.perf_counter()
        try:
            found = rule.check(case)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
            # A receipt passed the shape check yet still surprised a rule: report it on that rule.
            found = [(f"receipt content the rule could not read: {type(error).__name__}: "
                      f"{names.quote(str(error))}", case_dir)]
        seconds = time.perf_counter() - started
        if found:
            message = "; ".join(m for m, _where in found[:5]) + (f" (+{len(found) - 5} more)" if len(found) > 5 else "")
            findings.append(finding(rule.code, FAIL, message, found[0][1], seconds))
            failed.add(rule.code)
        else:
            findings.append(finding(rule.code, PASS, seconds=seconds))
    return case_id, findings


def _read_plan(run_dir, given):
    """(planned case IDs or None, run.json data, run findings)."""
    run_json = os.path.join(run_dir, "run.json")
    plan = load_json(run_json, RUN_SCHEMA, root=run_dir)
    if not plan.ok:
        return None, {}, [_file_finding(plan.problem, "run.plan")]
    cases = plan.data.get("cases")
    problem = None
    if not isinstance(cases, list) or not cases:
        problem = f"run.json: cases={names.quote(cases)}: must be a non-empty list of case IDs"
    else:
        bad = [c for c in cases if not names.is_name(c)]
        twice = sorted({c for c in cases if isinstance(c, str) and cases.count(c) > 1})
        if bad:
            problem = f"run.json: case IDs {names.quote(bad)}: each must be {names.NAME_RULE}"
        elif twice:
            problem = f"run.json: case IDs {twice} are planned twice"
    if problem:
        return None, plan.data, [finding("run.plan", FAIL, problem, run_json)]
    unplanned = [c for c in given or () if c not in cases]
    if unplanned:
        return cases, plan.data, [finding("run.plan", FAIL, f"cases {names.quote(unplanned)} were given to verify "
                                                            f"but are not in the plan {names.quote(cases)}", run_json)]
    return cases, plan.data, [finding("run.plan", PASS)]


def verify_run(run_dir, output_dir=None, write=True, cases=None, partial=False):
    """Verify the planned cases of ``run_dir``; write the verdict files to ``output_dir`` as it goes.

    ``cases``: verify only these planned cases (those run so far); the others are pending.
    ``partial``: the run is still going: the verdict is at best INCOMPLETE.
    Raises VerdictWriteError when the final verdict cannot be written in full (every older verdict
    file was removed first); ``error.verdict`` holds the verdict that was computed. A partial
    verification is not the last word: its write error is returned as ``write_error`` instead, and
    the final verification writes (or fails) later.
    """
    output_dir = output_dir or run_dir
    planned, meta, run_findings = _read_plan(run_dir, cases)
    verdict = {
        "schema": VERDICT_SCHEMA[0],
        "version": VERDICT_SCHEMA[1],
        "run_id": meta.get("run_id") if names.is_name(meta.get("run_id")) else os.path.basename(
            os.path.normpath(run_dir)),
        "run_dir": run_dir,
        "started_at": time.time(),
        "finished_at": None,
        "complete": False,
        "diagnostic_only": meta.get("allow_dirty") is True,
        "verdict": INCOMPLETE,
        "planned_cases": list(planned or []),
        "run_findings": run_findings,
        "cases": [],
        "counts": {},
        "failed_codes": [],
    }
    wanted = [c for c in planned or () if cases is None or c in cases]
    done, write_error = {}, []

    def publish(final):
        _summarize(verdict, planned, done, final and not partial)
        if final:
            verdict["finished_at"] = time.time()
        if not write:
            return
        try:
            write_reports(verdict, output_dir)
            write_error.clear()
        except VerdictWriteError as error:
            if final and not partial:
                error.verdict = verdict
                raise
            # Not the last word: the older files are gone (write_reports removed them); try again later.
            write_error[:] = [str(error)]

    publish(final=False)
    for case_id in wanted:
        started = time.perf_counter()
        case_dir = os.path.join(run_dir, "cases", case_id)
        if not os.path.isdir(case_dir):
            findings = [finding("case.missing", FAIL, f"case {case_id} has no directory under {run_dir}/cases",
                                run_dir)]
        else:
            findings = verify_case(case_dir, root=run_dir)[1]
        status = FAIL if any(f["status"] == FAIL for f in findings) else PASS
        done[case_id] = {"case": case_id, "verdict": status, "time": round(time.perf_counter() - started, 6),
                         "findings": findings}
        publish(final=False)
    publish(final=True)
    if write_error:
        verdict["write_error"] = write_error[0]
    return verdict


def _summarize(verdict, planned, done, final):
    pending = [c for c in planned or () if c not in done]
    verdict["cases"] = [done[c] if c in done else {"case": c, "verdict": INCOMPLETE, "time": 0.0, "findings": []}
                        for c in planned or ()]
    verdict["complete"] = bool(final and not pending)
    run_findings = [f for f in verdict["run_findings"] if f["code"] != "run.incomplete"]
    if planned is not None:
        if verdict["complete"]:
            run_findings.append(finding("run.incomplete", PASS))
        else:
            why = (f"not verified: {', '.join(pending)}" if pending else
                   "the run is still going (a partial verification)")
            run_findings.append(finding("run.incomplete", FAIL, f"{len(done)} of {len(planned)} planned case(s) "
                                                                f"verified; {why} (this is not a PASS)"))
    verdict["run_findings"] = run_findings

    counts = {PASS: 0, FAIL: 0, SKIP: 0}
    failed = []
    for found in run_findings + [f for case in verdict["cases"] for f in case["findings"]]:
        counts[found["status"]] += 1
        if found["status"] == FAIL and found["code"] not in failed:
            failed.append(found["code"])
    statuses = [case["verdict"] for case in verdict["cases"]]
    verdict["counts"] = {
        "pass": counts[PASS],
        "fail": counts[FAIL],
        "skip": counts[SKIP],
        "cases": len(statuses),
        "cases_passed": statuses.count(PASS),
        "cases_failed": statuses.count(FAIL),
        "cases_incomplete": statuses.count(INCOMPLETE),
    }
    verdict["failed_codes"] = failed
    if not failed and verdict["complete"] and statuses and all(s == PASS for s in statuses):
        verdict["verdict"] = PASS
    elif set(failed) <= {"run.incomplete"}:
        verdict["verdict"] = INCOMPLETE
    else:
        verdict["verdict"] = FAIL
