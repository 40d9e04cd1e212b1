"""Tests of the simulated runner's parts: slicing, content checks, discovery, the verbs binding, the case."""

import copy
import ctypes
import hashlib
import json
import shutil
import subprocess
import sys
import textwrap

import pytest
from helpers.native import verbs_headers_missing
from helpers.paths import FIXTURES, REPO
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(REPO / "sim"))
sys.path.insert(0, str(FIXTURES / "sim"))

import sim_harness as H
from orbite_sim import content, sysfs, verbs
from orbite_sim.case import MAX_WRS_PER_ROUND, validate_case
from orbite_sim.engine import slice_plan
from orbite_sim.errors import CaseError, EngineError

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
        lead, trail = (hashlib.sha256(w).hexdigest() for w in content.guard_bytes(9, p))
        assert content.check_region(arena, p, expected, 9) == (
            {"checked_bytes": payload, "mismatched_bytes": 0, "first_mismatch": None, "ok": True},
            {"guard_bytes": content.GUARD_BYTES, "leading_changed": 0, "trailing_changed": 0,
             "leading_sha256": lead, "trailing_sha256": trail, "ok": True})


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
    # the recorded digests are of the windows as they are, not of what was written
    stride = content.stride(payload)
    assert guard_check["leading_sha256"] == hashlib.sha256(arena[stride : stride + content.GUARD_BYTES]).hexdigest()
    assert guard_check["leading_sha256"] != hashlib.sha256(content.guard_bytes(9, 1)[0]).hexdigest()


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


def test_pinned_rail_reads_its_gid(small_host):
    rail = sysfs.describe_rail(small_host, "mlx5_1", 1, 3)
    assert rail["gid_type"] == "RoCE v2" and rail["netdev"] == "ens2f0" and rail["numa_node"] == 1
    with pytest.raises(EngineError) as err:
        sysfs.describe_rail(small_host, "mlx5_9", 1, 3)
    assert err.value.error == "Unavailable" and err.value.exit_code == 3


# ----------------------------------------------------------------------------------- verbs binding

