# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The run's case schedule (docs/qualification.md "Concurrent cases"): which cases run side by side on one host pair.

A case locks every rail of its hosts (a case always drives two rails: both contexts publish persistent MRs even
under a one-rail mask), so two cases are disjoint only on hosts with more RNICs than a case uses. A host whose
``orbite_rails`` lists 2k RNICs offers k lanes; lane i is rails [2i, 2i + 1]. Lane 0 is the inventory host itself,
lane i > 0 an inventory alias ``<host>~lane<i>`` with the lane's rails and its own service address. Cases go to lanes
in slots: the cases of one slot run at once (one include of the runner role, in lockstep), each on its own lane, so
no two concurrent cases share an RNIC. A slot never mixes modes (different modes run different task files, which
Ansible would run one after the other) and each lane keeps its mode's case order. ``serial`` is one lane: today's
order, one case a slot.
"""

import json
from typing import Dict, List

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote

MODES = ("lanes", "serial")
LANE_SEPARATOR = "~lane"
RAILS_PER_LANE = 2
# The estimate's fixed part of a case (deploy, supervisor, discovery, fetch), in units of one thousand WRs.
FIXED_COST = 1.0


class ScheduleError(OrbiteError):
    """The schedule's input breaks a rule (the switch, a host's rails)."""

    code = "schedule.invalid"


def schedule_mode(value) -> str:
    """The switch ``orbite_case_schedule`` (a survey's text included); unset or empty: lanes."""
    text = "" if value is None else str(value).strip().lower()
    if not text:
        return "lanes"
    if text not in MODES:
        raise ScheduleError(f"orbite_case_schedule={quote(value)}: must be one of {', '.join(MODES)} "
                            "(lanes: cases on disjoint RNICs side by side; serial: one case at a time)")
    return text


def lane_name(host: str, lane: int) -> str:
    """The inventory name of a host's lane: the host itself for lane 0."""
    return host if lane == 0 else f"{host}{LANE_SEPARATOR}{lane}"


def host_lanes(host: str, rails) -> List[List[Dict]]:
    """A host's lanes from its ``orbite_rails``: lane i is rails [2i, 2i + 1]; an odd count or a device listed
    twice is refused, naming the host, the field, the value and the rule."""
    where = f"host {host}: orbite_rails={quote(rails)}"
    if not isinstance(rails, list) or not rails or not all(isinstance(r, dict) for r in rails):
        raise ScheduleError(f"{where}: must be a non-empty list of rails ({{device, port, gid_index}})")
    devices = [r.get("device") for r in rails]
    if not all(isinstance(d, str) and d for d in devices):
        raise ScheduleError(f"{where}: every rail must name its device")
    twice = sorted({d for d in devices if devices.count(d) > 1})
    if twice:
        raise ScheduleError(f"{where}: device {', '.join(twice)} is listed twice (each RNIC is one rail of one lane)")
    if len(rails) % RAILS_PER_LANE:
        raise ScheduleError(f"{where}: {len(rails)} rails; a case locks {RAILS_PER_LANE}, so a host offers one lane "
                            f"per {RAILS_PER_LANE} rails (lane i = rails [2i, 2i+1]) and the count must be even")
    return [rails[i:i + RAILS_PER_LANE] for i in range(0, len(rails), RAILS_PER_LANE)]


def case_estimate(case: Dict) -> float:
    """A case's relative cost: a fixed part plus its WRs (every round of every generation), in thousands."""
    workload = case.get("workload") or {}
    wrs = int(workload.get("wrs_per_round") or 0) * int(workload.get("total_rounds") or 1)
    return FIXED_COST * int(workload.get("generations") or 1) + wrs / 1000.0


def _slots(cases: List[Dict], width: int) -> List[List[Dict]]:
    """Consecutive cases of one mode, ``width`` a slot; a new mode starts a new slot."""
    slots: List[List[Dict]] = []
    for case in cases:
        mode = (case.get("profile") or {}).get("mode")
        last = slots[-1] if slots else None
        if last and len(last) < width and (last[0].get("profile") or {}).get("mode") == mode:
            last.append(case)
        else:
            slots.append([case])
    return slots


def _lane_of_slot(slot: List[Dict], loads: List[float]) -> List[int]:
    """The slot's cases in order, each on the least-loaded lane still free in this slot (ties: the lower lane)."""
    free = list(range(len(loads)))
    lanes = []
    for case in slot:
        lane = min(free, key=lambda i: (loads[i], i))
        free.remove(lane)
        loads[lane] += case_estimate(case)
        lanes.append(lane)
    return lanes


def plan_schedule(cases: List[Dict], host_rails: Dict[str, list], mode="lanes") -> Dict:
    """The schedule of the run's cases on its host pair (``host_rails``: {host: its orbite_rails}).

    Returns {"mode", "lanes": [{"lane", "hosts": {host: {"name", "rails", "locks"}}}], "slots": [[{"id", "lane",
    "hosts": {"source", "requester"}, "locks": {host: [device, ...]}, "estimate"}]], "critical_path", "total"}.
    """
    mode = schedule_mode(mode)
    # A host without orbite_rails (an inventory the preflight only checks) is one lane; the runner refuses it later.
    lanes_by_host = {host: host_lanes(host, rails) if rails is not None else [None]
                     for host, rails in sorted(host_rails.items())}
    width = 1 if mode == "serial" else min(len(lanes) for lanes in lanes_by_host.values())
    lanes = [{"lane": i, "hosts": {host: {"name": lane_name(host, i), "rails": own[i],
                                          "locks": [r["device"] for r in own[i]] if own[i] else None}
                                   for host, own in lanes_by_host.items()}}
             for i in range(width)]
    loads = [0.0] * width
    slots = []
    for slot in _slots(cases, width):
        entries = []
        for case, lane in zip(slot, _lane_of_slot(slot, loads)):
            profile = case.get("profile") or {}
            entries.append({
                "id": case["id"], "lane": lane, "estimate": case_estimate(case),
                "hosts": {role: lane_name(profile[role], lane) for role in ("source", "requester")},
                "locks": {host: lanes[lane]["hosts"][host]["locks"]
                          for host in (profile["source"], profile["requester"])},
            })
        slots.append(entries)
    critical = sum(max(e["estimate"] for e in slot) for slot in slots)
    return {"mode": mode, "lanes": lanes, "slots": slots, "critical_path": critical,
            "total": sum(e["estimate"] for slot in slots for e in slot)}


def lane_cases(schedule: Dict, host: str, lane: int) -> List:
    """One lane host's case per slot, {"id", "source", "requester"} (the case's lane hosts), None where its lane has
    no case in that slot: what playbooks/_run_cases.yml loops over."""
    out = []
    for slot in schedule["slots"]:
        mine = [dict(e["hosts"], id=e["id"]) for e in slot if e["lane"] == lane and host in e["locks"]]
        out.append(mine[0] if mine else None)
    return out


def render(schedule: Dict) -> str:
    """The schedule file's text (the run directory's schedule.json)."""
    return json.dumps(schedule, indent=2, sort_keys=True) + "\n"


def lane_address(host: str, address, lane: int) -> str:
    """Lane i's runner service address: the host's ``orbite_service_address`` with its port plus i (lane 0: as given).
    The restart generation rebinds the address its first generation reported, so each lane keeps its own."""
    if lane == 0:
        return address
    text = str(address or "")
    head, _sep, port = text.rpartition(":")
    if not head or not port.isdigit() or not 0 < int(port) + lane <= 65535:
        raise ScheduleError(f"host {host}: orbite_service_address={quote(address)}: must be <address>:<port> with "
                            f"room for lane {lane}'s port (port + lane, at most 65535)")
    return f"{head}:{int(port) + lane}"


def lane_hosts(schedule: Dict, addresses: Dict[str, str]) -> List[Dict]:
    """Every lane host of the schedule, lane by lane: {"name", "host", "lane", "rails", "service_address",
    "cases"} (``cases``: its case ID per slot, None where it sits one out)."""
    out = []
    for lane in schedule["lanes"]:
        for host, own in sorted(lane["hosts"].items()):
            out.append({"name": own["name"], "host": host, "lane": lane["lane"], "rails": own["rails"],
                        "service_address": lane_address(host, addresses.get(host), lane["lane"]),
                        "cases": lane_cases(schedule, host, lane["lane"])})
    return out
