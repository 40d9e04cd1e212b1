"""artifact_build: argument rules, checkout state, crate extraction, consumer template, observers.

Everything here runs without cargo (git and make are used where the step itself needs them); the
real cargo flow is in tests/gate/test_build_installed.py.
"""

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile

import pytest
from ansible_collections.orbite.qualification.plugins.module_utils._build import artifact as ab

HAVE_GIT = shutil.which("git") is not None
needs_git = pytest.mark.skipif(not HAVE_GIT, reason="git is not installed")


def git(repo, *args):
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def repo(tmp_path):
    """A committed git checkout holding a crate-shaped tree."""
    path = tmp_path / "engine"
    (path / "src").mkdir(parents=True)
    (path / "Cargo.toml").write_text('[package]\nname = "orbite"\nversion = "0.4.0"\n')
    (path / "src" / "lib.rs").write_text("pub fn x() {}\n")
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "init")
    return path


# ----------------------------------------------------------------------------------------------
# Arguments


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"source": "/nonexistent/engine"}, "source"),
        ({"toolchain": "stable --config x"}, "toolchain"),
        ({"toolchain": "+stable"}, "toolchain"),
        ({"output": "relative/out"}, "output"),
        ({"features": ["rdma", "no spaces"]}, "features"),
        ({"features": ["rdma", "rdma"]}, "features"),
        ({"fixture": "../outside"}, "fixture"),
        ({"fixture": "/abs/fixture"}, "fixture"),
    ],
)
def test_bad_arguments_name_the_field(tmp_path, kwargs, field):
    args = {"source": str(tmp_path), "output": str(tmp_path / "out")}
    args.update(kwargs)
    with pytest.raises(ab.BuildArgumentError) as caught:
        ab.BuildRequest(**args)
    assert caught.value.field == field
    assert f"invalid argument {field}=" in str(caught.value)


def test_survey_text_features_are_split(tmp_path):
    request = ab.BuildRequest(str(tmp_path), output=str(tmp_path / "o"), features="rdma, tcp")
    assert request.features == ["rdma", "tcp"]


# ----------------------------------------------------------------------------------------------
# Checkout state (the refusals happen before any output is written)


def test_porcelain_parsing():
    text = "M  src/lib.rs\0?? src/new file.rs\0R  src/b.rs\0src/a.rs\0 D gone.rs\0"
    assert ab.parse_porcelain(text) == ["M src/lib.rs", "?? src/new file.rs", "R src/a.rs -> src/b.rs", "D gone.rs"]


@needs_git
def test_clean_checkout_state(repo):
    state = ab.git_state(str(repo))
    assert state["dirty_paths"] == [] and len(state["commit"]) == 40
    assert state["toplevel"] == os.path.realpath(repo)


@needs_git
def test_modified_file_is_refused_with_its_path(repo, tmp_path):
    # guards: `if git["dirty_paths"] and not request.allow_dirty: raise DirtyCheckout` in _preflight
    (repo / "src" / "lib.rs").write_text("pub fn y() {}\n")
    request = ab.BuildRequest(str(repo), output=str(tmp_path / "out"))
    with pytest.raises(ab.DirtyCheckout) as caught:
        ab.build(request)
    assert caught.value.paths == ["M src/lib.rs"]
    assert "M src/lib.rs" in str(caught.value) and "allow_dirty" in str(caught.value)
    assert not (tmp_path / "out").exists()


@needs_git
def test_untracked_file_is_refused_with_its_path(repo, tmp_path):
    (repo / "src" / "extra.rs").write_text("// new\n")
    with pytest.raises(ab.DirtyCheckout) as caught:
        ab.build(ab.BuildRequest(str(repo), output=str(tmp_path / "out")))
    assert caught.value.paths == ["?? src/extra.rs"]


@needs_git
def test_staged_but_uncommitted_file_is_refused(repo, tmp_path):
    (repo / "src" / "staged.rs").write_text("// staged\n")
    git(repo, "add", "src/staged.rs")
    with pytest.raises(ab.DirtyCheckout) as caught:
        ab.build(ab.BuildRequest(str(repo), output=str(tmp_path / "out")))
    assert caught.value.paths == ["A src/staged.rs"]


@needs_git
def test_checkout_without_commit_is_refused(tmp_path):
    path = tmp_path / "fresh"
    path.mkdir()
    git(path, "init", "-q")
    (path / "Cargo.toml").write_text("[package]\n")
    with pytest.raises(ab.BuildError, match="has no commit yet"):
        ab.build(ab.BuildRequest(str(path), output=str(tmp_path / "out")))


