"""`ansible-galaxy collection build` succeeds and ships no venvs, caches or build outputs."""

import subprocess
import sys
import tarfile
from pathlib import Path


def test_collection_builds_clean(repo_root, ansible_env, tmp_path):
    galaxy = Path(sys.executable).parent / "ansible-galaxy"
    result = subprocess.run([str(galaxy), "collection", "build", "--output-path", str(tmp_path), str(repo_root)],
                            env=ansible_env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    (archive,) = tmp_path.glob("orbite-qualification-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "MANIFEST.json" in names and "plugins/modules/profile_info.py" in names
    assert "roles/preflight/meta/argument_specs.yml" in names
    bad_parts = {".venv", ".collections", ".git", "__pycache__", ".pytest_cache", ".ruff_cache",
                 ".hypothesis", "target"}
    leaked = [n for n in names if bad_parts & set(Path(n).parts) or n.endswith((".pyc", ".tar.gz", ".so", ".o"))]
    assert not leaked, leaked
