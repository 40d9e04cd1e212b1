"""The real cargo flow on the dependency-free test crate (tests/fixtures/orbite_crate).

One session-scoped build goes through playbooks/build.yml (cold, then warm: unchanged input);
most tests read or copy its output. The failing builds (dirty, clippy, fmt, --locked) stop before
the release build, so the whole file stays at a handful of small cargo runs.
"""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from helpers.paths import FIXTURES, REPO
from ansible_collections.orbite.qualification.plugins.module_utils._build import artifact as ab
from ansible_collections.orbite.qualification.plugins.module_utils._build import manifest as im

PROTOCOL = "orbite-installed-host-v4"
FIXTURE = FIXTURES / "orbite_crate"


def _have_cargo():
    if not (shutil.which("cargo") and shutil.which("rustup") and shutil.which("git")):
        return False
    probe = subprocess.run(["cargo", "+stable", "clippy", "--version"], capture_output=True, check=False)
    fmt = subprocess.run(["cargo", "+stable", "fmt", "--version"], capture_output=True, check=False)
    return probe.returncode == 0 and fmt.returncode == 0


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _have_cargo(), reason="needs git and rustup's cargo +stable with clippy and rustfmt"),
]


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def git(repo, *args):
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def make_repo(path: Path, edit=None) -> Path:
    """Copy the test crate into a fresh git repo and commit it (after ``edit(path)`` when given)."""
    shutil.copytree(FIXTURE, path)
    if edit:
        edit(path)
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "test crate")
    return path


def fake_observers(path: Path) -> Path:
    """An observers dir implementing contract 4's make interface with stand-in libraries."""
    path.mkdir()
    (path / "Makefile").write_text(
        f"OUT ?= build\nTOOLS = {' '.join(im.OBSERVER_TOOLS)}\n"  # every tool the manifest pins
        'all:\n\tmkdir -p $(OUT)\n\tfor t in $(TOOLS); do echo "stand-in $$t" > $(OUT)/liborbite_$$t.so; done\n'
    )
    cc = path / "fake-cc"  # reports the rdma-core header as present, whatever this machine has
    cc.write_text("#!/bin/sh\ncat >/dev/null\nexit 0\n")
    cc.chmod(0o755)
    return path


