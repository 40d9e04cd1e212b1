"""One naming rule for the variables of roles/ and playbooks/ (ansible-lint's var-naming[no-role-prefix] stays
skipped, since the shared variables carry the collection's prefix instead of a role's):

- a variable a role sets itself (set_fact, register, vars, loop_var) and nobody outside the role reads is
  role-local: it carries the role's prefix (``runner_``, ``preflight_``, ...), and no other role or playbook reads
  it;
- a variable shared across roles, playbooks, plugins or the inventory carries ``orbite_``: what a role sets for
  others, a role's inputs (its argument_specs options and defaults, which may also carry the role's prefix), and
  every variable a playbook sets.
"""

import re

import yaml
from helpers.paths import REPO

SETTERS = ("ansible.builtin.set_fact", "set_fact")
NESTED = ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers")
# Read by Ansible itself, not by the collection.
ANSIBLE = ("ansible_",)


def _task_variables(items, where):
    """(name, where) of each variable the tasks ``items`` set: vars, register, set_fact, loop_var."""
    for task in items or []:
        if not isinstance(task, dict):
            continue
        for key in NESTED:
            yield from _task_variables(task.get(key) if isinstance(task.get(key), list) else [], where)
        yield from ((name, f"{where}: vars") for name in (task.get("vars") or {}) if isinstance(task.get("vars"), dict))
        if isinstance(task.get("register"), str):
            yield task["register"], f"{where}: register"
        for setter in SETTERS:
            if isinstance(task.get(setter), dict):
                yield from ((name, f"{where}: set_fact") for name in task[setter] if name != "cacheable")
        loop_control = task.get("loop_control")
        if isinstance(loop_control, dict) and "loop_var" in loop_control:
            yield loop_control["loop_var"], f"{where}: loop_var"


def _yaml(path):
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def set_variables(root=REPO):
    """{where it is set ("roles/<role>" or "playbooks"): {name: [how]}} of every variable set in the tree."""
    found = {}

    def add(scope, name, how):
        found.setdefault(scope, {}).setdefault(name, []).append(how)

    for path in sorted(root.glob("roles/*/tasks/*.yml")) + sorted(root.glob("roles/*/handlers/*.yml")):
        for name, how in _task_variables(_yaml(path), path.relative_to(root)):
            add("/".join(path.relative_to(root).parts[:2]), name, how)
    for path in sorted(root.glob("playbooks/*.yml")) + sorted(root.glob("playbooks/tasks/*.yml")):
        for name, how in _task_variables(_yaml(path), path.relative_to(root)):
            add("playbooks", name, how)
    for path in sorted(root.glob("playbooks/vars/*.yml")):
        for name in _yaml(path) or {}:
            add("playbooks", name, f"{path.relative_to(root)}: file")
    return found


def role_inputs(root=REPO):
    """{role: {name}} of each role's inputs: its argument_specs options, its defaults and vars files."""
    inputs = {}
    for role_dir in sorted(p for p in (root / "roles").iterdir() if p.is_dir()):
        names = inputs.setdefault(role_dir.name, set())
        specs = role_dir / "meta" / "argument_specs.yml"
        if specs.exists():
            for entry in (_yaml(specs).get("argument_specs") or {}).values():
                names.update((entry or {}).get("options") or {})
        for path in list(role_dir.glob("defaults/*.yml")) + list(role_dir.glob("vars/*.yml")):
            names.update(_yaml(path) or {})
    return inputs


def _readers(root=REPO):
    """{file: text} of everything that may read a variable: roles, playbooks, plugins, inventories."""
    paths = [p for top in ("roles", "playbooks", "plugins", "inventories") for p in (root / top).rglob("*")
             if p.suffix in (".yml", ".yaml", ".py", ".j2") and p.is_file()]
    return {str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in paths}


def problems(found, inputs, readers):
    """One line per variable that breaks the rule, naming it, where it is set and why."""
    out = []
    for scope, variables in sorted(found.items()):
        role = scope.split("/", 1)[1] if scope.startswith("roles/") else None
        for name, hows in sorted(variables.items()):
            if name.startswith(ANSIBLE):
                continue
            word = re.compile(rf"\b{re.escape(name)}\b")
            outside = sorted(f for f, text in readers.items() if role is None or not f.startswith(f"{scope}/")
                             if word.search(text))
            if role is None:
                if not name.startswith("orbite_"):
                    out.append(f"{name} ({hows[0]}): a playbook's variable carries orbite_")
            elif name.startswith(f"{role}_"):
                if outside and name not in inputs.get(role, ()):
                    out.append(f"{name} ({hows[0]}): role-local by its prefix, but read in {', '.join(outside)}")
            elif not name.startswith("orbite_"):
                out.append(f"{name} ({hows[0]}): carries neither the role's prefix {role}_ nor orbite_")
            elif not outside and name not in inputs.get(role, ()):
                out.append(f"{name} ({hows[0]}): read only in {scope}, so role-local: {role}_{name[len('orbite_'):]}")
    for role, names in sorted(inputs.items()):
        for name in sorted(names):
            if not name.startswith((f"{role}_", "orbite_", *ANSIBLE)):
                out.append(f"{name} (roles/{role} input): carries neither the role's prefix {role}_ nor orbite_")
    return out


def test_every_variable_follows_the_naming_rule():
    assert problems(set_variables(), role_inputs(), _readers()) == []


def test_the_rule_names_each_kind_of_offender(tmp_path):
    """Red check: a tree with one offender of each kind, each named with its rule."""
    play = "/".join(("playbooks", "play.yml"))  # a file of the red check's tree only (test_references)
    tasks = tmp_path / "roles" / "runner" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "main.yml").write_text(
        "- name: Set\n  ansible.builtin.set_fact:\n    node_supervisor_run_dir: 1\n    orbite_only_here: 2\n"
        "    runner_leaked: 3\n    orbite_shared: 4\n  register: runner_ok\n")
    (tmp_path / "playbooks").mkdir()
    (tmp_path / play).write_text(
        "- hosts: all\n  vars:\n    run_id: 1\n  tasks:\n    - name: Read\n      ansible.builtin.debug:\n"
        "        msg: '{{ runner_leaked }} {{ orbite_shared }}'\n")
    found = set_variables(tmp_path)
    readers = {str(p.relative_to(tmp_path)): p.read_text() for p in tmp_path.rglob("*.yml")}
    assert problems(found, {"runner": set()}, readers) == [
        f"run_id ({play}: vars): a playbook's variable carries orbite_",
        "node_supervisor_run_dir (roles/runner/tasks/main.yml: set_fact): carries neither the role's prefix runner_ "
        "nor orbite_",
        "orbite_only_here (roles/runner/tasks/main.yml: set_fact): read only in roles/runner, so role-local: "
        "runner_only_here",
        f"runner_leaked (roles/runner/tasks/main.yml: set_fact): role-local by its prefix, but read in {play}",
    ]
