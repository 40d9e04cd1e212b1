"""Every module's documentation, as ansible-doc assembles it from doc fragments, matches its argument_spec.

The argument_spec is captured by running the module's main() with AnsibleModule replaced by a probe
that records its keyword arguments, so the check needs no module to be written in a special way.
The documentation is read with ansible's own doc loader (``ansible-doc --json``), so options and
attributes that come from plugins/doc_fragments/ count, and an unknown fragment fails the test.
"""

import importlib
import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from helpers.paths import REPO

MODULES_DIR = REPO / "plugins" / "modules"
MODULE_NAMES = sorted(p.stem for p in MODULES_DIR.glob("*.py") if not p.name.startswith("_"))
FQCN = "orbite.qualification.{}"
TYPE_DEFAULT = "str"
# Keyword arguments of AnsibleModule that name options, and how each holds the names.
NAME_LISTS = ("mutually_exclusive", "required_together", "required_one_of")
AUTHOR = re.compile(r"^\w.*\(@[\w-]+\)$")


class _Captured(Exception):
    def __init__(self, kwargs):
        super().__init__("captured")
        self.kwargs = kwargs


def _capture_spec(name, monkeypatch):
    module = importlib.import_module(f"ansible_collections.orbite.qualification.plugins.modules.{name}")
    from ansible.module_utils import basic

    def probe(self, *args, **kwargs):
        if args:
            kwargs["argument_spec"] = args[0]
        raise _Captured(kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "__init__", probe)
    with pytest.raises(_Captured) as caught:
        module.main()
    return caught.value.kwargs


@pytest.fixture(scope="session")
def docs(ansible_env):
    """ansible-doc's view of every module (fragments merged), by module name."""
    run = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-doc"), "--json", "-t", "module",
         *(FQCN.format(name) for name in MODULE_NAMES)],
        env=ansible_env, capture_output=True, text=True, check=False,
    )
    assert run.returncode == 0 and not run.stderr.strip(), f"ansible-doc failed:\n{run.stderr}"
    found = json.loads(run.stdout)
    return {name: found[FQCN.format(name)] for name in MODULE_NAMES}


def _compare(spec, options, path, problems):
    spec = spec or {}
    options = options or {}
    for name in sorted(set(spec) | set(options)):
        where = f"{path}{name}"
        if name not in options:
            problems.append(f"{where}: in argument_spec, not documented")
            continue
        if name not in spec:
            problems.append(f"{where}: documented, not in argument_spec")
            continue
        s, d = spec[name], options[name]
        if s.get("type", TYPE_DEFAULT) != d.get("type", TYPE_DEFAULT):
            problems.append(f"{where}: type {s.get('type', TYPE_DEFAULT)!r} != documented {d.get('type')!r}")
        if bool(s.get("required", False)) != bool(d.get("required", False)):
            problems.append(f"{where}: required differs")
        if s.get("default") != d.get("default"):
            problems.append(f"{where}: default {s.get('default')!r} != documented {d.get('default')!r}")
        if s.get("choices") is not None or d.get("choices") is not None:
            if list(s.get("choices") or []) != list(d.get("choices") or []):
                problems.append(f"{where}: choices differ")
        if s.get("elements") != d.get("elements"):
            problems.append(f"{where}: elements {s.get('elements')!r} != documented {d.get('elements')!r}")
        if "options" in s or "suboptions" in d:
            _compare(s.get("options"), d.get("suboptions"), f"{where}.", problems)
        elif (s.get("type") == "dict" or s.get("elements") == "dict") and not _says_what_keys(d):
            problems.append(f"{where}: a dict without suboptions must say what its keys are, or where")
        if not d.get("description"):
            problems.append(f"{where}: no description")


def _says_what_keys(doc):
    """A free-form dict option is fine when its description says what maps to what, or where the keys are."""
    text = doc.get("description") or ""
    text = text if isinstance(text, str) else " ".join(text)
    return bool(re.search(r"\bto value\b|\bby tool name\b|\bmapping of [A-Za-z ]+ to\b|RV\(|docs/|\bschema\b", text))


