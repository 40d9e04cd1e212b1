# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The run.* and case.* codes: the plan, and each planned case as a whole (emitted by verdict.py)."""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import (
    EVERY_RUN,
    applies,
    declare,
)

# Modes whose fault-specific rules are written: a mode the profile model learns before the verifier has its
# rules fails by name (case.mode_unverified) instead of passing on the healthy-path rules alone. Every mode of
# the profile model has its rules today (tests/unit/plugins/module_utils/_verify/test_verifier.py holds the two
# lists together); the rule stays as the guard for the next one.
VERIFIED_MODES = ("installed-host", "installed-rail-accounting", "installed-restart", "installed-interruption",
                  "installed-lost-completion", "installed-cleanup-failure", "installed-inflight-dma",
                  "installed-memory-cleanup")


@applies("a mode of the profile model without fault rules in the verifier (none today)")
def unverified_mode(profile, _workload):
    return profile["mode"] not in VERIFIED_MODES


declare("run.plan", "run", "`run.json` is the plan: schema `orbite.run` v1, a non-empty list of unique case IDs "
        "(and every case given to verify is in it)", applies=EVERY_RUN, witness=("plan",))
declare("run.incomplete", "run", "the run finished and every planned case was verified (else the verdict is "
        "INCOMPLETE, never PASS)", applies=EVERY_RUN, witness=("plan",))
declare("verdict.unwritable", "run", "the full verdict reports were written (else the module fails, naming why, "
        "after removing every older verdict file; a short form left in their place is never PASS)",
        applies=EVERY_RUN, witness=("format",))
declare("case.missing", "case", "every planned case (`run.json` `cases`) left a directory", applies=EVERY_RUN,
        witness=("plan",))
declare("case.meta", "case", "`case.json` is readable, of schema `orbite.case` v1", witness=("plan",))
declare("case.profile", "case", "the case's profile is valid (profile model)", witness=("plan", "profile"))
declare("case.node_failure", "case", "no gate step failed on a node (else the failed task and its message, from "
        "`<role>/node-failure.json`)", witness=("gate",))
declare("case.mode_unverified", "case", "the verifier has the mode's fault rules (fails the fault modes until their "
        "rules land)", applies=unverified_mode, witness=("profile",))
