"""Every role has a README (Galaxy refuses a collection whose roles have none), whose variables section is
generated from the role's meta/argument_specs.yml and whose example names only variables the spec declares."""

import importlib.util
import re
import shutil

import pytest
import yaml
from helpers.paths import REPO

ROLE_FQCN = re.compile(r"^orbite\.qualification\.(\w+)$")
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.fixture
def script():
    spec = importlib.util.spec_from_file_location("role_readmes", REPO / "scripts" / "role_readmes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def roles_copy(script, tmp_path, monkeypatch):
    roles = tmp_path / "roles"
    shutil.copytree(REPO / "roles", roles)
    monkeypatch.setattr(script, "ROLES", roles)
    monkeypatch.setattr(script, "ROOT", tmp_path)
    return roles


def test_every_role_has_an_up_to_date_readme(script):
    assert script.roles() == sorted(path.name for path in (REPO / "roles").iterdir() if path.is_dir())
    assert script.problems() == []


def test_the_readme_shows_every_option_with_its_type_and_default(script):
    text = (REPO / "roles" / "runner" / "README.md").read_text()
    assert "| `orbite_runner_kind` | str, one of `sim`, `native` | `sim` |" in text
    assert "| `orbite_case` | dict | **required** |" in text
    # Ansible markup becomes Markdown: no O(...) or C(...) is left for a reader to decode.
    assert "O(" not in text and "C(" not in text


def test_an_option_added_to_the_spec_makes_the_readme_out_of_date(script, roles_copy):
    spec = roles_copy / "result_check" / "meta" / "argument_specs.yml"
    spec.write_text(spec.read_text().replace(
        "      orbite_result_check_fail:",
        "      orbite_result_check_new:\n        description: A new option.\n        type: str\n"
        "      orbite_result_check_fail:"))
    assert script.problems() == ["roles/result_check/README.md: out of date; run scripts/role_readmes.py"]
    assert script.main([]) == 0
    assert "| `orbite_result_check_new` | str |  | A new option. |" in (roles_copy / "result_check" /
                                                                         "README.md").read_text()
    assert script.problems() == []


def test_a_missing_readme_or_section_is_named(script, roles_copy):
    (roles_copy / "preflight" / "README.md").unlink()
    readme = roles_copy / "sim_lab" / "README.md"
    readme.write_text(readme.read_text().replace(script.END, ""))
    assert script.problems() == [
        "roles/preflight/README.md: missing (write it, with the generated section's markers)",
        f"roles/sim_lab/README.md: needs one {script.BEGIN} ... {script.END} section",
    ]
    assert script.main(["--check"]) == 1


def _role_uses(node):
    """(role, entry point, variables) of every role a play or task list of the example uses."""
    if isinstance(node, list):
        for item in node:
            yield from _role_uses(item)
        return
    if not isinstance(node, dict):
        return
    for entry in node.get("roles", []):
        yield ROLE_FQCN.match(entry["role"]).group(1), "main", set(entry.get("vars", {}))
    include = node.get("ansible.builtin.include_role") or node.get("ansible.builtin.import_role")
    if include:
        yield ROLE_FQCN.match(include["name"]).group(1), include.get("tasks_from", "main"), set(node.get("vars", {}))
    for section in ("tasks", "pre_tasks", "post_tasks", "block", "rescue", "always"):
        yield from _role_uses(node.get(section, []))


@pytest.mark.parametrize("role", sorted(path.name for path in (REPO / "roles").iterdir() if path.is_dir()))
def test_the_example_uses_the_role_with_declared_variables(script, role):
    text = (REPO / "roles" / role / "README.md").read_text()
    example = text.split("\n## Example\n", 1)[1]
    uses = [use for block in YAML_BLOCK.findall(example) for use in _role_uses(yaml.safe_load(block))]
    assert {used for used, _, _ in uses} == {role}
    specs = script.argument_specs(role)
    for _, entry_point, variables in uses:
        declared = set(specs[entry_point].get("options", {}))
        assert variables <= declared, f"{role} {entry_point}: the example sets undeclared {variables - declared}"
