"""Benchmark: a hostile profile (deep nesting, an unclosed list, an oversized text) is refused about as fast as a
valid profile is loaded.

The loader bounds nesting and size before it builds anything (docs/profiles.md, Loading). Prints, for each hostile
input, the median time to its refusal beside the median load of profiles/installed_host.json, measured side by side
in one process, and their ratio; a ratio far above 1 means a bound is checked too late.

    .venv/bin/python bench/bench_profile_bounds.py [--runs 5]
"""

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, ".collections"))

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model as pm  # noqa: E402

with open(os.path.join(ROOT, "profiles", "installed_host.json"), encoding="utf-8") as handle:
    VALID_TEXT = handle.read()

HOSTILE = {
    "JSON nested 1000 levels": '{"mode": ' + "[" * 1000 + "]" * 1000 + "}",
    "YAML flow nested 1000 levels": "mode: " + "[" * 1000 + "]" * 1000 + "\n",
    "YAML block nested 200 levels": "".join(" " * i + f"k{i}:\n" for i in range(200)),
    "unclosed list, 50 000 levels": "[" * 50_000,
    "unclosed list, 100 000 characters": "[" * 100_000,
    "valid fields padded past the size bound": json.dumps(dict(json.loads(VALID_TEXT),
                                                               pad="x" * pm.MAX_PROFILE_BYTES)),
}


def load(text):
    """Seconds to load or refuse one profile text, and the refusal's code (None when it loaded)."""
    started = time.perf_counter()
    try:
        pm.load_and_derive(profile=text)
        code = None
    except pm.ProfileError as exc:
        code = ",".join(violation.code for violation in exc.violations)
    return time.perf_counter() - started, code


def median_of(text, runs):
    times, code = [], None
    for _ in range(runs):
        took, code = load(text)
        times.append(took)
    return statistics.median(times), code


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    valid_s, valid_code = median_of(VALID_TEXT, args.runs)
    print(f"valid profile loaded: {valid_s * 1e3:8.2f} ms (code {valid_code})")
    for name, text in HOSTILE.items():
        took, code = median_of(text, args.runs)
        print(f"{name:42s} {took * 1e3:8.2f} ms  {took / valid_s:6.1f}x  {code}")


if __name__ == "__main__":
    main()
