# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Step rules: an order a survivor receipts as numbered steps must be the order its own clock shows.

"Destroy before drain" (lost_completion.destroy_before_drain, inflight_dma.destroy_before_drain) is
read from the steps' numbers; an engine that drained first can number its steps the other way round.
Each step also carries the time it was taken (`at`): the numbers must follow the list, the times must
never run backwards in that order, and every time must lie within the runner's life as its supervisor
journaled it (child start to exit, on the same node's clock).
"""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._lifecycle import LOST_MODE
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import each_ledger, part

INFLIGHT_MODE = "installed-inflight-dma"
# Where a ledger receipts a survivor's recovery as steps (docs/receipts.md 1.9a, 1.9b).
_STEP_SECTIONS = ("restart", "inflight")


@applies("installed-lost-completion and installed-inflight-dma (the survivor's recovery steps)")
def recovery_steps(profile, _workload):
    return profile.get("mode") in (LOST_MODE, INFLIGHT_MODE)


def _step_lists(ledger):
    """(section, steps) of every recovery the ledger receipts as steps."""
    for section in _STEP_SECTIONS:
        steps = part(part(ledger, section), "recovery").get("steps")
        if isinstance(steps, list) and steps:
            yield section, steps


def _lifetime(case, role, pid):
    """(start, exit) times of runner ``pid`` in the role's journal (None where it does not say)."""
    times = {}
    for event in case.journals[role].data["events"]:
        if event.get("ev") in ("child_start", "child_exit") and event.get("pid") == pid:
            times.setdefault(event["ev"], event.get("t"))
    return times.get("child_start"), times.get("child_exit")


def _is_time(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _disorder(steps, start, end):
    """What is wrong with one list of steps: numbers off the list's order, a time missing, earlier than the
    step before it, or outside the runner's life."""
    found = []
    numbers = [s.get("step") if isinstance(s, dict) else None for s in steps]
    if numbers != list(range(len(steps))):
        found.append(f"steps numbered {numbers}, listed 0..{len(steps) - 1}")
    times = [s.get("at") if isinstance(s, dict) else None for s in steps]
    if not all(map(_is_time, times)):
        return [*found, f"times {times}: not all numbers"]
    back = [numbers[i] for i in range(1, len(times)) if times[i] < times[i - 1]]
    if back:
        found.append(f"step(s) {back} taken before the step listed before them (times {times})")
    outside = [n for n, t in zip(numbers, times) if (_is_time(start) and t < start) or (_is_time(end) and t > end)]
    if outside:
        found.append(f"step(s) {outside} outside the runner's life as journaled ({start} to {end})")
    return found


@rule("steps.times", "steps",
      "a survivor's recovery steps are numbered in their listed order and their own times agree with it: never "
      "earlier than the step before, all within the runner's life as its supervisor journaled it",
      witness=("runner", "journal"), needs=("ledgers", "journals"), applies=recovery_steps)
def check_step_times(case):
    problems = []
    for role, generation, ledger, path in each_ledger(case):
        start, end = _lifetime(case, role, ledger.get("pid"))
        for section, steps in _step_lists(ledger):
            for finding in _disorder(steps, start, end):
                problems.append((f"{role} g{generation} {section}.recovery: {finding}",
                                 f"{path}#{section}.recovery.steps"))
    return problems
