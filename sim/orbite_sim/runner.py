# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Command line of the simulated runner and the mapping of outcomes to exit codes."""

import argparse
import json
import os
import sys
import traceback

from . import PROTOCOL
from .case import defect_table, load_case
from .errors import (
    EXIT_CASE_ERROR,
    EXIT_CHECK_FAILED,
    EXIT_INTERNAL,
    EXIT_OK,
    CaseError,
    EngineError,
)
from .ledger import Ledger
from .memory_cleanup import MemoryCleanupProcess, is_memory_mode
from .requester import RequesterEngine
from .source import SourceEngine
from .verbs import load as load_verbs


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise CaseError(f"command line: {message}")


def _parse(argv):
    parser = _Parser(prog="orbite-sim-runner", description="Simulated OrbiTE engine runner ("
                     + PROTOCOL + "); see docs/runner-contract.md.")
    parser.add_argument("--protocol", action="store_true", help="print the protocol string and exit")
    parser.add_argument("--defect-table", action="store_true",
                        help="print which defect switches each mode takes (JSON) and exit")
    parser.add_argument("--case", help="case file (JSON, schema orbite.runner-case v1)")
    parser.add_argument("--output", help="output directory (ledger.json, ready.json, observer logs)")
    args = parser.parse_args(argv)
    if not (args.protocol or args.defect_table) and (not args.case or not args.output):
        raise CaseError("command line: --case and --output are required (or --protocol)")
    return args


def _prepare_output(path):
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise CaseError(f"--output {path!r}: cannot be created ({exc.strerror})") from None
    if not os.access(path, os.W_OK):
        raise CaseError(f"--output {path!r}: is not writable")
    return path


def main(argv=None):
    try:
        args = _parse(sys.argv[1:] if argv is None else argv)
    except CaseError as exc:
        print(f"orbite-runner: {exc}", file=sys.stderr)
        return EXIT_CASE_ERROR
    if args.protocol:
        print(PROTOCOL)
        return EXIT_OK
    if args.defect_table:
        print(json.dumps(defect_table(), sort_keys=True))
        return EXIT_OK
    if "RDMAV_ALLOW_DISASSOC_DESTROY" in os.environ:
        print("orbite-runner: RDMAV_ALLOW_DISASSOC_DESTROY is set; it would turn a destroy EIO into success",
              file=sys.stderr)
        return EXIT_CASE_ERROR
    try:
        output = _prepare_output(args.output)
    except CaseError as exc:
        print(f"orbite-runner: {exc}", file=sys.stderr)
        return EXIT_CASE_ERROR
    ledger_path = os.path.join(output, "ledger.json")
    try:
        case = load_case(args.case)
        provider = load_verbs(case["verbs_library"], case["root"])
    except CaseError as exc:
        print(f"orbite-runner: {exc}", file=sys.stderr)
        ledger = Ledger(ledger_path)
        ledger.doc["errors"].append(EngineError("InvalidArgument", "case", str(exc)).as_dict())
        ledger.finish("case_error", EXIT_CASE_ERROR)
        return EXIT_CASE_ERROR

    ledger = Ledger(ledger_path, case, case["defects"])
    print(f"orbite-runner: role={case['role']} generation={case['generation']} pid={os.getpid()}", flush=True)
    engine = None
    code = EXIT_OK

    def current():
        # The survivor of installed-restart writes one ledger per generation: the last one is its end.
        return engine.ledger if engine is not None else ledger

    try:
        if is_memory_mode(case):  # two engines in one process (docs/memory_cleanup.md)
            engine = MemoryCleanupProcess(case, output, ledger, provider)
        else:
            engine = (SourceEngine if case["role"] == "source" else RequesterEngine)(case, output, ledger, provider)
        engine.run()
        if engine.rounds_failed_checks or (current().doc["teardown"] or {}).get("retained_owners", 0):
            code = EXIT_CHECK_FAILED
    except EngineError as exc:
        print(f"orbite-runner: {exc}", file=sys.stderr)
        if exc.round_no is None and engine is not None and engine.round_no:
            exc.round_no = engine.round_no  # e.g. the peer vanished during this round
        current().doc["errors"].append(exc.as_dict())
        code = exc.exit_code
    except Exception as exc:  # a bug: keep the traceback for the journal, still leave a ledger
        traceback.print_exc()
        current().doc["errors"].append(EngineError("Internal", "runner", f"{type(exc).__name__}: {exc}").as_dict())
        code = EXIT_INTERNAL
    if engine is not None:
        engine.abort()
        engine.totals()
    current().finish("complete" if code == EXIT_OK else "failed", code)
    return code
