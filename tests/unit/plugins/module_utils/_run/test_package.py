"""The simulated runner's zipapp (plugins/module_utils/_run/package.py): each module's source with its checked-hash
bytecode beside it, used only while it is the bytecode of that very source and of the running interpreter."""

import importlib.util
import marshal
import subprocess
import sys
import zipfile

import pytest
from helpers.interpreters import other_interpreter
from helpers.paths import REPO

from ansible_collections.orbite.qualification.plugins.module_utils._run import package

sys.path.insert(0, str(REPO / "sim"))
from orbite_sim import PROTOCOL  # the runner's own protocol string, to check what the zipapp prints


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    target = tmp_path_factory.mktemp("zipapp") / "orbite-sim-runner.pyz"
    package.runner_zipapp(str(REPO / "sim"), str(target))
    return target


def test_each_module_has_its_own_checked_bytecode(app):
    with zipfile.ZipFile(app) as archive:
        names = set(archive.namelist())
        sources = sorted(n for n in names if n.endswith(".py"))
        assert "__main__.py" in sources and "orbite_sim/runner.py" in sources
        assert not [n for n in names if "__pycache__" in n]
        for name in sources:
            source, pyc = archive.read(name), archive.read(name[:-3] + ".pyc")
            assert pyc[:4] == importlib.util.MAGIC_NUMBER
            assert int.from_bytes(pyc[4:8], "little") == 0b11, name  # hash-based, checked against the source
            assert pyc[8:16] == importlib.util.source_hash(source), name
            assert marshal.loads(pyc[16:]) == compile(source, name, "exec", dont_inherit=True), name
        assert names == set(sources) | {n[:-3] + ".pyc" for n in sources}


def test_the_zipapp_runs(app):
    out = subprocess.run([sys.executable, str(app), "--protocol"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == PROTOCOL


def test_bytecode_of_another_source_is_not_run(app, tmp_path):
    """A .py changed after packaging (its .pyc kept) runs as changed: the hash check, not the bytecode, decides."""
    changed = tmp_path / "changed.pyz"
    with zipfile.ZipFile(app) as old, zipfile.ZipFile(changed, "w") as new:
        for info in old.infolist():
            data = old.read(info.filename)
            if info.filename == "orbite_sim/__init__.py":
                data = data.replace(f'PROTOCOL = "{PROTOCOL}"'.encode(), b'PROTOCOL = "changed-after-packaging"')
                assert b"changed-after-packaging" in data
            new.writestr(info, data)
    out = subprocess.run([sys.executable, str(changed), "--protocol"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "changed-after-packaging"


@pytest.mark.parametrize("version", ["3.9", "3.13"])
def test_another_python_compiles_the_sources(app, version):
    """Bytecode of another interpreter version (bad magic) is skipped for the source beside it."""
    interpreter = other_interpreter(version)
    if interpreter is None:
        pytest.skip(f"no other Python {version} here")
    out = subprocess.run([interpreter, str(app), "--protocol"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == PROTOCOL
