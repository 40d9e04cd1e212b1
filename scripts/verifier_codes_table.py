"""Rewrite the failure-code table of docs/verifier.md from the rule table (run after adding a rule).

    .venv/bin/python scripts/verifier_codes_table.py
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / ".collections"))

from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import (  # noqa: E402
    RECEIPT_CODES,
    RECEIPT_MEANINGS,
)
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import RULES  # noqa: E402

BEGIN, END = "<!-- codes:begin -->", "<!-- codes:end -->"
CASE_CODES = [
    ("case.meta", "`case.json` is readable, of schema `orbite.case` v1", "every case"),
    ("case.profile", "the case's profile is valid (profile model)", "every case"),
    ("case.missing", "every planned case (`run.json` `cases`) left a directory", "every run"),
    ("case.node_failure", "no gate step failed on a node (else the failed task and its message, from "
     "`<role>/node-failure.json`)", "every case"),
    ("case.mode_unverified", "the verifier has the mode's fault rules (fails the fault modes until their rules "
     "land)", "fault modes"),
]
APPLIES = {None: "every case", "_has_accounting": "modes loading the accounting observer",
           "_rail_accounting": "installed-rail-accounting", "_discovery": "`discovery: auto`"}


def table():
    rows = ["| code | group | PASS when ... | applies to | masked by |", "|---|---|---|---|---|"]
    rows += [f"| `{code}` | case | {meaning} | {where} | |" for code, meaning, where in CASE_CODES]
    rows += [f"| `{code}` | receipts | {RECEIPT_MEANINGS[code]} | every case | |" for code in RECEIPT_CODES]
    for rule in RULES:
        applies = APPLIES[rule.applies.__name__ if rule.applies else None]
        masked = ", ".join(f"`{code}`" for code in rule.after)
        rows.append(f"| `{rule.code}` | {rule.group} | {rule.meaning} | {applies} | {masked} |")
    return "\n".join(rows)


def main():
    path = ROOT / "docs" / "verifier.md"
    text = path.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{table()}\n{END}{tail}")


if __name__ == "__main__":
    main()
