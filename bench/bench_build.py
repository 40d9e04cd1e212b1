"""Cold, warm and incremental build times of the installed-host artifact (the test crate).

    .venv/bin/python bench/bench_build.py

Measured side by side in one run, on a fresh git copy of tests/fixtures/orbite_crate:
- cold: empty output directory (package, extract, fmt, clippy, release build, install, manifest);
- warm: unchanged input, up-to-date manifest (the changed=false path), median of 5;
- incremental: after a one-line commit, with the target dir kept under the output;
- the same cold/warm pair through playbooks/build.yml (adds ansible-playbook's start-up).
Skips (exit 0 with a note) when cargo/rustup or git are missing.
"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / ".collections"))

from ansible_collections.orbite.qualification.plugins.module_utils._build import artifact as ab  # noqa: E402


def git(repo, *args):
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@example.invalid", *args],
        check=True,
        capture_output=True,
    )


def timed(function, *args, **kwargs):
    start = time.monotonic()
    value = function(*args, **kwargs)
    return value, time.monotonic() - start


def main():
    if not (shutil.which("cargo") and shutil.which("rustup") and shutil.which("git")):
        print("bench_build: skipped (needs git and rustup's cargo)")
        return
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
        repo = Path(tmp) / "engine"
        shutil.copytree(ROOT / "tests" / "fixtures" / "orbite_crate", repo)
        git(repo, "init", "-q")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "bench")
        request = ab.BuildRequest(str(repo), output=str(Path(tmp) / "out"))

        cold, cold_s = timed(ab.build, request)
        assert cold["changed"]
        warm_runs = []
        for _ in range(5):
            warm, seconds = timed(ab.build, request)
            assert not warm["changed"]
            warm_runs.append(seconds)
        lib = repo / "src" / "lib.rs"
        lib.write_text(lib.read_text() + "\n/// bench edit\npub const BENCH: u32 = 1;\n")
        git(repo, "commit", "-qam", "edit")
        incremental, incremental_s = timed(ab.build, request)
        assert incremental["changed"]

        print("build_installed on the test crate (module_utils, no ansible start-up):")
        print(
            f"  cold        {cold_s:6.2f} s   steps: "
            + ", ".join(f"{s['name']} {s['seconds']:.2f}" for s in cold["steps"])
        )
        print(f"  warm        {statistics.median(warm_runs):6.3f} s   (median of {len(warm_runs)}, unchanged input)")
        print(f"  incremental {incremental_s:6.2f} s   (after a commit, target dir kept)")
        print(f"  cold / warm ratio: {cold_s / statistics.median(warm_runs):.0f}x")

        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        playbook = [
            str(ROOT / ".venv" / "bin" / "ansible-playbook"),
            "playbooks/build.yml",
            "-e",
            f"orbite_source={repo}",
            "-e",
            f"orbite_build_root={Path(tmp) / 'pb'}",
        ]
        _, pb_cold = timed(subprocess.run, playbook, cwd=ROOT, env=env, check=True, capture_output=True)
        _, pb_warm = timed(subprocess.run, playbook, cwd=ROOT, env=env, check=True, capture_output=True)
        print("playbooks/build.yml (stable):")
        print(f"  cold {pb_cold:6.2f} s, warm {pb_warm:6.2f} s")


if __name__ == "__main__":
    main()
