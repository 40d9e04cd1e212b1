"""Every path of this checkout that the docs, the README and the code name exists.

A renamed test or module leaves its old name behind in prose, where no import fails; this walks the
text files and checks each path that starts with one of the checkout's top-level directories.
"""

import re
import sys

from pathlib import Path

import pytest
from helpers.paths import REPO

TOP_DIRS = ("bench", "docs", "observers", "playbooks", "plugins", "profiles", "roles", "runners", "schemas",
            "scripts", "sim", "tests")
PATH = re.compile(r"(?<![\w./-])(?:" + "|".join(TOP_DIRS)
                  + r")/[A-Za-z0-9_./-]+\.(?:py|md|yml|yaml|c|h|rs|json|sh|toml)\b")
SCANNED = ("*.md", "*.py", "*.yml", "*.c", "*.h", "*.rs", "*.sh")
SKIPPED_DIRS = {".git", ".venv", ".collections", "node_modules", "__pycache__", "build", "target", "fixtures"}
# Paths inside the engine crate (its consumer fixture), not inside this checkout.
CRATE_RELATIVE = ("tests/hardware/rdma_host/",)
# This file names missing paths on purpose (its red check).
SELF = Path(__file__).resolve().relative_to(REPO)


def scanned_files():
    for pattern in SCANNED:
        for path in REPO.rglob(pattern):
            relative = path.relative_to(REPO)
            folders = relative.parts[:-1]
            hidden = any(part.startswith(".") for part in folders)  # .venv-ansible-2.17 and the like
            if not hidden and not SKIPPED_DIRS.intersection(folders) and relative != SELF:
                yield relative


def named_paths(text):
    for match in PATH.finditer(text):
        name = match.group(0)
        if not name.startswith(CRATE_RELATIVE):
            yield name


def missing_references():
    missing = []
    for relative in sorted(set(scanned_files())):
        text = (REPO / relative).read_text(encoding="utf-8", errors="replace")
        missing.extend(f"{relative}: {name}" for name in named_paths(text) if not (REPO / name).exists())
    return missing


def test_every_named_path_exists():
    assert missing_references() == []


@pytest.mark.parametrize("text, expected", [
    ("see tests/unit/sim/test_sim_runner_units.py for it", ["tests/unit/sim/test_sim_runner_units.py"]),
    ("`docs/profiles.md`, and plugins/module_utils/_verify/rules/qps.py.", ["docs/profiles.md",
                                                                           "plugins/module_utils/_verify/rules/qps.py"]),
    ("orbite-0.4.0/tests/hardware/rdma_host/main.rs", []),
    ("a/tests/x.py and tests/hardware/rdma_host/main.rs", []),
])
def test_the_path_grammar(text, expected):
    assert list(named_paths(text)) == expected


def test_a_stale_name_is_reported(tmp_path, monkeypatch):
    """Red check: a doc naming a file that is not there is reported by its file and the name."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("run tests/unit/test_gone.py\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert missing_references() == ["docs/page.md: tests/unit/test_gone.py"]
