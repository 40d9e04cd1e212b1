# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The simulated lab's native part: build the loopback verbs provider and the observers, pin them.

``build_native(collection_dir, out_dir)`` runs ``make -C <collection>/observers OUT=<out_dir>
provider all`` (make rebuilds only what changed; everything it writes is under ``out_dir``, so a
read-only collection works) and writes ``<out_dir>/manifest.json``, rehashed every time::

    {"schema": "orbite.sim-native", "version": 1,
     "verbs_library": {"path": "<out>/provider/libibverbs.so.1", "sha256": "<64 hex>"},
     "observers": {"accounting": {"path": "<out>/liborbite_accounting.so", "sha256": "..."},
                   "cq_fault": {...}, "uverbs_fault": {...}, "inflight_fault": {...}}}

The gate pins the simulated runner's verbs library and preloaded observers to these hashes.
Concurrent builds into one ``out_dir`` (a lab set-up and a test run) take turns on a lock file.
Controller side, stdlib only, Python >= 3.9.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from typing import Dict, Tuple

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    atomic_write_json,
    private_dir,
    sha256_file,
)

SCHEMA = "orbite.sim-native"
VERSION = 1
MANIFEST = "manifest.json"
TOOLS = ("accounting", "cq_fault", "uverbs_fault", "inflight_fault")
VERBS_LIBRARY = os.path.join("provider", "libibverbs.so.1")
BUILD_TIMEOUT_S = 600
# make's output is kept to its end: the headers check names the missing package there.
MESSAGE_TAIL = 2000


class SimNativeError(OrbiteError):
    """The native part of the lab cannot be built; the message says what is missing."""

    code = "sim.native"


def artifact_paths(out_dir: str) -> Dict[str, str]:
    """Where the build leaves each artifact: ``verbs_library`` and each observer tool."""
    paths = {"verbs_library": os.path.join(out_dir, VERBS_LIBRARY)}
    paths.update({tool: os.path.join(out_dir, f"liborbite_{tool}.so") for tool in TOOLS})
    return paths


def _require_tools(make: str, cc: str) -> None:
    for field, tool, package in (("make", make, "make"), ("cc", cc, "gcc")):
        if not shutil.which(tool):
            raise SimNativeError(
                f"{field}={tool!r}: not found on the controller; the simulated lab builds the loopback verbs "
                f"provider and the observers with make and a C compiler (install {package} and the rdma-core "
                "headers, Debian libibverbs-dev / Fedora rdma-core-devel)"
            )


def read_manifest(path: str):
    """The manifest at ``path``, or None when there is none (or it is not JSON): then it is (re)built."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def build_native(collection_dir: str, out_dir: str, make: str = "make", cc: str = "gcc") -> Tuple[bool, Dict]:
    """Build (or bring up to date) provider and observers under ``out_dir``; returns (changed, manifest)."""
    source = os.path.join(collection_dir, "observers")
    if not os.path.isfile(os.path.join(source, "Makefile")):
        raise SimNativeError(f"collection_dir={collection_dir!r}: has no observers/Makefile (not the collection?)")
    if not os.path.isabs(out_dir):
        raise SimNativeError(f"out_dir={out_dir!r}: must be an absolute path")
    _require_tools(make, cc)
    private_dir(out_dir, "out_dir")
    with open(os.path.join(out_dir, ".build.lock"), "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            done = subprocess.run(
                [make, "-s", "-C", source, f"OUT={out_dir}", f"CC={cc}", "provider", "all"],
                capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
            )
        except subprocess.TimeoutExpired:
            raise SimNativeError(f"make -C {source} provider all: no end within {BUILD_TIMEOUT_S} s") from None
        if done.returncode != 0:
            output = (done.stderr or done.stdout).strip()[-MESSAGE_TAIL:]
            raise SimNativeError(f"make -C {source} OUT={out_dir} provider all failed "
                                 f"(exit {done.returncode}): {output}")
        manifest = {"schema": SCHEMA, "version": VERSION, "verbs_library": None, "observers": {}}
        for name, path in artifact_paths(out_dir).items():
            if not os.path.isfile(path):
                raise SimNativeError(f"make -C {source} provider all succeeded but left no {path}")
            entry = {"path": path, "sha256": sha256_file(path)}
            if name == "verbs_library":
                manifest["verbs_library"] = entry
            else:
                manifest["observers"][name] = entry
        manifest_path = os.path.join(out_dir, MANIFEST)
        changed = read_manifest(manifest_path) != manifest
        if changed:
            atomic_write_json(manifest_path, manifest, mode=0o600)
    return changed, manifest


def remove_native(out_dir: str, check_mode: bool = False) -> bool:
    """Remove what ``build_native`` made in ``out_dir``; a directory without its manifest is left alone."""
    manifest = read_manifest(os.path.join(out_dir, MANIFEST))
    if not os.path.isdir(out_dir):
        return False
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise SimNativeError(f"out_dir={out_dir!r}: holds no {SCHEMA} manifest; the lab did not build it, so it "
                             "is not removed")
    if not check_mode:
        shutil.rmtree(out_dir)
    return True
