"""Import boundaries between module_utils packages, read from the source with ast (nothing is imported).

- the verifier (``_verify``, the result_check module, its job in ``_controller`` and its action plugin with
  the in-process runner it uses) imports nothing from the simulated lab
  (``_sim``, the ``sim/`` engine), the run launcher (``_run``), the node side (``_node``) or any
  module (``plugins.modules``, the runner among them): a runner bug must not cancel itself out;
- node-side packages (``_node``, ``_node_steps``, ``_inventory``, ``_common``, ``_run``) import nothing from
  ``_verify``, nor from the simulated lab (real nodes never run simulated code);
- ``_common`` imports none of the other packages (everyone builds on it).
"""

import ast
from pathlib import Path

import pytest

from helpers.paths import REPO

COLLECTION = "ansible_collections.orbite.qualification"
MODULE_UTILS = f"{COLLECTION}.plugins.module_utils"
UTILS_DIR = REPO / "plugins" / "module_utils"
PACKAGES = ("_build", "_common", "_controller", "_fleet", "_inventory", "_node", "_node_steps", "_profile", "_run",
            "_sim", "_verify")

# Top-level names of the simulated engine under sim/ (run with sim/ on sys.path), and its path
# as a package of the collection, should anyone import it that way.
SIM_TREE = ("orbite_sim", "orbite_sim_runner", "sim", f"{COLLECTION}.sim")
VERIFIER_FORBIDDEN = (
    f"{MODULE_UTILS}._sim",
    f"{MODULE_UTILS}._run",
    f"{MODULE_UTILS}._node",
    f"{MODULE_UTILS}._node_steps",
    f"{COLLECTION}.plugins.modules",
    *SIM_TREE,
)
NODE_SIDE = ("_node", "_node_steps", "_inventory", "_common", "_run")
NODE_FORBIDDEN = (f"{MODULE_UTILS}._verify", f"{MODULE_UTILS}._sim", *SIM_TREE)
COMMON_FORBIDDEN = tuple(f"{MODULE_UTILS}.{p}" for p in PACKAGES if p != "_common")


def _dynamic_target(node):
    """The module named by ``importlib.import_module("x")`` or ``__import__("x")``, if literal."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    first = node.args[0]
    if name in ("import_module", "__import__") and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def imported_modules(path, package):
    """(line, dotted module name) for every import in ``path``, relative ones resolved in ``package``.

    ``from X import a`` yields X and X.a, because ``a`` may be a submodule (``from .. import _sim``).
    """
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                keep = len(parts) - (node.level - 1)
                if keep <= 0:
                    raise ValueError(f"{path}:{node.lineno}: relative import goes above {package}")
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names if alias.name != "*"]
        else:
            target = _dynamic_target(node)
            if target is not None:
                found.append((node.lineno, target))
    return found


def _matches(module, prefixes):
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def violations(path, package, forbidden):
    """'file:line imports module' for each import of ``path`` that falls under ``forbidden``."""
    found = imported_modules(path, package)
    return [f"{path}:{line} imports {module}" for line, module in found if _matches(module, forbidden)]


def package_files(name):
    files = sorted((UTILS_DIR / name).rglob("*.py"))
    assert files, f"package {name} has no Python files: was it renamed? update this test"
    return files


def _package_of(path):
    """Dotted package of a file under plugins/module_utils (its directory)."""
    relative = Path(path).parent.relative_to(UTILS_DIR)
    return ".".join([MODULE_UTILS, *relative.parts])


def check_package(name, forbidden):
    return [problem for path in package_files(name) for problem in violations(path, _package_of(path), forbidden)]


# ---------------------------------------------------------------- the boundaries


def test_every_package_is_known():
    """A new package must be placed on one side of the boundaries here."""
    present = {p.name for p in UTILS_DIR.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert present == set(PACKAGES)


def test_verifier_imports_no_simulation_runner_or_node_code():
    problems = check_package("_verify", VERIFIER_FORBIDDEN)
    for path, package in (("modules/result_check.py", "modules"), ("action/result_check.py", "action"),
                          ("module_utils/_controller/result_check.py", "module_utils._controller"),
                          ("plugin_utils/_in_process.py", "plugin_utils")):
        problems += violations(REPO / "plugins" / path, f"{COLLECTION}.plugins.{package}", VERIFIER_FORBIDDEN)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", NODE_SIDE)
def test_node_side_imports_no_verifier_or_simulation(name):
    problems = check_package(name, NODE_FORBIDDEN)
    assert not problems, "\n".join(problems)


def test_common_imports_no_other_package():
    problems = check_package("_common", COMMON_FORBIDDEN)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- the checker catches planted imports

VERIFY_PACKAGE = f"{MODULE_UTILS}._verify"


@pytest.mark.parametrize(
    "source",
    [
        f"from {MODULE_UTILS}._sim import fake_sysfs\n",
        f"from {MODULE_UTILS}._sim.fake_sysfs import write_host\n",
        f"from {MODULE_UTILS} import _sim\n",
        f"from {MODULE_UTILS} import _profile, _run\n",
        f"import {MODULE_UTILS}._node.client\n",
        f"import {MODULE_UTILS}._node.client as client\n",
        "from .._sim import hosts\n",
        "from ..  import _node\n",
        "from .._run.launch import start\n",
        "from orbite_sim.runner import main\n",
        "import orbite_sim\n",
        f"from {COLLECTION}.plugins.modules import runner\n",
        f"import importlib\nimportlib.import_module('{MODULE_UTILS}._sim.hosts')\n",
        "def later():\n    from .._run import plan\n    return plan\n",
        "try:\n    import orbite_sim_runner\nexcept ImportError:\n    pass\n",
    ],
)
def test_checker_catches_a_planted_verifier_import(tmp_path, source):
    planted = tmp_path / "planted.py"
    planted.write_text(source)
    assert violations(planted, VERIFY_PACKAGE, VERIFIER_FORBIDDEN)


@pytest.mark.parametrize(
    "source",
    [
        f"from {MODULE_UTILS}._profile import model\n",
        "from . import loader\n",
        "from .loader import load_json\n",
        "from .._inventory.compare import diff_inventories\n",
        f"import {MODULE_UTILS}._common.errors\n",
        "import os\nimport simplejson\nfrom sims import x\n",  # names that merely start like 'sim'
        f"from {MODULE_UTILS}._simple import y\n",
    ],
)
def test_checker_lets_allowed_imports_through(tmp_path, source):
    planted = tmp_path / "allowed.py"
    planted.write_text(source)
    assert violations(planted, VERIFY_PACKAGE, VERIFIER_FORBIDDEN) == []


def test_relative_imports_resolve_against_the_package(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from . import loader\nfrom ..._x import y\n")
    assert [m for _, m in imported_modules(planted, VERIFY_PACKAGE)] == [
        f"{VERIFY_PACKAGE}",
        f"{VERIFY_PACKAGE}.loader",
        f"{COLLECTION}.plugins._x",
        f"{COLLECTION}.plugins._x.y",
    ]


def test_checker_catches_a_verifier_import_planted_on_the_node_side(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from .._verify.verdict import verify_run\n")
    assert violations(planted, f"{MODULE_UTILS}._node", NODE_FORBIDDEN) == [
        f"{planted}:1 imports {MODULE_UTILS}._verify.verdict",
        f"{planted}:1 imports {MODULE_UTILS}._verify.verdict.verify_run",
    ]