# Every offset and constant verbs.py relies on, printed by C from <infiniband/verbs.h> itself.
_LAYOUT_PROBE = r"""
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stddef.h>
#define S(py, t) printf("size %s %zu\n", py, sizeof(struct t))
#define O(py, t, f) printf("off %s.%s %zu\n", py, #f, offsetof(struct t, f))
#define OF(py, t, f, name) printf("off %s.%s %zu\n", py, name, offsetof(struct t, f))
#define C(py, v) printf("const %s %ld\n", py, (long)(v))
int main(void)
{
    S("Sge", ibv_sge); S("SendWr", ibv_send_wr); S("Wc", ibv_wc); S("QpInitAttr", ibv_qp_init_attr);
    S("QpAttr", ibv_qp_attr); S("AhAttr", ibv_ah_attr); S("GlobalRoute", ibv_global_route); S("QpCap", ibv_qp_cap);
    O("Sge", ibv_sge, addr); O("Sge", ibv_sge, length); O("Sge", ibv_sge, lkey);
    O("SendWr", ibv_send_wr, wr_id); O("SendWr", ibv_send_wr, next); O("SendWr", ibv_send_wr, sg_list);
    O("SendWr", ibv_send_wr, num_sge); O("SendWr", ibv_send_wr, opcode); O("SendWr", ibv_send_wr, send_flags);
    OF("SendWr", ibv_send_wr, wr.rdma.remote_addr, "remote_addr"); OF("SendWr", ibv_send_wr, wr.rdma.rkey, "rkey");
    O("Wc", ibv_wc, wr_id); O("Wc", ibv_wc, status); O("Wc", ibv_wc, byte_len); O("Wc", ibv_wc, qp_num);
    O("QpInitAttr", ibv_qp_init_attr, send_cq); O("QpInitAttr", ibv_qp_init_attr, recv_cq);
    O("QpInitAttr", ibv_qp_init_attr, cap); O("QpInitAttr", ibv_qp_init_attr, qp_type);
    O("QpInitAttr", ibv_qp_init_attr, sq_sig_all);
    O("QpAttr", ibv_qp_attr, qp_state); O("QpAttr", ibv_qp_attr, path_mtu); O("QpAttr", ibv_qp_attr, rq_psn);
    O("QpAttr", ibv_qp_attr, sq_psn); O("QpAttr", ibv_qp_attr, dest_qp_num); O("QpAttr", ibv_qp_attr, qp_access_flags);
    O("QpAttr", ibv_qp_attr, ah_attr); O("QpAttr", ibv_qp_attr, pkey_index); O("QpAttr", ibv_qp_attr, max_rd_atomic);
    O("QpAttr", ibv_qp_attr, max_dest_rd_atomic); O("QpAttr", ibv_qp_attr, min_rnr_timer);
    O("QpAttr", ibv_qp_attr, port_num); O("QpAttr", ibv_qp_attr, timeout); O("QpAttr", ibv_qp_attr, retry_cnt);
    O("QpAttr", ibv_qp_attr, rnr_retry);
    O("AhAttr", ibv_ah_attr, grh); O("AhAttr", ibv_ah_attr, is_global); O("AhAttr", ibv_ah_attr, port_num);
    O("GlobalRoute", ibv_global_route, dgid); O("GlobalRoute", ibv_global_route, sgid_index);
    O("GlobalRoute", ibv_global_route, hop_limit);
    O("MrHead", ibv_mr, addr); O("MrHead", ibv_mr, lkey); O("MrHead", ibv_mr, rkey);
    O("QpHead", ibv_qp, qp_num); O("ChannelHead", ibv_comp_channel, fd);
    C("QPT_RC", IBV_QPT_RC); C("QPS_INIT", IBV_QPS_INIT); C("QPS_RTR", IBV_QPS_RTR); C("QPS_RTS", IBV_QPS_RTS);
    C("MTU_1024", IBV_MTU_1024); C("ACCESS_LOCAL_WRITE", IBV_ACCESS_LOCAL_WRITE);
    C("ACCESS_REMOTE_WRITE", IBV_ACCESS_REMOTE_WRITE); C("ACCESS_REMOTE_READ", IBV_ACCESS_REMOTE_READ);
    C("WR_RDMA_WRITE", IBV_WR_RDMA_WRITE); C("WR_RDMA_READ", IBV_WR_RDMA_READ); C("SEND_SIGNALED", IBV_SEND_SIGNALED);
    C("QP_STATE", IBV_QP_STATE); C("QP_ACCESS_FLAGS", IBV_QP_ACCESS_FLAGS); C("QP_PKEY_INDEX", IBV_QP_PKEY_INDEX);
    C("QP_PORT", IBV_QP_PORT); C("QP_AV", IBV_QP_AV); C("QP_PATH_MTU", IBV_QP_PATH_MTU);
    C("QP_TIMEOUT", IBV_QP_TIMEOUT); C("QP_RETRY_CNT", IBV_QP_RETRY_CNT); C("QP_RNR_RETRY", IBV_QP_RNR_RETRY);
    C("QP_RQ_PSN", IBV_QP_RQ_PSN); C("QP_MAX_QP_RD_ATOMIC", IBV_QP_MAX_QP_RD_ATOMIC);
    C("QP_MIN_RNR_TIMER", IBV_QP_MIN_RNR_TIMER); C("QP_SQ_PSN", IBV_QP_SQ_PSN);
    C("QP_MAX_DEST_RD_ATOMIC", IBV_QP_MAX_DEST_RD_ATOMIC); C("QP_DEST_QPN", IBV_QP_DEST_QPN);
    C("WC_SUCCESS", IBV_WC_SUCCESS); C("WC_REM_ACCESS_ERR", IBV_WC_REM_ACCESS_ERR);
    C("WC_TM_RNDV_INCOMPLETE", IBV_WC_TM_RNDV_INCOMPLETE);
    return 0;
}
"""


def test_the_binding_matches_the_verbs_header(tmp_path):
    """Each structure offset, size and constant of the ctypes binding is the header's (a layout slip would
    post garbage to the provider)."""
    missing = verbs_headers_missing()
    if missing:
        pytest.skip(f"cannot compile against <infiniband/verbs.h>: {missing}")
    (tmp_path / "probe.c").write_text(_LAYOUT_PROBE)
    subprocess.run(["gcc", "-o", str(tmp_path / "probe"), str(tmp_path / "probe.c")], check=True, timeout=60)
    lines = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, check=True).stdout.split("\n")
    checked = 0
    for kind, name, value in (line.split() for line in lines if line):
        if kind == "size":
            assert ctypes.sizeof(getattr(verbs, name)) == int(value), name
        elif kind == "off":
            struct, field = name.split(".")
            assert getattr(getattr(verbs, struct), field).offset == int(value), name
        elif hasattr(verbs, name):
            assert getattr(verbs, name) == int(value), name
        else:  # a completion status: the binding knows it by its name
            assert verbs.WC_STATUS_NAMES[int(value)] == name[len("WC_"):], name
        checked += 1
    assert checked > 70


@pytest.fixture(scope="module")
def provider_host(tmp_path_factory):
    """A fake host whose two RNICs' IPv4 GIDs are loopback, and the pinned native build."""
    missing = verbs_headers_missing()
    if missing:
        pytest.skip(f"the loopback verbs provider cannot be built: {missing}")
    return _small_host(tmp_path_factory.mktemp("vhost") / "root"), H.native()


