"""Every module's DOCUMENTATION matches its argument_spec, and EXAMPLES/RETURN are valid YAML.

The argument_spec is captured by running the module's main() with AnsibleModule replaced by a probe
that records its keyword arguments, so the check needs no module to be written in a special way.
"""

import importlib

import pytest
from helpers.paths import REPO
import yaml

MODULES_DIR = REPO / "plugins" / "modules"
MODULE_NAMES = sorted(p.stem for p in MODULES_DIR.glob("*.py") if not p.name.startswith("_"))
TYPE_DEFAULT = "str"


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
    return module, caught.value.kwargs


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
        if "description" not in d:
            problems.append(f"{where}: no description")


@pytest.mark.parametrize("name", MODULE_NAMES)
def test_documentation_matches_argument_spec(name, monkeypatch):
    module, kwargs = _capture_spec(name, monkeypatch)
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert doc["module"] == name
    assert doc.get("short_description")
    problems = []
    _compare(kwargs.get("argument_spec"), doc.get("options"), "", problems)
    assert not problems, "\n".join(problems)
    examples = yaml.safe_load(module.EXAMPLES)
    assert isinstance(examples, list) and examples
    assert any(f"orbite.qualification.{name}" in task for task in examples), "EXAMPLES use the FQCN"
    assert isinstance(yaml.safe_load(module.RETURN) or {}, dict)
    check_mode = doc.get("attributes", {}).get("check_mode", {}).get("support")
    if kwargs.get("supports_check_mode"):
        assert check_mode in ("full", "partial"), "supports_check_mode but attributes say otherwise"
    else:
        assert check_mode in (None, "none"), "attributes claim check mode the module does not support"
