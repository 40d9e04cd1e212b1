"""Fleet planner: pairs and host-disjoint waves; bad pairing input is a clear error before any host is touched."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._fleet.plan import (
    max_degree,
    plan_fleet,
)

HOSTS = [f"h{i}" for i in range(8)]


def _pairs(plan):
    return [(p["source"], p["requester"]) for p in plan["pairs"]]


def _check_waves(plan):
    """Every local pair in exactly one wave, no host twice in a wave; returns the wave count."""
    by_id = {p["id"]: (p["source"], p["requester"]) for p in plan["pairs"]}
    seen = [pair_id for wave in plan["waves"] for pair_id in wave]
    assert sorted(seen) == sorted(by_id), "every pair exactly once"
    for wave, slot in zip(plan["waves"], plan["slots"]):
        hosts = [h for pair_id in wave for h in by_id[pair_id]]
        assert len(hosts) == len(set(hosts)), f"host twice in wave {wave}"
        assert sorted(slot) == sorted(hosts)
        for host, entry in slot.items():
            assert by_id[entry["pair"]][0 if entry["role"] == "source" else 1] == host
            assert entry["source"] == by_id[entry["pair"]][0]
    return len(plan["waves"])


@pytest.mark.parametrize("n", range(2, 9))
def test_all_is_every_ordered_pair_in_optimal_waves(n):
    plan = plan_fleet(HOSTS[:n], "all")
    pairs = _pairs(plan)
    assert sorted(pairs) == sorted((a, b) for a in HOSTS[:n] for b in HOSTS[:n] if a != b)
    # A wave holds at most n // 2 pairs: this many waves is the least possible.
    assert _check_waves(plan) == (2 * (n - 1) if n % 2 == 0 else 2 * n)
    assert plan["elsewhere"] == []


@pytest.mark.parametrize("n", range(2, 9))
def test_ring(n):
    plan = plan_fleet(HOSTS[:n], "ring")
    expected = [(HOSTS[i], HOSTS[(i + 1) % n]) for i in range(n)][: 2 if n == 2 else n]
    assert _pairs(plan) == expected
    assert _check_waves(plan) == (2 if n % 2 == 0 else 3)


def test_four_disjoint_pairs_run_in_one_wave():
    plan = plan_fleet(HOSTS, "list", pairs=[["h0", "h1"], ["h2", "h3"], ["h4", "h5"], ["h6", "h7"]])
    assert plan["waves"] == [["p1", "p2", "p3", "p4"]]
    assert plan["slots"][0]["h3"] == {"pair": "p2", "role": "requester", "source": "h2"}


def test_pairs_that_share_a_host_go_to_different_waves():
    plan = plan_fleet(HOSTS[:3], "list", pairs=["h0:h1", ["h1", "h2"], {"source": "h2", "requester": "h0"}])
    assert _check_waves(plan) == 3


def test_a_slice_runs_only_the_pairs_among_its_hosts():
    plan = plan_fleet(["h0", "h2"], "all", fleet_hosts=HOSTS[:4])
    assert sorted(_pairs(plan)) == [("h0", "h2"), ("h2", "h0")]
    assert len(plan["elsewhere"]) == 10
    assert {p["id"] for p in plan["pairs"]}.isdisjoint(p["id"] for p in plan["elsewhere"])
    _check_waves(plan)
    # The ids are the whole fleet's: another slice names the same pair the same way.
    whole = {(p["source"], p["requester"]): p["id"] for p in plan_fleet(HOSTS[:4], "all")["pairs"]}
    assert all(whole[(p["source"], p["requester"])] == p["id"] for p in plan["pairs"] + plan["elsewhere"])


@pytest.mark.parametrize("kwargs, words", [
    ({"hosts": [], "pairing": "all"}, ["hosts=[]", "empty"]),
    ({"hosts": ["h0"], "pairing": "ring"}, ["hosts=['h0']", "single host"]),
    ({"hosts": ["h0", "h0"], "pairing": "ring"}, ["listed twice"]),
    ({"hosts": ["a", "A"], "pairing": "all"}, ["hosts=['a', 'A']", "'A' is listed twice (as 'a')", "by case"]),
    ({"hosts": ["h0", "h1"], "pairing": "ring", "fleet_hosts": ["h0", "h1", "H1"]}, ["fleet_hosts=", "twice"]),
    ({"hosts": ["h0", "bad host"], "pairing": "ring"}, ["hosts='bad host'", "DNS host name"]),
    ({"hosts": HOSTS[:3], "pairing": "star"}, ["pairing='star'", "all, ring, list"]),
    ({"hosts": HOSTS[:3], "pairing": "list", "pairs": [["h0", "h9"]]},
     ["pairs[0].requester='h9'", "not a host of the fleet"]),
    ({"hosts": HOSTS[:3], "pairing": "list", "pairs": [["h1", "h1"]]}, ["pairs[0]=['h1', 'h1']", "itself"]),
    ({"hosts": HOSTS[:3], "pairing": "list", "pairs": [["h0", "h1"], "h0:h1"]},
     ["pairs[1]=['h0', 'h1']", "duplicate pair", "pairs[0]"]),
    ({"hosts": HOSTS[:3], "pairing": "list", "pairs": [["h0", "h1", "h2"]]}, ["pairs[0]=", "[source, requester]"]),
    ({"hosts": HOSTS[:3], "pairing": "list", "pairs": []}, ["pairs=[]", "non-empty"]),
    ({"hosts": HOSTS[:3], "pairing": "ring", "pairs": [["h0", "h1"]]}, ["pairs=", "pairing 'list'"]),
    ({"hosts": ["h0", "h9"], "pairing": "ring", "fleet_hosts": HOSTS[:3]}, ["h9 not in fleet_hosts"]),
    ({"hosts": HOSTS[:3], "pairing": "ring", "fleet_id": "a/b"}, ["fleet_id='a/b'"]),
])
def test_bad_input_names_field_value_and_rule(kwargs, words):
    # A bad name is the one name grammar's error (InvalidName), the rest the planner's.
    with pytest.raises(OrbiteError) as err:
        plan_fleet(**kwargs)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("source, requester", [("a", "A"), ("sim-a", "SIM-A"), ("Lab-1.example", "lab-1.EXAMPLE"),
                                               ("a", "b"), ("sim-a", "sim-a1")])
def test_the_planner_and_the_profile_agree_on_what_is_one_host(source, requester):
    """One rule of host identity (names.host_key): two names the profile refuses as one host are one host to
    the planner too, never a pair it would run in one wave."""
    from ansible_collections.orbite.qualification.plugins.module_utils._profile import model

    profile = {"source": source, "requester": requester, "source_kind": "cpu", "requester_kind": "cpu",
               "transport": "rdma", "mode": "installed-host", "operation": "read", "rdma_events": False,
               "parents": 1, "payload": 4096, "block": 4096, "num_lanes": 1, "mask": 1}
    try:
        model.validate_profile(profile)
        profile_one_host = False
    except model.ProfileError as error:
        assert [v.code for v in error.violations] == ["requester.distinct"]
        profile_one_host = True
    try:
        plan = plan_fleet([source, requester], "all")
        planner_one_host = False
        assert _check_waves(plan) == 2
    except OrbiteError as error:
        assert "listed twice" in str(error)
        planner_one_host = True
    assert planner_one_host == profile_one_host == (source.lower() == requester.lower())


@st.composite
def explicit_pairings(draw):
    n = draw(st.integers(2, 8))
    hosts = HOSTS[:n]
    candidates = [(a, b) for a in hosts for b in hosts if a != b]
    pairs = draw(st.lists(st.sampled_from(candidates), min_size=1, unique=True))
    return hosts, pairs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(explicit_pairings())
def test_explicit_waves_are_host_disjoint_complete_and_few(case):
    hosts, pairs = case
    plan = plan_fleet(hosts, "list", pairs=[list(p) for p in pairs])
    assert _pairs(plan) == pairs
    assert _check_waves(plan) <= 2 * max_degree(pairs) - 1


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 8), st.sampled_from(["all", "ring"]), st.data())
def test_slices_partition_the_fleet_pairs(n, pairing, data):
    hosts = HOSTS[:n]
    slices = data.draw(st.integers(1, n))
    whole = plan_fleet(hosts, pairing)
    ran = []
    for k in range(slices):  # AWX slices the inventory round robin
        part = hosts[k::slices]
        if len(part) < 1:
            continue
        plan = plan_fleet(part, pairing, fleet_hosts=hosts)
        _check_waves(plan)
        ran += plan["pairs"]
        assert sorted(p["id"] for p in plan["pairs"] + plan["elsewhere"]) == sorted(p["id"] for p in whole["pairs"])
    # No pair runs in two slices; what no slice runs is left for the merge to call INCOMPLETE.
    assert len({p["id"] for p in ran}) == len(ran)