def _names_in_spec(kwargs):
    """Every option name the AnsibleModule keyword arguments refer to, with where it was found."""
    for key in NAME_LISTS:
        for group in kwargs.get(key) or ():
            for name in group:
                yield key, name
    for entry in kwargs.get("required_if") or ():
        yield "required_if", entry[0]
        for name in entry[2]:
            yield "required_if", name
    for key, names in (kwargs.get("required_by") or {}).items():
        yield "required_by", key
        for name in [names] if isinstance(names, str) else names:
            yield "required_by", name


def _problems(name, kwargs, entry):
    doc = entry["doc"]
    problems = []
    _compare(kwargs.get("argument_spec"), doc.get("options"), "", problems)
    spec = kwargs.get("argument_spec") or {}
    problems += [f"{key}: {option!r} is not an option" for key, option in _names_in_spec(kwargs) if option not in spec]
    if doc.get("module") != name or not doc.get("short_description"):
        problems.append("module name or short_description")
    problems += [f"author {line!r}: not 'Name (@handle)'" for line in doc.get("author") or ["(none)"]
                 if not AUTHOR.match(line)]
    attributes = doc.get("attributes") or {}
    for attribute in ("check_mode", "diff_mode", "platform"):
        if not (attributes.get(attribute) or {}).get("description") or "support" not in attributes.get(attribute, {}):
            problems.append(f"attributes.{attribute}: needs a description and a support level")
    check_mode = attributes.get("check_mode", {}).get("support")
    if kwargs.get("supports_check_mode") and check_mode not in ("full", "partial"):
        problems.append("supports_check_mode but attributes say otherwise")
    if not kwargs.get("supports_check_mode") and check_mode not in (None, "none"):
        problems.append("attributes claim check mode the module does not support")
    if not doc.get("seealso"):
        problems.append("no seealso")
    for key, value in (entry.get("return") or {}).items():
        contained = (value.get("contains") or {}).values()
        if "sample" not in value and not (contained and all("sample" in c for c in contained)):
            problems.append(f"RETURN {key}: no sample")
    return problems


@pytest.mark.parametrize("name", MODULE_NAMES)
def test_documentation_matches_argument_spec(name, monkeypatch, docs):
    kwargs = _capture_spec(name, monkeypatch)
    problems = _problems(name, kwargs, docs[name])
    assert not problems, "\n".join(problems)
    examples = yaml.safe_load(docs[name]["examples"])
    assert isinstance(examples, list) and examples
    assert any(FQCN.format(name) in task for task in examples), "EXAMPLES use the FQCN"


def test_the_comparison_catches_what_the_docs_get_wrong(monkeypatch, docs):
    """The check is not vacuous: each kind of disagreement with the spec is reported."""
    kwargs = _capture_spec("supervised_process", monkeypatch)
    entry = json.loads(json.dumps(docs["supervised_process"]))
    options = entry["doc"]["options"]
    options["timeout"]["type"] = "int"
    options["signal"]["default"] = "SIGTERM"
    del options["root"]  # comes from the _root fragment: without fragments it would be missing
    options["extra"] = {"description": ["not in the spec"], "type": "str"}
    entry["doc"]["author"] = ["Someone without a handle"]
    del entry["doc"]["attributes"]["platform"]
    kwargs["required_if"] = [("launch", "launch", ("argv",))]  # the old supervised_process bug
    del entry["return"]["timed_out"]["sample"]
    problems = "\n".join(_problems("supervised_process", kwargs, entry))
    for expected in ("timeout: type 'float' != documented 'int'",
                     "signal: default 'SIGKILL' != documented 'SIGTERM'",
                     "root: in argument_spec, not documented",
                     "extra: documented, not in argument_spec",
                     "author 'Someone without a handle'",
                     "attributes.platform",
                     "required_if: 'launch' is not an option",
                     "RETURN timed_out: no sample"):
        assert expected in problems


def test_suboptions_are_compared_too(monkeypatch, docs):
    kwargs = _capture_spec("runner", monkeypatch)
    entry = json.loads(json.dumps(docs["runner"]))
    entry["doc"]["options"]["rails"]["suboptions"]["port"]["type"] = "str"
    del entry["doc"]["options"]["ld_preload"]["suboptions"]
    problems = "\n".join(_problems("runner", kwargs, entry))
    assert "rails.port: type 'int' != documented 'str'" in problems
    assert "ld_preload.path: in argument_spec, not documented" in problems
