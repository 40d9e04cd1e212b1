"""Consistent defects (issue 12, "Tests and proof"): a faulty engine that keeps every receipt it
writes in agreement cannot talk the verifier into a PASS.

Each defect of tests/helpers/consistent_defects.py starts from a clean PASS (real simulated-runner
receipts, tests/helpers/sim_pair.py), changes one fact and every figure a naive cross-check would
compare it with (the lists, counters, totals, the peer's ledger, the observer's lines and summary),
and must fail exactly its one code. Journals, inventories, the profile and the plan are the
supervisor's, the gate's and the controller's: a defect edits them only when it is theirs.
No-op rewrites of the same receipts still PASS.
"""

import json
import shutil

import pytest
from helpers import consistent_defects as cd
from helpers.sim_pair import RAIL_ACCOUNTING, SMALL_HOST, run_pair

from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import REGISTRY
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

CASES = {
    "ra": RAIL_ACCOUNTING,  # read, polling, the accounting observer
    "ih": dict(SMALL_HOST, operation="write", rdma_events=True),  # write, events, two lanes, no observer
    "rad": dict(RAIL_ACCOUNTING, discovery="auto"),  # inventories around the runner
}


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("clean") / "run"
    for case_id, profile in CASES.items():
        run_pair(run_dir, case_id, profile)
    return run_dir


def _copy(clean, tmp_path, case_id, beside=()):
    """A run of the clean case ``case_id`` (and the clean cases ``beside`` it, planned with it)."""
    run_dir = tmp_path / "run"
    for copied in (case_id, *beside):
        shutil.copytree(clean / "cases" / copied, run_dir / "cases" / copied)
    (run_dir / "run.json").write_text(json.dumps(dict(json.loads((clean / "run.json").read_text()),
                                                      cases=sorted({case_id, *beside}))))
    return run_dir, run_dir / "cases" / case_id


def _failures(run_dir):
    verdict = verify_run(str(run_dir), write=False)
    return verdict["failed_codes"], [(f["code"], f["message"]) for c in verdict["cases"] for f in c["findings"]
                                     if f["status"] == "FAIL"]


def _snapshot(case_dir):
    return {str(p.relative_to(case_dir)): p.read_text() for p in sorted(case_dir.rglob("*.json*"))}


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_the_clean_case_passes_and_renormalizing_it_changes_no_fact(clean, tmp_path, case_id):
    """The corpus's starting point is a PASS, and the helpers that keep a defect consistent are
    faithful: recounting a clean case reproduces every figure the runner and observer wrote."""
    run_dir, case_dir = _copy(clean, tmp_path, case_id)
    assert _failures(run_dir) == ([], [])
    before = cd.CaseFiles(case_dir)
    after = cd.renormalize(case_dir)
    assert after.ledgers == before.ledgers
    assert after.logs == before.logs
    assert cd.naive_disagreements(after) == []
    assert _failures(run_dir) == ([], [])


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_no_op_rewrites_still_pass(clean, tmp_path, case_id):
    run_dir, case_dir = _copy(clean, tmp_path, case_id)
    cd.noop_rewrite(case_dir)
    assert '"x_unknown"' in (case_dir / "requester" / "g1" / "ledger.json").read_text()
    assert _failures(run_dir) == ([], [])


@pytest.mark.parametrize("name", sorted(cd.DEFECTS))
def test_a_consistent_defect_fails_exactly_its_code(clean, tmp_path, name):
    defect = cd.DEFECTS[name]
    run_dir, case_dir = _copy(clean, tmp_path, defect.case, defect.beside)
    before = _snapshot(case_dir)
    files = cd.apply(name, case_dir)
    assert _snapshot(case_dir) != before, f"{name} changed nothing"
    # Consistent: none of the old self-referential cross-checks sees a disagreement; and only the
    # supervisor's or the gate's defects touch what the engine cannot write.
    assert cd.naive_disagreements(files) == []
    assert sorted(files.touched) == sorted(defect.writes)
    failed, messages = _failures(run_dir)
    assert failed == [defect.code], messages


def test_the_corpus_covers_the_classes_and_is_all_caught(clean, tmp_path):
    """The measurement the issue asks for: how many consistent defects the verifier catches, each
    with exactly its code (goal: all)."""
    classes = {d.issue_class for d in cd.DEFECTS.values()}
    assert classes == {cd.SELF, cd.UNREAD} and len(cd.DEFECTS) >= 25
    assert {d.code for d in cd.DEFECTS.values()} <= set(REGISTRY.codes())
    missed = {}
    for name, defect in cd.DEFECTS.items():
        run_dir, case_dir = _copy(clean, tmp_path / name, defect.case, defect.beside)
        cd.apply(name, case_dir)
        failed = _failures(run_dir)[0]
        if failed != [defect.code]:
            missed[name] = (defect.code, failed)
    print(f"\nconsistent defects caught with exactly their code: {len(cd.DEFECTS) - len(missed)} of "
          f"{len(cd.DEFECTS)}" + "".join(f"\n  {n}: wanted {w}, failed {f}" for n, (w, f) in missed.items()))
    assert missed == {}


@pytest.mark.parametrize("rails", ["mlx5_0", [7, None], [{"device": ["x"], "port": "1"}], None])
def test_garbage_pinned_rails_are_a_coded_failure(clean, tmp_path, rails):
    """What the supervisor journaled as the runner's rails, whatever its shape, gives rails.pinned a
    finding naming the rails, never a traceback."""
    run_dir, case_dir = _copy(clean, tmp_path, "ih")
    files = cd.CaseFiles(case_dir)
    cd.told_rails(files, "requester", lambda _old: rails)
    files.save()
    failed, messages = _failures(run_dir)
    assert failed == ["rails.pinned"], messages
    assert any("rails" in message for _code, message in messages)


# Rules that report an order, a reuse, a mark or a pairing rather than two figures they compared; every other
# defect's failing finding states its expected and observed figures (verdict.html's columns of that name).
WITHOUT_FIGURES = {
    "busy_polling_claims_events", "events_on_a_polling_profile",  # progress.mode: several counts at once
    "child_started_before_locks", "locks_released_before_reaping",  # journal.order: an order of events
    "event_after_the_close",  # journal.order too
    "completion_never_reaped",  # accounting.join: WRs without their completion
    "grant_never_returned",  # ledger.drain: grant lists of the peers
    "guard_seed_reused_read", "guard_seed_reused_write",  # ledger.guard_content: a seed seen before
    "source_qp_pairs_crossed",  # qps.peers: a pairing
    "timeout_marked_expected", "unquiesced_marked_expected",  # ledger.errors: an error marked expected
    "writes_on_a_read",  # counters.opcodes: QPs of another operation
}


@pytest.mark.parametrize("name", sorted(set(cd.DEFECTS) - WITHOUT_FIGURES))
def test_the_failing_finding_states_expected_and_observed(clean, tmp_path, name):
    defect = cd.DEFECTS[name]
    run_dir, case_dir = _copy(clean, tmp_path, defect.case, defect.beside)
    cd.apply(name, case_dir)
    verdict = verify_run(str(run_dir), write=False)
    (found,) = [f for c in verdict["cases"] for f in c["findings"] if f["status"] == "FAIL"]
    assert found["code"] == defect.code and found.get("figures"), found["message"]
    for figure in found["figures"]:
        assert figure["expected"] != figure["observed"], figure
        assert figure["evidence"].startswith(str(case_dir))


def test_every_defect_without_figures_is_one_of_the_corpus():
    assert set(cd.DEFECTS) >= WITHOUT_FIGURES
