# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The fleet verdict (one row per pair and case) and the merge of AWX slices' fleet verdicts (docs/fleet.md).

Each pair is an ordinary run directory verified by the verifier (_verify/verdict.py); the fleet
verdict only gathers the pairs' verdicts, and fails closed like them:

- ``PASS`` only when every planned pair has a complete verdict and every planned case of every pair
  passed;
- ``FAIL`` when any row or pair verdict failed (or, merging, slices contradict each other);
- ``INCOMPLETE`` otherwise: a pair without a verdict, a case a pair's verdict does not name, a
  fleet still running; merging, a slice missing (killed before it wrote anything), a slice that
  did not finish, a pair no slice ran. Never PASS.
"""

from __future__ import annotations

import json
import os
import time

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    atomic_write_json,
    atomic_write_text,
    read_regular_bytes,
)
from ansible_collections.orbite.qualification.plugins.module_utils._verify.reports import (
    FAIL,
    INCOMPLETE,
    PASS,
    md_code,
    md_text,
)

FLEET_VERDICT_SCHEMA = ("orbite.fleet-verdict", 1)
JSON_NAME, MARKDOWN_NAME = "fleet-verdict.json", "fleet-verdict.md"
READ_LIMIT = 16 << 20  # a verdict of 56 pairs x a few cases is well under a megabyte


class FleetVerdictError(OrbiteError):
    code = "fleet.verdict"


def _finding(code, message):
    return {"code": code, "message": message}


def _pair_rows(pair, cases, pair_verdict):
    """The rows of one pair: the case verdicts its run's verdict names, INCOMPLETE for the rest."""
    named = {c.get("case"): c for c in (pair_verdict or {}).get("cases") or [] if isinstance(c, dict)}
    rows = []
    for case_id in cases:
        case = named.get(case_id)
        status = case.get("verdict") if case and case.get("verdict") in (PASS, FAIL, INCOMPLETE) else INCOMPLETE
        failed = sorted({f.get("code") for f in (case or {}).get("findings") or []
                         if isinstance(f, dict) and f.get("status") == FAIL})
        rows.append({"pair": pair["id"], "source": pair["source"], "requester": pair["requester"],
                     "case": case_id, "verdict": status, "failed_codes": failed})
    return rows


def _summary(rows, findings, complete):
    statuses = [row["verdict"] for row in rows]
    failed_codes = sorted({code for row in rows for code in row["failed_codes"]}
                          | {f["code"] for f in findings if f.get("fail")})
    if FAIL in statuses or any(f.get("fail") for f in findings):
        verdict = FAIL
    elif complete and rows and all(s == PASS for s in statuses) and not findings:
        verdict = PASS
    else:
        verdict = INCOMPLETE
    counts = {"rows": len(rows), "passed": statuses.count(PASS), "failed": statuses.count(FAIL),
              "incomplete": statuses.count(INCOMPLETE)}
    return verdict, counts, failed_codes


def fleet_verdict(plan, cases, pair_verdicts, final=True):
    """The fleet verdict of ``plan`` (_fleet/plan.py) for the planned ``cases`` from each pair's run
    verdict (``pair_verdicts``: {pair id: verdict dict, or None when the pair has none)."""
    findings, pairs, rows = [], [], []
    for pair in plan["pairs"]:
        got = pair_verdicts.get(pair["id"])
        if not isinstance(got, dict):
            findings.append(_finding("fleet.pair_incomplete", f"pair {pair['id']} ({pair['source']} -> "
                                     f"{pair['requester']}) has no verdict"))
            status, complete = INCOMPLETE, False
        else:
            status, complete = got.get("verdict"), got.get("complete") is True
            if status not in (PASS, FAIL, INCOMPLETE):
                findings.append(dict(_finding("fleet.pair_verdict", f"pair {pair['id']}: verdict "
                                              f"{quote(status)} is none of PASS, FAIL, INCOMPLETE"), fail=True))
                status = FAIL
            elif status == INCOMPLETE:
                findings.append(_finding("fleet.pair_incomplete", f"pair {pair['id']}: its run's verdict is "
                                         f"{status}{'' if complete else ' (not complete)'}"))
            missing = [c for c in cases if c not in (got.get("planned_cases") or [])]
            if missing:
                findings.append(_finding("fleet.pair_incomplete", f"pair {pair['id']}: its run did not plan "
                                         f"{', '.join(missing)}"))
        pair_rows = _pair_rows(pair, cases, got if isinstance(got, dict) else None)
        if status == FAIL and not any(row["verdict"] == FAIL for row in pair_rows):
            # A run-level failure (run.plan, say) fails the pair even when no case row did.
            codes = (got or {}).get("failed_codes") or ["fleet.pair_verdict"]
            findings.append(dict(_finding("fleet.pair_failed", f"pair {pair['id']}: run verdict FAIL "
                                          f"({', '.join(map(str, codes))})"), fail=True))
        pairs.append({"id": pair["id"], "source": pair["source"], "requester": pair["requester"],
                      "verdict": status, "complete": complete,
                      "run_dir": (got or {}).get("run_dir"), "run_id": (got or {}).get("run_id")})
        rows += pair_rows
    if not plan["pairs"]:
        findings.append(_finding("fleet.no_pairs", "no pair of the fleet has both hosts here: nothing ran"))
    complete = bool(final and all(p["complete"] for p in pairs))
    verdict, counts, failed_codes = _summary(rows, findings, complete)
    return {
        "schema": FLEET_VERDICT_SCHEMA[0], "version": FLEET_VERDICT_SCHEMA[1],
        "fleet_id": plan.get("fleet_id"), "slice": plan.get("slice"), "merged": False,
        "written_at": time.time(), "complete": complete, "verdict": verdict,
        "pairing": plan.get("pairing"), "fleet_hosts": plan.get("fleet_hosts"), "hosts": plan.get("hosts"),
        "planned_cases": list(cases), "waves": plan.get("waves"), "elsewhere": plan.get("elsewhere", []),
        "pairs": pairs, "rows": rows, "findings": findings, "counts": counts, "failed_codes": failed_codes,
    }


