"""The verifier's registry: one place for every code, refusing bad registrations, and the docs generated from it."""

import importlib.util
import re

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._verify import registry, rules
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import (
    REGISTRY,
    Registry,
    RegistryError,
    applies,
)

VERIFY_DIR = "plugins/module_utils/_verify"


def _check(_case):
    return []


def test_a_second_registration_of_a_code_is_refused():
    mine = Registry()
    mine.rule("demo.one", "demo", "first", witness=("profile",))(_check)
    with pytest.raises(RegistryError, match=re.escape("'demo.one': is already registered")):
        mine.rule("demo.one", "demo", "again", witness=("journal",))(_check)
    with pytest.raises(RegistryError, match="already registered"):
        mine.declare("demo.one", "demo", "as a declared code", witness=("plan",))


def test_the_real_registry_refuses_an_existing_code():
    with pytest.raises(RegistryError, match="already registered"):
        registry.rule("journal.locks", "journal", "a second meaning", witness=("journal",))(_check)
    assert REGISTRY["journal.locks"].check.__name__ == "check_journal_locks"


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"witness": ()}, "witness=()"),
    ({"witness": ("the runner said so",)}, "must be a non-empty tuple"),
    ({"witness": ("profile",), "after": ("demo.later",)}, "after='demo.later': must name a rule registered before"),
    ({"witness": ("profile",), "needs": ("ledgers", "rumours")}, "needs="),
    ({"witness": ("profile",), "applies": lambda p, w: True}, "must be an Applies"),
])
def test_bad_registrations_are_refused(kwargs, words):
    with pytest.raises(RegistryError, match=re.escape(words)):
        Registry().rule("demo.rule", "demo", "meaning", **kwargs)(_check)


@pytest.mark.parametrize("code", ["Demo.rule", "demo", "demo.", "demo.rule.x", ""])
def test_codes_follow_the_grammar(code):
    with pytest.raises(RegistryError, match=re.escape("must be <group>.<name>")):
        Registry().declare(code, "demo", "meaning", witness=("plan",))


def test_a_rule_can_mask_an_earlier_rule_and_applies_carries_its_label():
    mine = Registry()
    mine.rule("demo.first", "demo", "first", witness=("profile",))(_check)

    @applies("only on Tuesdays")
    def tuesday(_profile, _workload):
        return False

    mine.rule("demo.second", "demo", "second", witness=("observer",), applies=tuesday, after=("demo.first",))(_check)
    assert [r.code for r in mine.rules()] == ["demo.first", "demo.second"]
    assert mine["demo.second"].applies.label == "only on Tuesdays"
    assert not mine["demo.second"].applies_to({}, {})


def test_every_rule_declares_its_witness_and_runs_in_registration_order():
    assert rules.RULES == REGISTRY.rules()
    assert all(rule.witness and set(rule.witness) <= set(registry.WITNESSES) for rule in REGISTRY)
    groups = [rule.group for rule in rules.RULES]
    assert groups == sorted(groups, key=groups.index)  # each group's rules together, in its own module
    for rule in rules.RULES:
        assert rule.check.__module__.endswith(f"._verify.rules.{rule.group}"), rule.code


def test_every_code_the_verifier_names_is_registered(repo_root):
    """Literal codes in the verifier's sources (a finding, a ReceiptProblem) must all be registered."""
    literal = re.compile(r'"((?:run|case|receipt|verdict)\.[a-z_]+)"')
    files = {"run.json", "case.json", "verdict.json", "verdict.xml", "verdict.md", "verdict.html"}
    named = set()
    for path in (repo_root / VERIFY_DIR).rglob("*.py"):
        named |= set(literal.findall(path.read_text())) - files
    assert {"receipt.unsafe", "run.plan", "case.missing"} <= named
    assert named - set(REGISTRY.codes()) == set()


def _table_script(repo_root):
    spec = importlib.util.spec_from_file_location("verifier_codes_table", repo_root / "scripts" /
                                                  "verifier_codes_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_table_is_the_registry(repo_root):
    script = _table_script(repo_root)
    text = (repo_root / "docs" / "verifier.md").read_text()
    assert script.rendered(text) == text, "docs/verifier.md is out of date: run scripts/verifier_codes_table.py"
    for code in REGISTRY.codes():
        assert f"| `{code}` |" in text


def test_the_docs_check_fails_when_a_code_is_missing(repo_root, tmp_path, monkeypatch):
    script = _table_script(repo_root)
    doc = tmp_path / "verifier.md"
    doc.write_text((repo_root / "docs" / "verifier.md").read_text().replace("| `journal.locks` |", "| `gone` |"))
    monkeypatch.setattr(script, "DOC", doc)
    assert script.main(["--check"]) == 1
    assert script.main([]) == 0 and script.main(["--check"]) == 0
    assert "| `journal.locks` |" in doc.read_text()
