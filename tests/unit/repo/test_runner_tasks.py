"""The runner role reads the launch plan verbatim (docs/case-flow.md): no task argument of roles/runner/tasks is
built by a Jinja statement block or an inline if/else; a condition belongs in a task's ``when:``, a choice
between values in the plan (or a lookup table keyed by the plan's word)."""

import re

import pytest
import yaml
from helpers.paths import REPO

TASKS = sorted((REPO / "roles" / "runner" / "tasks").glob("*.yml"))
# Keys whose value is a condition or a loop, not an argument.
CONDITIONS = ("when", "that", "failed_when", "changed_when", "until", "loop")
STATEMENT = re.compile(r"\{%")
INLINE_IF = re.compile(r"\{\{(?:(?!\}\}).)*\bif\b(?:(?!\}\}).)*\belse\b", re.S)


def _arguments(node, path):
    """(path, string) of every string a task passes on, conditions left out."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key not in CONDITIONS:
                yield from _arguments(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _arguments(value, f"{path}[{index}]")
    elif isinstance(node, str):
        yield path, node


def conditional_arguments(document):
    """Each argument of a task list built by a statement block or an inline if/else, as path: text."""
    return [f"{path}: {text.strip()[:80]}" for path, text in _arguments(document, "")
            if STATEMENT.search(text) or INLINE_IF.search(text)]


@pytest.mark.parametrize("path", TASKS, ids=lambda path: path.name)
def test_no_runner_task_builds_an_argument_with_a_conditional(path):
    assert conditional_arguments(yaml.safe_load(path.read_text())) == []


def test_the_check_sees_both_forms_and_leaves_conditions_alone():
    tasks = [{"name": "t", "x.y": {"a": "{{ 1 if b else 2 }}", "c": ["{% if d %}e{% endif %}"], "f": "{{ g }}"},
              "when": "h if i else j"}]
    assert [line.split(":")[0] for line in conditional_arguments(tasks)] == ["[0].x.y.a", "[0].x.y.c[0]"]


def test_the_role_included_without_its_prepare_entry_point_fails_naming_it_before_any_node_task(
        tmp_path, ansible_env, repo_root):
    # Every case's launch comes from the prepare entry point (orbite_case_launches): a playbook that skips it fails
    # on the role's argument specs, naming that variable, before the case's block (no supervisor, no stop).
    import subprocess
    import sys
    from pathlib import Path

    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "tasks": [{"ansible.builtin.include_role": {"name": "orbite.qualification.runner"},
                   "vars": {"orbite_case": {"id": "c1", "profile": {}}, "orbite_run_id": "r1",
                            "orbite_run_dir": str(tmp_path / "run"), "orbite_gate_artifacts": {},
                            "orbite_rails": [], "orbite_service_address": "127.0.0.1:1"}}],
    }]))
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           str(playbook)], cwd=repo_root, env=ansible_env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode != 0
    assert "Validating arguments against arg spec 'main'" in done.stdout, done.stdout[-3000:]
    assert "orbite_case_launches" in done.stdout + done.stderr, done.stdout[-3000:]
    assert "Deploy the run's executables" not in done.stdout and "Stop the control relay" not in done.stdout
    assert not (tmp_path / "run").exists()