def test_source_outside_git_is_refused(tmp_path):
    with pytest.raises(ab.BuildError, match="not inside a git checkout"):
        ab.git_state(str(tmp_path))


@needs_git
@pytest.mark.parametrize("inside", ["out", "src/out", "."])
def test_output_inside_the_checkout_is_refused(repo, inside):
    # guards: the `_is_within(request.output, git["toplevel"])` refusal in _preflight
    with pytest.raises(ab.BuildArgumentError) as caught:
        ab.build(ab.BuildRequest(str(repo), output=str(repo / inside)))
    assert caught.value.field == "output" and "outside the checkout" in str(caught.value)


@needs_git
def test_dirty_digest_follows_dirty_contents(repo):
    (repo / "src" / "lib.rs").write_text("pub fn y() {}\n")
    state = ab.git_state(str(repo))
    first = ab._dirty_digest(state["toplevel"], state["dirty_paths"])
    (repo / "src" / "lib.rs").write_text("pub fn z() {}\n")
    assert ab._dirty_digest(state["toplevel"], state["dirty_paths"]) != first


# ----------------------------------------------------------------------------------------------
# Toolchain


def _missing_toolchain():
    listed = subprocess.run(["rustup", "toolchain", "list"], capture_output=True, text=True, check=False).stdout
    return "1.85.0" if "1.85.0" not in listed else "1.0.0"


@pytest.mark.skipif(shutil.which("rustup") is None, reason="rustup is not installed")
def test_missing_toolchain_is_named():
    # guards: the returncode check of toolchain_versions (RUSTUP_AUTO_INSTALL=0 keeps it offline)
    name = _missing_toolchain()
    with pytest.raises(ab.ToolchainMissing) as caught:
        ab.toolchain_versions(name)
    assert f"toolchain {name!r} is not usable" in str(caught.value)
    assert f"rustup toolchain install {name}" in str(caught.value)
    assert "Stack backtrace" not in str(caught.value)


# ----------------------------------------------------------------------------------------------
# Crate extraction and the consumer template


