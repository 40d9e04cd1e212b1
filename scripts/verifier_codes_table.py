"""Rewrite the failure-code table of docs/verifier.md from the verifier's registry (run after adding a rule).

    .venv/bin/python scripts/verifier_codes_table.py           # rewrite the table
    .venv/bin/python scripts/verifier_codes_table.py --check   # exit 1 when the docs are out of date

Every code comes from ``_verify/registry.py`` (``@rule`` beside each check, ``declare`` for the run.*,
case.* and receipt.* codes): the docs cannot list a code the verifier does not have, nor miss one.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "verifier.md"
BEGIN, END = "<!-- codes:begin -->", "<!-- codes:end -->"
WITNESS_BEGIN, WITNESS_END = "<!-- witnesses:begin -->", "<!-- witnesses:end -->"


def _registry():
    if str(ROOT / ".collections") not in sys.path:
        sys.path.insert(0, str(ROOT / ".collections"))
    # Imported late: the checkout becomes importable only once .collections is on the path.
    from ansible_collections.orbite.qualification.plugins.module_utils._verify import (  # noqa: PLC0415
        registry,
        rules,  # noqa: F401 - importing the rules registers every code
    )

    return registry


def table():
    registry = _registry()
    rows = ["| code | group | PASS when ... | applies to | witness | masked by |", "|---|---|---|---|---|---|"]
    for entry in registry.REGISTRY:
        witness = ", ".join(entry.witness)
        masked = ", ".join(f"`{code}`" for code in entry.after)
        rows.append(f"| `{entry.code}` | {entry.group} | {entry.meaning} | {entry.applies.label} | {witness} | "
                    f"{masked} |")
    return "\n".join(rows)


def witnesses():
    registry = _registry()
    return "\n".join(f"- `{name}`: {meaning}" for name, meaning in registry.WITNESSES.items())


def _replace(text, begin, end, body):
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def rendered(text):
    return _replace(_replace(text, BEGIN, END, table()), WITNESS_BEGIN, WITNESS_END, witnesses())


def main(argv):
    text = DOC.read_text(encoding="utf-8")
    new = rendered(text)
    if "--check" in argv:
        if new != text:
            print(f"{DOC}: the code table is out of date; run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
