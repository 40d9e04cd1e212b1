# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Lanes inside a fleet's pairs (docs/fleet.md "Lanes in a fleet"): each pair's cases scheduled on its lanes by the
single pair's scheduler (``_run/schedule.py``), and what every lane host does in each wave.

A pair's schedule depends on its cases and its two hosts' rails only, exactly as a single pair's gate plans it, so a
pair's run directory gets the same ``schedule.json`` and case hosts. A lane host (``<host>~lane<i>``, the one name
grammar of ``_run/schedule.lane_name``) depends on its host only: its rails and service address are the same in every
pair the host is in, so the fleet adds each lane host once. Its case per slot is its pair's, hence per wave. The
fleet's waves stay host-disjoint, so a lane host is in at most one pair of a wave.
"""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._fleet.plan import FleetPlanError
from ansible_collections.orbite.qualification.plugins.module_utils._run import schedule


def pair_schedule(cases, source, requester, rails, addresses, mode):
    """One pair's schedule (``_run/schedule.plan_schedule``) with its lane hosts, as the preflight's case_schedule
    filter gives a single pair's: ``rails``/``addresses`` by host (the hosts' orbite_rails, orbite_service_address;
    a host without them: None)."""
    hosts = [source, requester]
    plan = schedule.plan_schedule(list(cases), {host: rails.get(host) for host in hosts}, mode)
    plan["lane_hosts"] = schedule.lane_hosts(plan, {host: addresses.get(host) for host in hosts})
    return plan


def case_hosts(plan):
    """{case id: {source, requester}}: each case's lane hosts, run_plan's ``case_hosts``."""
    return {entry["id"]: entry["hosts"] for slot in plan["slots"] for entry in slot}


def fleet_lanes(pairs, waves, runs, rails, addresses, mode="lanes"):
    """Every local pair's schedule and every wave's lane hosts.

    ``pairs``: the fleet plan's pairs (id, source, requester, run_id, run_dir); ``waves``: pair IDs per wave;
    ``runs``: {pair id: {"cases": the pair's cases}}; ``rails``/``addresses``: {host: orbite_rails /
    orbite_service_address}; ``mode``: the switch orbite_case_schedule.

    Returns {"mode", "pairs": {pair id: {"schedule", "case_hosts"}}, "lane_hosts": [{"name", "host", "lane",
    "rails", "service_address"}] (each once, host by host, lane by lane), "waves": [{"slots": how many slots the
    wave's longest pair has, "hosts": {lane host: {"pair", "run_id", "run_dir", "cases"}}}]} (``cases``: the lane
    host's case per slot, {id, source, requester} or None, as playbooks/_run_cases.yml's orbite_lane_cases).
    A bad switch or a host's bad rails raises ``schedule.invalid`` naming the host, the field, the value and the rule.
    """
    mode = schedule.schedule_mode(mode)
    by_id = {pair["id"]: pair for pair in pairs}
    planned, lane_hosts = {}, {}
    for pair in pairs:
        plan = pair_schedule((runs.get(pair["id"]) or {}).get("cases") or [], pair["source"], pair["requester"],
                             rails, addresses, mode)
        planned[pair["id"]] = plan
        for lane in plan["lane_hosts"]:
            lane_hosts.setdefault(lane["name"], {key: lane[key] for key in
                                                 ("name", "host", "lane", "rails", "service_address")})
    out_waves = []
    for wave in waves:
        hosts = {}
        for pair_id in wave:
            pair, plan = by_id[pair_id], planned[pair_id]
            for lane in plan["lane_hosts"]:
                if lane["name"] in hosts:  # never: a wave's pairs share no host (fleet/plan.py)
                    other = hosts[lane["name"]]["pair"]
                    raise FleetPlanError(f"wave {wave}: lane host {lane['name']} in pairs {other} and {pair_id}; "
                                         "a wave's pairs share no host")
                hosts[lane["name"]] = {"pair": pair_id, "run_id": pair["run_id"], "run_dir": pair["run_dir"],
                                       "cases": lane["cases"]}
        out_waves.append({"slots": max((len(planned[p]["slots"]) for p in wave), default=0), "hosts": hosts})
    ordered = sorted(lane_hosts.values(), key=lambda lane: (lane["host"], lane["lane"]))
    return {"mode": mode,
            "pairs": {pair_id: {"schedule": plan, "case_hosts": case_hosts(plan)} for pair_id, plan in planned.items()},
            "lane_hosts": ordered, "waves": out_waves}
