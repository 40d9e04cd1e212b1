"""Build the native reference runner (runners/reference) for tests: once per process and feature set.

``cargo build --release --offline --locked`` into tests/output/reference-runner/<variant>/ (cargo only
rebuilds what changed). The shipped build has no features; ``defects=True`` builds the test build
(cargo feature ``test-defects``), the only one that honours a case file's ``defects``;
``extended=True`` the build that posts and polls with the extended verbs (cargo feature ``verbs-ex``).
"""

import shutil
import subprocess
from pathlib import Path

from ansible_collections.orbite.qualification.plugins.module_utils._common.files import sha256_file

REPO = Path(__file__).resolve().parents[2]
CRATE = REPO / "runners" / "reference"
BINARY = "orbite-rdma-host"
_BUILT = {}


def cargo_available():
    return shutil.which("cargo") is not None and shutil.which("cc") is not None


def reference_runner(defects=False, extended=False):
    """The plan's runner entry {kind: native, path, sha256} of a release build of the crate."""
    features = (["test-defects"] if defects else []) + (["verbs-ex"] if extended else [])
    variant = "+".join(features) or "shipped"
    if variant not in _BUILT:
        target = REPO / "tests" / "output" / "reference-runner" / variant
        argv = ["cargo", "build", "--release", "--offline", "--locked", "--manifest-path", str(CRATE / "Cargo.toml"),
                "--target-dir", str(target)]
        if features:
            argv += ["--features", ",".join(features)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stderr[-4000:]}")
        binary = target / "release" / BINARY
        _BUILT[variant] = {"kind": "native", "path": str(binary), "sha256": sha256_file(str(binary))}
    return dict(_BUILT[variant])
