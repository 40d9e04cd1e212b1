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

import json
import os
import re
import time

from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.case import ROLES, case_receipts
from ansible_collections.orbite.qualification.plugins.module_utils._verify.loader import (
    CASE_SCHEMA,
    RUN_SCHEMA,
    load_json,
)
from ansible_collections.orbite.qualification.plugins.module_utils._verify import history
from ansible_collections.orbite.qualification.plugins.module_utils._verify import plots as plots_of
from ansible_collections.orbite.qualification.plugins.module_utils._verify.reading import no_gc
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
RUNNER_KINDS = ("sim", "native")
_SHA256 = re.compile(r"[0-9a-f]{64}", re.ASCII)
# A file the verifier could not trust as read is named by its receipt.* code wherever it lies
# (run.json, case.json, a gate note), so one code always names an unsafe file.
BOUNDS_CODES = ("receipt.unsafe", "receipt.oversize", "receipt.nesting")
__all__ = ("FAIL", "INCOMPLETE", "PASS", "RECEIPT_CODES", "SKIP", "VerdictWriteError", "verify_case", "verify_run")


def finding(code, status, message="", evidence=None, seconds=None, figures=None):
    """One finding of a registered code (its group and meaning come from the registry). ``figures``:
    [{"evidence", "expected", "observed"}] where the rule states the two figures it compared."""
    entry = REGISTRY[code]
    found = {"code": code, "group": entry.group, "meaning": entry.meaning, "status": status,
             "message": message, "evidence": evidence}
    if seconds is not None:
        found["time"] = round(seconds, 6)
    if figures:
        # As JSON has them (keys as text), so a report sorting keys never meets int and str keys together.
        found["figures"] = json.loads(json.dumps(figures, default=str))
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


def verify_case(case_dir, root=None, plan=None, loaded=None, run_memo=None):
    """(case id, findings) of one case directory; never raises on bad receipts.

    ``root`` is the run directory: no file outside it is read (default: the case directory).
    ``plan`` is run.json (checked by ``_read_plan``): without it the identity rules fail.
    ``loaded``: a dict that gets the case's receipts as read (``"case"``), for the reports' plots.
    ``run_memo``: facts of the run's other cases the rules read, shared by the cases of one run.
    """
    # A case's receipts and the rules' columns are large acyclic structures: the cyclic collector
    # would only rescan them, again and again while they are built (a million-record log: seconds).
    with no_gc():
        return _verify_case(case_dir, root, plan, loaded, run_memo)


def _verify_case(case_dir, root, plan, loaded, run_memo):
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
    case.plan, case.meta = dict(plan or {}), meta.data
    case.run_memo = run_memo if run_memo is not None else {}
    # The switches this case ran with: the run's and its own (run.json case_defects), which the identity
    # rules compare with what each runner was told; a case with its own never passes.
    own = list((case.plan.get("case_defects") or {}).get(case_id) or [])
    left_out = list((case.plan.get("case_left_out") or {}).get(case_id) or [])
    if own:
        case.plan["defects"] = list(case.plan.get("defects") or []) + own
    if own or left_out:
        why = [f"its own defect switches are on: {', '.join(own)}"] if own else []
        why += [f"it left {', '.join(left_out)} out of the preload"] if left_out else []
        findings.append(finding("run.diagnostic", FAIL, f"this case is diagnostic and never a PASS: {'; '.join(why)}",
                                os.path.join(root, "run.json")))
    if loaded is not None:
        loaded["case"] = case
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
        if missing == ["provider"]:
            why = ("skipped: no witness here: the plan loads no loopback verbs provider (artifacts.verbs_library "
                   "null), and the system libibverbs keeps no per-device counters")
            findings.append(finding(rule.code, SKIP, why))
            continue
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
            # A problem is (message, where) or (message, where, {"expected", "observed"}).
            message = "; ".join(p[0] for p in found[:5]) + (f" (+{len(found) - 5} more)" if len(found) > 5 else "")
            figures = [{"evidence": p[1], **p[2]} for p in found if len(p) > 2][:5]
            findings.append(finding(rule.code, FAIL, message, found[0][1], seconds, figures))
            failed.add(rule.code)
        else:
            findings.append(finding(rule.code, PASS, seconds=seconds))
    return case_id, findings


def _file_entry_problem(where, entry, fields=("path", "sha256")):
    if not isinstance(entry, dict):
        return f"{where}={names.quote(entry)}: must be an object of {', '.join(fields)}"
    for key in fields:
        if key not in entry:
            return f"{where}.{key}: missing"
    if not (isinstance(entry["path"], str) and entry["path"].startswith("/")):
        return f"{where}.path={names.quote(entry['path'])}: must be an absolute path"
    if not (isinstance(entry["sha256"], str) and _SHA256.fullmatch(entry["sha256"])):
        return f"{where}.sha256={names.quote(entry['sha256'])}: must be 64 lowercase hex digits"
    return None


