# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The installation manifest: schema, loading and validation, hashing, and the checks run on it.

Stdlib only, Python >= 3.9: the node-side half (``check_node``) runs on every lab node.

A manifest (``manifest.json`` beside the artifact, written by ``artifact_build``) pins what the
gate runs. Every ``path`` of an artifact file is relative to the manifest's directory; native
library paths are absolute (they are the build host's resolution)::

    {"schema": "orbite.installation-manifest", "version": 1,
     "protocol": "orbite-installed-host-v4",
     "package": {"name": "orbite", "version": "0.4.0"},
     "commit": "<40 or 64 hex>", "dirty": false, "dirty_paths": [],
     "toolchain": "rustc 1.95.0 (59807616e 2026-04-14)", "toolchain_name": "stable",
     "features": ["rdma"], "fixture": "tests/hardware/rdma_host",
     "archive": {"path": "orbite-0.4.0.crate", "sha256": "..."},
     "fixture_modules": [{"path": "consumer/main.rs", "sha256": "..."}, ...],
     "consumer_manifest": {"path": "consumer/Cargo.toml", "sha256": "..."},
     "lockfile": {"path": "consumer/Cargo.lock", "sha256": "..."},
     "binary": {"path": "installed/bin/orbite-rdma-host", "sha256": "..."},
     "observers": {"accounting": {"path": "observers/liborbite_accounting.so", "sha256": "..."},
                   "cq_fault": null, "uverbs_fault": null, "inflight_fault": null},
     "observers_absent_reason": null,
     "native_libraries": [{"soname": "libc.so.6", "path": "/lib/x86_64-linux-gnu/libc.so.6",
                           "sha256": "..."}],
     "build": {"builder": 1, "fingerprint": "<64 hex>"}}

An observer is ``null`` when it was not built; ``observers_absent_reason`` then says why. A mode
that needs an observer must fail preflight when it is null (``missing_observers``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Dict, List, Optional, Tuple

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import sha256_file
from ansible_collections.orbite.qualification.plugins.module_utils._node.pinned import (
    PinError,
    PinMismatch,
    Pinned,
    pin_file,
)

SCHEMA = "orbite.installation-manifest"
VERSION = 1
PROTOCOL = "orbite-installed-host-v4"
OBSERVER_TOOLS = ("accounting", "cq_fault", "uverbs_fault", "inflight_fault")
PROTOCOL_TIMEOUT = 10

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_FEATURE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_+.-]*$")


def observer_filename(tool: str) -> str:
    """File name of a native observer library (contract 4 of the collection)."""
    return f"liborbite_{tool}.so"


class InstallationError(OrbiteError):
    """Base of every error about building or checking an installation."""

    code = "installation.error"


class ManifestError(InstallationError):
    """A manifest that cannot be read or has the wrong shape. ``problems`` are (field, value, rule)."""

    def __init__(self, origin: str, problems: List[Tuple[str, object, str]]):
        self.origin = origin
        self.problems = problems
        text = "; ".join(f"field {f!r}: value {_short(v)} breaks rule: {r}" for f, v, r in problems)
        super().__init__(f"invalid installation manifest {origin}: {text}")


class Mismatch:
    """One precise difference between the manifest and what was found."""

    def __init__(self, field: str, expected, found, path: Optional[str] = None):
        self.field = field
        self.expected = expected
        self.found = found
        self.path = path

    def as_dict(self) -> dict:
        return {"field": self.field, "path": self.path, "expected": self.expected, "found": self.found}

    def __str__(self) -> str:
        where = f" ({self.path})" if self.path else ""
        return f"{self.field}{where}: expected {_short(self.expected)}, found {_short(self.found)}"

    def __repr__(self) -> str:
        return f"Mismatch({self})"


class InstallationMismatch(InstallationError):
    """The installation does not match its manifest; ``mismatches`` lists every difference."""

    def __init__(self, mismatches: List[Mismatch]):
        self.mismatches = mismatches
        super().__init__("; ".join(str(m) for m in mismatches))


def _short(value, limit: int = 120) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------------------------------
# Loading and validation


def load_manifest(path: str) -> dict:
    """Read and validate a manifest file; raises ManifestError naming the field and the rule."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise ManifestError(path, [("(file)", path, f"must be readable ({error.strerror})")]) from None
    try:
        data = json.loads(text)
    except ValueError as error:
        raise ManifestError(path, [("(file)", text[:60], f"must be JSON ({error})")]) from None
    validate_manifest(data, origin=path)
    return data


def _relative_path_problem(value) -> Optional[str]:
    if not isinstance(value, str) or not value:
        return "a non-empty relative path string"
    if os.path.isabs(value) or ".." in value.split("/"):
        return "relative to the manifest directory, without '..'"
    return None


def _check_file_record(field: str, value, problems: list, absolute: bool = False) -> None:
    if not isinstance(value, dict):
        problems.append((field, value, "an object {path, sha256}"))
        return
    path = value.get("path")
    if absolute:
        if not isinstance(path, str) or not os.path.isabs(path):
            problems.append((f"{field}.path", path, "an absolute path"))
    else:
        rule = _relative_path_problem(path)
        if rule:
            problems.append((f"{field}.path", path, rule))
    if not isinstance(value.get("sha256"), str) or not _HEX64.match(value["sha256"]):
        problems.append((f"{field}.sha256", value.get("sha256"), "64 lowercase hex digits"))


def validate_manifest(data, origin: str = "manifest") -> None:
    """Raise ManifestError listing every field of ``data`` that breaks the schema."""
    problems: List[Tuple[str, object, str]] = []
    if not isinstance(data, dict):
        raise ManifestError(origin, [("(top level)", data, "a JSON object")])
    if data.get("schema") != SCHEMA:
        problems.append(("schema", data.get("schema"), f"must be {SCHEMA!r}"))
    if data.get("version") != VERSION or isinstance(data.get("version"), bool):
        problems.append(("version", data.get("version"), f"must be {VERSION}"))
    if problems:  # another document or another schema version: the rest would only add noise
        raise ManifestError(origin, problems)
    for field in ("protocol", "toolchain", "toolchain_name", "fixture"):
        if not isinstance(data.get(field), str) or not data.get(field):
            problems.append((field, data.get(field), "a non-empty string"))
    if not isinstance(data.get("commit"), str) or not _COMMIT.match(data.get("commit") or ""):
        problems.append(("commit", data.get("commit"), "a full git commit id (40 or 64 lowercase hex)"))
    if not isinstance(data.get("dirty"), bool):
        problems.append(("dirty", data.get("dirty"), "a boolean"))
    dirty_paths = data.get("dirty_paths")
    if not isinstance(dirty_paths, list) or not all(isinstance(p, str) for p in dirty_paths):
        problems.append(("dirty_paths", dirty_paths, "a list of strings"))
    elif data.get("dirty") is False and dirty_paths:
        problems.append(("dirty_paths", dirty_paths, "empty when dirty is false"))
    package = data.get("package")
    if not isinstance(package, dict) or not all(isinstance(package.get(k), str) for k in ("name", "version")):
        problems.append(("package", package, "an object {name, version} of strings"))
    features = data.get("features")
    if not isinstance(features, list) or not all(isinstance(f, str) and _FEATURE.match(f) for f in features):
        problems.append(("features", features, "a list of cargo feature names"))
    for field in ("archive", "lockfile", "binary", "consumer_manifest"):
        _check_file_record(field, data.get(field), problems)
    modules = data.get("fixture_modules")
    if not isinstance(modules, list) or not modules:
        problems.append(("fixture_modules", modules, "a non-empty list of {path, sha256}"))
    else:
        for index, record in enumerate(modules):
            _check_file_record(f"fixture_modules[{index}]", record, problems)
    _validate_observers(data, problems)
    libraries = data.get("native_libraries")
    if not isinstance(libraries, list):
        problems.append(("native_libraries", libraries, "a list of {soname, path, sha256}"))
    else:
        for index, record in enumerate(libraries):
            _check_file_record(f"native_libraries[{index}]", record, problems, absolute=True)
            if isinstance(record, dict) and not (isinstance(record.get("soname"), str) and record["soname"]):
                problems.append((f"native_libraries[{index}].soname", record.get("soname"), "a non-empty string"))
    build = data.get("build")
    if not isinstance(build, dict) or not _HEX64.match(str(build.get("fingerprint", ""))):
        problems.append(("build", build, "an object whose fingerprint is 64 lowercase hex digits"))
    if problems:
        raise ManifestError(origin, problems)


def _validate_observers(data: dict, problems: list) -> None:
    observers = data.get("observers")
    if not isinstance(observers, dict) or sorted(observers) != sorted(OBSERVER_TOOLS):
        problems.append(("observers", observers, f"an object with exactly the keys {list(OBSERVER_TOOLS)}"))
        return
    for tool in OBSERVER_TOOLS:
        if observers[tool] is not None:
            _check_file_record(f"observers.{tool}", observers[tool], problems)
    reason = data.get("observers_absent_reason")
    if any(observers[tool] is None for tool in OBSERVER_TOOLS):
        if not isinstance(reason, str) or not reason:
            problems.append(("observers_absent_reason", reason, "a non-empty string when an observer is null"))
    elif reason is not None:
        problems.append(("observers_absent_reason", reason, "null when every observer is built"))


def missing_observers(manifest: dict, tools) -> List[Tuple[str, str]]:
    """(tool, reason) for each tool in ``tools`` the manifest has no observer for (preflight)."""
    unknown = [t for t in tools if t not in OBSERVER_TOOLS]
    if unknown:
        raise ManifestError(
            "(require_observers)", [("require_observers", unknown, f"tools among {list(OBSERVER_TOOLS)}")]
        )
    reason = manifest.get("observers_absent_reason") or "not built"
    return [(t, reason) for t in tools if manifest["observers"].get(t) is None]


# ----------------------------------------------------------------------------------------------
# Native libraries and the protocol probe (shared by the build and the node check)

_LDD_RESOLVED = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)\s+\(0x[0-9a-fA-F]+\)\s*$")
_LDD_MISSING = re.compile(r"^\s*(\S+)\s+=>\s+not found\s*$")
_LDD_INTERPRETER = re.compile(r"^\s*(/\S+)\s+\(0x[0-9a-fA-F]+\)\s*$")
_LDD_VIRTUAL = re.compile(r"^\s*(\S+)\s+\(0x[0-9a-fA-F]+\)\s*$")


def parse_ldd(text: str) -> Tuple[List[Tuple[str, str]], List[str]]:
    """(resolved [(soname, path)], unresolved [soname]) from ``ldd`` output; vDSO entries skipped."""
    resolved, unresolved = [], []
    for line in text.splitlines():
        if _LDD_MISSING.match(line):
            unresolved.append(_LDD_MISSING.match(line).group(1))
        elif _LDD_RESOLVED.match(line):
            resolved.append(_LDD_RESOLVED.match(line).groups())
        elif _LDD_INTERPRETER.match(line):
            path = _LDD_INTERPRETER.match(line).group(1)
            resolved.append((os.path.basename(path), path))
        elif _LDD_VIRTUAL.match(line) or not line.strip():
            continue  # the vDSO has no file
        elif "statically linked" in line or "not a dynamic executable" in line:
            return [], []
    return resolved, unresolved


def _target(binary: str, pinned: Optional[Pinned]) -> Tuple[str, tuple]:
    """What to hand to the loader or to exec: the pinned copy (/proc/self/fd/N, passed on) if any."""
    return (pinned.proc_path, (pinned.fd,)) if pinned is not None else (binary, ())


def resolve_native_libraries(binary: str, pinned: Optional[Pinned] = None) -> Tuple[List[dict], List[str]]:
    """Resolve ``binary``'s shared libraries with the system loader (``ldd``) and hash each one.

    ``ldd`` runs the dynamic loader on the binary in trace mode, so it is only ever given bytes whose
    hash was checked: the pinned copy (``pinned``, see _node/pinned.py) of the binary this
    collection built or of its deployed copy.
    """
    target, fds = _target(binary, pinned)
    try:
        proc = subprocess.run(
            ["ldd", target],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env=_loader_env(),
            pass_fds=fds,
        )
    except FileNotFoundError:
        raise InstallationError("ldd (glibc's libc-bin) is needed to resolve native libraries") from None
    except subprocess.TimeoutExpired:
        raise InstallationError(f"ldd {binary}: no answer within 30 s") from None
    resolved, unresolved = parse_ldd(proc.stdout + "\n" + proc.stderr)
    if proc.returncode != 0 and not resolved and not unresolved:
        return [], []  # a static binary or a script: nothing to resolve
    libraries = [{"soname": soname, "path": path, "sha256": sha256_file(path)} for soname, path in resolved]
    return libraries, unresolved


def _loader_env() -> dict:
    # The check must see what a runner would see: no preload, audit module or extra search path from
    # the caller (every LD_* variable is dropped, as the supervisor drops them for a runner).
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    env["LC_ALL"] = "C"
    return env


def probe_protocol(binary: str, pinned: Optional[Pinned] = None) -> str:
    """What ``<binary> --protocol`` prints (stripped), or a description of how it failed.

    With ``pinned`` the pinned copy is what runs (argv[0] still names ``binary``).
    """
    target, fds = _target(binary, pinned)
    try:
        proc = subprocess.run(
            [binary, "--protocol"],
            executable=target,
            capture_output=True,
            text=True,
            timeout=PROTOCOL_TIMEOUT,
            check=False,
            env=_loader_env(),
            pass_fds=fds,
        )
    except OSError as error:
        return f"cannot run: {error.strerror}"
    except subprocess.TimeoutExpired:
        return f"no answer within {PROTOCOL_TIMEOUT} s"
    if proc.returncode != 0:
        return f"exit status {proc.returncode}: {proc.stderr.strip()[:200]}"
    return proc.stdout.strip()


# ----------------------------------------------------------------------------------------------
# Checks


def _compare_file(field: str, expected_sha: str, path: str, mismatches: List[Mismatch]) -> None:
    if not os.path.isfile(path):
        mismatches.append(Mismatch(field, expected_sha, "missing", path))
        return
    found = sha256_file(path)
    if found != expected_sha:
        mismatches.append(Mismatch(f"{field}.sha256", expected_sha, found, path))


def pin_checked(field: str, expected_sha: str, path: str, mismatches: List[Mismatch]) -> Optional[Pinned]:
    """A pinned copy of ``path`` whose hash is ``expected_sha``, or None and a Mismatch.

    Whatever is run afterwards (``ldd``, ``--protocol``) runs this copy: a file swapped or rewritten
    after the check is never executed, and a mismatching one never at all.
    """
    if not os.path.exists(path):
        mismatches.append(Mismatch(field, expected_sha, "missing", path))
        return None
    try:
        # Resolve a symlinked install path first: what counts is the hash of the bytes opened.
        return pin_file(os.path.realpath(path), expected_sha, field)
    except PinMismatch as error:
        mismatches.append(Mismatch(f"{field}.sha256", expected_sha, error.found, path))
    except PinError as error:
        mismatches.append(Mismatch(field, expected_sha, f"unreadable ({error})", path))
    return None


def artifact_records(manifest: dict) -> List[Tuple[str, dict]]:
    """(field, record) of every artifact file the manifest pins beside itself."""
    records = [
        ("archive", manifest["archive"]),
        ("consumer_manifest", manifest["consumer_manifest"]),
        ("lockfile", manifest["lockfile"]),
        ("binary", manifest["binary"]),
    ]
    records += [(f"fixture_modules[{i}]", r) for i, r in enumerate(manifest["fixture_modules"])]
    records += [(f"observers.{t}", manifest["observers"][t]) for t in OBSERVER_TOOLS if manifest["observers"][t]]
    return records


def check_artifact_files(manifest: dict, manifest_dir: str) -> List[Mismatch]:
    """Every pinned artifact file beside the manifest, re-hashed."""
    mismatches: List[Mismatch] = []
    for field, record in artifact_records(manifest):
        _compare_file(field, record["sha256"], os.path.join(manifest_dir, record["path"]), mismatches)
    return mismatches


def check_controller(
    manifest: dict,
    manifest_dir: Optional[str],
    allow_dirty: bool = False,
    expected_commit: Optional[str] = None,
    verify_files: bool = True,
    binary: Optional[str] = None,
    require_observers=(),
    probe: bool = True,
) -> Tuple[List[Mismatch], List[str]]:
    """Controller-side check. Returns (mismatches, names of what was checked)."""
    mismatches: List[Mismatch] = []
    checked = ["schema", "protocol", "dirty"]
    if manifest["protocol"] != PROTOCOL:
        mismatches.append(Mismatch("protocol", PROTOCOL, manifest["protocol"]))
    if manifest["dirty"] and not allow_dirty:
        mismatches.append(Mismatch("dirty", False, True, ", ".join(manifest["dirty_paths"]) or None))
    if expected_commit:
        checked.append("commit")
        if manifest["commit"] != expected_commit.strip().lower():
            mismatches.append(Mismatch("commit", expected_commit, manifest["commit"]))
    for tool, reason in missing_observers(manifest, require_observers):
        mismatches.append(Mismatch(f"observers.{tool}", "built", f"absent ({reason})"))
    checked += [f"observers.{t}" for t in require_observers]
    if verify_files:
        if manifest_dir is None:
            raise InstallationError("verify_files needs the manifest's directory (give the manifest as a path)")
        checked.append("artifact files")
        mismatches += check_artifact_files(manifest, manifest_dir)
    if binary:
        # The gate's (installation, binary) pair: the binary it was given must be the pinned one,
        # and only then is it run (--protocol), from the copy whose hash matched.
        checked.append("binary")
        pinned = pin_checked("binary", manifest["binary"]["sha256"], binary, mismatches)
        if pinned is not None:
            with pinned:
                if probe:
                    checked.append("binary --protocol")
                    _check_protocol_answer(binary, mismatches, pinned)
    return mismatches, checked


def _check_protocol_answer(binary: str, mismatches: List[Mismatch], pinned: Optional[Pinned] = None) -> None:
    answer = probe_protocol(binary, pinned)
    if answer != PROTOCOL:
        mismatches.append(Mismatch("protocol (binary --protocol)", PROTOCOL, answer, binary))


def check_node(
    manifest: dict,
    binary: str,
    observers: Optional[Dict[str, str]] = None,
    require_observers=(),
    pin_native_libraries: bool = True,
    probe: bool = True,
) -> Tuple[List[Mismatch], List[str]]:
    """Node-side check of a deployed binary (and observers). Returns (mismatches, checked)."""
    observers = dict(observers or {})
    mismatches: List[Mismatch] = []
    checked = ["binary"]
    unknown = sorted(set(observers) - set(OBSERVER_TOOLS))
    if unknown:
        raise ManifestError("(observers)", [("observers", unknown, f"tools among {list(OBSERVER_TOOLS)}")])
    pinned = pin_checked("binary", manifest["binary"]["sha256"], binary, mismatches)
    for tool, reason in missing_observers(manifest, require_observers):
        mismatches.append(Mismatch(f"observers.{tool}", "built", f"absent ({reason})"))
    for tool in require_observers:
        if tool not in observers and manifest["observers"][tool] is not None:
            mismatches.append(Mismatch(f"observers.{tool}", "a deployed path", "none given"))
    for tool, path in sorted(observers.items()):
        checked.append(f"observers.{tool}")
        record = manifest["observers"][tool]
        if record is None:
            reason = manifest.get("observers_absent_reason") or "not built"
            mismatches.append(Mismatch(f"observers.{tool}", f"absent ({reason})", "a deployed file", path))
        else:
            _compare_file(f"observers.{tool}", record["sha256"], path, mismatches)
    if pinned is not None:  # never ldd or run a binary whose hash does not match
        with pinned:
            checked.append("native_libraries")
            _check_native_libraries(manifest, binary, pin_native_libraries, mismatches, pinned)
            if probe:
                checked.append("binary --protocol")
                _check_protocol_answer(binary, mismatches, pinned)
    return mismatches, checked


def _check_native_libraries(manifest: dict, binary: str, pin: bool, mismatches: List[Mismatch],
                            copy: Optional[Pinned] = None) -> None:
    found, unresolved = resolve_native_libraries(binary, copy)
    for soname in unresolved:
        mismatches.append(Mismatch(f"native_libraries[{soname}]", "resolved", "not found"))
    by_soname = {lib["soname"]: lib for lib in found}
    for pinned in manifest["native_libraries"]:
        here = by_soname.pop(pinned["soname"], None)
        if here is None:
            if pinned["soname"] not in unresolved:
                mismatches.append(Mismatch(f"native_libraries[{pinned['soname']}]", pinned["path"], "not needed"))
            continue
        if pin and here["sha256"] != pinned["sha256"]:
            mismatches.append(
                Mismatch(f"native_libraries[{pinned['soname']}].sha256", pinned["sha256"], here["sha256"], here["path"])
            )
    for soname, lib in sorted(by_soname.items()):
        mismatches.append(Mismatch(f"native_libraries[{soname}]", "not in the manifest", lib["path"]))
