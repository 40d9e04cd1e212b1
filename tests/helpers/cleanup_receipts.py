"""Reading one case's receipts of a runner pair (tests/unit/sim/test_sim_cleanup_failure.py,
test_sim_cleanup_kinds.py; case_dir and ledger also test_sim_inflight_dma.py, test_sim_memory_cleanup.py): the
case is ``c1`` of the run directory (editing them: helpers/receipts.py)."""

import json

OBSERVER_LOG = ("requester", "g1", "observer-uverbs_fault.jsonl")


def case_dir(run_dir):
    return run_dir / "cases" / "c1"


def ledger(run_dir, role, generation):
    return json.loads((case_dir(run_dir) / role / f"g{generation}" / "ledger.json").read_text())


def observer_events(run_dir):
    """The generation-1 requester's uverbs_fault events, header left out."""
    path = case_dir(run_dir).joinpath(*OBSERVER_LOG)
    return [json.loads(line) for line in path.read_text().splitlines()[1:]]


def one_qp_fewer_held(ledger):
    """A consistent defect: the provider's QP count lowered alike before and after the cleanup step."""
    record = ledger["restart"]["cleanup"]
    for held in (record["before"]["provider_held"], record["retained"]["provider_held"]):
        held["qp"] -= 1