def merge_verdicts(fleet_id, expected_pairs, expected_slices, slices, cases=None):
    """One fleet verdict from the slices' fleet verdicts.

    ``expected_pairs``: every pair of the whole fleet ({id, source, requester}, the plan of the fleet's
    hosts and pairing); ``expected_slices``: how many slices the job had; ``slices``: {name: verdict
    dict, or None when its file is missing or unreadable}; ``cases``: the planned case IDs (default:
    those the slices planned). A missing or unfinished slice, or a pair no slice ran, leaves the merge
    INCOMPLETE; slices that contradict each other or the expectation make it FAIL."""
    findings = []
    present = {name: doc for name, doc in slices.items() if isinstance(doc, dict)}
    for name in sorted(set(slices) - set(present)):
        findings.append(_finding("fleet.slice_missing", f"slice {name}: no readable fleet verdict"))
    if len(slices) < expected_slices:
        findings.append(_finding("fleet.slice_missing", f"{len(slices)} of {expected_slices} slice(s) left a "
                                 "fleet verdict: a slice that never ran or was killed before writing is missing"))
    elif len(slices) > expected_slices:
        findings.append(dict(_finding("fleet.merge_conflict", f"{len(slices)} slice verdicts for "
                                      f"{expected_slices} expected slice(s)"), fail=True))
    if cases is None:
        cases = []
        for doc in present.values():  # a slice without pairs planned no case
            if doc.get("pairs"):
                cases += [c for c in doc.get("planned_cases") or [] if c not in cases]
    expected = {p["id"]: p for p in expected_pairs}
    ran = {}
    for name, doc in sorted(present.items()):
        if (doc.get("schema"), doc.get("version")) != FLEET_VERDICT_SCHEMA or doc.get("fleet_id") != fleet_id:
            findings.append(dict(_finding("fleet.merge_conflict", f"slice {name}: not a fleet verdict of fleet "
                                          f"{fleet_id} (schema {quote(doc.get('schema'))}, fleet "
                                          f"{quote(doc.get('fleet_id'))})"), fail=True))
            continue
        if doc.get("complete") is not True:
            findings.append(_finding("fleet.slice_incomplete", f"slice {name}: did not finish (verdict "
                                     f"{doc.get('verdict')}, complete false)"))
        for pair in doc.get("pairs") or []:
            want = expected.get(pair.get("id"))
            if want is None or (want["source"], want["requester"]) != (pair.get("source"), pair.get("requester")):
                findings.append(dict(_finding("fleet.merge_conflict", f"slice {name}: pair {quote(pair.get('id'))} "
                                              f"({pair.get('source')} -> {pair.get('requester')}) is not the "
                                              "fleet's pair of that id"), fail=True))
            elif pair["id"] in ran:
                findings.append(dict(_finding("fleet.merge_conflict", f"pair {pair['id']} ran in slices "
                                              f"{ran[pair['id']][0]} and {name}"), fail=True))
            else:
                ran[pair["id"]] = (name, doc, pair)
    rows, pairs = [], []
    for pair_id, want in expected.items():
        if pair_id not in ran:
            findings.append(_finding("fleet.pair_incomplete", f"pair {pair_id} ({want['source']} -> "
                                     f"{want['requester']}): no slice ran it"))
            pairs.append(dict(want, verdict=INCOMPLETE, complete=False, slice=None))
            rows += [{"pair": pair_id, "source": want["source"], "requester": want["requester"], "case": c,
                      "verdict": INCOMPLETE, "failed_codes": []} for c in cases]
            continue
        name, doc, pair = ran[pair_id]
        pairs.append(dict(pair, slice=name))
        if pair.get("verdict") == FAIL:
            findings.append(dict(_finding("fleet.pair_failed", f"pair {pair_id}: FAIL in slice {name}"), fail=True))
        elif pair.get("verdict") != PASS or pair.get("complete") is not True:
            findings.append(_finding("fleet.pair_incomplete", f"pair {pair_id}: {pair.get('verdict')} in slice {name}"))
        got = {(r.get("pair"), r.get("case")): r for r in doc.get("rows") or [] if isinstance(r, dict)}
        for case_id in cases:
            row = got.get((pair_id, case_id))
            status = row.get("verdict") if row and row.get("verdict") in (PASS, FAIL, INCOMPLETE) else INCOMPLETE
            rows.append({"pair": pair_id, "source": want["source"], "requester": want["requester"], "case": case_id,
                         "verdict": status, "failed_codes": list((row or {}).get("failed_codes") or []),
                         "slice": name})
    complete = len(present) == expected_slices == len(slices) and all(
        d.get("complete") is True for d in present.values()) and len(ran) == len(expected)
    verdict, counts, failed_codes = _summary(rows, [f for f in findings if f.get("fail")], complete)
    if verdict == PASS and findings:  # anything found that is not a failure still keeps it from PASS
        verdict = INCOMPLETE
    return {
        "schema": FLEET_VERDICT_SCHEMA[0], "version": FLEET_VERDICT_SCHEMA[1],
        "fleet_id": fleet_id, "slice": None, "merged": True, "slices": sorted(slices),
        "expected_slices": expected_slices, "written_at": time.time(), "complete": complete,
        "verdict": verdict, "planned_cases": list(cases), "pairs": pairs, "rows": rows,
        "findings": findings, "counts": counts, "failed_codes": failed_codes,
    }


