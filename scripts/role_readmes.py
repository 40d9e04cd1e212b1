"""Rewrite each role README's variables section from the role's meta/argument_specs.yml.

    .venv/bin/python scripts/role_readmes.py           # rewrite the sections
    .venv/bin/python scripts/role_readmes.py --check   # exit 1 when a README is missing or out of date

Each roles/<role>/README.md is written by hand (what the role does, an example) around one generated
section between the markers below: the entry points and their variables, rendered from argument_specs
(Ansible's markup, C() O() V() M() ..., becomes Markdown code spans), so the README cannot drift from the
spec that ansible-core validates.
"""

import json
import re
import sys
from pathlib import Path

import yaml
from antsibull_docs_parser import dom
from antsibull_docs_parser.md import MDFormatter, to_md
from antsibull_docs_parser.parser import Context, parse

ROOT = Path(__file__).resolve().parent.parent
ROLES = ROOT / "roles"
COLLECTION = "orbite.qualification"
BEGIN, END = "<!-- argument_specs:begin -->", "<!-- argument_specs:end -->"
_TEXT_ESCAPE = re.compile(r"([\\`*|<])")


def _code(text):
    return f"`{text}`"


class ReadableMarkdown(MDFormatter):
    """Markdown that reads as well in a terminal as on Galaxy: code spans, not HTML tags."""

    @staticmethod
    def _format_option_like(part, url):
        return _code(part.name if part.value is None else f"{part.name}={part.value}")

    def format_code(self, part):
        return _code(part.text)

    def format_env_variable(self, part):
        return _code(part.name)

    def format_option_value(self, part):
        return _code(part.value)

    def format_module(self, part, url):
        return _code(part.fqcn)

    def format_plugin(self, part, url):
        return _code(part.plugin.fqcn)

    def format_text(self, part):
        return _TEXT_ESCAPE.sub(r"\\\1", part.text)


def markdown(text, role, entry_point):
    """One description (a string or a list of paragraphs) as Markdown paragraphs."""
    context = Context(current_plugin=dom.PluginIdentifier(f"{COLLECTION}.{role}", "role"),
                      role_entrypoint=entry_point)
    paragraphs = parse(text, context, errors="exception")
    return to_md(paragraphs, formatter=ReadableMarkdown(), par_sep="\n\n").strip()


def _cell(text):
    return " ".join(text.split("\n\n")).replace("\n", " ")


def _type(option):
    kind = option.get("type", "str")
    if kind == "list":
        kind = f"list of {option.get('elements', 'str')}"
    if "choices" in option:
        kind += ", one of " + ", ".join(_code(choice) for choice in option["choices"])
    return kind


def _default(option):
    if option.get("required"):
        return "**required**"
    if "default" not in option:
        return ""
    default = option["default"]
    return _code(default if isinstance(default, str) and default else json.dumps(default))


def entry_point_section(role, name, spec):
    lines = [f"### Entry point `{name}`: {spec['short_description']}", ""]
    description = spec.get("description")
    if description:
        lines += [markdown(description, role, name), ""]
    lines += ["| variable | type | default | description |", "|---|---|---|---|"]
    for option_name, option in spec.get("options", {}).items():
        lines.append(f"| `{option_name}` | {_type(option)} | {_default(option)} | "
                     f"{_cell(markdown(option['description'], role, name))} |")
    return "\n".join(lines)


def variables_section(role):
    specs = argument_specs(role)
    # main first (what `roles:` and a plain include_role run), then in the spec's order.
    names = sorted(specs, key=lambda name: name != "main")
    return "\n\n".join(entry_point_section(role, name, specs[name]) for name in names)


def argument_specs(role):
    return yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text(encoding="utf-8"))["argument_specs"]


def roles():
    return sorted(path.parent.parent.name for path in ROLES.glob("*/meta/argument_specs.yml"))


def rendered(role, text):
    """The README text with its generated section replaced; ValueError when the markers are missing."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"roles/{role}/README.md: needs one {BEGIN} ... {END} section")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{variables_section(role)}\n{END}{tail}"


def problems():
    """Every README that is missing or out of date, with what to do."""
    found = []
    for role in roles():
        readme = ROLES / role / "README.md"
        if not readme.is_file():
            found.append(f"{readme.relative_to(ROOT)}: missing (write it, with the generated section's markers)")
            continue
        try:
            if rendered(role, readme.read_text(encoding="utf-8")) != readme.read_text(encoding="utf-8"):
                found.append(f"{readme.relative_to(ROOT)}: out of date; run scripts/{Path(__file__).name}")
        except ValueError as error:
            found.append(str(error))
    return found


def main(argv):
    if "--check" in argv:
        found = problems()
        for problem in found:
            print(problem, file=sys.stderr)
        return 1 if found else 0
    for role in roles():
        readme = ROLES / role / "README.md"
        readme.write_text(rendered(role, readme.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
