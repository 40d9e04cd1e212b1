# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Build and pin the installed-host artifact (the logic of ``build_installed``).

Runs on the controller. From a clean committed checkout of the engine crate:

1. refuse a dirty or uncommitted checkout (listing the paths) unless ``allow_dirty``;
2. ``cargo +TOOLCHAIN package`` into ``<output>/target`` and copy the ``.crate`` to ``<output>``;
3. extract it to ``<output>/package`` (members checked: no absolute path, no ``..``, no links);
4. copy the packaged fixture into the independent consumer ``<output>/consumer``, whose
   ``Cargo.toml`` is rendered from the fixture's ``Cargo.toml.in`` (path of the extracted engine,
   the requested features) and whose ``Cargo.lock`` is the fixture's own;
5. ``cargo fmt --check``, ``cargo clippy --all-targets -- -D warnings`` and
   ``cargo build --release`` on the consumer, all ``--offline --locked`` with the target dir
   ``<output>/target`` (kept, so rebuilds are incremental);
6. install the binary to ``<output>/installed/bin/`` and require ``--protocol`` to answer;
7. build the native observers (``make -C <observers_dir> OUT=<output>/observers``) when the
   rdma-core headers are present, otherwise record them as absent with the reason;
8. resolve the binary's native libraries (``ldd``) and write ``manifest.json`` last, atomically.

The build is skipped (``changed: false``) when the fingerprint of its inputs equals the one in the
existing manifest and every pinned file still has its pinned hash.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import time
from typing import List, Optional

from ansible_collections.orbite.qualification.plugins.module_utils._common.files import atomic_write_json
from ansible_collections.orbite.qualification.plugins.module_utils._build.manifest import (
    OBSERVER_TOOLS,
    PROTOCOL,
    SCHEMA,
    VERSION,
    InstallationError,
    ManifestError,
    check_artifact_files,
    load_manifest,
    observer_filename,
    probe_protocol,
    resolve_native_libraries,
    sha256_file,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node.pinned import PinError, pin_file

# Bumped whenever the build steps change what they produce: it is part of the input fingerprint.
BUILDER_VERSION = 1
MANIFEST_NAME = "manifest.json"
LOCK_NAME = ".build.lock"
TEMPLATE_NAME = "Cargo.toml.in"
PLACEHOLDERS = ("@ORBITE_PATH@", "@ORBITE_FEATURES@")
OUTPUT_TAIL = 6000
_TOOLCHAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_FEATURE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_+.-]*$")
# Environment that would redirect or change the build behind the module's back.
_SCRUBBED_ENV = ("RUSTUP_TOOLCHAIN", "CARGO_TARGET_DIR", "CARGO_BUILD_TARGET_DIR", "CARGO_BUILD_TARGET")


class BuildError(InstallationError):
    """The build could not be done; the message says which step and why."""


class BuildArgumentError(BuildError):
    """A module argument breaks a rule (field, value, rule)."""

    def __init__(self, field: str, value, rule: str):
        self.field, self.value, self.rule = field, value, rule
        super().__init__(f"invalid argument {field}={value!r}: {rule}")


class ToolchainMissing(BuildError):
    """``cargo +TOOLCHAIN`` does not run."""


class DirtyCheckout(BuildError):
    """The checkout has uncommitted changes or untracked files."""

    def __init__(self, checkout: str, paths: List[str]):
        self.paths = paths
        super().__init__(
            f"checkout {checkout} is not clean; commit or remove these paths (allow_dirty is for local"
            f" diagnosis only): {', '.join(paths)}"
        )


class StepFailed(BuildError):
    """A build command exited non-zero; the message carries its output's tail."""

    def __init__(self, step: str, argv: List[str], returncode: int, output: str):
        self.step, self.argv, self.returncode, self.output = step, argv, returncode, output
        tail = output[-OUTPUT_TAIL:]
        super().__init__(f"build step {step!r} failed (exit {returncode}): {' '.join(argv)}\n{tail}")