def read_fleet_verdict(path):
    """A fleet verdict file, or None when it is missing; FleetVerdictError when it is not one."""
    try:
        data = json.loads(read_regular_bytes(path, READ_LIMIT))
    except FileNotFoundError:
        return None
    except (OSError, OrbiteError, ValueError) as error:
        raise FleetVerdictError(f"{path}: not a readable fleet verdict ({error})", path=path) from None
    if not isinstance(data, dict):
        raise FleetVerdictError(f"{path}: not a JSON object", path=path)
    return data


def render_markdown(verdict):
    """The fleet verdict as Markdown; every value from a verdict file shown as literal text (md_text)."""
    lines = [f"# Fleet {md_text(verdict.get('fleet_id'))}: {md_text(verdict['verdict'])}", ""]
    scope = "merged from slices " + ", ".join(verdict.get("slices") or []) if verdict.get("merged") else (
        f"slice {verdict['slice']}" if verdict.get("slice") else "whole fleet")
    counts = verdict["counts"]
    lines += [f"{md_text(scope)}; {counts['passed']} of {counts['rows']} pair-case row(s) passed, "
              f"{counts['failed']} failed, {counts['incomplete']} incomplete; complete: "
              f"{str(verdict['complete']).lower()}", ""]
    lines += ["| pair | source | requester | case | verdict | failed codes |", "|---|---|---|---|---|---|"]
    for row in verdict["rows"]:
        cells = [row["pair"], row["source"], row["requester"], row["case"], row["verdict"],
                 ", ".join(row["failed_codes"]) or "-"]
        lines.append("| " + " | ".join(md_text(cell) for cell in cells) + " |")
    if verdict["findings"]:
        lines += ["", "## Why not PASS" if verdict["verdict"] != PASS else "## Notes", ""]
        lines += [f"- {md_code(f['code'])}: {md_text(f['message'])}" for f in verdict["findings"]]
    if verdict.get("pairs"):
        lines += ["", "## Pairs", ""]
        lines += [f"- {md_text(p['id'])} {md_text(p['source'])} -> {md_text(p['requester'])}: {md_text(p['verdict'])}"
                  + (f" ({md_text(p['run_dir'])}/verdict.md)" if p.get("run_dir") else "") for p in verdict["pairs"]]
    return "\n".join(lines) + "\n"


def write_fleet_verdict(verdict, output_dir):
    """fleet-verdict.json and fleet-verdict.md, each replaced atomically; their paths."""
    paths = {"json": os.path.join(output_dir, JSON_NAME), "markdown": os.path.join(output_dir, MARKDOWN_NAME)}
    # JSON last: the file the merge and AWX read is never newer than its Markdown.
    atomic_write_text(paths["markdown"], render_markdown(verdict))
    atomic_write_json(paths["json"], verdict)
    return paths