def _in_provider(host, body):
    """Run ``body`` (Python, with ``v`` = orbite_sim.verbs, ``p`` = the loaded provider) in a process of its
    own, so the stand-in libibverbs.so.1 never enters this test process; returns what it prints as JSON."""
    root, native = host
    script = "\n".join(["import json, sys", f"sys.path.insert(0, {str(REPO / 'sim')!r})",
                         "from orbite_sim import verbs as v",
                         f"p = v.load({native['verbs_library']!r}, {root!r})", textwrap.dedent(body)])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env=H.preload_env("/nonexistent", []), check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_qp_pair_moves_bytes_and_the_send_queue_holds_until_the_cqe_is_polled(provider_host):
    """Two contexts (two RNICs of one host), one RC QP each, connected by QPN and GID: READs move the peer's
    bytes into the local MR, a post beyond max_send_wr is ENOMEM until a completion is polled, an armed CQ
    signals its channel once, and the resource table and the provider agree on what is held."""
    got = _in_provider(provider_host, """
        import select
        table = v.ResourceTable()
        out = {}
        ends = []
        for rail, dev in enumerate(("mlx5_0", "mlx5_1")):
            ctx = v.open_device(p, table, rail, dev)
            pd = ctx.alloc_pd()
            ch = ctx.create_comp_channel()
            cq = ctx.create_cq(16, ch)
            buf = bytearray(bytes(range(256)) * 256) if rail == 1 else bytearray(65536)
            mr = ctx.reg_mr(pd, buf, "data")
            qp = ctx.create_qp(pd, cq, 0, "read", 2)
            ends.append({"ctx": ctx, "pd": pd, "ch": ch, "cq": cq, "buf": buf, "mr": mr, "qp": qp,
                         "gid": ctx.query_gid(1, 3)})
        a, b = ends
        a["qp"].connect(1, 3, b["qp"].qpn, b["gid"])
        b["qp"].connect(1, 3, a["qp"].qpn, a["gid"])
        out["held_open"] = p.held()
        out["table_open"] = table.live_count()
        a["cq"].req_notify()
        for wr_id, off in ((1, 0), (2, 4096)):
            a["qp"].post_send(wr_id, a["mr"].addr + off, 4096, a["mr"].lkey, b["mr"].addr + off, b["mr"].rkey)
        try:
            a["qp"].post_send(3, a["mr"].addr, 8, a["mr"].lkey, b["mr"].addr, b["mr"].rkey)
            out["third"] = "accepted"
        except v.VerbsError as exc:
            out["third"] = exc.code
        out["readable"] = bool(select.select([a["ch"]], [], [], 10)[0])
        out["event_cq"] = a["ch"].get_cq_event() == a["cq"].ptr
        a["cq"].ack_events(1)
        seen = []
        while len(seen) < 2:
            seen += a["cq"].poll()
        a["qp"].retire(); a["qp"].retire()
        out["cqes"] = sorted((w[0], w[1], w[2], w[3] == a["qp"].qpn) for w in seen)
        a["qp"].post_send(3, a["mr"].addr + 8192, 8, a["mr"].lkey, b["mr"].addr + 8192, b["mr"].rkey)
        while not a["cq"].poll():
            pass
        out["landed"] = bytes(a["buf"][:8200]) == bytes(b["buf"][:8200])
        out["native"] = a["ctx"].native.snapshot()
        out["counters"] = p.counters()
        out["handles"] = [a["ctx"].handle == hex(a["ctx"].ptr), a["cq"].handle.startswith("0x")]
        for end in (a, b):
            end["qp"].destroy(); end["mr"].dereg(); end["cq"].destroy(); end["ch"].destroy()
            end["pd"].dealloc(); end["ctx"].close()
        out["held_after"] = p.held()
        out["table_after"] = (table.live_count(), table.acquired)
        print(json.dumps(out))
    """)
    assert got["held_open"] == {"ctx": 2, "pd": 2, "mr": 2, "mw": 0, "cq": 2, "channel": 2, "qp": 2}
    assert got["table_open"] == 12
    assert got["third"] == "ENOMEM"  # the provider holds both slots until their completions are polled
    assert got["readable"] and got["event_cq"]
    assert got["cqes"] == [[1, 0, 4096, True], [2, 0, 4096, True]]
    assert got["landed"]
    assert got["native"] == {"wrs": 3, "cqes": 3, "bytes": 8200}
    assert got["counters"]["read_bytes_landed"] == got["counters"]["read_bytes_served"] == 8200
    assert got["counters"]["wr_completed"] == 3 and got["counters"]["wr_failed"] == 0
    assert got["handles"] == [True, True]
    assert got["held_after"] == dict.fromkeys(verbs.HELD_KINDS, 0) and got["table_after"] == [0, 12]


