# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Run the verifier's rules over a run directory and decide the verdict (reports.py writes it).

The verdict is rewritten atomically after every case, so a killed controller still leaves the
verdict so far. Layout of a run directory: docs/verifier.md.
"""

from __future__ import annotations

import os
import time

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.reports import STATUSES, write_reports
from ansible_collections.orbite.qualification.plugins.module_utils._verify.loader import CASE_SCHEMA, load_json
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import (
    RULES,
    VERIFIED_MODES,
    case_receipts,
)

VERDICT_SCHEMA = ("orbite.verdict", 1)
PASS, FAIL, SKIP = STATUSES
RECEIPT_CODES = ("receipt.missing", "receipt.malformed", "receipt.schema", "receipt.truncated", "receipt.shape")
RECEIPT_MEANINGS = {
    "receipt.missing": "every receipt the case implies is present",
    "receipt.malformed": "every receipt is readable JSON of the documented kind",
    "receipt.schema": "every receipt carries the documented schema name and version",
    "receipt.truncated": "no receipt is a checkpoint or cut short",
    "receipt.shape": "every receipt has the documented fields and types",
}


def _finding(code, group, meaning, status, message="", evidence=None):
    return {
        "code": code,
        "group": group,
        "meaning": meaning,
        "status": status,
        "message": message,
        "evidence": evidence,
    }


def verify_case(case_dir):
    """All findings of one case directory (never raises on bad receipts)."""
    case_id = os.path.basename(os.path.normpath(case_dir))
    meta = load_json(os.path.join(case_dir, "case.json"), CASE_SCHEMA)
    if not meta.ok:
        return case_id, [
            _finding(
                "case.meta", "case", "the case description is readable", FAIL, meta.problem.message, meta.problem.path
            )
        ]
    try:
        profile = model.validate_profile(meta.data.get("profile"))
    except model.ProfileError as error:
        return case_id, [_finding("case.profile", "case", "the case's profile is valid", FAIL, str(error), meta.path)]
    workload = model.derive_workload(profile)
    findings = []
    if profile["mode"] not in VERIFIED_MODES:
        findings.append(
            _finding(
                "case.mode_unverified",
                "case",
                "the verifier has the mode's fault rules",
                FAIL,
                f"mode {profile['mode']} has no fault-specific rules yet: it cannot pass",
                meta.path,
            )
        )

    failures = []
    for role in ("source", "requester"):
        note = load_json(os.path.join(case_dir, role, "node-failure.json"))
        if note.ok:
            failures.append(f"{role} on {note.data.get('host')}: task {note.data.get('task')!r} failed: "
                            f"{note.data.get('message')}")
    findings.append(_finding("case.node_failure", "case", "no gate step failed on a node",
                             FAIL if failures else PASS, "; ".join(failures),
                             os.path.join(case_dir, "<role>", "node-failure.json") if failures else None))

    case = case_receipts(case_dir, case_id, profile, workload)
    problems = [r.problem for r in case.ledgers.values() if r.problem]
    problems += [log.problem for log in case.observer_logs.values() if log.problem]
    problems += [r.problem for r in case.journals.values() if r.problem]
    problems += [r.problem for r in case.inventories.values() if r.problem]
    for code in RECEIPT_CODES:
        mine = [p for p in problems if p.code == code]
        message = "; ".join(f"{p.path}: {p.message}" for p in mine[:5])
        findings.append(
            _finding(
                code,
                "receipts",
                RECEIPT_MEANINGS[code],
                FAIL if mine else PASS,
                message,
                mine[0].path if mine else None,
            )
        )

    usable = {
        "ledgers": all(r.ok for r in case.ledgers.values()),
        "observers": all(log.ok for log in case.observer_logs.values()),
        "journals": all(r.ok for r in case.journals.values()),
        "inventories": all(r.ok for r in case.inventories.values()),
    }
    failed = set()
    for rule in RULES:
        if not rule.applies_to(profile, workload):
            continue
        masked_by = [code for code in rule.after if code in failed]
        if masked_by:
            findings.append(_finding(rule.code, rule.group, rule.meaning, SKIP,
                                     f"masked by {', '.join(masked_by)}: the same fact already failed there"))
            continue
        missing = [need for need in rule.needs if not usable[need]]
        if missing:
            findings.append(
                _finding(
                    rule.code,
                    rule.group,
                    rule.meaning,
                    SKIP,
                    f"skipped: unusable {', '.join(missing)} (see the receipt findings)",
                )
            )
            continue
        try:
            found = rule.check(case)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
            # A receipt passed the shape check yet still surprised a rule: report it on that rule.
            found = [(f"receipt content the rule could not read: {type(error).__name__}: {error}", case_dir)]
        if found:
            message = "; ".join(m for m, _where in found[:5]) + (f" (+{len(found) - 5} more)" if len(found) > 5 else "")
            findings.append(_finding(rule.code, rule.group, rule.meaning, FAIL, message, found[0][1]))
            failed.add(rule.code)
        else:
            findings.append(_finding(rule.code, rule.group, rule.meaning, PASS))
    return case_id, findings


def _missing_case(case_id, message, run_dir):
    finding = _finding("case.missing", "case", "every planned case left its receipts", FAIL, message, run_dir)
    return {"case": case_id, "verdict": FAIL, "findings": [finding]}


def _case_dirs(run_dir):
    cases_root = os.path.join(run_dir, "cases")
    if not os.path.isdir(cases_root):
        return []
    return [
        os.path.join(cases_root, name)
        for name in sorted(os.listdir(cases_root))
        if os.path.isdir(os.path.join(cases_root, name))
    ]


def verify_run(run_dir, output_dir=None, write=True, expected_cases=None, partial=False):
    """Verify every case under ``run_dir/cases``; write verdict files to ``output_dir`` as it goes.

    ``partial``: the run is still going (only ``expected_cases`` are done): the verdict says
    ``complete: false``.
    """
    output_dir = output_dir or run_dir
    run_meta = load_json(os.path.join(run_dir, "run.json"))
    meta = run_meta.data if run_meta.ok else {}
    verdict = {
        "schema": VERDICT_SCHEMA[0],
        "version": VERDICT_SCHEMA[1],
        "run_id": meta.get("run_id") or os.path.basename(os.path.normpath(run_dir)),
        "run_dir": run_dir,
        "started_at": time.time(),
        "finished_at": None,
        "complete": False,
        "diagnostic_only": bool(meta.get("allow_dirty")),
        "verdict": FAIL,
        "cases": [],
        "counts": {},
        "failed_codes": [],
    }
    case_dirs = _case_dirs(run_dir)
    found_ids = [os.path.basename(d) for d in case_dirs]
    wanted = list(expected_cases if expected_cases is not None else meta.get("cases") or found_ids)
    for case_id in wanted:
        if case_id not in found_ids:
            verdict["cases"].append(_missing_case(case_id, f"case {case_id} has no directory under {run_dir}/cases",
                                                  run_dir))
    for case_dir in case_dirs:
        if os.path.basename(case_dir) not in wanted:
            continue
        case_id, findings = verify_case(case_dir)
        status = FAIL if any(f["status"] == FAIL for f in findings) else PASS
        verdict["cases"].append({"case": case_id, "verdict": status, "findings": findings})
        _summarize(verdict)
        if write:
            write_reports(verdict, output_dir)
    if not wanted:
        verdict["cases"].append(_missing_case("(none)", f"no case under {run_dir}/cases", run_dir))
    verdict["complete"] = not partial
    verdict["finished_at"] = None if partial else time.time()
    _summarize(verdict)
    if write:
        write_reports(verdict, output_dir)
    return verdict


def _summarize(verdict):
    counts = {PASS: 0, FAIL: 0, SKIP: 0}
    failed = []
    for case in verdict["cases"]:
        for finding in case["findings"]:
            counts[finding["status"]] += 1
            if finding["status"] == FAIL and finding["code"] not in failed:
                failed.append(finding["code"])
    verdict["counts"] = {
        "pass": counts[PASS],
        "fail": counts[FAIL],
        "skip": counts[SKIP],
        "cases": len(verdict["cases"]),
        "cases_failed": sum(c["verdict"] == FAIL for c in verdict["cases"]),
    }
    verdict["failed_codes"] = failed
    ok = verdict["cases"] and all(c["verdict"] == PASS for c in verdict["cases"])
    verdict["verdict"] = PASS if ok else FAIL
