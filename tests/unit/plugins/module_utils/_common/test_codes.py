"""One failure-code grammar and one registry: every code written in plugins/ is registered (here or in the
verifier's registry) and follows the grammar; the scan itself sees an unregistered code (red check)."""

import ast
from pathlib import Path

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._common import codes
from ansible_collections.orbite.qualification.plugins.module_utils._verify import verdict  # noqa: F401 (rules)
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import REGISTRY

PLUGINS = Path(__file__).resolve().parents[5] / "plugins"
# Errors whose first argument is the code, and the supervisor client's errors that take it second.
CODE_FIRST = {"RequestError", "RunnerError", "_fail_start"}
CODE_SECOND = {"SupervisorStartError", "SupervisorRequestError"}


def _literals(node):
    """The string constants a code expression can take (a literal, or either side of a conditional)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _literals(node.body) + _literals(node.orelse)
    return []


def written_codes(tree):
    """(code, line) for every code literal: ``code = ...``, ``code=``/``error=`` arguments, ``"code"``/``"error"``
    keys of a dict, and the code argument of the errors above."""
    for node in ast.walk(tree):
        values = []
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "code" for t in node.targets):
            values = _literals(node.value)
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", "")
            values = [v for kw in node.keywords if kw.arg in ("code", "error") for v in _literals(kw.value)]
            if name in CODE_FIRST and node.args:
                values += _literals(node.args[0])
            elif name in CODE_SECOND and len(node.args) > 1:
                values += _literals(node.args[1])
        elif isinstance(node, ast.Dict):
            values = [v for key, value in zip(node.keys, node.values)
                      if isinstance(key, ast.Constant) and key.value in ("code", "error") for v in _literals(value)]
        for value in values:
            if value:  # "" is "no code given" (errors.fail_from then names one)
                yield value, node.lineno


def _unregistered(source):
    known = set(codes.CODES) | set(REGISTRY.codes())
    return [(code, line) for code, line in written_codes(ast.parse(source))
            if code not in known or not codes.is_code(code)]


def test_every_code_written_in_plugins_is_registered_and_follows_the_grammar():
    problems = []
    for path in sorted(PLUGINS.rglob("*.py")):
        problems += [f"{path.relative_to(PLUGINS)}:{line}: {code!r}" for code, line in _unregistered(path.read_text())]
    assert not problems, "codes outside plugins/module_utils/_common/codes.py or the verifier's registry:\n" + \
        "\n".join(problems)


@pytest.mark.parametrize("source", [
    'raise RunnerError("bad_input", "x")',  # the bare word of before the grammar
    'raise OrbiteError("x", code="runner.not_a_code")',
    'module.fail_json(msg="x", code="Runner.BadInput")',
    'resp = {"ok": False, "error": "supervisor.nope"}',
    'code = "runner.timeout" if slow else "runner.too_fast"',
])
def test_the_scan_sees_a_code_outside_the_registry(source):
    assert _unregistered(source), source


def test_the_registries_are_disjoint_and_every_code_follows_the_grammar():
    assert not set(codes.CODES) & set(REGISTRY.codes())
    assert [code for code in codes.CODES if not codes.CODE_RE.fullmatch(code)] == []


@pytest.mark.parametrize(("code", "valid"), [
    ("runner.bad_input", True), ("os.PermissionError", True), ("error.KeyError", True),
    ("bad_input", False), ("runner.Bad", False), ("a.b.c", False), ("os.", False), (" runner.x", False),
])
def test_the_grammar(code, valid):
    assert codes.is_code(code) is valid