class BuildRequest:
    """Validated arguments of one build."""

    def __init__(
        self,
        source,
        toolchain="stable",
        output=None,
        features=("rdma",),
        fixture="tests/hardware/rdma_host",
        allow_dirty=False,
        observers_dir=None,
    ):
        if not source or not os.path.isdir(source):
            raise BuildArgumentError("source", source, "must be an existing directory (the engine checkout)")
        if not isinstance(toolchain, str) or not _TOOLCHAIN.match(toolchain):
            raise BuildArgumentError("toolchain", toolchain, "a rustup toolchain name such as stable or 1.85.0")
        if not output or not os.path.isabs(output):
            raise BuildArgumentError("output", output, "must be an absolute path")
        if isinstance(features, str):
            features = [f for f in features.split(",") if f.strip()]  # survey text
        features = [str(f).strip() for f in features or []]
        for feature in features:
            if not _FEATURE.match(feature):
                raise BuildArgumentError("features", feature, "a cargo feature name (letters, digits, _ - + .)")
        if len(set(features)) != len(features):
            raise BuildArgumentError("features", features, "each feature once")
        parts = str(fixture).split("/")
        if not fixture or os.path.isabs(fixture) or ".." in parts:
            raise BuildArgumentError("fixture", fixture, "a relative path inside the package, without '..'")
        self.source = os.path.realpath(source)
        self.toolchain = toolchain
        self.output = os.path.realpath(output)
        self.features = sorted(features)
        self.fixture = "/".join(p for p in parts if p not in ("", "."))
        self.allow_dirty = bool(allow_dirty)
        self.observers_dir = os.path.realpath(observers_dir) if observers_dir else None


# ----------------------------------------------------------------------------------------------
# Commands


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    env.update(
        {
            "CARGO_TERM_COLOR": "never",
            "CARGO_NET_OFFLINE": "true",
            "RUSTUP_AUTO_INSTALL": "0",
            "RUST_BACKTRACE": "0",
            "LC_ALL": "C",
        }
    )
    return env


def run(
    step: str, argv: List[str], cwd: Optional[str] = None, stdin: Optional[str] = None, timeout: int = 1800
) -> subprocess.CompletedProcess:
    """Run a build command (never through a shell); StepFailed with its output when it fails."""
    try:
        proc = subprocess.run(
            argv, cwd=cwd, input=stdin, capture_output=True, text=True, env=_env(), timeout=timeout, check=False
        )
    except FileNotFoundError:
        raise BuildError(f"build step {step!r}: {argv[0]} is not installed or not on PATH") from None
    except subprocess.TimeoutExpired:
        raise BuildError(f"build step {step!r} did not finish within {timeout} s: {' '.join(argv)}") from None
    if proc.returncode != 0:
        raise StepFailed(step, argv, proc.returncode, (proc.stdout + "\n" + proc.stderr).strip())
    return proc


def cargo(toolchain: str, *args: str) -> List[str]:
    return ["cargo", f"+{toolchain}", *args]


def toolchain_versions(toolchain: str) -> dict:
    """``rustc -V`` and ``cargo -V`` of the toolchain; ToolchainMissing names it when absent."""
    versions = {}
    for tool in ("rustc", "cargo"):
        try:
            proc = subprocess.run(
                [tool, f"+{toolchain}", "-V"], capture_output=True, text=True, env=_env(), timeout=60, check=False
            )
        except FileNotFoundError:
            raise ToolchainMissing(f"toolchain {toolchain!r}: {tool} is not on PATH (install rustup)") from None
        if proc.returncode != 0:
            detail = (proc.stderr.strip().splitlines() or ["(no output)"])[0]
            raise ToolchainMissing(
                f"toolchain {toolchain!r} is not usable: {detail} (install it with"
                f" `rustup toolchain install {toolchain} --component rustfmt,clippy`)"
            )
        versions[tool] = proc.stdout.strip()
    return versions


# ----------------------------------------------------------------------------------------------
# The checkout


def _is_within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip(os.sep) + os.sep)


