# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Progress rules: completions reaped by events or by polling, as the profile's `rdma_events` says."""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._lifecycle import process_generation
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import each_ledger


@rule("progress.mode", "progress",
      "completions reaped as `rdma_events` says: events = a completion channel per context and armed CQs that "
      "signalled; polling = no channel, no arm, no event; every derived completion polled",
      witness=("profile",), after=("counters.slicing", "counters.wrs"))
def check_progress(case):
    """A completion channel on every context and CQ exactly when the profile asks for events (both
    peers, docs/runner-contract.md §4 step 2); per round the requester's reaping is of that mode:
    events need at least one CQ event a round and never more events than arms so far (an arm made
    late in one round may signal in the next, so arms are counted from the process's first round on, across
    the generations a restart survivor lives through),
    polling has none; either way poll_cq returned the derived completions (the WRs a round)."""
    problems = []
    events = case.profile["rdma_events"] is True
    mode = "events" if events else "polling"
    completions = case.workload["wrs_per_round"]
    so_far = {}  # (role, process generation) -> [arms, events] from that process's first round on
    for role, generation, ledger, path in each_ledger(case):
        label = f"{role} g{generation}"
        channels = [c.get("completion_channel") for c in ledger["contexts"]]
        channels += [cq.get("channel") for c in ledger["contexts"] for cq in c.get("cqs") or [{}]]
        if (all(channels) if events else any(channels)) != events:
            problems.append((f"{label}: completion channels {channels} with rdma_events {events}", f"{path}#contexts"))
        counts = so_far.setdefault((role, process_generation(case.profile, role, generation)), [0, 0])
        for index, rnd in enumerate(ledger["rounds"]):
            progress = rnd.get("progress") or {}
            where = f"{path}#rounds[{index}].progress"
            if progress.get("mode") != mode:
                problems.append((f"{label} round {rnd['round']}: progress mode {progress.get('mode')!r}, the profile "
                                 f"says {mode!r}", where))
                continue
            if role != "requester":
                continue
            arms, signalled = progress.get("cq_arms"), progress.get("cq_events")
            counted = all(isinstance(n, int) and not isinstance(n, bool) for n in (arms, signalled))
            if counted:
                counts[0], counts[1] = counts[0] + arms, counts[1] + signalled
            reaped = (arms, signalled) == (0, 0) if not events else (
                counted and signalled >= 1 and counts[0] >= counts[1])
            if not reaped or progress.get("cqes_polled") != completions:
                wanted = "events >= 1, arms so far >= events so far" if events else "no arm, no event"
                problems.append((f"{label} round {rnd['round']}: {mode}, yet {arms!r} CQ arms, {signalled!r} CQ "
                                 f"events and {progress.get('cqes_polled')!r} completions polled (expected "
                                 f"{wanted} and {completions})", where))
    return problems
