# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The history of runs under a work directory (``runs/index.json`` and ``runs/index.html``), and the
comparison of two runs' verdicts.

The index is rewritten by the verdict writer after each verification, under an exclusive lock
(``runs/index.lock``, flock) so two runs finishing together never lose each other's entry, and
atomically (``_common/files``), so a reader never sees half a file. One entry per run ID: run
directory, date, profiles and hosts per case, the artifacts' sha256 and the reports' sha256,
verdict, counts and failing codes, and the origin of a rerun. An index that cannot be read (cut
short, edited) is kept aside as ``index.json.unreadable`` and a new one started.

``compare_runs`` holds two verdicts (``verdict.json``) against each other: codes newly failing,
newly passing, still failing, no longer checked, and the headline figures (``plots.headline``)
that moved.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from html import escape

from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    atomic_write_json,
    atomic_write_text,
    private_dir,
    read_regular_bytes,
    sha256_file,
)

INDEX_SCHEMA = ("orbite.run-index", 1)
COMPARE_SCHEMA = ("orbite.compare", 1)
INDEX_LIMIT = 64 << 20
VERDICT_LIMIT = 256 << 20
REPORT_FILES = {"json": "verdict.json", "junit": "verdict.xml", "markdown": "verdict.md", "html": "verdict.html"}
PROFILE_KEYS = ("mode", "operation", "rdma_events", "discovery", "parents", "payload", "block", "num_lanes", "mask")


class HistoryError(OrbiteError):
    code = "history.invalid"


def _iso(when):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)) if isinstance(when, (int, float)) else None


def _sha256(path):
    try:
        return sha256_file(path)
    except (OSError, OrbiteError):
        return None


def index_entry(verdict, plan, output_dir):
    """The index's line for one run, from its verdict and its plan (run.json)."""
    plan = plan if isinstance(plan, dict) else {}
    profiles = plan.get("profiles") if isinstance(plan.get("profiles"), dict) else {}
    artifacts = verdict.get("artifacts") if isinstance(verdict.get("artifacts"), dict) else {}
    hashes = {}
    if isinstance(artifacts.get("runner"), dict):
        hashes["runner"] = artifacts["runner"].get("sha256")
    if isinstance(artifacts.get("verbs_library"), dict):
        hashes["verbs_library"] = artifacts["verbs_library"].get("sha256")
    for tool, entry in sorted((artifacts.get("observers") or {}).items()):
        if isinstance(entry, dict):
            hashes[f"observer.{tool}"] = entry.get("sha256")
    return {
        "run_id": verdict.get("run_id"),
        "run_dir": verdict.get("run_dir"),
        "output_dir": output_dir,
        "date": _iso(verdict.get("finished_at") or verdict.get("started_at")),
        "verdict": verdict.get("verdict"),
        "complete": verdict.get("complete"),
        "diagnostic_only": verdict.get("diagnostic_only"),
        "defects": verdict.get("defects") or [],
        "runner_kind": verdict.get("runner_kind"),
        "profiles": {case: {k: p.get(k) for k in PROFILE_KEYS if k in p}
                     for case, p in profiles.items() if isinstance(p, dict)},
        "hosts": plan.get("hosts") if isinstance(plan.get("hosts"), dict) else {},
        "cases": {c["case"]: c["verdict"] for c in verdict.get("cases") or []},
        "counts": verdict.get("counts") or {},
        "failed_codes": verdict.get("failed_codes") or [],
        "artifacts": hashes,
        "reports": {kind: {"path": name, "sha256": _sha256(os.path.join(output_dir, name))}
                    for kind, name in REPORT_FILES.items()},
        "origin": verdict.get("origin"),
    }


