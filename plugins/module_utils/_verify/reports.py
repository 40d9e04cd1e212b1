# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Write a verdict as reports: JSON, JUnit XML (ElementTree), Markdown and HTML (html_report.py), each
replaced atomically.

No older verdict outlives a failed write: when the full reports cannot be written (a full disk),
every older verdict file is removed first (which also frees its space) and a short form is
written instead (the verdict, never PASS, its counts and failed codes with ``verdict.unwritable``,
each case's verdict and failed codes, no finding text); when even that fails, no verdict file is
left. Either way VerdictWriteError names why.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import atomic_write_text
from ansible_collections.orbite.qualification.plugins.module_utils._verify.html_report import render_html

STATUSES = PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
INCOMPLETE = "INCOMPLETE"
KINDS = ("json", "junit", "markdown", "html")


class VerdictWriteError(OrbiteError):
    """The verdict could not be written at all; ``verdict`` is the verdict computed (set by the caller)."""

    code = "verdict.unwritable"
    verdict = None


def report_paths(output_dir):
    return {
        "json": os.path.join(output_dir, "verdict.json"),
        "junit": os.path.join(output_dir, "verdict.xml"),
        "markdown": os.path.join(output_dir, "verdict.md"),
        "html": os.path.join(output_dir, "verdict.html"),
    }


def render(verdict, plots=None):
    """{kind: text}; ``plots``: {case id: plots.case_plots(...)} for the HTML page."""
    return {
        "json": json.dumps(verdict, indent=2, sort_keys=True) + "\n",
        "junit": junit_xml(verdict),
        "markdown": markdown(verdict),
        "html": render_html(verdict, plots, artifact_lines(verdict)),
    }


def _write_all(paths, texts):
    """{kind: OSError} of the reports that could not be written."""
    failed = {}
    for kind in KINDS:
        try:
            os.makedirs(os.path.dirname(paths[kind]) or ".", exist_ok=True)
            atomic_write_text(paths[kind], texts[kind], mode=0o600)  # private like the run dir (docs/security.md)
        except OSError as error:
            failed[kind] = error
    return failed


def _remove(paths):
    """Remove every report file; {path: OSError} of those that stayed."""
    stayed = {}
    for path in paths.values():
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as error:
            stayed[path] = error
    return stayed


def _why(paths, failed):
    return "; ".join(f"{os.path.basename(paths[kind])}: {error.strerror or error}" for kind, error in failed.items())


def write_reports(verdict, output_dir, plots=None):
    """Write the four reports atomically; raise VerdictWriteError when the full reports cannot be written.

    Then every older verdict file is removed first (it must never outlive this attempt, whatever it
    said, and its space is freed) and the short form is written in its place if it fits: the same
    verdict without finding text, never PASS (a PASS is only written with its full evidence).
    """
    paths = report_paths(output_dir)
    failed = _write_all(paths, render(verdict, plots))
    if not failed:
        return paths
    reason = f"the full reports could not be written ({_why(paths, failed)})"
    _remove(paths)
    short = short_form(verdict, reason)
    failed_short = _write_all(paths, render(short))
    if not failed_short:
        raise VerdictWriteError(f"cannot write the verdict under {output_dir}: {reason}; a short form "
                                f"({short['verdict']}, never PASS) was written in its place", output_dir=output_dir)
    stayed = _remove(paths)
    message = f"cannot write the verdict under {output_dir}: {reason}, nor its short form; no verdict file is left"
    if stayed:
        message = (f"cannot write the verdict under {output_dir}: {reason}, nor its short form; and the older "
                   f"{', '.join(sorted(stayed))} could not be removed: IT IS STALE, do not read it")
    raise VerdictWriteError(message, output_dir=output_dir)


def short_form(verdict, reason):
    """What still fits when the full reports do not: no finding text, and never PASS."""
    short = {key: verdict.get(key) for key in ("schema", "version", "run_id", "run_dir", "started_at",
                                               "finished_at", "complete", "diagnostic_only", "verdict",
                                               "planned_cases", "counts", "runner_kind", "artifacts",
                                               "defects", "origin")}
    short["reports_cut"] = reason
    unwritable = {"code": "verdict.unwritable", "group": "run", "meaning": "", "status": FAIL,
                  "message": reason, "evidence": None}
    short["run_findings"] = [_short_finding(f) for f in verdict["run_findings"] if f["status"] == FAIL] + [unwritable]
    short["failed_codes"] = [*verdict.get("failed_codes", []), "verdict.unwritable"]
    if short["verdict"] == PASS:
        short["verdict"] = FAIL
    short["cases"] = [{"case": c["case"], "verdict": c["verdict"], "time": c.get("time", 0.0),
                       "findings": [_short_finding(f) for f in c["findings"] if f["status"] == FAIL]}
                      for c in verdict["cases"]]
    return short


def _short_finding(found):
    return {"code": found["code"], "group": found["group"], "meaning": "", "status": found["status"],
            "message": "", "evidence": None}


# --- JUnit ------------------------------------------------------------------------------------


def _seconds(value):
    return f"{float(value or 0.0):.6f}"


def _testcase(suite, classname, found):
    """One finding as one testcase (its code the name), so the JUnit counts are verdict.json's."""
    case = ET.SubElement(suite, "testcase", classname=classname, name=found["code"], time=_seconds(found.get("time")))
    why = found["message"] or found["meaning"]
    if found["status"] == FAIL:
        failure = ET.SubElement(case, "failure", message=why or found["code"], type=found["code"])
        failure.text = f"[{found['code']}] {why}" + (f" (evidence: {found['evidence']})" if found["evidence"] else "")
        return "failure"
    if found["status"] == SKIP:
        ET.SubElement(case, "skipped", message=why)
        return "skipped"
    return "pass"


def _not_verified(suite, case_id):
    """A planned case the run did not verify: an error (it never ran), so its suite is not green."""
    case = ET.SubElement(suite, "testcase", classname=case_id, name="verification", time=_seconds(0))
    ET.SubElement(case, "error", type="run.incomplete",
                  message="planned, not verified: the run did not finish (INCOMPLETE, not a PASS)")
    return "error"


def artifact_lines(verdict):
    """(name, value) of what the verdict qualifies: runner kind, each artifact's sha256, defect switches."""
    lines = [("runner_kind", verdict.get("runner_kind"))]
    artifacts = verdict.get("artifacts")
    if isinstance(artifacts, dict):
        runner = artifacts.get("runner") or {}
        lines.append(("artifact.runner", f"{runner.get('sha256')} {runner.get('path')}"))
        library = artifacts.get("verbs_library")
        if isinstance(library, dict):
            lines.append(("artifact.verbs_library", f"{library.get('sha256')} {library.get('path')}"))
        for tool, entry in sorted((artifacts.get("observers") or {}).items()):
            known = entry if isinstance(entry, dict) else {}
            lines.append((f"artifact.observer.{tool}", f"{known.get('sha256')} {known.get('path')}"))
    else:
        lines.append(("artifacts", "none named by the plan: this verdict qualifies no build"))
    lines.append(("defects", ", ".join(verdict.get("defects") or []) or "none"))
    return lines


def _diagnostic(verdict):
    """Why the verdict qualifies nothing whatever it says, or ''."""
    why = []
    if verdict.get("defects"):
        why.append(f"defect switches {', '.join(verdict['defects'])}")
    if verdict.get("diagnostic_only") and not verdict.get("defects"):
        why.append("dirty build")
    return "; ".join(why)


def _suite(parent, name, seconds):
    return ET.SubElement(parent, "testsuite", name=name, tests="0", failures="0", errors="0", skipped="0",
                         time=_seconds(seconds))


def _count(element, outcomes):
    element.set("tests", str(len(outcomes)))
    element.set("failures", str(outcomes.count("failure")))
    element.set("errors", str(outcomes.count("error")))
    element.set("skipped", str(outcomes.count("skipped")))


def junit_xml(verdict):
    """One testsuite for the run's own findings and one per planned case, one testcase per finding (classname
    ``<case>.<group>``): failures and skipped are verdict.json's ``fail`` and ``skip`` counts.

    A planned case not verified (INCOMPLETE) has no findings: its one testcase is an error, so no JUnit reader
    counts an unfinished run as green (errors = ``cases_incomplete``).
    """
    run_id = str(verdict.get("run_id"))
    root = ET.Element("testsuites", name=f"orbite {run_id}", tests="0", failures="0", errors="0", skipped="0",
                      time=_seconds((verdict.get("finished_at") or 0) - (verdict.get("started_at") or 0)
                                    if verdict.get("finished_at") else 0))
    everything = []
    run_findings = verdict.get("run_findings") or []
    if run_findings:
        suite = _suite(root, "run", 0)
        properties = ET.SubElement(suite, "properties")  # what this verdict qualifies
        for name, value in artifact_lines(verdict):
            ET.SubElement(properties, "property", name=name, value=str(value))
        outcomes = [_testcase(suite, "run", f) for f in run_findings]
        _count(suite, outcomes)
        everything += outcomes
    for case in verdict["cases"]:
        suite = _suite(root, case["case"], case.get("time", 0))
        if case["verdict"] == INCOMPLETE and not case["findings"]:
            outcomes = [_not_verified(suite, case["case"])]
        else:
            outcomes = [_testcase(suite, f"{case['case']}.{found['group']}", found) for found in case["findings"]]
        _count(suite, outcomes)
        everything += outcomes
    _count(root, everything)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# --- Markdown -----------------------------------------------------------------------------------


# Receipt text shown as Markdown text: no raw HTML (a renderer would run <script> or fetch <img src=...>), no
# link or image (![](url) fetches like <img>), no code span or table cell it could open or close. The backslash
# goes first so a receipt's own backslash cannot undo an escape.
_MD_ESCAPES = (("\\", "\\\\"), ("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("[", "\\["), ("]", "\\]"),
               ("`", "\\`"), ("|", "\\|"), ("\r", " "), ("\n", " "))
_CODE_SAFE = re.compile(r"[A-Za-z0-9._:/@+=-]+")


def md_text(text):
    """``text`` (anything: str() of it) as literal Markdown text on one line, safe in a table cell."""
    text = str(text)
    for raw, escaped in _MD_ESCAPES:
        text = text.replace(raw, escaped)
    return text


def md_code(text):
    """``text`` as a code span when it holds only name characters, else as md_text (a code span shows its
    content raw, so only text that needs no escape goes in one)."""
    text = str(text)
    return f"`{text}`" if _CODE_SAFE.fullmatch(text) else md_text(text)


def markdown(verdict):
    counts = verdict.get("counts") or {}
    diagnostic = _diagnostic(verdict)
    title = f"# Verdict: {verdict['verdict']}" + (f" (diagnostic only: {md_text(diagnostic)})" if diagnostic else "")
    lines = [title, ""]
    if verdict["verdict"] == INCOMPLETE:
        lines += [f"**INCOMPLETE, not a PASS**: {counts.get('cases_incomplete', 0)} of {counts.get('cases', 0)} "
                  "planned case(s) not verified (the run did not finish, or is still going).", ""]
    if verdict.get("reports_cut"):
        lines += [f"Short form only: {md_text(verdict['reports_cut'])}.", ""]
    if isinstance(verdict.get("origin"), dict):
        lines += [f"Rerun of {md_code(verdict['origin'].get('run_id'))} ({md_text(verdict['origin'].get('run_dir'))}): "
                  "the cases that did not pass there.", ""]
    lines += [
        f"Run {md_code(verdict['run_id'])}" + ("" if verdict["complete"] else " (incomplete: verdict so far)"),
        "",
        f"{counts.get('pass', 0)} rules passed, {counts.get('fail', 0)} failed, {counts.get('skip', 0)} skipped "
        f"over {counts.get('cases', 0)} planned case(s): {counts.get('cases_passed', 0)} passed, "
        f"{counts.get('cases_failed', 0)} failed, {counts.get('cases_incomplete', 0)} not verified.",
        "",
    ]
    lines += ["## Artifacts qualified", "", "| artifact | sha256 and path |", "|---|---|"]
    lines += [f"| {md_code(name)} | {md_text(value)} |" for name, value in artifact_lines(verdict)]
    lines.append("")
    sections = [("run", verdict["verdict"], verdict.get("run_findings") or [])]
    sections += [(case["case"], case["verdict"], case["findings"]) for case in verdict["cases"]]
    for name, status, findings in sections:
        lines += [f"## {md_text(name)}: {status}", ""]
        if status == INCOMPLETE and name != "run":
            lines += ["Not verified: the run did not finish.", ""]
            continue
        lines += ["| rule | status | detail |", "|---|---|---|"]
        for found in findings:
            lines.append(f"| {md_code(found['code'])} | {found['status']} | "
                         f"{md_text(found['message'] or found['meaning'])} |")
        lines.append("")
    return "\n".join(lines)
