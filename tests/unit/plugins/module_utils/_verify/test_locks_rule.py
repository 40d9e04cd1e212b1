"""locks.exclusive's interval logic (plugins/module_utils/_verify/rules/locks.py): holds from journal lines,
when two holds overlap, which machines compare, and which side of an overlap reports it.

The rule's red checks on real receipts are consistent defects (tests/helpers/consistent_defects.py:
lane_alias_locks_in_its_own_directory, runner_outlives_its_locks)."""

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import locks

BOOT_A, BOOT_B = "0b5e1d00-0000-4000-8000-00000000000a", "0b5e1d00-0000-4000-8000-00000000000b"


def _lines(*events):
    """A journal's lines, header first: (ev, t, fields) tuples."""
    return [{"seq": i, "ev": ev, "t": t, **fields} for i, (ev, t, fields) in
            enumerate([("journal_open", 0.0, {}), *events])]


def _acquire(t, rnic="mlx5_0"):
    return "lock_acquire", t, {"rnic": rnic}


def _release(t, rnic="mlx5_0", ok=True):
    return "lock_release", t, {"rnic": rnic, "ok": ok}


def _identity(t, host="node-a", boot=BOOT_A):
    return "identity_check", t, {"stage": "inside_locks", "ok": True, "observed": {"hostname": host, "boot_id": boot}}


def test_a_hold_runs_from_its_acquire_to_its_release():
    lines = _lines(_acquire(1.0), _acquire(1.5, "mlx5_1"), _release(3.0, "mlx5_1"), _release(3.5),
                   ("journal_close", 4.0, {}))
    assert locks.holds(lines) == [locks.Hold("mlx5_0", 1.0, 3.5), locks.Hold("mlx5_1", 1.5, 3.0)]


def test_a_missing_release_is_held_until_the_journal_closes():
    lines = _lines(_acquire(1.0), _acquire(1.1, "mlx5_1"), _release(2.0, "mlx5_1"), ("journal_close", 9.0, {}))
    assert locks.holds(lines) == [locks.Hold("mlx5_0", 1.0, 9.0), locks.Hold("mlx5_1", 1.1, 2.0)]


def test_a_failed_release_is_held_until_the_journal_closes():
    lines = _lines(_acquire(1.0), _release(2.0, ok=False), ("journal_close", 9.0, {}))
    assert locks.holds(lines) == [locks.Hold("mlx5_0", 1.0, 9.0)]


def test_a_journal_cut_short_holds_until_its_last_line_and_a_new_session_ends_the_old_one():
    assert locks.holds(_lines(_acquire(1.0), ("child_start", 2.0, {"pid": 7}))) == [locks.Hold("mlx5_0", 1.0, 2.0)]
    # The supervisor died without a close; one started again on the run directory opened a new session.
    lines = _lines(_acquire(1.0), ("journal_open", 5.0, {}), _acquire(6.0), _release(7.0), ("journal_close", 8.0, {}))
    assert locks.holds(lines) == [locks.Hold("mlx5_0", 1.0, 5.0), locks.Hold("mlx5_0", 6.0, 7.0)]


def test_holds_touching_at_one_instant_do_not_overlap():
    first, second = locks.Hold("mlx5_0", 1.0, 2.0), locks.Hold("mlx5_0", 2.0, 3.0)
    assert not locks.overlap(first, second) and not locks.overlap(second, first)


@pytest.mark.parametrize("other, expected", [
    (locks.Hold("mlx5_0", 1.999999, 3.0), True),  # begins a microsecond before the first ends
    (locks.Hold("mlx5_0", 1.2, 1.8), True),  # inside it
    (locks.Hold("mlx5_0", 0.0, 5.0), True),  # around it
    (locks.Hold("mlx5_1", 1.2, 1.8), False),  # another RNIC
    (locks.Hold("mlx5_0", 2.5, 3.0), False),  # after it
])
def test_overlap(other, expected):
    first = locks.Hold("mlx5_0", 1.0, 2.0)
    assert locks.overlap(first, other) is expected and locks.overlap(other, first) is expected


def test_only_the_same_host_name_and_boot_compare():
    assert locks.comparable(("node-a", BOOT_A), ("node-a", BOOT_A))
    assert not locks.comparable(("node-a", BOOT_A), ("node-a", BOOT_B))  # another boot: clocks never compare
    assert not locks.comparable(("node-a", BOOT_A), ("node-b", BOOT_A))
    assert not locks.comparable(None, None)  # no identity observed: nothing to compare with