def test_a_failed_destroy_stays_held_in_the_table(provider_host):
    """A destroy the provider refuses (EBUSY: a PD with an MR) leaves the owner counted; the later one frees it."""
    got = _in_provider(provider_host, """
        table = v.ResourceTable()
        ctx = v.open_device(p, table, 0, "mlx5_0")
        pd = ctx.alloc_pd()
        mr = ctx.reg_mr(pd, bytearray(4096), "ctrl")
        try:
            pd.dealloc()
            code = None
        except v.VerbsError as exc:
            code = exc.code
        held = (table.live_count(), p.held()["pd"])
        mr.dereg(); pd.dealloc(); ctx.close()
        print(json.dumps({"code": code, "held": held, "after": table.live_count()}))
    """)
    assert got == {"code": "EBUSY", "held": [3, 1], "after": 0}


def test_strict_gid_255_is_unavailable_and_retains_nothing(provider_host):
    got = _in_provider(provider_host, f"""
        from orbite_sim.engine import strict_gid_request
        result = strict_gid_request(p, {provider_host[0]!r}, "mlx5_0", 1)
        print(json.dumps(dict(result, held=p.held())))
    """)
    assert got["result"] == "Unavailable" and got["error"]["expected"] is True
    assert got["owners_acquired"] == 1 and got["retained_owners"] == 0
    assert got["held"] == dict.fromkeys(verbs.HELD_KINDS, 0)


def test_the_pinned_library_is_loaded_from_a_sealed_copy(provider_host, tmp_path):
    """What is hashed is what is loaded: a copy in a sealed memfd, not the file (which may change after)."""
    root, native = provider_host
    copy = tmp_path / "libibverbs.so.1"
    shutil.copy(native["verbs_library"]["path"], copy)
    got = _in_provider(provider_host, f"""
        import os
        q = v.load({{"path": {str(copy)!r}, "sha256": {native['verbs_library']['sha256']!r}}}, {root!r})
        with open({str(copy)!r}, "ab") as handle:
            handle.write(b"changed after loading")
        maps = open("/proc/self/maps").read()
        print(json.dumps({{"record": q.record(), "memfd": "orbite-verbs-library" in maps,
                          "file": {str(copy)!r} in maps, "root": os.environ["ORBITE_PROVIDER_ROOT"]}}))
    """)
    assert got == {"record": {"path": str(copy), "sha256": native["verbs_library"]["sha256"]}, "memfd": True,
                   "file": False, "root": root}


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


@pytest.mark.parametrize(("parents", "payload", "block", "refused"), [
    (16, 2048, 1, False), (16, 2049, 1, True), (32, 1024 * 1024 + 1, 1024, True), (32, 8380416, 8192, False)])
def test_the_runner_refuses_past_the_gates_wr_bound_on_its_own(parents, payload, block, refused):
    case = copy.deepcopy(_case())
    case["profile"].update(mode="installed-host", parents=parents, payload=payload, block=block, num_lanes=3)
    case["profile"].pop("discovery")
    case.pop("discovery")
    case["rails"] = [{"device": "mlx5_0", "port": 1, "gid_index": 3}, {"device": "mlx5_1", "port": 1, "gid_index": 3}]
    if not refused:
        validate_case(case)
        return
    with pytest.raises(CaseError) as err:
        validate_case(case)
    assert f"the simulated runner allows at most {MAX_WRS_PER_ROUND}" in str(err.value)


def test_valid_case_gets_defaults():
    case = validate_case(_case())
    assert case["root"] == "/" and case["rails"] is None and case["defects"] == []
    assert case["timeouts"] == {"connect_s": 30.0, "round_s": 300.0}
    assert case["verbs_library"] is None  # the system's libibverbs.so.1


@pytest.mark.parametrize(("spec", "message"), [
    ("lib", "case field verbs_library = 'lib': must be null or an object with path and sha256"),
    ({"path": "/x.so"}, "case field verbs_library.sha256 = null: must be 64 lower-case hex digits"),
    ({"path": "/x.so", "sha256": "A" * 64}, "must be 64 lower-case hex digits"),
    ({"sha256": "a" * 64}, "case field verbs_library.path = null: must be an absolute path"),
])
def test_verbs_library_errors_name_field_value_and_rule(spec, message):
    with pytest.raises(CaseError) as err:
        validate_case(dict(_case(), verbs_library=spec))
    assert message in str(err.value)
