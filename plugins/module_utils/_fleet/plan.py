# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Plan a fleet run: which host pairs run, and in which waves (docs/fleet.md).

A pair is one ordered (source, requester) of two RNIC hosts; every planned case runs on every pair.
Pairs in one wave share no host, so they run concurrently; pairs that share a host go to different
waves. The waves are only a schedule: what keeps two cases off one RNIC is the node's RNIC locks
(roles/runner/tasks/supervisor.yml), never the wave order.

Bounds on the wave count (tests/unit/plugins/module_utils/_fleet/test_plan.py checks them):

- ``all`` (every ordered pair of n hosts): the circle method, 2(n-1) waves for even n and 2n for odd
  n, which is optimal (a wave holds at most floor(n/2) of the n(n-1) pairs);
- ``ring`` (h0->h1, ..., h(n-1)->h0): 2 waves for even n, 3 for odd n;
- an explicit list: greedy, at most 2*D - 1 waves where D is the largest number of pairs a host is in
  (each pair shares a host with at most 2(D-1) others).

With AWX job slicing a job sees only its slice of the hosts (``hosts``) while the pairing is planned
over the whole fleet (``fleet_hosts``): the pairs with both hosts in the slice run here, the others are
listed as ``elsewhere`` (the merge, _controller/fleet_merge.py, expects every pair of the whole fleet).
"""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote

PAIRINGS = ("all", "ring", "list")
PAIR_PREFIX = "p"
FLEET_PLAN_SCHEMA = ("orbite.fleet-plan", 1)


class FleetPlanError(OrbiteError):
    """Bad fleet input: names the field, the value and the rule."""

    code = "fleet.plan"


def _host_list(field, value):
    if isinstance(value, str):  # an AWX survey sends "a,b,c"
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)):
        raise FleetPlanError(f"{field}={quote(value)}: must be a list of host names")
    hosts, seen = [], {}
    for host in value:
        names.check_hostname(field, host)
        key = names.host_key(host)
        if key in seen:
            raise FleetPlanError(f"{field}={quote(list(value))}: host {host!r} is listed twice (as {seen[key]!r}); "
                                 "each host once (host names differing only by case are one host)")
        seen[key] = host
        hosts.append(host)
    return hosts


def _explicit_pairs(pairs, known):
    if not isinstance(pairs, (list, tuple)) or not pairs:
        raise FleetPlanError(f"pairs={quote(pairs)}: pairing 'list' needs a non-empty list of [source, requester]")
    out = []
    for number, given in enumerate(pairs):
        field = f"pairs[{number}]"
        pair = given
        if isinstance(given, dict):
            pair = [given.get("source"), given.get("requester")]
        elif isinstance(given, str):  # "a:b" from a survey
            pair = given.split(":")
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise FleetPlanError(f"{field}={quote(pair)}: must be [source, requester] (or 'source:requester')")
        source, requester = (p.strip() if isinstance(p, str) else p for p in pair)
        for role, host in (("source", source), ("requester", requester)):
            if host not in known:
                raise FleetPlanError(f"{field}.{role}={quote(host)}: not a host of the fleet "
                                     f"({', '.join(known)}); a pair names two hosts of the fleet's group")
        if source == requester:
            raise FleetPlanError(f"{field}={quote([source, requester])}: a host cannot be paired with itself")
        if (source, requester) in out:
            raise FleetPlanError(f"{field}={quote([source, requester])}: duplicate pair (listed at "
                                 f"pairs[{out.index((source, requester))}]); each ordered pair once")
        out.append((source, requester))
    return out


def _circle_rounds(hosts):
    """Rounds of the circle method: each a perfect matching of unordered pairs (n-1 rounds for even n,
    n for odd n, one host idle per round); every unordered pair appears once."""
    ring = list(hosts) + ([None] if len(hosts) % 2 else [])
    n = len(ring)
    rounds = []
    for _round in range(n - 1):
        rounds.append([(ring[i], ring[n - 1 - i]) for i in range(n // 2)
                       if ring[i] is not None and ring[n - 1 - i] is not None])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


def _all_waves(hosts):
    """Every ordered pair: each circle round twice, once per direction (optimal, see the module doc)."""
    order = {host: i for i, host in enumerate(hosts)}
    waves = []
    for matching in _circle_rounds(hosts):
        forward = [tuple(sorted(pair, key=order.get)) for pair in matching]
        waves.append(forward)
        waves.append([(b, a) for a, b in forward])
    return waves


def _greedy_waves(pairs):
    """First-fit: each pair into the first wave where neither host is busy (at most 2*D - 1 waves)."""
    waves, busy = [], []
    for pair in pairs:
        for wave, used in zip(waves, busy):
            if pair[0] not in used and pair[1] not in used:
                wave.append(pair)
                used.update(pair)
                break
        else:
            waves.append([pair])
            busy.append(set(pair))
    return waves


def _ring_waves(pairs):
    """A ring: alternate waves, the odd ring's closing pair in a third (2 or 3 waves)."""
    if len(pairs) == 2:  # a ring of two hosts is a->b, b->a: they share both hosts
        return [[pairs[0]], [pairs[1]]]
    waves = [pairs[0::2], pairs[1::2]]
    if len(pairs) % 2:
        waves = [pairs[0:-1:2], pairs[1::2], [pairs[-1]]]
    return waves