def git_state(source: str) -> dict:
    """Top level, commit and dirty paths (porcelain ``XY path``) of the checkout holding ``source``."""
    try:
        top = subprocess.run(
            ["git", "-C", source, "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            env=_env(),
            check=False,
        )
    except FileNotFoundError:
        raise BuildError("git is needed to check the checkout") from None
    if top.returncode != 0:
        raise BuildError(f"source {source} is not inside a git checkout: {top.stderr.strip()}")
    toplevel = os.path.realpath(top.stdout.strip())
    head = subprocess.run(
        ["git", "-C", toplevel, "rev-parse", "--verify", "-q", "HEAD^{commit}"],
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    if head.returncode != 0:
        raise BuildError(f"checkout {toplevel} has no commit yet: commit the sources before building")
    status = run(
        "git status",
        ["git", "-C", toplevel, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignore-submodules=none"],
    )
    return {"toplevel": toplevel, "commit": head.stdout.strip(), "dirty_paths": parse_porcelain(status.stdout)}


def parse_porcelain(text: str) -> List[str]:
    """``git status --porcelain=v1 -z`` entries as ``"XY path"`` (renames: ``"R  old -> new"``)."""
    entries, fields, index = [], text.split("\0"), 0
    while index < len(fields):
        entry = fields[index]
        index += 1
        if len(entry) < 4:
            continue
        code, path = entry[:2], entry[3:]
        if code[0] in "RC" and index < len(fields):
            path = f"{fields[index]} -> {path}"
            index += 1
        entries.append(f"{code.strip() or code} {path}")
    return entries


def _dirty_digest(toplevel: str, dirty_paths: List[str]) -> str:
    """Hash of the dirty paths' current contents, so a dirty rebuild notices further edits."""
    digest = hashlib.sha256()
    for entry in dirty_paths:
        digest.update(entry.encode() + b"\0")
        path = os.path.join(toplevel, entry.split(" ", 1)[1].split(" -> ")[-1])
        if os.path.isfile(path):
            digest.update(sha256_file(path).encode())
    return digest.hexdigest()


def package_identity(request: BuildRequest) -> dict:
    """Name and version of the crate at ``source`` (cargo metadata, offline)."""
    proc = run(
        "cargo metadata",
        cargo(
            request.toolchain,
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
            "--manifest-path",
            os.path.join(request.source, "Cargo.toml"),
        ),
    )
    wanted = os.path.join(request.source, "Cargo.toml")
    for package in json.loads(proc.stdout).get("packages", []):
        if os.path.realpath(package["manifest_path"]) == wanted:
            return {"name": package["name"], "version": package["version"]}
    raise BuildError(f"source {request.source}: Cargo.toml is a virtual workspace, not the engine crate")


# ----------------------------------------------------------------------------------------------
# Observers


def observers_plan(observers_dir: Optional[str]) -> dict:
    """Whether the observers can be built here, why not, and a digest of their sources."""
    if observers_dir is None:
        return {"buildable": False, "reason": "no observers directory was given (observers_dir)", "digest": None}
    if not os.path.isdir(observers_dir):
        return {"buildable": False, "reason": f"observers directory {observers_dir} does not exist", "digest": None}
    makefile = os.path.join(observers_dir, "Makefile")
    if not os.path.isfile(makefile):
        return {"buildable": False, "reason": f"{makefile} does not exist (observers not built)", "digest": None}
    if shutil.which("make") is None:
        return {"buildable": False, "reason": "make is not on PATH", "digest": None}
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        return {"buildable": False, "reason": f"no C compiler ({compiler}) on PATH", "digest": None}
    probe = subprocess.run(
        [compiler, "-E", "-x", "c", "-"],
        input="#include <infiniband/verbs.h>\n",
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    if probe.returncode != 0:
        return {
            "buildable": False,
            "digest": None,
            "reason": "infiniband/verbs.h not found (rdma-core headers: Debian libibverbs-dev)",
        }
    return {"buildable": True, "reason": None, "digest": _tree_digest(observers_dir)}


# What the observers' build reads: their Makefile and C sources (not their tests, not build output).
_OBSERVER_SOURCE_SUFFIXES = (".c", ".h", ".map", ".mk", ".lds", ".S")


def _tree_digest(root: str) -> str:
    digest = hashlib.sha256()
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("build", "tests", "__pycache__") and not d.startswith("."))
        for name in sorted(files):
            path = os.path.join(directory, name)
            if os.path.isfile(path) and (name == "Makefile" or name.endswith(_OBSERVER_SOURCE_SUFFIXES)):
                digest.update(os.path.relpath(path, root).encode() + b"\0" + sha256_file(path).encode())
    return digest.hexdigest()


def build_observers(request: BuildRequest, plan: dict) -> dict:
    """Build the observers (contract 4) into ``<output>/observers`` and pin them; or record absence."""
    if not plan["buildable"]:
        return {tool: None for tool in OBSERVER_TOOLS}
    out = os.path.join(request.output, "observers")
    run("observers (make)", ["make", "-C", request.observers_dir, f"OUT={out}"])
    records = {}
    for tool in OBSERVER_TOOLS:
        path = os.path.join(out, observer_filename(tool))
        if not os.path.isfile(path):
            raise BuildError(f"observers: make -C {request.observers_dir} did not produce {path}")
        records[tool] = {"path": os.path.relpath(path, request.output), "sha256": sha256_file(path)}
    return records


# ----------------------------------------------------------------------------------------------
# Fingerprint and the up-to-date check


def fingerprint(request: BuildRequest, git: dict, versions: dict, observers: dict) -> str:
    inputs = {
        "builder": BUILDER_VERSION,
        "commit": git["commit"],
        "dirty": _dirty_digest(git["toplevel"], git["dirty_paths"]) if git["dirty_paths"] else None,
        "toolchain": request.toolchain,
        "versions": versions,
        "features": request.features,
        "fixture": request.fixture,
        "output": request.output,
        "observers": {
            "buildable": observers["buildable"],
            "reason": observers["reason"],
            "digest": observers["digest"],
        },
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def up_to_date(request: BuildRequest, wanted: str) -> Optional[str]:
    """None when the existing manifest matches ``wanted`` and its files; else why a build is due."""
    path = os.path.join(request.output, MANIFEST_NAME)
    if not os.path.exists(path):
        return "no manifest yet"
    try:
        manifest = load_manifest(path)
    except ManifestError as error:
        return f"existing manifest unusable ({error})"
    if manifest["build"]["fingerprint"] != wanted:
        return "inputs changed (commit, dirty files, toolchain, features, fixture or observers)"
    mismatches = check_artifact_files(manifest, request.output)
    for library in manifest["native_libraries"]:
        if not os.path.isfile(library["path"]) or sha256_file(library["path"]) != library["sha256"]:
            return f"native library {library['path']} changed"
    if mismatches:
        return f"pinned files changed: {mismatches[0]}"
    return None


# ----------------------------------------------------------------------------------------------
# The build


def _reset_dir(path: str) -> None:
    if os.path.lexists(path):
        shutil.rmtree(path)
    os.makedirs(path)


def extract_crate(archive: str, destination: str, top: str) -> str:
    """Extract a ``.crate`` safely into ``destination``; returns the package root directory."""
    _reset_dir(destination)
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if (
                os.path.isabs(member.name)
                or ".." in parts
                or parts[0] != top
                or not (member.isfile() or member.isdir())
            ):
                raise BuildError(
                    f"archive {archive}: refusing member {member.name!r} (outside {top}/ or not a plain file)"
                )
            target = os.path.join(destination, *parts)
            if member.isdir():
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.chmod(target, 0o644)
            os.utime(target, (member.mtime, member.mtime))
    return os.path.join(destination, top)


def render_consumer_manifest(template: str, engine_path: str, features: List[str], origin: str) -> str:
    for placeholder in PLACEHOLDERS:
        if template.count(placeholder) != 1:
            raise BuildError(f"fixture template {origin} must hold {placeholder} exactly once")
    # JSON strings are valid TOML basic strings for these values (quotes and backslashes escaped).
    return template.replace("@ORBITE_PATH@", json.dumps(engine_path)).replace("@ORBITE_FEATURES@", json.dumps(features))


def make_consumer(request: BuildRequest, engine_root: str) -> str:
    """Copy the packaged fixture into ``<output>/consumer`` and render its Cargo.toml."""
    fixture = os.path.join(engine_root, *request.fixture.split("/"))
    if not os.path.isdir(fixture):
        raise BuildError(f"fixture {request.fixture!r} is not in the package (check `include` in Cargo.toml)")
    for needed in (TEMPLATE_NAME, "Cargo.lock"):
        if not os.path.isfile(os.path.join(fixture, needed)):
            raise BuildError(f"fixture {request.fixture!r} has no {needed} in the package")
    consumer = os.path.join(request.output, "consumer")
    if os.path.lexists(consumer):
        shutil.rmtree(consumer)
    shutil.copytree(fixture, consumer)
    template_path = os.path.join(consumer, TEMPLATE_NAME)
    with open(template_path, encoding="utf-8") as handle:
        text = render_consumer_manifest(
            handle.read(), engine_root, request.features, f"{request.fixture}/{TEMPLATE_NAME}"
        )
    os.unlink(template_path)
    with open(os.path.join(consumer, "Cargo.toml"), "w", encoding="utf-8") as handle:
        handle.write(text)
    return consumer


def _consumer_binary(build_stdout: str, consumer: str) -> str:
    executables = []
    for line in build_stdout.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if (
            message.get("reason") == "compiler-artifact"
            and message.get("executable")
            and os.path.realpath(message.get("manifest_path", "")) == os.path.join(consumer, "Cargo.toml")
        ):
            executables.append(message["executable"])
    if len(executables) != 1:
        raise BuildError(f"the consumer must build exactly one binary, cargo reported {executables}")
    return executables[0]


def _install(binary: str, bin_dir: str) -> str:
    os.makedirs(bin_dir, exist_ok=True)
    target = os.path.join(bin_dir, os.path.basename(binary))
    temporary = target + ".partial"
    shutil.copyfile(binary, temporary)
    os.chmod(temporary, 0o755)
    os.replace(temporary, target)
    return target


def _record(path: str, output: str) -> dict:
    return {"path": os.path.relpath(path, output), "sha256": sha256_file(path)}


def _preflight(request: BuildRequest) -> dict:
    """Everything checked before anything is written; returns the facts the build needs."""
    git = git_state(request.source)
    if _is_within(request.output, git["toplevel"]) or _is_within(request.output, request.source):
        raise BuildArgumentError("output", request.output, f"must be outside the checkout {git['toplevel']}")
    if os.path.exists(request.output) and not os.path.isdir(request.output):
        raise BuildArgumentError("output", request.output, "must be a directory")
    if git["dirty_paths"] and not request.allow_dirty:
        raise DirtyCheckout(git["toplevel"], git["dirty_paths"])
    if not os.path.isfile(os.path.join(request.source, "Cargo.toml")):
        raise BuildArgumentError("source", request.source, "must hold the engine crate's Cargo.toml")
    versions = toolchain_versions(request.toolchain)
    observers = observers_plan(request.observers_dir)
    return {
        "git": git,
        "versions": versions,
        "observers": observers,
        "fingerprint": fingerprint(request, git, versions, observers),
    }


def build(request: BuildRequest, check_mode: bool = False) -> dict:
    """Build (or, in check mode, plan) the installation. Returns the module result."""
    facts = _preflight(request)
    manifest_path = os.path.join(request.output, MANIFEST_NAME)
    reason = up_to_date(request, facts["fingerprint"])
    result = {
        "changed": reason is not None,
        "manifest_path": manifest_path,
        "rebuild_reason": reason,
        "dirty_paths": facts["git"]["dirty_paths"],
        "commit": facts["git"]["commit"],
        "observers_absent_reason": facts["observers"]["reason"],
        "steps": [],
    }
    if reason is None:
        result["manifest"] = load_manifest(manifest_path)
        return result
    if check_mode:
        result["plan"] = _plan(request, facts)
        return result
    result["manifest"] = _do_build(request, facts, result["steps"])
    return result


def _plan(request: BuildRequest, facts: dict) -> List[str]:
    steps = [
        f"cargo +{request.toolchain} package --offline --locked ({request.source})",
        f"extract the .crate into {request.output}/package",
        f"copy the fixture {request.fixture} into {request.output}/consumer",
        "cargo fmt --check, cargo clippy -D warnings, cargo build --release (offline, locked)",
        f"install the binary into {request.output}/installed/bin",
    ]
    if facts["observers"]["buildable"]:
        steps.append(f"make -C {request.observers_dir} OUT={request.output}/observers")
    else:
        steps.append(f"record the observers as absent: {facts['observers']['reason']}")
    steps.append(f"write {request.output}/{MANIFEST_NAME}")
    return steps


@contextlib.contextmanager
def output_lock(output: str):
    """Exclusive, non-blocking lock of the output dir (flock: released when the holder dies too)."""
    os.makedirs(output, exist_ok=True)
    fd = os.open(os.path.join(output, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BuildError(f"another build is writing {output} (lock {LOCK_NAME} is held)") from None
        yield
    finally:
        os.close(fd)


def _do_build(request: BuildRequest, facts: dict, steps: List[dict]) -> dict:
    with output_lock(request.output):
        return _build_locked(request, facts, steps)


def _build_locked(request: BuildRequest, facts: dict, steps: List[dict]) -> dict:
    output, toolchain = request.output, request.toolchain
    manifest_path = os.path.join(output, MANIFEST_NAME)
    if os.path.exists(manifest_path):
        os.unlink(manifest_path)  # never leave a manifest that describes a half-replaced output
    target = os.path.join(output, "target")

    def timed(name, function, *args):
        start = time.monotonic()
        value = function(*args)
        steps.append({"name": name, "seconds": round(time.monotonic() - start, 3)})
        return value

    identity = timed("metadata", package_identity, request)
    top = f"{identity['name']}-{identity['version']}"
    package_argv = cargo(
        toolchain,
        "package",
        "--offline",
        "--locked",
        "--no-verify",
        "--target-dir",
        target,
        "--manifest-path",
        os.path.join(request.source, "Cargo.toml"),
    )
    if request.allow_dirty:
        package_argv.append("--allow-dirty")
    timed("package", run, "cargo package", package_argv, request.source)
    archive = os.path.join(output, f"{top}.crate")
    shutil.copyfile(os.path.join(target, "package", f"{top}.crate"), archive)
    engine_root = timed("extract", extract_crate, archive, os.path.join(output, "package"), top)
    consumer = timed("consumer", make_consumer, request, engine_root)
    consumer_toml = os.path.join(consumer, "Cargo.toml")
    timed("fmt", run, "cargo fmt", cargo(toolchain, "fmt", "--check", "--manifest-path", consumer_toml))
    timed(
        "clippy",
        run,
        "cargo clippy",
        cargo(
            toolchain,
            "clippy",
            "--offline",
            "--locked",
            "--all-targets",
            "--target-dir",
            target,
            "--manifest-path",
            consumer_toml,
            "--",
            "-D",
            "warnings",
        ),
    )
    built = timed(
        "build",
        run,
        "cargo build",
        cargo(
            toolchain,
            "build",
            "--release",
            "--offline",
            "--locked",
            "--target-dir",
            target,
            "--message-format",
            "json-render-diagnostics",
            "--manifest-path",
            consumer_toml,
        ),
    )
    binary = _install(_consumer_binary(built.stdout, consumer), os.path.join(output, "installed", "bin"))
    # The hash the manifest pins is the hash of the bytes that answered --protocol and were traced.
    try:
        pinned = pin_file(binary, what="installed binary")
    except PinError as error:
        raise BuildError(str(error)) from None
    with pinned:
        answer = probe_protocol(binary, pinned)
        if answer != PROTOCOL:
            raise BuildError(f"installed binary {binary}: --protocol answered {answer!r}, expected {PROTOCOL!r}")
        libraries, unresolved = resolve_native_libraries(binary, pinned)
    binary_record = {"path": os.path.relpath(binary, output), "sha256": pinned.sha256}
    observers = timed("observers", build_observers, request, facts["observers"])
    if unresolved:
        raise BuildError(f"installed binary {binary}: native libraries not found: {', '.join(unresolved)}")
    modules = sorted(os.path.join(d, f) for d, _dirs, files in os.walk(consumer) for f in files if f.endswith(".rs"))
    manifest = {
        "schema": SCHEMA,
        "version": VERSION,
        "protocol": PROTOCOL,
        "package": identity,
        "commit": facts["git"]["commit"],
        "dirty": bool(facts["git"]["dirty_paths"]),
        "dirty_paths": facts["git"]["dirty_paths"],
        "toolchain": facts["versions"]["rustc"],
        "toolchain_name": toolchain,
        "features": request.features,
        "fixture": request.fixture,
        "archive": _record(archive, output),
        "fixture_modules": [_record(m, output) for m in modules],
        "consumer_manifest": _record(consumer_toml, output),
        "lockfile": _record(os.path.join(consumer, "Cargo.lock"), output),
        "binary": binary_record,
        "observers": observers,
        "observers_absent_reason": facts["observers"]["reason"],
        "native_libraries": libraries,
        "build": {"builder": BUILDER_VERSION, "fingerprint": facts["fingerprint"]},
    }
    atomic_write_json(manifest_path, manifest, mode=0o644)
    return manifest