def playbook(repo_root, env, *extra):
    start = time.monotonic()
    proc = subprocess.run(
        [str(Path(env["PATH"].split(os.pathsep)[0]) / "ansible-playbook"), "playbooks/build.yml", *extra],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return proc, time.monotonic() - start


@pytest.fixture(scope="session")
def build_env(ansible_env, tmp_path_factory):
    observers = fake_observers(tmp_path_factory.mktemp("coll") / "observers")
    env = dict(ansible_env)
    env["CC"] = str(observers / "fake-cc")
    return env, observers


@pytest.fixture(scope="session")
def session_build(repo_root, build_env, tmp_path_factory):
    env, observers = build_env
    base = tmp_path_factory.mktemp("build")
    repo = make_repo(base / "engine")
    root = base / "out"
    args = ["-e", f"orbite_source={repo}", "-e", f"orbite_build_root={root}", "-e", f"orbite_observers_dir={observers}"]
    cold, cold_s = playbook(repo_root, env, *args)
    assert cold.returncode == 0, cold.stdout + cold.stderr
    manifest_file = root / "stable" / "manifest.json"
    first_mtime = manifest_file.stat().st_mtime_ns
    warm, warm_s = playbook(repo_root, env, *args)
    assert warm.returncode == 0, warm.stdout + warm.stderr
    print(f"\nbuild.yml on the test crate: cold {cold_s:.2f} s, warm (unchanged input) {warm_s:.2f} s")
    return {
        "repo": repo,
        "out": root / "stable",
        "manifest": json.loads(manifest_file.read_text()),
        "cold": cold,
        "warm": warm,
        "first_mtime": first_mtime,
        "env": env,
        "observers": observers,
    }


def copy_installation(src: Path, dst: Path) -> Path:
    """The output without its cargo target dir (enough for the checks, cheap to copy)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("target"))
    return dst


# ----------------------------------------------------------------------------------------------
# The real build


def test_cold_build_pins_the_real_files(session_build):
    out, manifest = session_build["out"], session_build["manifest"]
    assert "changed=1" in session_build["cold"].stdout
    assert manifest["schema"] == "orbite.installation-manifest" and manifest["version"] == 1
    assert manifest["protocol"] == PROTOCOL
    assert manifest["commit"] == git(session_build["repo"], "rev-parse", "HEAD").strip()
    assert manifest["dirty"] is False and manifest["dirty_paths"] == []
    assert manifest["features"] == ["rdma"]
    rustc = subprocess.run(["rustc", "+stable", "-V"], capture_output=True, text=True, check=True).stdout.strip()
    assert manifest["toolchain"] == rustc and manifest["toolchain_name"] == "stable"
    # every pinned hash is the hash of the file on disk (hashed here independently)
    records = [
        manifest["archive"],
        manifest["lockfile"],
        manifest["binary"],
        manifest["consumer_manifest"],
        *manifest["fixture_modules"],
        *manifest["observers"].values(),
    ]
    for record in records:
        assert sha(out / record["path"]) == record["sha256"], record
    assert sorted(Path(m["path"]).name for m in manifest["fixture_modules"]) == ["main.rs", "resources.rs"]
    # the lockfile is the packaged fixture's own, unchanged by --locked resolution
    assert (out / manifest["lockfile"]["path"]).read_bytes() == (
        FIXTURE / "tests/hardware/rdma_host/Cargo.lock"
    ).read_bytes()
    for library in manifest["native_libraries"]:
        assert sha(os.path.realpath(library["path"])) == library["sha256"]
    assert "libc.so.6" in {lib["soname"] for lib in manifest["native_libraries"]}
    assert manifest["observers_absent_reason"] is None
    assert (out / manifest["observers"]["cq_fault"]["path"]).read_text() == "stand-in cq_fault\n"


def test_archive_is_the_package_with_the_fixture(session_build):
    out, manifest = session_build["out"], session_build["manifest"]
    with tarfile.open(out / manifest["archive"]["path"]) as tar:
        names = set(tar.getnames())
    assert {
        "orbite-0.4.0/src/lib.rs",
        "orbite-0.4.0/src/rdma.rs",
        "orbite-0.4.0/tests/hardware/rdma_host/main.rs",
        "orbite-0.4.0/tests/hardware/rdma_host/Cargo.lock",
    } <= names
    assert manifest["package"] == {"name": "orbite", "version": "0.4.0"}


def test_consumer_depends_on_the_extracted_package_outside_the_checkout(session_build):
    out, repo = session_build["out"], session_build["repo"]
    consumer_toml = (out / "consumer" / "Cargo.toml").read_text()
    engine = out / "package" / "orbite-0.4.0"
    assert f'path = "{engine}"' in consumer_toml
    assert 'default-features = false, features = ["rdma"]' in consumer_toml
    assert str(repo) not in consumer_toml
    assert not (repo / "target").exists() and git(repo, "status", "--porcelain") == ""


def test_installed_binary_answers_the_protocol(session_build):
    binary = session_build["out"] / "installed" / "bin" / "orbite-rdma-host"
    assert session_build["manifest"]["binary"]["path"] == "installed/bin/orbite-rdma-host"
    assert subprocess.run([binary, "--protocol"], capture_output=True, text=True, check=False).stdout == PROTOCOL + "\n"
    # the rdma feature really reached the engine: the fixture reports its transports
    described = subprocess.run([binary, "--describe"], capture_output=True, text=True, check=False).stdout
    assert described.startswith("transports=tcp,rdma slices=6 sq_depth=8")


def test_unchanged_input_is_not_rebuilt(session_build):
    # guards: `if reason is None: ... return result` in artifact_build.build
    assert "changed=0" in session_build["warm"].stdout
    manifest_file = session_build["out"] / "manifest.json"
    assert manifest_file.stat().st_mtime_ns == session_build["first_mtime"]


def test_playbook_reports_and_checks_each_manifest(session_build):
    stdout = session_build["cold"].stdout
    assert "Verify each manifest and its installed binary as the gate will" in stdout
    assert f"manifest: {session_build['out']}/manifest.json" in stdout
    assert session_build["manifest"]["binary"]["sha256"] in stdout


# ----------------------------------------------------------------------------------------------
# Tampering is named by installation_check


def test_changed_binary_byte_is_named(session_build, tmp_path):
    out = copy_installation(session_build["out"], tmp_path / "out")
    binary = out / "installed" / "bin" / "orbite-rdma-host"
    data = bytearray(binary.read_bytes())
    data[len(data) // 2] ^= 0xFF
    binary.write_bytes(bytes(data))
    manifest = im.load_manifest(str(out / "manifest.json"))
    mismatches, _ = im.check_controller(manifest, str(out), probe=False)
    assert [(m.field, m.path) for m in mismatches] == [("binary.sha256", str(binary))]
    node_mismatches, _ = im.check_node(manifest, str(binary), probe=False)
    assert [m.field for m in node_mismatches] == ["binary.sha256"]


def test_swapped_lockfile_is_named(session_build, tmp_path):
    out = copy_installation(session_build["out"], tmp_path / "out")
    lock = out / "consumer" / "Cargo.lock"
    lock.write_text(lock.read_text().replace("version = 3", "version = 4"))
    manifest = im.load_manifest(str(out / "manifest.json"))
    mismatches, _ = im.check_controller(manifest, str(out))
    assert [(m.field, m.path) for m in mismatches] == [("lockfile.sha256", str(lock))]


def test_replaced_observer_is_named_on_controller_and_node(session_build, tmp_path):
    out = copy_installation(session_build["out"], tmp_path / "out")
    observer = out / "observers" / "liborbite_accounting.so"
    observer.write_text("another library\n")
    manifest = im.load_manifest(str(out / "manifest.json"))
    mismatches, _ = im.check_controller(manifest, str(out))
    assert [(m.field, m.path) for m in mismatches] == [("observers.accounting.sha256", str(observer))]
    binary = out / "installed" / "bin" / "orbite-rdma-host"
    node_mismatches, _ = im.check_node(
        manifest, str(binary), observers={"accounting": str(observer)}, require_observers=["accounting"]
    )
    assert [m.field for m in node_mismatches] == ["observers.accounting.sha256"]


def test_node_check_of_a_deployed_copy_passes(session_build, tmp_path):
    out, manifest = session_build["out"], session_build["manifest"]
    node = tmp_path / "node"
    node.mkdir()
    binary = shutil.copy2(out / manifest["binary"]["path"], node / "orbite-rdma-host")
    observer = shutil.copy2(out / manifest["observers"]["accounting"]["path"], node / "liborbite_accounting.so")
    mismatches, checked = im.check_node(
        manifest, str(binary), observers={"accounting": str(observer)}, require_observers=["accounting"]
    )
    assert mismatches == []
    assert "native_libraries" in checked and "binary --protocol" in checked


def test_module_names_the_tampered_file(session_build, tmp_path, repo_root):
    out = copy_installation(session_build["out"], tmp_path / "out")
    lock = out / "consumer" / "Cargo.lock"
    lock.write_text(lock.read_text() + "\n")
    binary = session_build["out"] / "installed" / "bin" / "orbite-rdma-host"
    args = json.dumps({"manifest": str(out / "manifest.json"), "binary": str(binary)})
    env = session_build["env"]
    ansible = Path(env["PATH"].split(os.pathsep)[0]) / "ansible"
    proc = subprocess.run(
        [str(ansible), "localhost", "-m", "orbite.qualification.installation_check", "-a", args],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
    assert f"lockfile.sha256 ({lock}): expected" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


# ----------------------------------------------------------------------------------------------
# Refusals and failing builds


def test_dirty_checkout_is_refused_by_the_playbook(session_build, tmp_path, repo_root):
    repo = tmp_path / "engine"
    shutil.copytree(session_build["repo"], repo)
    (repo / "src" / "lib.rs").write_text((repo / "src" / "lib.rs").read_text() + "// edited\n")
    (repo / "src" / "new.rs").write_text("// untracked\n")
    proc, _ = playbook(
        repo_root, session_build["env"], "-e", f"orbite_source={repo}", "-e", f"orbite_build_root={tmp_path / 'out'}"
    )
    assert proc.returncode != 0
    assert "is not clean" in proc.stdout and "M src/lib.rs, ?? src/new.rs" in proc.stdout
    assert not (tmp_path / "out").exists()


def test_allow_dirty_marks_the_manifest(session_build, tmp_path):
    repo = tmp_path / "engine"
    shutil.copytree(session_build["repo"], repo)
    (repo / "src" / "new.rs").write_text("// untracked\n")
    request = ab.BuildRequest(str(repo), output=str(tmp_path / "out"), allow_dirty=True)
    result = ab.build(request)
    manifest = result["manifest"]
    assert manifest["dirty"] is True and manifest["dirty_paths"] == ["?? src/new.rs"]
    # the controller rejects it unless diagnosis is explicitly allowed there too
    mismatches, _ = im.check_controller(manifest, str(tmp_path / "out"))
    assert [m.field for m in mismatches] == ["dirty"]
    assert im.check_controller(manifest, str(tmp_path / "out"), allow_dirty=True)[0] == []
    # a further edit of a dirty file changes the inputs: the next run rebuilds
    (repo / "src" / "new.rs").write_text("// edited again\n")
    assert ab.build(request, check_mode=True)["changed"] is True


def _failing_build(tmp_path, edit):
    repo = make_repo(tmp_path / "engine", edit)
    with pytest.raises(ab.StepFailed) as caught:
        ab.build(ab.BuildRequest(str(repo), output=str(tmp_path / "out")))
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert not (tmp_path / "out" / "installed").exists()
    return caught.value


def test_clippy_warning_fails_the_build_with_the_warning_shown(tmp_path):
    # guards: "-D", "warnings" on the cargo clippy step
    def add_warning(repo):
        resources = repo / "tests/hardware/rdma_host/resources.rs"
        text = resources.read_text()
        text = text.replace(
            "    format!(",
            "    let pending: Vec<u64> = Vec::new();\n    let idle = pending.len() == 0;\n    format!(",
        )
        text = text.replace("SEND_QUEUE_DEPTH\n    )", 'SEND_QUEUE_DEPTH\n    ) + if idle { "" } else { "!" }')
        resources.write_text(text)

    error = _failing_build(tmp_path, add_warning)
    assert error.step == "cargo clippy"
    assert "len_zero" in str(error) and "resources.rs" in str(error)


def test_unformatted_fixture_fails_fmt(tmp_path):
    def misformat(repo):
        main = repo / "tests/hardware/rdma_host/main.rs"
        main.write_text(main.read_text().replace("mod resources;", "mod   resources ;"))

    error = _failing_build(tmp_path, misformat)
    assert error.step == "cargo fmt" and "main.rs" in str(error)


def test_binary_with_another_protocol_is_not_installed_as_valid(tmp_path):
    # guards: the `answer != PROTOCOL` check after _install in artifact_build
    def old_protocol(repo):
        main = repo / "tests/hardware/rdma_host/main.rs"
        main.write_text(main.read_text().replace("orbite-installed-host-v4", "orbite-installed-host-v3"))

    repo = make_repo(tmp_path / "engine", old_protocol)
    with pytest.raises(ab.BuildError, match="--protocol answered 'orbite-installed-host-v3'"):
        ab.build(ab.BuildRequest(str(repo), output=str(tmp_path / "out")))
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_stale_lockfile_fails_locked_resolution(tmp_path):
    # guards: --locked on the consumer (the engine version no longer matches the packaged lockfile)
    def bump(repo):
        cargo_toml = repo / "Cargo.toml"
        cargo_toml.write_text(cargo_toml.read_text().replace('version = "0.4.0"', 'version = "0.4.1"', 1))
        lock = repo / "Cargo.lock"
        lock.write_text(lock.read_text().replace('version = "0.4.0"', 'version = "0.4.1"'))

    error = _failing_build(tmp_path, bump)
    assert error.step == "cargo clippy" and "--locked" in str(error)


def test_concurrent_build_into_the_same_output_is_refused(session_build, tmp_path):
    # guards: the LOCK_EX | LOCK_NB flock of output_lock
    out = tmp_path / "out"
    request = ab.BuildRequest(str(session_build["repo"]), output=str(out))
    with ab.output_lock(str(out)):
        with pytest.raises(ab.BuildError, match="another build is writing"):
            ab.build(request)
    assert not (out / "manifest.json").exists()
    assert oct((out / ".build.lock").stat().st_mode & 0o777) == "0o600"


def test_missing_toolchain_is_named_by_the_module(session_build, tmp_path, repo_root):
    listed = subprocess.run(["rustup", "toolchain", "list"], capture_output=True, text=True, check=False).stdout
    name = "1.85.0" if "1.85.0" not in listed else "1.0.0"
    proc, _ = playbook(
        repo_root,
        session_build["env"],
        "-e",
        f"orbite_source={session_build['repo']}",
        "-e",
        f"orbite_build_root={tmp_path}",
        "-e",
        f"orbite_toolchains={name}",
    )
    assert proc.returncode != 0
    assert f"toolchain '{name}' is not usable" in proc.stdout
    assert not (tmp_path / name).exists()


# ----------------------------------------------------------------------------------------------
# Idempotency and check mode on a private output


def test_rebuild_triggers_and_check_mode(session_build, tmp_path):
    repo = tmp_path / "engine"
    shutil.copytree(session_build["repo"], repo)
    out = tmp_path / "out"
    request = ab.BuildRequest(str(repo), output=str(out), observers_dir=str(session_build["observers"]))
    os.environ["CC"] = session_build["env"]["CC"]
    try:
        planned = ab.build(request, check_mode=True)
        assert planned["changed"] is True and not out.exists()
        assert any("cargo fmt --check" in step for step in planned["plan"])

        assert ab.build(request)["rebuild_reason"] == "no manifest yet"
        again = ab.build(request)
        assert again["changed"] is False and again["steps"] == []
        assert ab.build(request, check_mode=True)["changed"] is False

        # a changed pinned file in the output is rebuilt (guards the check_artifact_files call in up_to_date)
        binary = out / "installed" / "bin" / "orbite-rdma-host"
        binary.chmod(binary.stat().st_mode | stat.S_IWUSR)
        binary.write_bytes(binary.read_bytes() + b"\0")
        rebuilt = ab.build(request)
        assert rebuilt["changed"] is True and rebuilt["rebuild_reason"].startswith("pinned files changed")
        assert sha(binary) == rebuilt["manifest"]["binary"]["sha256"]

        # a new commit changes the inputs (guards the fingerprint comparison in up_to_date)
        lib = repo / "src" / "lib.rs"
        lib.write_text(lib.read_text() + "\n/// A comment-only change.\npub const REVISION: u32 = 2;\n")
        git(repo, "commit", "-qam", "change")
        start = time.monotonic()
        changed = ab.build(request)
        incremental_s = time.monotonic() - start
        assert changed["rebuild_reason"].startswith("inputs changed")
        assert changed["manifest"]["commit"] == git(repo, "rev-parse", "HEAD").strip()
        print(f"\nincremental rebuild after a commit: {incremental_s:.2f} s")
    finally:
        os.environ.pop("CC", None)


# ----------------------------------------------------------------------------------------------
# The collection's own observers (another part of the collection), when they can be built here


OBSERVERS = REPO / "observers"


@pytest.mark.skipif(not (OBSERVERS / "Makefile").is_file(), reason="observers/Makefile is not in the tree yet")
def test_collection_observers_are_built_and_pinned(tmp_path):
    plan = ab.observers_plan(str(OBSERVERS))
    if not plan["buildable"]:
        pytest.skip(f"observers not buildable here: {plan['reason']}")
    request = ab.BuildRequest(str(tmp_path), output=str(tmp_path / "out"), observers_dir=str(OBSERVERS))
    records = ab.build_observers(request, plan)
    for tool in im.OBSERVER_TOOLS:
        assert sha(tmp_path / "out" / records[tool]["path"]) == records[tool]["sha256"]
