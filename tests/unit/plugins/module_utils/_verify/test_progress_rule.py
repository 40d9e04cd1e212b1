"""progress.mode counts CQ arms and events per process: a restart survivor's arm made late in one generation may
signal in the next (one process, one provider, one armed CQ), a replacement's never can (a new process)."""

from types import SimpleNamespace

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules.progress import check_progress

WRS = 4


def _round(number, arms, events):
    return {"round": number, "progress": {"mode": "events", "cq_arms": arms, "cq_events": events,
                                          "cqes_polled": WRS}}


def _case(fault_role, requester_rounds):
    """A 2-generation installed-restart case with events whose requester rounds are ``requester_rounds``
    ({generation: [(arms, events), ...]}); the source's rounds say events and count nothing."""
    channelled = [{"completion_channel": "ch0", "cqs": [{"channel": "ch0"}]}]
    ledgers = {}
    for generation in (1, 2):
        ledgers[("requester", generation)] = {"contexts": channelled, "rounds": [
            _round(i + 1, a, e) for i, (a, e) in enumerate(requester_rounds[generation])]}
        ledgers[("source", generation)] = {"contexts": channelled, "rounds": [
            _round(i + 1, 0, 0) for i in range(3)]}
    return SimpleNamespace(
        profile={"mode": "installed-restart", "fault_role": fault_role, "generations": 2, "rdma_events": True},
        workload={"wrs_per_round": WRS, "generations": 2},
        generations=lambda: range(1, 3),
        ledger=lambda role, generation=1: ledgers[(role, generation)],
        ledger_path=lambda role, generation=1: f"{role}/g{generation}/ledger.json")


# Round 3 of generation 1 arms twice more after its event; one of those arms signals in generation 2's first round.
LATE_ARM = {1: [(2, 1), (2, 2), (4, 1)], 2: [(2, 3), (2, 2), (2, 2)]}


def test_a_survivors_late_arm_may_signal_in_its_next_generation():
    assert check_progress(_case("source", LATE_ARM)) == []  # the requester survives: one process


def test_a_replacement_never_reaps_an_event_its_predecessor_armed():
    problems = check_progress(_case("requester", LATE_ARM))  # the requester is replaced: a new process in g2
    _first_flagged_is_g2_round_1(problems)


@pytest.mark.parametrize("fault_role", ["source", "requester"])
def test_more_events_than_arms_over_a_whole_process_fails(fault_role):
    rounds = {1: [(2, 1), (2, 2), (2, 1)], 2: [(2, 2), (2, 2), (2, 2)]}
    rounds[2][0] = (2, 2 + 3 if fault_role == "source" else 3)  # past the survivor's 6 - 4 spare arms; past 2
    problems = check_progress(_case(fault_role, rounds))
    _first_flagged_is_g2_round_1(problems)


def _first_flagged_is_g2_round_1(problems):
    # Counted from the process's first round, the excess stays in every later round's figures.
    wheres = [where for _message, where in problems]
    assert wheres and wheres[0] == "requester/g2/ledger.json#rounds[0].progress", wheres
    assert all(where.startswith("requester/g2/") for where in wheres), wheres