def _crate(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            if kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_crate_extracts_plain_files(tmp_path):
    crate = tmp_path / "orbite-0.4.0.crate"
    _crate(
        crate,
        [
            ("orbite-0.4.0/Cargo.toml", b"[package]\n", "file"),
            ("orbite-0.4.0/tests/hardware/rdma_host/main.rs", b"fn main() {}\n", "file"),
        ],
    )
    root = ab.extract_crate(str(crate), str(tmp_path / "package"), "orbite-0.4.0")
    assert (
        tmp_path / "package" / "orbite-0.4.0" / "tests/hardware/rdma_host/main.rs"
    ).read_bytes() == b"fn main() {}\n"
    assert root == str(tmp_path / "package" / "orbite-0.4.0")


@pytest.mark.parametrize(
    "member",
    [
        ("orbite-0.4.0/../../escape.rs", b"x", "file"),
        ("/etc/cron.d/x", b"x", "file"),
        ("other-1.0/src/lib.rs", b"x", "file"),
        ("orbite-0.4.0/link", b"", "sym"),
    ],
)
def test_crate_members_outside_the_package_are_refused(tmp_path, member):
    # guards: the member check in extract_crate
    crate = tmp_path / "orbite-0.4.0.crate"
    _crate(crate, [member])
    with pytest.raises(ab.BuildError, match="refusing member"):
        ab.extract_crate(str(crate), str(tmp_path / "package"), "orbite-0.4.0")
    assert not (tmp_path / "escape.rs").exists()


def test_consumer_template_is_rendered_as_toml_strings():
    template = "orbite = { path = @ORBITE_PATH@, features = @ORBITE_FEATURES@ }\n"
    text = ab.render_consumer_manifest(template, '/tmp/a "b"/orbite-0.4.0', ["rdma"], "t")
    assert text == 'orbite = { path = "/tmp/a \\"b\\"/orbite-0.4.0", features = ["rdma"] }\n'


@pytest.mark.parametrize("template", ["path = @ORBITE_PATH@\n", "@ORBITE_PATH@ @ORBITE_PATH@ @ORBITE_FEATURES@"])
def test_consumer_template_needs_each_placeholder_once(template):
    with pytest.raises(ab.BuildError, match="exactly once"):
        ab.render_consumer_manifest(template, "/x", ["rdma"], "Cargo.toml.in")


def test_fixture_missing_from_package_is_named(tmp_path):
    engine = tmp_path / "package" / "orbite-0.4.0"
    engine.mkdir(parents=True)
    request = ab.BuildRequest(str(tmp_path), output=str(tmp_path / "out"))
    with pytest.raises(ab.BuildError, match="'tests/hardware/rdma_host' is not in the package"):
        ab.make_consumer(request, str(engine))
    (engine / "tests" / "hardware" / "rdma_host").mkdir(parents=True)
    (engine / "tests" / "hardware" / "rdma_host" / "Cargo.toml.in").write_text("x")
    with pytest.raises(ab.BuildError, match=r"has no Cargo\.lock"):
        ab.make_consumer(request, str(engine))


# ----------------------------------------------------------------------------------------------
# Observers


def _fake_compiler(tmp_path, status):
    cc = tmp_path / f"cc{status}"
    cc.write_text(f"#!/bin/sh\ncat >/dev/null\nexit {status}\n")
    cc.chmod(0o755)
    return str(cc)


def _fake_observers(tmp_path):
    """An observers dir whose Makefile writes the three libraries into OUT (contract 4's interface)."""
    src = tmp_path / "observers"
    src.mkdir()
    (src / "Makefile").write_text(
        "OUT ?= build\nTOOLS = accounting cq_fault uverbs_fault inflight_fault\n"
        'all:\n\tmkdir -p $(OUT)\n\tfor t in $(TOOLS); do echo "fake $$t" > $(OUT)/liborbite_$$t.so; done\n'
    )
    return src


def test_observers_absent_reasons(tmp_path, monkeypatch):
    assert "no observers directory" in ab.observers_plan(None)["reason"]
    assert "does not exist" in ab.observers_plan(str(tmp_path / "nope"))["reason"]
    (tmp_path / "empty").mkdir()
    assert "Makefile does not exist" in ab.observers_plan(str(tmp_path / "empty"))["reason"]
    src = _fake_observers(tmp_path)
    monkeypatch.setenv("CC", _fake_compiler(tmp_path, 1))
    plan = ab.observers_plan(str(src))
    assert plan == {
        "buildable": False,
        "digest": None,
        "reason": "infiniband/verbs.h not found (rdma-core headers: Debian libibverbs-dev)",
    }
    request = ab.BuildRequest(str(tmp_path), output=str(tmp_path / "out"), observers_dir=str(src))
    assert ab.build_observers(request, plan) == {"accounting": None, "cq_fault": None, "uverbs_fault": None,
                                                "inflight_fault": None}


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_observers_are_built_and_pinned(tmp_path, monkeypatch):
    src = _fake_observers(tmp_path)
    monkeypatch.setenv("CC", _fake_compiler(tmp_path, 0))
    plan = ab.observers_plan(str(src))
    assert plan["buildable"] and plan["reason"] is None
    request = ab.BuildRequest(str(tmp_path), output=str(tmp_path / "out"), observers_dir=str(src))
    records = ab.build_observers(request, plan)
    assert records["cq_fault"]["path"] == "observers/liborbite_cq_fault.so"
    assert records["cq_fault"]["sha256"] == hashlib.sha256(b"fake cq_fault\n").hexdigest()
    # the source digest follows the observer sources, so an edit there forces a rebuild ...
    (src / "accounting.c").write_text("int x;\n")
    edited = ab.observers_plan(str(src))["digest"]
    assert edited != plan["digest"]
    # ... but not their tests or build output
    (src / "tests").mkdir()
    (src / "tests" / "harness.c").write_text("int y;\n")
    (src / "notes.txt").write_text("x\n")
    assert ab.observers_plan(str(src))["digest"] == edited


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_observer_missing_after_make_is_an_error(tmp_path, monkeypatch):
    src = _fake_observers(tmp_path)
    (src / "Makefile").write_text("all:\n\tmkdir -p $(OUT)\n\ttouch $(OUT)/liborbite_accounting.so\n")
    monkeypatch.setenv("CC", _fake_compiler(tmp_path, 0))
    request = ab.BuildRequest(str(tmp_path), output=str(tmp_path / "out"), observers_dir=str(src))
    with pytest.raises(ab.BuildError, match=r"did not produce .*liborbite_cq_fault\.so"):
        ab.build_observers(request, ab.observers_plan(str(src)))


# ----------------------------------------------------------------------------------------------
# Up-to-date check


def test_up_to_date_reasons(tmp_path):
    request = ab.BuildRequest(str(tmp_path), output=str(tmp_path / "out"))
    assert ab.up_to_date(request, "f" * 64) == "no manifest yet"
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "manifest.json").write_text(json.dumps({"schema": "x"}))
    assert ab.up_to_date(request, "f" * 64).startswith("existing manifest unusable")