def _read_index(path):
    """The index's runs; an unreadable index is kept aside (never silently dropped) and a new one begun."""
    try:
        data = json.loads(read_regular_bytes(path, INDEX_LIMIT).decode("utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError, RecursionError, OrbiteError):
        data = None
    if isinstance(data, dict) and data.get("schema") == INDEX_SCHEMA[0] and isinstance(data.get("runs"), list):
        return [run for run in data["runs"] if isinstance(run, dict) and names.is_name(run.get("run_id"))]
    os.replace(path, path + ".unreadable")
    return []


def update_index(index_dir, entry):
    """Put ``entry`` into ``<index_dir>/index.json`` (replacing the run's older entry) and rewrite index.html,
    under the index's lock. Returns the index's path."""
    private_dir(index_dir, "the history index")
    path = os.path.join(index_dir, "index.json")
    fd = os.open(os.path.join(index_dir, "index.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        runs = [run for run in _read_index(path) if run.get("run_id") != entry["run_id"]]
        runs.append(entry)
        runs.sort(key=lambda run: (str(run.get("date") or ""), str(run.get("run_id"))))
        index = {"schema": INDEX_SCHEMA[0], "version": INDEX_SCHEMA[1], "runs": runs}
        atomic_write_json(path, index, mode=0o600)
        atomic_write_text(os.path.join(index_dir, "index.html"), index_html(index), mode=0o600)
    finally:
        os.close(fd)  # releases the lock
    return path


def index_html(index):
    """The index as one self-contained page, newest run first; links stay inside the work directory."""
    def e(value):
        return escape("" if value is None else str(value), quote=True)

    rows = []
    for run in reversed(index["runs"]):
        run_id = str(run.get("run_id"))
        report = f"{run_id}/verdict.html"
        if run.get("output_dir") and run.get("run_dir") and run["output_dir"] != run["run_dir"]:
            report = ""  # written elsewhere (orbite_output_dir): no relative link
        profiles = "; ".join(f"{case}: {p.get('mode')} {p.get('operation')}" for case, p in
                             (run.get("profiles") or {}).items())
        hosts = "; ".join(f"{case}: {h.get('source')} \u2192 {h.get('requester')}" for case, h in
                          (run.get("hosts") or {}).items() if isinstance(h, dict))
        origin = (run.get("origin") or {}).get("run_id")
        artifacts = "<br>".join(f"{e(name)} {e(str(sha)[:12])}" for name, sha in (run.get("artifacts") or {}).items())
        link = f'<a href="{e(report)}">{e(run_id)}</a>' if report else e(run_id)
        rows.append(f'<tr class="run" data-run="{e(run_id)}" data-verdict="{e(run.get("verdict"))}"><td>{link}'
                    + (f"<br>rerun of {e(origin)}" if origin else "") + f'</td><td>{e(run.get("date"))}</td>'
                    f'<td class="{e(run.get("verdict"))}">{e(run.get("verdict"))}</td><td>{e(profiles)}</td>'
                    f"<td>{e(hosts)}</td>"
                    f'<td class="mono">{artifacts}</td><td class="mono">{e(", ".join(run.get("failed_codes") or []))}'
                    "</td></tr>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>OrbiTE runs</title><style>"
            "body{font-family:system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse}td,th{border:1px "
            "solid #ccd;padding:.25em .5em;vertical-align:top;font-size:.9em}th{background:#eef1f4}.FAIL{color:"
            "#c0392b}.PASS{color:#1e7d32}.INCOMPLETE{color:#8a6d00}.mono{font-family:monospace}</style></head>"
            f"<body><h1>OrbiTE runs ({len(index['runs'])})</h1><table><tr><th>run</th><th>date</th><th>verdict</th>"
            "<th>profiles</th><th>hosts</th><th>artifacts (sha256)</th><th>failing codes</th></tr>\n"
            + "\n".join(rows) + "\n</table></body></html>\n")


# --- compare ----------------------------------------------------------------------------------------


def resolve_run(value, runs_dir=None, field="a"):
    """A run directory: an absolute path, or a run ID under ``runs_dir``."""
    if isinstance(value, str) and value.startswith("/"):
        return os.path.normpath(value)
    if not names.is_name(value):
        raise HistoryError(f"{field}={names.quote(value)}: must be a run directory (absolute path) or a run ID "
                           f"({names.NAME_RULE})")
    if not runs_dir:
        raise HistoryError(f"{field}={value!r}: a run ID needs the runs directory (runs_dir)")
    return os.path.join(runs_dir, value)


def read_verdict(run_dir, field="a"):
    path = os.path.join(run_dir, "verdict.json")
    try:
        data = json.loads(read_regular_bytes(path, VERDICT_LIMIT).decode("utf-8"))
    except FileNotFoundError:
        raise HistoryError(f"{field}={run_dir}: has no verdict.json (not verified yet?)") from None
    except (OSError, ValueError, RecursionError, OrbiteError) as error:
        raise HistoryError(f"{field}={run_dir}: verdict.json cannot be read ({error})") from None
    if not isinstance(data, dict) or data.get("schema") != "orbite.verdict" or not isinstance(data.get("cases"), list):
        raise HistoryError(f"{field}={run_dir}: verdict.json holds {quote(data)}, not an orbite.verdict")
    return data


def _statuses(verdict):
    """{(case, code): status} over the run's findings ("run") and every case's."""
    out = {}
    for found in verdict.get("run_findings") or []:
        if isinstance(found, dict):
            out[("run", found.get("code"))] = found.get("status")
    for case in verdict["cases"]:
        if isinstance(case, dict):
            for found in case.get("findings") or []:
                if isinstance(found, dict):
                    out[(case.get("case"), found.get("code"))] = found.get("status")
    return out


def _figures(verdict):
    out = {}
    for case in verdict["cases"]:
        if isinstance(case, dict) and isinstance(case.get("figures"), dict):
            for name, value in case["figures"].items():
                out[(case.get("case"), name)] = value
    return out


def compare_runs(a_dir, b_dir):
    """What changed from run A to run B: codes and figures (B is the newer run, usually)."""
    a, b = read_verdict(a_dir, "a"), read_verdict(b_dir, "b")
    sa, sb = _statuses(a), _statuses(b)

    def listed(keys):
        return [{"case": case, "code": code} for case, code in sorted(keys, key=str)]

    failing_a = {k for k, s in sa.items() if s == "FAIL"}
    failing_b = {k for k, s in sb.items() if s == "FAIL"}
    fa, fb = _figures(a), _figures(b)
    moved = [{"case": case, "figure": name, "a": fa.get((case, name)), "b": fb.get((case, name))}
             for case, name in sorted(set(fa) | set(fb), key=str)
             if fa.get((case, name)) != fb.get((case, name))]
    cases_a = [c.get("case") for c in a["cases"] if isinstance(c, dict)]
    cases_b = [c.get("case") for c in b["cases"] if isinstance(c, dict)]

    def summary(verdict, run_dir):
        return {"run_id": verdict.get("run_id"), "run_dir": run_dir, "verdict": verdict.get("verdict"),
                "defects": verdict.get("defects") or [], "failed_codes": verdict.get("failed_codes") or [],
                "origin": verdict.get("origin")}

    return {
        "schema": COMPARE_SCHEMA[0], "version": COMPARE_SCHEMA[1],
        "a": summary(a, a_dir), "b": summary(b, b_dir),
        "newly_failing": listed(failing_b - failing_a),
        "newly_passing": listed(k for k in failing_a - failing_b if sb.get(k) == "PASS"),
        "still_failing": listed(failing_a & failing_b),
        "no_longer_checked": listed(k for k in failing_a - failing_b if sb.get(k) != "PASS"),
        "moved": moved,
        "cases_only_in_a": [c for c in cases_a if c not in cases_b],
        "cases_only_in_b": [c for c in cases_b if c not in cases_a],
    }


def compare_lines(result):
    """The comparison as a few lines for a playbook's output."""
    def codes(entries):
        return ", ".join(f"{e['case']}:{e['code']}" for e in entries) or "none"

    a, b = result["a"], result["b"]
    lines = [f"A {a['run_id']} {a['verdict']} -> B {b['run_id']} {b['verdict']}",
             f"newly failing: {codes(result['newly_failing'])}",
             f"newly passing: {codes(result['newly_passing'])}",
             f"still failing: {codes(result['still_failing'])}"]
    if result["no_longer_checked"]:
        lines.append(f"failing in A, not checked in B: {codes(result['no_longer_checked'])}")
    moved = ", ".join(f"{m['case']}:{m['figure']} {m['a']} -> {m['b']}" for m in result["moved"][:20]) or "none"
    more = f" (+{len(result['moved']) - 20} more)" if len(result["moved"]) > 20 else ""
    lines.append(f"figures moved: {moved}{more}")
    return lines
