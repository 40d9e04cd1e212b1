"""In-process tests of the simulated runner's parts: slicing, content checks, discovery, verbs model."""

import copy
import select
import sys

import pytest
from helpers.paths import REPO
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(REPO / "sim"))

from orbite_sim import content, sysfs
from orbite_sim.case import validate_case
from orbite_sim.engine import slice_plan, strict_gid_request
from orbite_sim.errors import CaseError, EngineError
from orbite_sim.verbs import Allocator, Context, Cqe, ResourceTable, VerbsError, WorkRequest

from ansible_collections.orbite.qualification.plugins.module_utils._sim.fake_sysfs import (
    sim_host_spec,
    write_host,
)

# ----------------------------------------------------------------------------------- slicing


@settings(deadline=None, max_examples=200)
@given(st.integers(1, 32 << 20), st.integers(4096, 2 << 20))
def test_slices_follow_the_gate_rule(payload, block):
    sizes = slice_plan(payload, block)
    assert len(sizes) == max(1, payload // block)
    assert sum(sizes) == payload
    assert all(s == block for s in sizes[:-1])
    assert sizes[-1] >= (block if payload >= block else payload)


def test_seed_figures_per_round():
    assert 16 * len(slice_plan(4194305, 1 << 20)) == 64
    assert slice_plan(4194305, 1 << 20) == [1 << 20] * 3 + [(1 << 20) + 1]
    assert 16 * len(slice_plan(6291457, 1 << 20)) == 96
    assert len(slice_plan(4194305, 1 << 20, wrong=True)) == 5  # the wrong_slicing defect


# ----------------------------------------------------------------------------------- content


def _arena(parents, payload, seed=7, guard_seed=9):
    arena = bytearray(parents * content.stride(payload))
    content.prepare_destination(arena, parents, payload, guard_seed)
    return arena


def test_filled_regions_pass_and_poisoned_ones_fail():
    payload, parents = 5000, 3
    arena = _arena(parents, payload)
    expected = content.RoundInput(7, parents, payload)
    byte_check, guard_check = content.check_region(arena, 1, expected, 9)
    assert not byte_check["ok"] and byte_check["first_mismatch"] == 0 and guard_check["ok"]
    content.fill_input(arena, parents, payload, 7)
    for p in range(parents):
        assert content.check_region(arena, p, expected, 9) == (
            {"checked_bytes": payload, "mismatched_bytes": 0, "first_mismatch": None, "ok": True},
            {"guard_bytes": content.GUARD_BYTES, "leading_changed": 0, "trailing_changed": 0, "ok": True})


def test_one_flipped_byte_and_one_guard_byte_are_counted_exactly():
    payload = 70000
    arena = _arena(2, payload)
    content.fill_input(arena, 2, payload, 7)
    off = content.region_offset(1, payload)
    arena[off + 12345] ^= 0x01
    arena[off + payload] ^= 0xFF  # first trailing guard byte
    arena[off - 1] ^= 0xFF  # last leading guard byte
    byte_check, guard_check = content.check_region(arena, 1, content.RoundInput(7, 2, payload), 9)
    assert byte_check["mismatched_bytes"] == 1 and byte_check["first_mismatch"] == 12345
    assert guard_check["leading_changed"] == 1 and guard_check["trailing_changed"] == 1 and not guard_check["ok"]


def test_input_differs_between_seeds_parents_and_offsets():
    one, other = content.RoundInput(1, 2, 4096), content.RoundInput(2, 2, 4096)
    assert bytes(one.parent(0)) != bytes(other.parent(0))
    assert bytes(one.parent(0)) != bytes(one.parent(1))
    assert bytes(one.parent(0)[:1024]) != bytes(one.parent(0)[1024:2048])
    assert content.round_seed(5, 6, 1) != content.round_seed(5, 6, 2) != content.round_seed(5, 7, 2)


# ----------------------------------------------------------------------------------- discovery


def _small_host(root, mutate=None):
    spec = sim_host_spec(3, "sim-d")
    for dev in spec["devices"]:
        dev["ports"][0]["gid_tbl_len"] = 8  # fewer files: writing is faster, slot 255 does not exist
    if mutate:
        mutate(spec)
    write_host(root, spec)
    return str(root)


@pytest.fixture(scope="module")
def small_host(tmp_path_factory):
    return _small_host(tmp_path_factory.mktemp("host") / "root")


def test_whitelist_wins_over_an_identical_blacklist(small_host):
    found = sysfs.discover(small_host, ["mlx5_0", "mlx5_1"], ["mlx5_0", "mlx5_1"])
    assert found["chosen_nic_ids"] == ["mlx5_0:1", "mlx5_1:1"] and found["excluded"] == []
    assert [c["gid_index"] for c in found["candidates"]] == [3, 3]  # IPv4-mapped RoCE v2 first
    assert all(sysfs.is_ipv4_mapped(c["gid"]) for c in found["candidates"])


def test_blacklist_applies_without_whitelist_and_tiers_follow_numa(small_host):
    found = sysfs.discover(small_host, [], ["mlx5_0"])
    assert found["chosen_nic_ids"] == ["mlx5_1:1"]
    assert found["excluded"] == [{"device": "mlx5_0", "reason": "blacklisted"}]
    assert found["memory_tiers"] == [{"numa_node": 0, "tiers": [["mlx5_1:1"]]},
                                     {"numa_node": 1, "tiers": [["mlx5_1:1"]]}]
    found = sysfs.discover(small_host, ["mlx5_1"], [])
    assert found["excluded"] == [{"device": "mlx5_0", "reason": "not in whitelist"}]


def test_down_port_and_missing_roce_v2_are_excluded(tmp_path):
    def mutate(spec):
        spec["devices"][0]["ports"][0]["state"] = "DOWN"
        for entry in spec["devices"][1]["ports"][0]["gids"].values():
            entry["type"] = "IB/RoCE v1"

    root = _small_host(tmp_path / "root", mutate)
    found = sysfs.discover(root, [], [])
    assert found["candidates"] == []
    assert found["excluded"] == [{"device": "mlx5_0", "reason": "no ACTIVE Ethernet port"},
                                 {"device": "mlx5_1", "reason": "no RoCE v2 GID"}]


def test_strict_gid_255_is_unavailable_and_retains_nothing(small_host):
    result = strict_gid_request(small_host, "mlx5_0", 1)
    assert result["result"] == "Unavailable" and result["error"]["expected"] is True
    assert result["owners_acquired"] == 1 and result["retained_owners"] == 0


def test_pinned_rail_reads_its_gid(small_host):
    rail = sysfs.describe_rail(small_host, "mlx5_1", 1, 3)
    assert rail["gid_type"] == "RoCE v2" and rail["netdev"] == "ens2f0" and rail["numa_node"] == 1
    with pytest.raises(EngineError) as err:
        sysfs.describe_rail(small_host, "mlx5_9", 1, 3)
    assert err.value.error == "Unavailable" and err.value.exit_code == 3


# ----------------------------------------------------------------------------------- verbs model


def _context():
    table = ResourceTable()
    ctx = Context(table, Allocator(100), 0, "mlx5_0")
    pd = ctx.alloc_pd()
    channel = ctx.create_comp_channel()
    cq = ctx.create_cq(16, channel)
    mr = ctx.reg_mr(pd, memoryview(bytearray(64)), "data")
    qp = ctx.create_qp(pd, cq, 0, "read", 2)
    sent = []
    qp.connect(555, lambda q, wr: sent.append(wr.wr_id))
    return table, ctx, pd, channel, cq, mr, qp, sent


def test_send_queue_depth_is_enforced_until_the_cqe_is_polled():
    _table, ctx, _pd, _ch, cq, mr, qp, sent = _context()
    for wr_id in (1, 2):
        qp.post_send(WorkRequest(wr_id, "read", mr, 0, 8, 0, mr.rkey))
    with pytest.raises(VerbsError) as err:
        qp.post_send(WorkRequest(3, "read", mr, 0, 8, 0, mr.rkey))
    assert err.value.code == "ENOMEM" and sent == [1, 2]
    cq.push(Cqe(qp, 1, 0, 8, "RDMA_READ"))
    with pytest.raises(VerbsError):  # a CQE that is not yet polled does not free the slot
        qp.post_send(WorkRequest(3, "read", mr, 0, 8, 0, mr.rkey))
    assert len(cq.poll(8)) == 1
    qp.post_send(WorkRequest(3, "read", mr, 0, 8, 0, mr.rkey))
    assert ctx.native.snapshot() == {"wrs": 3, "cqes": 1, "bytes": 8}


def test_armed_cq_signals_its_channel_once():
    _table, _ctx, _pd, channel, cq, _mr, qp, _sent = _context()
    cq.push(Cqe(qp, 1, 0, 8, "RDMA_READ"))  # not armed: no event
    assert select.select([channel], [], [], 0)[0] == []
    cq.req_notify()
    cq.push(Cqe(qp, 2, 0, 8, "RDMA_READ"))
    cq.push(Cqe(qp, 3, 0, 8, "RDMA_READ"))  # one event per arming
    assert select.select([channel], [], [], 0)[0] == [channel]
    assert channel.get_cq_event() is cq and channel.get_cq_event() is None


def test_resource_table_counts_what_teardown_leaves():
    table, ctx, pd, channel, cq, mr, qp, _sent = _context()
    assert table.live_count() == 6
    qp.destroy()
    mr.dereg()
    cq.destroy()
    channel.destroy()
    assert table.live_count() == 2
    pd.dealloc()
    ctx.close()
    assert table.live_count() == 0 and table.acquired == 6


# ----------------------------------------------------------------------------------- case


def _case():
    return {"schema": "orbite.runner-case", "version": 1, "protocol": "orbite-installed-host-v4", "run_id": "r",
            "role": "requester", "generation": 1, "registration_id": "reg", "peer_address": "127.0.0.1:5000",
            "profile": {"mode": "installed-rail-accounting", "operation": "read", "rdma_events": False,
                        "parents": 16, "payload": 4194305, "block": 1048576, "num_lanes": 1, "mask": 3,
                        "discovery": "auto"},
            "discovery": {"whitelist": ["mlx5_0"], "blacklist": []}}


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda c: c.update(rails=[]), "case field rails = []: must be absent with profile.discovery 'auto'"),
    (lambda c: c.pop("discovery"), "case field discovery = null: must be an object"),
    (lambda c: c.update(peer_address="127.0.0.1:0"), "must name the source's real port"),
    (lambda c: c.update(peer_address="::1:80"), "IPv6 addresses must be written '[addr]:port'"),
    (lambda c: c["profile"].update(block=1), "payload WRs per round; the simulated runner allows at most"),
    (lambda c: c.update(timeouts={"round_s": 0}), "case field timeouts.round_s = 0: must be a positive number"),
    (lambda c: c.update(defects=["skip_drain", "skip_drain"]), "must not repeat a name"),
])
def test_case_errors_name_field_value_and_rule(mutate, message):
    case = copy.deepcopy(_case())
    mutate(case)
    with pytest.raises(CaseError) as err:
        validate_case(case)
    assert message in str(err.value)


def test_valid_case_gets_defaults():
    case = validate_case(_case())
    assert case["root"] == "/" and case["rails"] is None and case["defects"] == []
    assert case["timeouts"] == {"connect_s": 30.0, "round_s": 300.0}
