# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Write a verdict as reports: JSON, JUnit XML and Markdown, each replaced atomically."""

from __future__ import annotations

import json
import os
from xml.sax.saxutils import escape, quoteattr

from ansible_collections.orbite.qualification.plugins.module_utils._common.files import atomic_write_text

STATUSES = PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


def _atomic_write(path, text):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic_write_text(path, text, mode=0o644)


def report_paths(output_dir):
    return {
        "json": os.path.join(output_dir, "verdict.json"),
        "junit": os.path.join(output_dir, "verdict.xml"),
        "markdown": os.path.join(output_dir, "verdict.md"),
    }


def write_reports(verdict, output_dir):
    paths = report_paths(output_dir)
    _atomic_write(paths["json"], json.dumps(verdict, indent=2, sort_keys=True) + "\n")
    _atomic_write(paths["junit"], junit_xml(verdict))
    _atomic_write(paths["markdown"], markdown(verdict))
    return paths


def junit_xml(verdict):
    """One testsuite per case, one testcase per rule group; a group fails when any of its rules does."""
    suites = []
    for case in verdict["cases"]:
        groups = {}
        for finding in case["findings"]:
            groups.setdefault(finding["group"], []).append(finding)
        cases_xml = []
        for group, findings in groups.items():
            failed = [f for f in findings if f["status"] == FAIL]
            skipped = all(f["status"] == SKIP for f in findings)
            body = ""
            if failed:
                text = "\n".join(f"[{f['code']}] {f['message']} (evidence: {f['evidence']})" for f in failed)
                body = f"<failure message={quoteattr(', '.join(f['code'] for f in failed))}>{escape(text)}</failure>"
            elif skipped:
                body = f"<skipped message={quoteattr(findings[0]['message'])}/>"
            cases_xml.append(
                f"    <testcase classname={quoteattr(case['case'])} name={quoteattr(group)}>{body}</testcase>"
            )
        failures = sum(1 for c in cases_xml if "<failure" in c)
        suites.append(
            f'  <testsuite name={quoteattr(case["case"])} tests="{len(cases_xml)}" '
            f'failures="{failures}">\n' + "\n".join(cases_xml) + "\n  </testsuite>"
        )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<testsuites name={quoteattr('orbite ' + str(verdict['run_id']))}>\n" + "\n".join(suites) + "\n</testsuites>\n"
    )


def markdown(verdict):
    lines = [
        f"# Verdict: {verdict['verdict']}" + (" (diagnostic only: dirty build)" if verdict["diagnostic_only"] else ""),
        "",
        f"Run `{verdict['run_id']}`" + ("" if verdict["complete"] else " (incomplete: verdict so far)"),
        "",
        f"{verdict['counts'].get('pass', 0)} rules passed, {verdict['counts'].get('fail', 0)} failed, "
        f"{verdict['counts'].get('skip', 0)} skipped over {verdict['counts'].get('cases', 0)} case(s).",
        "",
    ]
    for case in verdict["cases"]:
        lines += [f"## {case['case']}: {case['verdict']}", "", "| rule | status | detail |", "|---|---|---|"]
        for finding in case["findings"]:
            detail = finding["message"] or finding["meaning"]
            detail = detail.replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `{finding['code']}` | {finding['status']} | {detail} |")
        lines.append("")
    return "\n".join(lines)