def _artifacts_problem(artifacts, runner_kind):
    """None, or the first rule ``run.json`` ``artifacts`` breaks (absent is identity.artifacts' finding)."""
    if artifacts is None:
        return None
    if not isinstance(artifacts, dict):
        return f"artifacts={names.quote(artifacts)}: must be an object of runner, verbs_library, observers"
    problem = _file_entry_problem("artifacts.runner", artifacts.get("runner"), ("kind", "path", "sha256"))
    if problem:
        return problem
    if artifacts["runner"]["kind"] != runner_kind:
        return (f"artifacts.runner.kind={names.quote(artifacts['runner']['kind'])}: must be the runner_kind "
                f"{runner_kind!r}")
    if artifacts.get("verbs_library") is not None:
        problem = _file_entry_problem("artifacts.verbs_library", artifacts["verbs_library"])
        if problem:
            return problem
    observers = artifacts.get("observers")
    if observers is None:
        return None
    if not isinstance(observers, dict):
        return f"artifacts.observers={names.quote(observers)}: must be an object of tool to {{path, sha256}}"
    for tool, entry in observers.items():
        problem = _file_entry_problem(f"artifacts.observers.{tool}", entry)
        if problem:
            return problem
    return None


def _plan_problem(data):
    """None, or the first rule run.json breaks (docs/verifier.md, run directory layout)."""
    cases = data.get("cases")
    if not names.is_name(data.get("run_id")):
        return f"run.json: run_id={names.quote(data.get('run_id'))}: must be {names.NAME_RULE}"
    if not isinstance(cases, list) or not cases:
        return f"run.json: cases={names.quote(cases)}: must be a non-empty list of case IDs"
    bad = [c for c in cases if not names.is_name(c)]
    twice = sorted({c for c in cases if isinstance(c, str) and cases.count(c) > 1})
    if bad:
        return f"run.json: case IDs {names.quote(bad)}: each must be {names.NAME_RULE}"
    if twice:
        return f"run.json: case IDs {twice} are planned twice"
    if data.get("runner_kind") not in RUNNER_KINDS:
        return f"run.json: runner_kind={names.quote(data.get('runner_kind'))}: must be one of {', '.join(RUNNER_KINDS)}"
    defects = data.get("defects")
    if not isinstance(defects, list) or not all(names.is_name(d) for d in defects):
        return (f"run.json: defects={names.quote(defects)}: must be a list of defect switch names (empty for a "
                "qualifying run)")
    for field, what in (("case_defects", "defect switch names"), ("case_left_out", "observer names")):
        per_case = data.get(field, {})
        if not (isinstance(per_case, dict) and all(
                isinstance(v, list) and all(names.is_name(d) for d in v) for v in per_case.values())):
            return f"run.json: {field}={names.quote(per_case)}: must be an object of case ID to a list of {what}"
    if not isinstance(data.get("allow_dirty"), bool):
        return f"run.json: allow_dirty={names.quote(data.get('allow_dirty'))}: must be true or false"
    for field in ("profiles", "hosts"):
        if not isinstance(data.get(field), dict) or not all(isinstance(v, dict) for v in data[field].values()):
            return f"run.json: {field}={names.quote(data.get(field))}: must be an object of case ID to object"
    problem = _artifacts_problem(data.get("artifacts"), data["runner_kind"]) or _origin_problem(data.get("origin"))
    return f"run.json: {problem}" if problem else None


def _origin_problem(origin):
    """None, or the rule a rerun's ``origin`` breaks: {"run_id": name, "run_dir": absolute path, "cases": [name]}."""
    if origin is None:
        return None
    if not isinstance(origin, dict) or not names.is_name(origin.get("run_id")):
        return f"origin={names.quote(origin)}: must be an object whose run_id is {names.NAME_RULE}"
    if not (isinstance(origin.get("run_dir"), str) and origin["run_dir"].startswith("/")):
        return f"origin.run_dir={names.quote(origin.get('run_dir'))}: must be an absolute path"
    return None


