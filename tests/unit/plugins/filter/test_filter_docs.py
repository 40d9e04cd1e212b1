"""Every filter the collection ships is documented (plugins/filter/<name>.yml), its options being its parameters."""

import importlib
import inspect
import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from helpers.paths import REPO

FILTER_DIR = REPO / "plugins" / "filter"
FQCN = "orbite.qualification.{}"
AUTHOR = re.compile(r"^\w.*\(@[\w-]+\)$")


def _filters():
    """name -> function, from every FilterModule of plugins/filter/*.py."""
    found = {}
    for path in sorted(FILTER_DIR.glob("*.py")):
        module = importlib.import_module(f"ansible_collections.orbite.qualification.plugins.filter.{path.stem}")
        found.update(module.FilterModule().filters())
    return found


FILTERS = _filters()


@pytest.fixture(scope="module")
def docs(ansible_env):
    run = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-doc"), "--json", "-t", "filter",
         *(FQCN.format(name) for name in FILTERS)],
        env=ansible_env, capture_output=True, text=True, check=False,
    )
    assert run.returncode == 0 and not run.stderr.strip(), f"ansible-doc failed:\n{run.stderr}"
    return json.loads(run.stdout)


def test_every_doc_file_belongs_to_a_filter():
    assert sorted(p.stem for p in FILTER_DIR.glob("*.yml")) == sorted(FILTERS)


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_filter_is_documented_with_its_parameters(name, docs):
    entry = docs[FQCN.format(name)]
    doc = entry["doc"]
    assert doc, f"{name}: no documentation"
    assert doc["name"] == name and doc.get("short_description") and doc.get("description")
    assert all(AUTHOR.match(line) for line in doc.get("author") or ["(none)"]), doc.get("author")
    parameters = list(inspect.signature(FILTERS[name]).parameters)
    options = doc.get("options") or {}
    # The first parameter is the piped value, documented as _input; the rest keep their names.
    assert sorted(options) == sorted(["_input", *parameters[1:]]), f"{name}: options {sorted(options)}"
    positional = [p.strip() for p in str(doc.get("positional", "")).split(",") if p.strip()]
    assert positional[:1] == ["_input"] and all(p in options for p in positional)
    assert all(option.get("description") and option.get("type") for option in options.values())
    value = (entry.get("return") or {}).get("_value") or {}
    contained = (value.get("contains") or {}).values()
    assert value.get("description") and value.get("type")
    assert "sample" in value or (contained and all("sample" in c for c in contained)), f"{name}: no sample"
    examples = yaml.safe_load(entry["examples"])
    assert examples and FQCN.format(name) in entry["examples"]