def test_the_machine_is_the_identity_observed_inside_the_locks_never_an_inventory_name():
    events = _lines(_acquire(1.0), _identity(1.1, "lab-node-3", BOOT_A))[1:]
    assert locks.machine(events) == ("lab-node-3", BOOT_A)
    failed = [dict(events[-1], ok=False)]
    assert locks.machine(failed) is None
    assert locks.machine([dict(events[-1], observed={"hostname": "lab-node-3", "boot_id": None})]) is None


def test_a_clock_stepped_back_or_a_line_without_time_is_named():
    assert locks.clock_problem(_lines(_acquire(1.0), _release(1.0))) is None  # equal times: not backwards
    problem = locks.clock_problem(_lines(_acquire(5.0), _release(4.0)))
    assert "line 3" in problem and "stepped back" in problem
    assert "has no time" in locks.clock_problem(_lines(_acquire("5.0"))) and \
        "has no time" in locks.clock_problem(_lines(_acquire(True)))


def _journal(case_id, role, *holds, boot=BOOT_A):
    return locks.JournalHolds(case_id, role, f"/run/cases/{case_id}/{role}/journal.jsonl", ("node-a", boot),
                              tuple(holds), None)


def test_an_overlap_is_reported_once_by_the_hold_that_began_last():
    early = _journal("c1", "source", locks.Hold("mlx5_0", 1.0, 3.0))
    late = _journal("c2", "source", locks.Hold("mlx5_0", 2.0, 4.0))
    index = {"c1": 0, "c2": 1}
    assert locks._clash(late, early, index) == [(late.holds[0], early.holds[0])]
    assert locks._clash(early, late, index) == []
    # Begun at the same instant: the case later in the plan reports it.
    same = _journal("c0", "requester", locks.Hold("mlx5_0", 1.0, 2.0))
    assert locks._clash(same, early, {"c0": 2, "c1": 0}) != [] and locks._clash(early, same, {"c0": 2, "c1": 0}) == []


def test_serial_holds_handed_over_at_one_instant_never_clash():
    first = _journal("c1", "source", locks.Hold("mlx5_0", 1.0, 2.0), locks.Hold("mlx5_1", 1.0, 2.0))
    second = _journal("c2", "source", locks.Hold("mlx5_0", 2.0, 3.0), locks.Hold("mlx5_1", 2.5, 3.0))
    index = {"c1": 0, "c2": 1}
    assert locks._clash(first, second, index) == locks._clash(second, first, index) == []


def _run_of(case_id, cases, others):
    """A case of a run whose other cases' journals are ``others`` (JournalHolds, as read once per run)."""
    from types import SimpleNamespace

    memo = {("locks.journal", c, role): None for c in cases for role in ("source", "requester")}
    memo.update({("locks.journal", j.case_id, j.role): j for j in others})
    return SimpleNamespace(case_id=case_id, plan={"cases": cases}, root="/run", case_dir=f"/run/cases/{case_id}",
                           run_memo=memo)


def test_overlapping_holds_on_another_boot_of_the_same_host_never_compare():
    earlier = _journal("c1", "source", locks.Hold("mlx5_0", 1.0, 3.0), boot=BOOT_B)
    mine = _journal("c2", "source", locks.Hold("mlx5_0", 2.0, 4.0))
    assert locks._exclusive(_run_of("c2", ["c1", "c2"], [earlier]), [mine]) == []
    same_boot = _journal("c1", "source", locks.Hold("mlx5_0", 1.0, 3.0))
    (problem,) = locks._exclusive(_run_of("c2", ["c1", "c2"], [same_boot]), [mine])
    assert "case c1's source supervisor held it [1.0, 3.0]" in problem[0] and problem[1] == mine.path
    assert problem[2]["expected"] != problem[2]["observed"]


def test_a_journal_whose_clock_ran_back_cannot_vouch_for_its_holds():
    stepped = locks.journal_holds("c2", "source", "/run/cases/c2/source/journal.jsonl",
                                  {"header": _lines()[0], "events": _lines(_acquire(5.0), _release(4.0))[1:]})
    (problem,) = locks._exclusive(_run_of("c2", ["c2"], []), [stepped])
    assert "cannot be ordered" in problem[0] and "stepped back" in problem[0]