def _read_plan(run_dir, given):
    """(planned case IDs or None, run.json data, run findings)."""
    run_json = os.path.join(run_dir, "run.json")
    plan = load_json(run_json, RUN_SCHEMA, root=run_dir)
    if not plan.ok:
        return None, {}, [_file_finding(plan.problem, "run.plan")]
    problem = _plan_problem(plan.data)
    if problem:
        return None, plan.data, [finding("run.plan", FAIL, problem, run_json)]
    cases = plan.data["cases"]
    defects = sorted(plan.data["defects"])
    # A defect matrix: each case's own switches, named with their case.
    defects += [f"{switch} (case {case_id})" for case_id, switches in sorted(plan.data.get("case_defects", {}).items())
                for switch in switches]
    defects += [f"{tool} left out of the preload (case {case_id})"
                for case_id, tools in sorted(plan.data.get("case_left_out", {}).items()) for tool in tools]
    diagnostic = (finding("run.diagnostic", FAIL, f"defect switches on: {', '.join(defects)}: this run is "
                                                  "diagnostic and never a PASS", run_json)
                  if defects else finding("run.diagnostic", PASS))
    unplanned = [c for c in given or () if c not in cases]
    if unplanned:
        return cases, plan.data, [finding("run.plan", FAIL, f"cases {names.quote(unplanned)} were given to verify "
                                                            f"but are not in the plan {names.quote(cases)}", run_json),
                                  diagnostic]
    return cases, plan.data, [finding("run.plan", PASS), diagnostic]


def _all_defects(meta):
    """The run's defect switches and every case's own (run.json case_defects), each once."""
    seen = list(meta.get("defects") or [])
    for switches in (meta.get("case_defects") or {}).values():
        seen += [s for s in switches if s not in seen]
    return seen


def verify_run(run_dir, output_dir=None, write=True, cases=None, partial=False, index_dir=None):
    """Verify the planned cases of ``run_dir``; write the verdict files to ``output_dir`` as it goes.

    ``cases``: verify only these planned cases (those run so far); the others are pending.
    ``partial``: the run is still going: the verdict is at best INCOMPLETE.
    Raises VerdictWriteError when the final verdict cannot be written in full (every older verdict
    file was removed first); ``error.verdict`` holds the verdict that was computed. A partial
    verification is not the last word: its write error is returned as ``write_error`` instead, and
    the final verification writes (or fails) later.
    ``index_dir``: the runs directory whose history (history.py: index.json, index.html) gets this
    run's entry once the verdict is written; a failure there is returned as ``index_error``.
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
        # What the verdict qualifies: the plan's artifacts (sha256 of runner, verbs library, observers),
        # and whether it can qualify anything at all (a dirty build, defect switches).
        "runner_kind": meta.get("runner_kind") if planned is not None else None,
        "artifacts": meta.get("artifacts") if planned is not None else None,
        "defects": _all_defects(meta) if planned is not None else [],
        "diagnostic_only": meta.get("allow_dirty") is True or bool(planned is not None and (
            _all_defects(meta) or meta.get("case_left_out"))),
        # A rerun of the cases that did not pass in an earlier run (run_plan rerun_from) names that run.
        "origin": meta.get("origin") if planned is not None else None,
        "verdict": INCOMPLETE,
        "planned_cases": list(planned or []),
        "run_findings": run_findings,
        "cases": [],
        "counts": {},
        "failed_codes": [],
    }
    wanted = [c for c in planned or () if cases is None or c in cases]
    done, write_error, plots = {}, [], {}
    run_memo = {}  # what the cases' rules read of each other's receipts (the lock holds), read once

    def publish(final):
        _summarize(verdict, planned, done, final and not partial)
        if final:
            verdict["finished_at"] = time.time()
        if not write:
            return
        try:
            write_reports(verdict, output_dir, plots)
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
        loaded = {}
        # One pause of the cyclic collector over the case, its figures included: resumed while the
        # receipts were still held, it would first rescan all of them (seconds for a million records).
        with no_gc():
            if not os.path.isdir(case_dir):
                findings = [finding("case.missing", FAIL, f"case {case_id} has no directory under {run_dir}/cases",
                                    run_dir)]
            else:
                findings = verify_case(case_dir, root=run_dir, plan=meta, loaded=loaded, run_memo=run_memo)[1]
            status = FAIL if any(f["status"] == FAIL for f in findings) else PASS
            done[case_id] = {"case": case_id, "verdict": status, "time": round(time.perf_counter() - started, 6),
                             "findings": findings}
            if "case" in loaded:
                done[case_id]["figures"], plots[case_id] = _figures(loaded.pop("case"))
        publish(final=False)
    publish(final=True)
    if write_error:
        verdict["write_error"] = write_error[0]
    elif write and index_dir:
        try:
            history.update_index(index_dir, history.index_entry(verdict, meta, output_dir))
        except (OSError, OrbiteError) as error:
            verdict["index_error"] = f"{index_dir}: the run index could not be updated ({error})"
    return verdict


def _figures(case):
    """(headline figures, plot data) of a verified case; a receipt that surprises the drawing costs only the
    plots (the rules judged it already), never the verdict."""
    try:
        with no_gc():  # the case's receipts are still held: a collection would rescan them all (verify_case)
            return plots_of.headline(case), plots_of.case_plots(case)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return {}, None


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
