# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The progress receipt (docs/receipts.md section 3): where the runner is, rewritten as it goes.

``progress.json`` in the output directory, replaced atomically, so the controller's wait shows a
stuck round within seconds. Informational: the verifier never reads it, and a write that fails
(a full disk) never stops the runner (the ledger is the receipt).
"""

import os
import time

from .ledger import write_json_atomic

PROGRESS_NAME = "progress.json"
SCHEMA = ("orbite.runner-progress", 1)
MIN_INTERVAL_S = 0.25  # while WRs complete; a round's start and end are always written


def report(engine, round_no, rounds, phase, wrs_done=0, wrs_total=0, wrs_posted=0, force=True):
    """Write where ``engine`` is: round ``round_no`` of the generation's ``rounds``, ``phase`` (``transfer`` while its
    WRs complete, ``drained`` once the round is drained), its WRs completed and posted of the round's."""
    now = time.monotonic()
    if not force and now - getattr(engine, "_progress_written", 0.0) < MIN_INTERVAL_S:
        return
    engine._progress_written = now
    doc = {"schema": SCHEMA[0], "version": SCHEMA[1], "pid": os.getpid(), "role": engine.role,
           "generation": engine.generation, "round": round_no, "rounds": rounds,
           "phase": phase, "wrs_done": wrs_done, "wrs_posted": wrs_posted, "wrs_total": wrs_total,
           "updated_at": time.time()}
    try:
        write_json_atomic(os.path.join(engine.output, PROGRESS_NAME), doc)
    except OSError:
        pass  # informational only: the ledger is the receipt
