"""The simulated runner's progress receipt (docs/receipts.md section 3): valid, only ever moving forward, and
at the end the last round drained with every WR of the round done (requester) or none (source)."""

import json
import threading
import time

import jsonschema
from helpers.paths import REPO
from helpers.sim_pair import RAIL_ACCOUNTING, run_pair

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model

SCHEMA = json.loads((REPO / "schemas" / "runner-progress.schema.json").read_text())


def test_progress_moves_forward_and_ends_drained(tmp_path):
    run_dir = tmp_path / "run"
    seen, seen_source, stop = [], [], threading.Event()
    path = run_dir / "cases" / "ra" / "requester" / "g1" / "progress.json"
    source_path = run_dir / "cases" / "ra" / "source" / "g1" / "progress.json"

    def watch():
        while not stop.is_set():
            for where, into in ((path, seen), (source_path, seen_source)):
                try:
                    into.append(json.loads(where.read_text()))
                except (OSError, ValueError):
                    pass  # not written yet (a rename never leaves half a file)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        case_dir = run_pair(run_dir, "ra", RAIL_ACCOUNTING)
    finally:
        stop.set()
        watcher.join()
    wrs = model.derive_workload(model.validate_profile(RAIL_ACCOUNTING))["wrs_per_round"]
    for role, total in (("requester", wrs), ("source", 0)):
        final = json.loads((case_dir / role / "g1" / "progress.json").read_text())
        jsonschema.Draft202012Validator(SCHEMA).validate(final)
        ledger = json.loads((case_dir / role / "g1" / "ledger.json").read_text())
        assert (final["pid"], final["role"], final["generation"]) == (ledger["pid"], role, 1)
        assert (final["round"], final["rounds"], final["phase"]) == (3, 3, "drained")
        assert (final["wrs_done"], final["wrs_posted"], final["wrs_total"]) == (total, total, total)
    assert seen, "the requester's progress was never seen while it ran"
    # The source posts no WR: it says each round's start, so the controller's wait shows the round it is in.
    assert {(p["round"], p["phase"]) for p in seen_source if p["phase"] == "transfer"} >= {(1, "transfer")}
    order = [(p["round"], p["phase"] == "drained", p["wrs_done"]) for p in seen]
    assert order == sorted(order)  # never backwards
    for entry in seen:
        jsonschema.Draft202012Validator(SCHEMA).validate(entry)
        assert entry["wrs_total"] == wrs and 0 <= entry["wrs_done"] <= entry["wrs_posted"] <= wrs