def plan_fleet(hosts, pairing="ring", pairs=None, fleet_hosts=None, fleet_id=None):
    """The fleet plan: pairs (ids p1.., in planning order), waves (lists of pair ids) and the pairs
    planned for the whole fleet that run elsewhere (another slice). Raises FleetPlanError on bad input,
    before anything touches a host."""
    here = _host_list("hosts", hosts)
    known = _host_list("fleet_hosts", fleet_hosts) if fleet_hosts not in (None, "", []) else list(here)
    stray = [h for h in here if h not in known]
    if stray:
        raise FleetPlanError(f"hosts={quote(here)}: {', '.join(stray)} not in fleet_hosts={quote(known)}; "
                             "a slice's hosts are part of the fleet")
    if len(known) < 2:
        raise FleetPlanError(f"fleet_hosts={quote(known)}: a fleet needs at least 2 hosts (a pair)"
                             if fleet_hosts not in (None, "", []) else
                             f"hosts={quote(here)}: a fleet needs at least 2 hosts (a pair); the group is "
                             f"{'empty' if not here else 'a single host'}")
    if pairing not in PAIRINGS:
        raise FleetPlanError(f"pairing={quote(pairing)}: must be one of {', '.join(PAIRINGS)}")
    if pairing != "list" and pairs not in (None, "", []):
        raise FleetPlanError(f"pairs={quote(pairs)}: given with pairing={pairing!r}; "
                             "explicit pairs need pairing 'list'")
    if fleet_id is not None:
        names.check_name("fleet_id", fleet_id)

    if pairing == "all":
        all_waves = _all_waves(known)
        planned = [pair for wave in all_waves for pair in wave]
    elif pairing == "ring":
        planned = [(known[i], known[(i + 1) % len(known)]) for i in range(len(known))]
        if len(known) == 2:
            planned = planned[:2]
        all_waves = _ring_waves(planned)
    else:
        planned = _explicit_pairs(pairs, known)
        all_waves = None

    ids = {pair: f"{PAIR_PREFIX}{number}" for number, pair in enumerate(planned, 1)}
    local = [pair for pair in planned if pair[0] in here and pair[1] in here]
    # A slice keeps the fleet's wave order for its pairs (their waves stay host-disjoint).
    waves = ([[p for p in wave if p in local] for wave in all_waves] if all_waves is not None
             else _greedy_waves(local))
    waves = [wave for wave in waves if wave]

    def entry(pair):
        return {"id": ids[pair], "source": pair[0], "requester": pair[1]}

    plan = {
        "schema": FLEET_PLAN_SCHEMA[0],
        "version": FLEET_PLAN_SCHEMA[1],
        "pairing": pairing,
        "fleet_hosts": known,
        "hosts": here,
        "pairs": [entry(p) for p in local],
        "waves": [[ids[p] for p in wave] for wave in waves],
        "elsewhere": [entry(p) for p in planned if p not in local],
        "max_degree": max_degree(planned),
    }
    if fleet_id is not None:
        plan["fleet_id"] = fleet_id
    plan["slots"] = wave_slots(plan)
    return plan


def max_degree(pairs):
    """The largest number of pairs one host is in."""
    degree = {}
    for source, requester in pairs:
        degree[source] = degree.get(source, 0) + 1
        degree[requester] = degree.get(requester, 0) + 1
    return max(degree.values(), default=0)


def wave_slots(plan):
    """Per wave, what each busy host does: {host: {pair, role, source}} (the source names the pair's
    source host, whose runner the requester connects to). A host absent from a wave's slots idles."""
    by_id = {pair["id"]: pair for pair in plan["pairs"]}
    slots = []
    for wave in plan["waves"]:
        slot = {}
        for pair_id in wave:
            pair = by_id[pair_id]
            for role in ("source", "requester"):
                if pair[role] in slot:  # never: a wave's pairs share no host (checked by the tests)
                    raise FleetPlanError(f"wave {wave}: host {pair[role]} twice")
                slot[pair[role]] = {"pair": pair_id, "role": role, "source": pair["source"]}
        slots.append(slot)
    return slots


def pair_run_id(fleet_id, pair_id):
    """The run ID of one pair's run directory (a name: run.json and the verifier stay per pair)."""
    return names.check_name("pair run id", f"{fleet_id}-{pair_id}")
