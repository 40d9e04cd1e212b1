"""Native observers (observers/, issue 8) on the loopback verbs provider.

Builds the three LD_PRELOAD libraries, the loopback provider's libibverbs.so.1
(docs/provider.md) and the C test drivers twice (plain, and AddressSanitizer +
UBSan), runs the drivers as an engine would run on a fake host written by
fake_sysfs (GIDs on 127.0.3.x: run in a network namespace with lo up), and
checks what the engine saw against the observer log (contract 3).  Each
red-check note names the production line whose removal makes exactly that
test fail (verified once by disabling it; see
docs/observers.md).
"""

import hashlib
import json
import os
import random
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from helpers import observer_log
from helpers.native import HELD_KINDS, SANITIZER_MARKS, libasan, verbs_headers_missing
from helpers.paths import REPO

from ansible_collections.orbite.qualification.plugins.module_utils._sim import fake_sysfs

OBSERVERS = REPO / "observers"
KINDS = ("qp", "mr", "mw", "cq", "channel", "pd")
KINDS_HELD = HELD_KINDS
PAYLOAD = {"RDMA_READ", "RDMA_WRITE"}
# Opcode cycle of the driver's post_list: READ, WRITE, WRITE_WITH_IMM, SEND.
DRIVER_OPS = ("RDMA_READ", "RDMA_WRITE", "RDMA_WRITE", None)
NOT_HASHED = observer_log.NOT_HASHED


_MISSING = verbs_headers_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"native observers cannot be built: {_MISSING}")


class Build:
    def __init__(self, out, asan_lib, host):
        self.out = Path(out)
        self.asan_lib = asan_lib
        self.host = host

    def lib(self, tool):
        return self.out / f"liborbite_{tool}.so"

    def tool(self, name):
        return self.out / "tests" / name


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """A sim-lab host (mlx5_0, mlx5_1) whose IPv4 GIDs (index 2/3) are 127.0.3.10 and .11."""
    root = tmp_path_factory.mktemp("host")
    spec = fake_sysfs.sim_host_spec(0, "obs-host")
    for k, dev in enumerate(spec["devices"]):
        gids = dev["ports"][0]["gids"]
        gids["2"], gids["3"] = fake_sysfs.roce_gid_pair(f"127.0.3.{10 + k}", gids["2"]["ndev"])
    fake_sysfs.write_host(str(root), spec)
    return root


@pytest.fixture(scope="module", params=["plain", "asan"])
def build(request, tmp_path_factory, host):
    asan_lib = None
    args = ["make", "-s", "-C", str(OBSERVERS), f"OUT={tmp_path_factory.mktemp('obs') / request.param}", "tests"]
    if request.param == "asan":
        asan_lib = libasan()
        if asan_lib is None:
            pytest.skip("libasan is not installed (gcc's AddressSanitizer runtime)")
        args.append("SAN=1")
    done = subprocess.run(args, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    return Build(args[4].split("=", 1)[1], asan_lib, host)


# ----------------------------------------------------------------- running --


def _validate_log_line(obj):
    """Contract 3, exactly: the keys and the types of every line."""
    ev = obj.get("ev")
    if "schema" in obj:
        assert set(obj) == {"schema", "version", "tool", "pid", "format", "record_bytes", "digest", "guard_bytes"}
        assert obj["schema"] == "orbite.observer-log" and obj["version"] == 2
        assert obj["tool"] in ("accounting", "cq_fault", "uverbs_fault", "inflight_fault")
        assert (obj["format"], obj["record_bytes"]) in (("binary", 80), ("json", 0))
        assert obj["digest"] == ("sha256" if obj["tool"] == "accounting" else None)
        return
    shapes = {
        "wr": {"ctx": str, "dev": str, "cq": str, "qpn": int, "wr_id": int, "opcode": str, "bytes": int},
        "cqe": {"ctx": str, "cq": str, "qpn": int, "wr_id": int, "status": int, "status_name": str},
        "withheld": {"ctx": str, "cq": str, "qpn": int, "wr_id": int},
        "data": {"qpn": int, "wr_id": int, "sge": int, "off": int, "len": int, "mr_len": int,
                 "sha256": (str, type(None)), "flags": int},
        "destroy": {"kind": str, "handle": str, "errno": int, "injected": bool, "retry": bool},
        "not_armed": {"reason": str},
        "inflight_fault": {"ctx": str, "cq": str, "qpn": int, "wr_id": int, "opcode": str, "bytes": int,
                           "stall_bytes": int, "stalled": int, "landed_local": int, "modify_qp": int,
                           "state_before": int, "state_after": int, "port_state_before": int,
                           "port_state_after": int, "post_ret": int},
        "inflight_cqe": {"ctx": str, "cq": str, "qpn": int, "wr_id": int, "status": int, "status_name": str,
                         "byte_len": int, "dest_sha256": (str, type(None))},
        "inflight_destroy": {"qpn": int, "ret": int, "after_cqe": int},
        "context_close": {"dev": str},
        "summary": {
            "accepted_wrs": int,
            "joined": int,
            "unjoined": int,
            "max_inflight_per_qp": dict,
            "max_outstanding_parents_per_qp": dict,
        },
    }
    assert ev in shapes, obj
    if ev == "destroy" and "dependency" in obj:  # dependency mode (cq, channel, pd): the verb's own result
        shapes["destroy"] = dict(shapes["destroy"], dependency=bool, command=bool)
    assert set(obj) == {"ev", *shapes[ev]}, obj
    for key, typ in shapes[ev].items():
        assert isinstance(obj[key], typ) and not (typ is int and isinstance(obj[key], bool)), (key, obj)
    if ev == "wr":
        assert obj["opcode"] in PAYLOAD
    if ev == "destroy":
        assert obj["kind"] in KINDS
    if ev == "data":
        assert (obj["sha256"] is None) == bool(obj["flags"] & NOT_HASHED)


class Run:
    def __init__(self, driver_lines, log, stderr):
        self.driver = driver_lines
        self.log = log
        self.stderr = stderr

    def ops(self, op):
        return [d for d in self.driver if d["op"] == op]

    def events(self, ev):
        return [e for e in self.log if e.get("ev") == ev]

    @property
    def summary(self):
        (summary,) = self.events("summary")
        return summary


def run(build, tool, driver, scenario, tmp_path, env=None, leaks=True, api="classic"):
    """Run the driver's scenario under ``tool``; ``api`` "ext" posts and polls through the extended verbs."""
    log = tmp_path / f"{tool}-{scenario}{'' if api == 'classic' else '-' + api}.log"
    full_env = dict(os.environ)
    full_env.update(
        {
            "LD_LIBRARY_PATH": str(build.out / "provider"),
            "ORBITE_PROVIDER_ROOT": str(build.host),
            "ORBITE_OBSERVER_LOG": str(log),
            # The format a qualification run reads fastest (test_binary_and_json_logs_say_the_same
            # shows the JSON lines say the same).
            "ORBITE_OBSERVER_LOG_FORMAT": "binary",
        }
    )
    preload = str(build.lib(tool))
    if build.asan_lib:
        # The sanitizer runtime must come first in the process.
        preload = f"{build.asan_lib} {preload}"
        full_env["ASAN_OPTIONS"] = f"detect_leaks={1 if leaks else 0}:exitcode=23"
        full_env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    full_env["LD_PRELOAD"] = preload
    full_env.update(env or {})
    done = subprocess.run(
        [str(build.tool(driver)), scenario, api], env=full_env, capture_output=True, text=True, timeout=60, check=False
    )
    for mark in SANITIZER_MARKS:
        assert mark not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines[-1] == {"op": "done"}
    events = observer_log.decode(log.read_bytes()) if log.exists() else []
    for obj in events:
        _validate_log_line(obj)
    if events:
        assert events[0]["tool"] == tool
    return Run(lines, events, done.stderr)


def _expected_payload_wrs(run_):
    """The payload WRs the driver's post calls had accepted (before bad_wr)."""
    expected = {}
    for post in run_.ops("post"):
        for i in range(post["n"]):
            wr_id = post["first"] + i
            if post["ret"] and wr_id >= post["bad"]:
                break
            expected[(post["qpn"], wr_id)] = i
    return expected


def _independent_join(run_):
    """Join the log's accepted WRs to successful CQEs by (ctx, CQ, QPN, WR ID)."""
    ok = Counter((c["ctx"], c["cq"], c["qpn"], c["wr_id"]) for c in run_.events("cqe") if c["status"] == 0)
    joined = 0
    for wr in run_.events("wr"):
        key = (wr["ctx"], wr["cq"], wr["qpn"], wr["wr_id"])
        if ok[key]:
            ok[key] -= 1
            joined += 1
    return joined


# -------------------------------------------------------------------- build --


def test_make_builds_contract_libraries(tmp_path):
    done = subprocess.run(
        ["make", "-s", "-C", str(OBSERVERS), f"OUT={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for tool in ("accounting", "cq_fault", "uverbs_fault"):
        lib = tmp_path / f"liborbite_{tool}.so"
        assert lib.is_file()
        dyn = subprocess.run(["readelf", "-d", "-W", str(lib)], capture_output=True, text=True, check=True).stdout
        # Never linked to libibverbs: the real one is resolved at run time,
        # also when the engine dlopens it with RTLD_LOCAL.
        assert "libibverbs" not in dyn


def test_make_names_the_missing_verbs_header(tmp_path):
    # -nostdinc hides every system header, as on a host without libibverbs-dev.
    done = subprocess.run(
        ["make", "-s", "-C", str(OBSERVERS), f"OUT={tmp_path}", "CC=gcc -nostdinc"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "infiniband/verbs.h" in done.stderr and "libibverbs-dev" in done.stderr
    assert not list(tmp_path.glob("*.so"))


# --------------------------------------------------------------- accounting --


# How an engine loads libibverbs: linked, dlopened RTLD_LOCAL and dlsymed, or linked to a library the engine
# dlopens RTLD_LOCAL (libibverbs loaded, never global: Python's pyverbs).
LOADINGS = ["obs_driver_direct", "obs_driver_dlopen", "obs_driver_local"]


@pytest.mark.parametrize("driver", LOADINGS)
def test_accounting_joins_each_accepted_payload_wr(build, driver, tmp_path):
    # Red check (join): in obs_core.c obs_poll_cq, removing `joined_wrs++;`
    # fails exactly this test and test_error_completions_use_the_recorded_wr.
    # Breaking the key instead (`e->cq = qp->send_cq;` -> `e->cq = NULL;` in
    # obs_post_send) also fails every test that needs the join to act: the
    # threads test, the cq_fault tests and the qp-selector test.  The dlopen
    # variant guards the dlsym interposition in obs_core.c dlsym():
    # `return h->wrapper;` -> `return real;` fails the dlopen variants only.
    # The local variant guards obs_real's fallback to the loaded library:
    # without `r = real_dlsym_fn(verbs_lib, name);` RTLD_NEXT finds no
    # ibv_open_device, the open fails with ENOSYS and every local variant
    # fails (the driver's CHECK).
    r = run(build, "accounting", driver, "accounting", tmp_path)
    expected = _expected_payload_wrs(r)
    wrs = r.events("wr")
    got = {(w["qpn"], w["wr_id"]): w for w in wrs}
    payload = {k: i for k, i in expected.items() if DRIVER_OPS[i % 4]}
    assert set(got) == set(payload) and len(wrs) == len(payload) == 20
    for key, index in payload.items():
        assert got[key]["opcode"] == DRIVER_OPS[index % 4]
        assert got[key]["bytes"] == (4096 if key[1] % (1 << 20) < 4 else 100) + index
    # Two contexts, one device each; two QPs of a context share one CQ.
    assert {w["dev"] for w in wrs} == {"mlx5_0", "mlx5_1"}
    for dev in ("mlx5_0", "mlx5_1"):
        mine = [w for w in wrs if w["dev"] == dev]
        assert len({w["ctx"] for w in mine}) == 1 and len({w["cq"] for w in mine}) == 1
        assert len({w["qpn"] for w in mine}) == 2
    # Completions are forwarded unchanged: the engine saw each one, in order.
    seen = [(c["qpn"], c["wr_id"], c["status"]) for c in r.ops("cqe")]
    logged = [(c["qpn"], c["wr_id"], c["status"]) for c in r.events("cqe")]
    assert seen == logged and len(seen) == 24
    assert _independent_join(r) == 20
    s = r.summary
    assert (s["accepted_wrs"], s["joined"], s["unjoined"]) == (20, 20, 0)
    # 3 payload WRs of the first list + 2 of the second before any poll.
    assert s["max_inflight_per_qp"] == {str(q): 5 for q in {w["qpn"] for w in wrs}}
    assert s["max_outstanding_parents_per_qp"] == {}
    assert r.ops("held")[-1] == {"op": "held", "when": "end", **dict.fromkeys(KINDS_HELD, 0)}


def test_bad_wr_mid_list_counts_only_the_wrs_before_it(build, tmp_path):
    # Red check: in obs_post_send, dropping `rejecting = 1;` counts WRs from
    # bad_wr on as accepted: 102-104 and 206-207 appear and this test fails
    # (and the threads test, whose posters resume from bad_wr).
    r = run(build, "accounting", "obs_driver_direct", "badwr", tmp_path)
    posts = r.ops("post")
    assert [(p["ret"], p["bad"]) for p in posts] == [(22, 102), (12, 206)]
    ids = [w["wr_id"] for w in r.events("wr")]
    assert ids == [100, 101, 200, 201, 202, 203, 204, 205]
    assert r.summary["accepted_wrs"] == 8
    assert list(r.summary["max_inflight_per_qp"].values()) == [8]


def test_error_completions_use_the_recorded_wr(build, tmp_path):
    # WR 302 carries a wrong rkey: the peer NAKs it and the rest flush.  The
    # provider poisons opcode and byte_len of error completions; the join
    # uses only wr_id, status and qp_num plus the polled CQ.
    r = run(build, "accounting", "obs_driver_direct", "errors", tmp_path)
    cqes = r.events("cqe")
    assert [(c["wr_id"], c["status"], c["status_name"]) for c in cqes] == [
        (300, 0, "IBV_WC_SUCCESS"),
        (301, 0, "IBV_WC_SUCCESS"),
        (302, 10, "IBV_WC_REM_ACCESS_ERR"),
        (303, 5, "IBV_WC_WR_FLUSH_ERR"),
        (304, 5, "IBV_WC_WR_FLUSH_ERR"),
    ]
    assert [(w["wr_id"], w["opcode"], w["bytes"]) for w in r.events("wr")] == [
        (300 + i, "RDMA_WRITE", 2048 + i) for i in range(5)
    ]
    s = r.summary
    assert (s["accepted_wrs"], s["joined"], s["unjoined"]) == (5, 2, 3)


def test_concurrent_posting_threads(build, tmp_path):
    # Red check: in obs_poll_cq, polling the provider outside the ledger lock
    # lets a post commit between the provider freeing SQ slots and the ledger
    # retiring them; the maximum then exceeds the send-queue depth (64) here
    # (a race: it failed on the run that verified it, 72 > 64).
    r = run(build, "accounting", "obs_driver_direct", "threads", tmp_path)
    (threads,) = r.ops("threads")
    assert threads["posted"] == threads["polled"] == 12000
    wrs = r.events("wr")
    assert len(wrs) == 12000 and len({(w["qpn"], w["wr_id"]) for w in wrs}) == 12000
    # Joined from the log itself: no WR or completion lost or duplicated.
    assert _independent_join(r) == 12000
    s = r.summary
    assert s["accepted_wrs"] == 12000
    assert len(s["max_inflight_per_qp"]) == 3
    assert all(1 <= v <= 64 for v in s["max_inflight_per_qp"].values())


def test_outstanding_parents_from_wr_ids(build, tmp_path):
    # wr_id >> 20 is the driver's (context, QP) number: one parent per QP.
    r = run(
        build, "accounting", "obs_driver_direct", "accounting", tmp_path, env={"ORBITE_OBSERVER_PARENT_SHIFT": "20"}
    )
    assert set(r.summary["max_outstanding_parents_per_qp"].values()) == {1}
    r = run(build, "accounting", "obs_driver_direct", "accounting", tmp_path, env={"ORBITE_OBSERVER_PARENT_SHIFT": "0"})
    # shift 0: every WR its own parent, so as many as WRs in flight (5).
    assert set(r.summary["max_outstanding_parents_per_qp"].values()) == {5}


def test_no_log_without_a_device(build, tmp_path):
    # A process that inherits LD_PRELOAD but never opens a device must not
    # truncate the runner's log.
    log = tmp_path / "kept.log"
    log.write_text("runner's log\n")
    env = dict(os.environ, LD_PRELOAD=str(build.lib("accounting")), ORBITE_OBSERVER_LOG=str(log))
    if build.asan_lib:
        env["LD_PRELOAD"] = f"{build.asan_lib} {build.lib('accounting')}"
    subprocess.run(["true"], env=env, check=True, timeout=30)
    assert log.read_text() == "runner's log\n"


def test_dlsym_keeps_rtld_next_relative_to_the_caller(build, tmp_path):
    # Red check: building obs_core.c with -fno-optimize-sibling-calls (or
    # adding work after `return real_dlsym_fn(handle, name);`) makes glibc see
    # the observer as the caller, and RTLD_NEXT from libnext_a finds its own
    # symbol again (1 instead of 2).
    env = dict(os.environ, LD_LIBRARY_PATH=str(build.out / "tests" / "lib"), LD_PRELOAD=str(build.lib("accounting")))
    if build.asan_lib:
        env["LD_PRELOAD"] = f"{build.asan_lib} {build.lib('accounting')}"
        env["ASAN_OPTIONS"] = "detect_leaks=0"
    done = subprocess.run(
        [str(build.tool("next_driver"))], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.stdout.strip() == "2", done.stderr


# ------------------------------------------------------------------ digests --


def test_sha256_matches_hashlib(build, tmp_path):
    # Both compression paths (SHA extensions when the CPU has them, portable
    # C) and the incremental update, against hashlib, on every length class
    # of the padding (55/56/64 bytes) and on large inputs.
    rng = random.Random(12)
    accelerated = set()
    for size in (0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 128, 1000, 4096, (1 << 20) + 7):
        data = rng.randbytes(size)
        path = tmp_path / "input"
        path.write_bytes(data)
        done = subprocess.run([str(build.tool("sha_driver")), str(path)], capture_output=True, text=True,
                              timeout=30, check=True)
        got = json.loads(done.stdout)
        want = hashlib.sha256(data).hexdigest()
        assert (got["default"], got["portable"], got["pieces"]) == (want, want, want), size
        accelerated.add(got["accelerated"])
    flags = Path("/proc/cpuinfo").read_text().split()
    assert accelerated == {1 if "sha_ni" in flags else 0}  # the fast path is the one tested where it exists


def _pattern(length):
    """What obs_driver.c's pattern() writes at offsets 0..length-1 of the peer (READ) or its own buffer (WRITE)."""
    return bytes(((i * 131 + 7) ^ (i >> 8)) & 0xFF for i in range(length))


def _digest_run(build, variant, tmp_path, driver="obs_driver_direct", env=None):
    r = run(build, "accounting", driver, variant, tmp_path, env={"ORBITE_OBSERVER_GUARD_BYTES": "1024", **(env or {})})
    (layout,) = r.ops("layout")
    slices = {s["wr_id"]: s for s in r.ops("slice")[: layout["n"]]}
    data = {d["wr_id"]: d for d in r.events("data")}
    assert r.log[0]["guard_bytes"] == 1024
    return r, layout, slices, data


def _guard_flags(slices, data, layout):
    """Flags of the windows that are guards in the layout (first slice's lead, last slice's trail), by wr_id."""
    end = {p: max(s["off"] + s["len"] for s in slices.values() if s["parent"] == p) for p in range(layout["parents"])}
    start = {p: min(s["off"] for s in slices.values() if s["parent"] == p) for p in range(layout["parents"])}
    flags = {}
    for wr_id, s in slices.items():
        mask = (1 if s["off"] == start[s["parent"]] else 0) | (2 if s["off"] + s["len"] == end[s["parent"]] else 0)
        flags[wr_id] = data[wr_id]["flags"] & mask
    return flags


@pytest.mark.parametrize(("driver", "variant"), [("obs_driver_direct", "digests"), ("obs_driver_dlopen", "digests"),
                                                 ("obs_driver_direct", "digests-iova")])
def test_digest_of_each_landed_read_range(build, driver, variant, tmp_path):
    # Red check: in obs_core.c sge_record, `s->off = g->addr - m->iova;` ->
    # `g->addr - (uintptr_t)m->va` (offsets taken in the VA, not in the
    # space the SGEs name) fails the iova variant, and only it.
    r, layout, slices, data = _digest_run(build, variant, tmp_path, driver)
    peer = _pattern(1 << 17)
    assert set(data) == set(slices) and len(r.events("data")) == layout["n"] == 6
    for wr_id, s in slices.items():
        d = data[wr_id]
        assert (d["sge"], d["off"], d["len"], d["mr_len"]) == (0, s["off"], s["len"], layout["mr_len"])
        assert d["sha256"] == hashlib.sha256(peer[s["off"]:s["off"] + s["len"]]).hexdigest(), wr_id
    assert set(_guard_flags(slices, data, layout).values()) == {0}
    # Each data event follows its successful completion.
    kinds = [(e["ev"], e.get("wr_id")) for e in r.log[1:-1]]
    for wr_id in slices:
        assert kinds.index(("data", wr_id)) == kinds.index(("cqe", wr_id)) + 1


def test_a_corrupted_byte_changes_exactly_its_range_digest(build, tmp_path):
    _r, _layout, slices, data = _digest_run(build, "digests-corrupt", tmp_path)
    peer = bytearray(_pattern(1 << 17))
    wrong = [w for w, s in slices.items()
             if data[w]["sha256"] != hashlib.sha256(peer[s["off"]:s["off"] + s["len"]]).hexdigest()]
    assert wrong == [904]  # parent 1, slice 1: the one holding the flipped byte
    s = slices[904]
    peer[s["off"] + 5] ^= 1
    assert data[904]["sha256"] == hashlib.sha256(peer[s["off"]:s["off"] + s["len"]]).hexdigest()


def test_a_guard_written_in_flight_is_flagged(build, tmp_path):
    # Red check: in sge_digest, dropping `r->a |= DATA_TRAIL_CHANGED;` fails
    # this test (the stray write goes unseen).
    _r, layout, slices, data = _digest_run(build, "digests-guard", tmp_path)
    assert _guard_flags(slices, data, layout) == {900: 0, 901: 0, 902: 2, 903: 0, 904: 0, 905: 0}
    peer = _pattern(1 << 17)
    assert all(data[w]["sha256"] == hashlib.sha256(peer[s["off"]:s["off"] + s["len"]]).hexdigest()
               for w, s in slices.items())


def test_digest_of_each_written_source_range(build, tmp_path):
    r, layout, slices, data = _digest_run(build, "digests-write", tmp_path)
    local = _pattern(layout["mr_len"])
    assert {w["opcode"] for w in r.events("wr")} == {"RDMA_WRITE"}
    for wr_id, s in slices.items():
        assert data[wr_id]["sha256"] == hashlib.sha256(local[s["off"]:s["off"] + s["len"]]).hexdigest()


def test_memory_of_a_deregistered_mr_is_not_read(build, tmp_path):
    # The local MR is deregistered (and another registered on the same
    # buffer) before the completion is polled: the range is named, not hashed.
    # Red check: in sge_digest, `if (!m || m->gen != s->gen)` -> `if (0)`
    # reads through the stale record and this test fails.
    _r, _layout, _slices, data = _digest_run(build, "digests-dereg", tmp_path)
    assert [(d["wr_id"], d["sha256"], d["flags"]) for d in data.values()] == [(900, None, 4)]


def _normalized(events):
    """Events with pointers replaced by their order of appearance (two processes, two address spaces), and
    without the window flags of slices next to other slices (those windows change as the others land)."""
    names = {}
    out = []
    for event in events[1:]:
        e = dict(event)
        for key in ("ctx", "cq"):
            if key in e:
                e[key] = names.setdefault(e[key], f"p{len(names)}")
        if e.get("ev") == "data":
            e["flags"] &= NOT_HASHED
        out.append(e)
    return out


@pytest.mark.parametrize(("tool", "scenario", "env"), [
    ("accounting", "digests", {}),
    ("accounting", "errors", {}),
    ("cq_fault", "withhold", {"ORBITE_CQ_FAULT_ARMED": "1", "ORBITE_CQ_FAULT_SKIP": "1"}),
    ("uverbs_fault", "destroy-retry", {"ORBITE_UVERBS_FAULT_KIND": "mr"}),
])
def test_binary_and_json_logs_say_the_same(build, tool, scenario, env, tmp_path):
    logs = {}
    for fmt in ("binary", "json"):
        (tmp_path / fmt).mkdir()
        r = run(build, tool, "obs_driver_direct", scenario, tmp_path / fmt,
                env={**env, "ORBITE_OBSERVER_LOG_FORMAT": fmt}, leaks=tool != "uverbs_fault")
        assert r.log[0]["format"] == fmt
        logs[fmt] = r.log
        # The tests' writer (helpers/observer_log.py, used to edit logs in the verifier's red checks)
        # gives back the observer's bytes exactly (where every device opened carried a WR: the
        # binary log names the others too, which the JSON form has no event for).
        if tool != "uverbs_fault":
            assert observer_log.encode(r.log) == (tmp_path / fmt / f"{tool}-{scenario}.log").read_bytes()
    binary, json_ = _normalized(logs["binary"]), _normalized(logs["json"])
    if tool == "uverbs_fault":  # handles are per-process descriptor numbers
        binary = [dict(e, handle=None) if e.get("ev") == "destroy" else e for e in binary]
        json_ = [dict(e, handle=None) if e.get("ev") == "destroy" else e for e in json_]
    qpns = [{e["qpn"] for e in log if "qpn" in e} for log in (binary, json_)]
    assert len(qpns[0]) == len(qpns[1])  # QPNs differ between the runs (the provider's port)
    rename = dict(zip(sorted(qpns[1]), sorted(qpns[0])))
    json_ = [dict(e, qpn=rename[e["qpn"]]) if "qpn" in e else e for e in json_]
    summary = [e for e in json_ if e.get("ev") == "summary"]
    for e in summary:
        e["max_inflight_per_qp"] = {str(rename[int(k)]): v for k, v in e["max_inflight_per_qp"].items()}
    assert binary == json_


# ------------------------------------------------------- extended verbs --


def _by_qp(events):
    """The records of a log grouped by QP ({renamed QPN or None: [record, ...]}): the order of completions of two
    QPs sharing a CQ is the provider's timing, within a QP it is the posting order. Pointers and QPNs (per
    process) are renamed by their order of appearance in the WR records (the posting order), and the window
    flags of slices next to other slices are dropped (see _normalized)."""
    names, qpns = {}, {}
    body = [dict(e) for e in events[1:]]
    for e in sorted(body, key=lambda e: e.get("ev") != "wr"):  # WR records first, in order
        for key in ("ctx", "cq"):
            if key in e:
                names.setdefault(e[key], f"p{len(names)}")
        if "qpn" in e:
            qpns.setdefault(e["qpn"], len(qpns))
    groups = {}
    for e in body:
        for key in ("ctx", "cq"):
            if key in e:
                e[key] = names[e[key]]
        if e.get("ev") == "data":
            e["flags"] &= NOT_HASHED
        if "qpn" in e:
            e["qpn"] = qpns[e["qpn"]]
        if e.get("ev") == "summary":
            for key in ("max_inflight_per_qp", "max_outstanding_parents_per_qp"):
                e[key] = {qpns[int(k)]: v for k, v in e[key].items()}
        groups.setdefault(e.get("qpn"), []).append(e)
    return groups


def _first_difference(classic, ext):
    """None when the two logs say the same, record by record (each QP's records in order); else the first
    record that differs."""
    a, b = _by_qp(classic), _by_qp(ext)
    for qpn in sorted(set(a) | set(b), key=str):
        x, y = a.get(qpn, []), b.get(qpn, [])
        for i, (r, t) in enumerate(zip(x, y)):
            if r != t:
                return f"QP {qpn} record {i + 1}: classic {r} != ext {t}"
        if len(x) != len(y):
            unmatched = (x + y)[min(len(x), len(y))]
            return f"QP {qpn}: classic has {len(x)} records, ext {len(y)}: first unmatched {unmatched}"
    return None


INFLIGHT = {"ORBITE_INFLIGHT_FAULT_ARMED": "1", "ORBITE_INFLIGHT_FAULT_BYTES": "100"}
# (tool, scenario, env) runs whose logs must not depend on the API the engine posts and polls with.
SAME_LOG = [
    ("accounting", "accounting", {}),
    ("accounting", "errors", {}),
    ("accounting", "digests", {}),
    ("accounting", "digests-write", {}),
    ("cq_fault", "withhold", {"ORBITE_CQ_FAULT_ARMED": "1", "ORBITE_CQ_FAULT_SKIP": "1"}),
    ("inflight_fault", "digests", INFLIGHT),
    ("inflight_fault", "errors", {**INFLIGHT, "ORBITE_INFLIGHT_FAULT_SKIP": "0"}),
    ("uverbs_fault", "cleanup-qp", {"ORBITE_UVERBS_FAULT_KIND": "qp", "ORBITE_UVERBS_FAULT_WITHHOLD_SKIP": "1"}),
    ("uverbs_fault", "destroy-retry", {"ORBITE_UVERBS_FAULT_KIND": "cq"}),
    ("uverbs_fault", "destroy-retry", {"ORBITE_UVERBS_FAULT_KIND": "qp"}),
]


@pytest.mark.parametrize("driver", LOADINGS)
@pytest.mark.parametrize(("tool", "scenario", "env"), SAME_LOG)
def test_extended_verbs_give_the_classic_log(build, driver, tool, scenario, env, tmp_path):
    # An engine posting with ibv_wr_* and polling with ibv_start_poll/next_poll/end_poll is seen exactly as one
    # using ibv_post_send and ibv_poll_cq: the same records in the same order (WRs, completions, withheld ones,
    # data digests, the in-flight fault, destroys), and the engine sees the same completions.
    # Red check: obs_core.c built with -DOBS_RED_NO_EXTENDED (qpx_wrap and cqx_wrap wrap nothing) fails this
    # comparison; test_an_observer_blind_to_the_extended_verbs_is_caught runs that build.
    runs = {}
    for api in ("classic", "ext"):
        runs[api] = run(build, tool, driver, scenario, tmp_path, env=env, leaks=tool != "uverbs_fault", api=api)
    assert _first_difference(runs["classic"].log, runs["ext"].log) is None
    # Something to compare: WRs and completions, or (destroy-retry, which posts nothing) destroys.
    assert [e for e in runs["ext"].log if e.get("ev") in ("wr", "destroy")]
    seen = {api: sorted((c["wr_id"], c["status"]) for c in r.ops("cqe")) for api, r in runs.items()}
    assert seen["classic"] == seen["ext"]


def test_extended_batches_are_taken_whole_or_refused_whole(build, tmp_path):
    # wr_complete refuses the batch that holds the 2-SGE WR (the 1-SGE QP): nothing of it is logged as
    # accepted, as a refused post_send logs nothing from bad_wr on; the next batch of 8 fits the queue.
    r = run(build, "accounting", "obs_driver_direct", "badwr", tmp_path, api="ext")
    assert [(p["ret"], p["bad"]) for p in r.ops("post")] == [(22, 100), (0, -1)]
    assert [w["wr_id"] for w in r.events("wr")] == list(range(200, 208))
    assert (r.summary["accepted_wrs"], r.summary["joined"]) == (8, 8)


def test_an_aborted_batch_is_never_logged_and_inline_bytes_are_named(build, tmp_path):
    # wr_abort drops its batch (900, 901 never posted); an inline WRITE's bytes were copied at the call and no
    # MR names them: logged with its bytes, its range named, not hashed.  Red check: without the batch resets
    # of obs_wr_start and obs_wr_abort (`r->n = 0;`, both), 900 and 901 are logged as accepted.
    r = run(build, "accounting", "obs_driver_direct", "abort", tmp_path, api="ext")
    assert [(w["wr_id"], w["opcode"], w["bytes"]) for w in r.events("wr")] == [
        (902, "RDMA_WRITE", 64), (903, "RDMA_READ", 1000)]
    data = {d["wr_id"]: d for d in r.events("data")}
    assert (data[902]["sha256"], data[902]["flags"], data[902]["len"]) == (None, 4, 64)
    assert data[903]["sha256"] is not None and data[903]["flags"] & NOT_HASHED == 0
    assert (r.summary["accepted_wrs"], r.summary["joined"]) == (2, 2)


def test_extended_threads_post_and_poll_concurrently(build, tmp_path):
    # Three posting threads (wr_* batches, resubmitted whole when the queue is full) and one extended poller.
    r = run(build, "accounting", "obs_driver_direct", "threads", tmp_path, api="ext")
    (threads,) = r.ops("threads")
    assert threads["posted"] == threads["polled"] == 12000
    assert len(r.events("wr")) == 12000 and _independent_join(r) == 12000
    assert all(1 <= v <= 64 for v in r.summary["max_inflight_per_qp"].values())


_PYVERBS = r"""
import json, time
import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.pd import PD
from pyverbs.mr import MR
from pyverbs.cq import CQEX, CqInitAttrEx, PollCqAttr
from pyverbs.qp import QPEx, QPCap, QPInitAttrEx, QPAttr, QP, QPInitAttr
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.wr import SGE
ctx = d.Context(name="mlx5_0")
pd = PD(ctx)
A = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
mr = MR(pd, 1 << 16, A)
cqa = CQEX(ctx, CqInitAttrEx(cqe=64, wc_flags=0))
cqb = CQEX(ctx, CqInitAttrEx(cqe=64, wc_flags=0))
cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
qa = QPEx(ctx, QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=cqa, rcq=cqa, pd=pd, cap=cap,
                             comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                             send_ops_flags=e.IBV_QP_EX_WITH_RDMA_WRITE | e.IBV_QP_EX_WITH_RDMA_READ))
qb = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cqb, rcq=cqb, cap=cap))
gid = ctx.query_gid(1, 3)
def connect(qp, dqpn):
    attr = QPAttr(qp_state=e.IBV_QPS_INIT, port_num=1)
    attr.qp_access_flags = A
    qp.to_init(attr)
    attr = QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=e.IBV_MTU_1024)
    attr.dest_qp_num = dqpn; attr.max_dest_rd_atomic = 4; attr.min_rnr_timer = 12
    attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=3), is_global=1, port_num=1)
    qp.to_rtr(attr)
    attr = QPAttr(qp_state=e.IBV_QPS_RTS)
    attr.timeout = 14; attr.retry_cnt = 7; attr.rnr_retry = 7; attr.max_rd_atomic = 4
    qp.to_rts(attr)
connect(qa, qb.qp_num); connect(qb, qa.qp_num)
mr.write(b"pyverbs-observed", 16, 0)
qa.wr_start()
qa.wr_id = 1; qa.wr_flags = e.IBV_SEND_SIGNALED
qa.wr_rdma_write(mr.rkey, mr.buf + 4096); qa.wr_set_sge(SGE(mr.buf, 16, mr.lkey))
qa.wr_id = 2
qa.wr_rdma_read(mr.rkey, mr.buf + 4096); qa.wr_set_sge(SGE(mr.buf + 8192, 16, mr.lkey))
qa.wr_complete()
seen = []
for _ in range(20000):
    if len(seen) == 2:
        break
    if cqa.start_poll(PollCqAttr()) == 2:  # ENOENT
        time.sleep(0.001); continue
    seen.append((cqa.wr_id, cqa.status))
    cqa.end_poll()
print(json.dumps({"seen": seen, "qpn": qa.qp_num}))
for o in (qa, qb, cqa, cqb, mr, pd, ctx):
    o.close()
"""


def test_pyverbs_extended_verbs_are_observed(build, tmp_path):
    # The system's pyverbs: Cython modules linked to libibverbs that Python dlopens RTLD_LOCAL (libibverbs never
    # global), posting with QPEx's wr_* and polling a CQEX asked for no QP numbers.  Both WRs are logged,
    # joined and hashed.  Red check: without obs_real's RTLD_NOLOAD fallback the Context open fails (ENOSYS).
    system_python = "/usr/bin/python3"
    if build.asan_lib or subprocess.run([system_python, "-c", "import pyverbs.qp"], capture_output=True,
                                        check=False).returncode:
        pytest.skip("needs the system python3 with pyverbs (python3-pyverbs), without the sanitizer build")
    log = tmp_path / "accounting.jsonl"
    env = dict(os.environ, LD_LIBRARY_PATH=str(build.out / "provider"), ORBITE_PROVIDER_ROOT=str(build.host),
               ORBITE_OBSERVER_LOG=str(log), LD_PRELOAD=str(build.lib("accounting")))
    done = subprocess.run([system_python, "-c", _PYVERBS], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["seen"] == [[1, 0], [2, 0]]
    events = observer_log.read(log)
    for obj in events:
        _validate_log_line(obj)
    assert [(w["qpn"], w["wr_id"], w["opcode"], w["bytes"]) for w in events if w.get("ev") == "wr"] == [
        (got["qpn"], 1, "RDMA_WRITE", 16), (got["qpn"], 2, "RDMA_READ", 16)]
    assert [(c["qpn"], c["wr_id"]) for c in events if c.get("ev") == "cqe"] == [(got["qpn"], 1), (got["qpn"], 2)]
    data = [d["sha256"] for d in events if d.get("ev") == "data"]
    assert data == [hashlib.sha256(b"pyverbs-observed").hexdigest()] * 2
    assert (events[-1]["accepted_wrs"], events[-1]["joined"]) == (2, 2)


@pytest.fixture(scope="module")
def blind_build(tmp_path_factory, host):
    """The observers built with the extended wrapping skipped (the red check of the equality test)."""
    out = tmp_path_factory.mktemp("obs-blind")
    done = subprocess.run(["make", "-s", "-C", str(OBSERVERS), f"OUT={out}", "OBS_CFLAGS=-DOBS_RED_NO_EXTENDED",
                           "tests"], capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    return Build(out, None, host)


def test_an_observer_blind_to_the_extended_verbs_is_caught(blind_build, tmp_path):
    # The equality check of test_extended_verbs_give_the_classic_log names the first record the blind build
    # misses: the first accepted WR (an ext post it never saw).
    runs = {api: run(blind_build, "accounting", "obs_driver_direct", "errors", tmp_path, api=api)
            for api in ("classic", "ext")}
    difference = _first_difference(runs["classic"].log, runs["ext"].log)
    assert difference is not None and "{'ev': 'wr'" in difference.split("!=")[0], difference
    assert runs["ext"].events("wr") == [] and runs["ext"].summary["accepted_wrs"] == 0


def test_guard_size_and_format_settings_are_checked(build, tmp_path):
    r = run(build, "accounting", "obs_driver_direct", "digests", tmp_path,
            env={"ORBITE_OBSERVER_GUARD_BYTES": "4k", "ORBITE_OBSERVER_LOG_FORMAT": "xml"})
    assert "ORBITE_OBSERVER_GUARD_BYTES=4k is not an integer" in r.stderr
    assert "ORBITE_OBSERVER_LOG_FORMAT=xml is not json or binary" in r.stderr
    assert (r.log[0]["guard_bytes"], r.log[0]["format"]) == (4096, "json")  # the documented guard, the default
    r = run(build, "cq_fault", "obs_driver_direct", "withhold", tmp_path)
    assert (r.log[0]["digest"], r.log[0]["guard_bytes"]) == (None, 0) and r.events("data") == []


@pytest.mark.parametrize(("name", "fmt", "wanted", "warned"), [
    ("observer-accounting.bin", "", "binary", False),  # no format set: the name says it
    ("observer-accounting.jsonl", "", "json", False),
    ("observer-accounting.bin", "json", "json", True),  # the setting wins, the disagreement is named
])
def test_the_log_name_gives_the_format_unless_one_is_set(build, tmp_path, name, fmt, wanted, warned):
    log = tmp_path / name
    r = run(build, "accounting", "obs_driver_direct", "digests", tmp_path,
            env={"ORBITE_OBSERVER_LOG": str(log), "ORBITE_OBSERVER_LOG_FORMAT": fmt})
    header = json.loads(log.read_bytes().split(b"\n", 1)[0])
    assert header["format"] == wanted
    assert observer_log.decode(log.read_bytes())[-1]["ev"] == "summary"
    assert ("names a binary log, ORBITE_OBSERVER_LOG_FORMAT says json" in r.stderr) == warned


# ----------------------------------------------------------------- cq_fault --


@pytest.mark.parametrize("driver", LOADINGS)
def test_cq_fault_withholds_successful_payload_completions(build, driver, tmp_path):
    # Red check (withhold): in obs_poll_cq, deleting `drop = 1;` hands every
    # withheld completion to the engine: 502, 504 and 600 show up below.  It
    # fails exactly these two variants and the qp-selector test.
    env = {"ORBITE_CQ_FAULT_ARMED": "1", "ORBITE_CQ_FAULT_SKIP": "1"}
    r = run(build, "cq_fault", driver, "withhold", tmp_path, env=env)
    seen = [(c["wr_id"], c["status"]) for c in r.ops("cqe")]
    withheld = [w["wr_id"] for w in r.events("withheld")]
    assert withheld == [502, 504, 600]
    # Never reappearing: the driver polled dozens of times after, and the
    # provider's send queue shows them consumed (checked in the driver with
    # orbite_provider_qp_outstanding).  601 fails because the driver moved
    # the peer QP to ERR (nobody answers), 602 is flushed.
    assert not set(withheld) & {w for w, _ in seen}
    # SEND completions (not payload), the skipped first READ and error
    # completions all pass unchanged.
    assert seen == [(500, 0), (501, 0), (503, 0), (505, 0), (601, 12), (602, 5)]
    assert [(c["wr_id"], c["status"]) for c in r.events("cqe")] == seen
    assert r.summary["accepted_wrs"] == 6


def test_cq_fault_limit_and_disarmed(build, tmp_path):
    r = run(
        build,
        "cq_fault",
        "obs_driver_direct",
        "withhold",
        tmp_path,
        env={"ORBITE_CQ_FAULT_ARMED": "1", "ORBITE_CQ_FAULT_LIMIT": "1"},
    )
    assert [w["wr_id"] for w in r.events("withheld")] == [500]
    r = run(build, "cq_fault", "obs_driver_direct", "withhold", tmp_path)
    assert r.events("withheld") == []
    assert "not armed" in r.stderr
    r = run(
        build,
        "cq_fault",
        "obs_driver_direct",
        "withhold",
        tmp_path,
        env={"ORBITE_CQ_FAULT_ARMED": "1", "ORBITE_CQ_FAULT_SKIP": "many"},
    )
    assert r.events("withheld") == []
    assert "ORBITE_CQ_FAULT_SKIP=many" in r.stderr


def test_cq_fault_repeats_its_window(build, tmp_path):
    """REPEAT: pass SKIP, withhold LIMIT, and again (one lost round per generation of a long-lived
    requester, docs/lost_completion.md). Red check: without the reset in cq_fault_withhold only 502 is
    withheld."""
    env = {"ORBITE_CQ_FAULT_ARMED": "1", "ORBITE_CQ_FAULT_SKIP": "1", "ORBITE_CQ_FAULT_LIMIT": "1",
           "ORBITE_CQ_FAULT_REPEAT": "1"}
    r = run(build, "cq_fault", "obs_driver_direct", "withhold", tmp_path, env=env)
    assert [w["wr_id"] for w in r.events("withheld")] == [502, 600]
    r = run(build, "cq_fault", "obs_driver_direct", "withhold", tmp_path,
            env={"ORBITE_CQ_FAULT_ARMED": "1", "ORBITE_CQ_FAULT_REPEAT": "1"})
    assert r.events("withheld") == []
    assert "ORBITE_CQ_FAULT_REPEAT=1 needs ORBITE_CQ_FAULT_LIMIT > 0" in r.stderr


# ------------------------------------------------------------- uverbs_fault --


# What a destroy that failed leaves busy, as the kernel checks it (the
# provider's EBUSY table, docs/provider.md): a QP keeps its CQ and PD, a CQ
# its channel, an MR or a window its PD; a kept CQ keeps its channel in turn.
BLOCKS = {"qp": ("cq", "pd"), "cq": ("channel",), "mr": ("pd",), "mw": ("pd",), "channel": (), "pd": ()}


def _kept_busy(kind):
    """Every kind left alive (errno EBUSY) when the `kind` object's destroy failed."""
    busy, todo = [], list(BLOCKS[kind])
    while todo:
        k = todo.pop(0)
        if k not in busy:
            busy.append(k)
            todo.extend(BLOCKS[k])
    return busy


def _expected_failures(kind, dev, index, retry=False):
    """{(kind, dev, index, retry): errno} of the destroy scenario when one object's destroy fails."""
    expected = {(kind, dev, index, False): 5}
    if retry:
        expected[(kind, dev, index, True)] = 5  # the object stays failed
    for k in _kept_busy(kind):
        expected[(k, dev, index, False)] = 16
        if retry:
            expected[(k, dev, index, True)] = 16
    return expected


def _destroy_results(r):
    return {(d["kind"], d["dev"], d["index"], d["retry"]): d["ret"] for d in r.ops("destroy")}


@pytest.mark.parametrize("style", ["ioctl", "invoke_write", "write"])
@pytest.mark.parametrize("kind", KINDS)
def test_uverbs_fault_fails_exactly_the_selected_destroy(build, kind, style, tmp_path):
    # Red check (EIO): in uverbs_fault.c handle_one, deleting
    # `resp.error = -err;` answers the selected destroy with success: it
    # returns 0, and this test fails for every kind and style, as does every
    # other test that expects an injected EIO (and only those).
    env = {
        "ORBITE_UVERBS_FAULT_KIND": kind,
        "ORBITE_UVERBS_FAULT_OCCURRENCE": "2",
        "ORBITE_PROVIDER_CMD": style,
    }
    r = run(build, "uverbs_fault", "obs_driver_direct", "destroy", tmp_path, env=env, leaks=False)
    results = _destroy_results(r)
    assert len(results) == 24
    failed = {k: v for k, v in results.items() if v}
    # The second destroy of the kind is device 0's object 1; what it keeps
    # busy fails with the real EBUSY, no fault.
    assert failed == _expected_failures(kind, 0, 1)
    events = r.events("destroy")
    injected = [e for e in events if e["injected"]]
    assert len(injected) == 1
    assert (injected[0]["kind"], injected[0]["errno"], injected[0]["retry"]) == (kind, 5, False)
    assert all(e["errno"] == 0 and not e["retry"] for e in events if not e["injected"])
    # Every destroy command that reached a watched descriptor was seen: in
    # write style only the first context's descriptor is inspected
    # (ORBITE_UVERBS_FAULT_WRITES=first), and close() only for `channel`.
    seen = Counter(e["kind"] for e in events)
    for k in KINDS:
        if k == "channel":
            want = 4 if kind == "channel" else 0
        else:
            want = 2 if style == "write" else 4
        assert seen[k] == want, (k, seen)
    held = r.ops("held")[-1]
    assert held[kind] == 1 and all(held[k] == 1 for k in _kept_busy(kind))
    assert sum(held[k] for k in ("pd", "mr", "mw", "cq", "channel", "qp")) == 1 + len(_kept_busy(kind))


def test_uverbs_fault_write_path_on_every_descriptor(build, tmp_path):
    env = {
        "ORBITE_UVERBS_FAULT_KIND": "pd",
        "ORBITE_UVERBS_FAULT_OCCURRENCE": "3",
        "ORBITE_UVERBS_FAULT_WRITES": "all",
        "ORBITE_PROVIDER_CMD": "write",
    }
    r = run(build, "uverbs_fault", "obs_driver_direct", "destroy", tmp_path, env=env, leaks=False)
    assert {k: v for k, v in _destroy_results(r).items() if v} == {("pd", 1, 0, False): 5}
    assert Counter(e["kind"] for e in r.events("destroy")) == Counter({"qp": 4, "mw": 4, "mr": 4, "cq": 4, "pd": 4})


@pytest.mark.parametrize("driver", LOADINGS)
@pytest.mark.parametrize("kind", ["qp", "mr", "channel"])
def test_uverbs_fault_records_a_retry_as_violation(build, driver, kind, tmp_path):
    # Red check: in uverbs_fault.c decide(), `retry = is_failed(fd, kind,
    # handle);` -> `... && 0;` lets the retried QP/MR destroy through,
    # unrecorded: exactly the qp and mr variants fail.  A channel retry never
    # reaches a syscall (libibverbs freed the channel); the interposed
    # ibv_destroy_comp_channel records it.
    env = {"ORBITE_UVERBS_FAULT_KIND": kind}
    r = run(build, "uverbs_fault", driver, "destroy-retry", tmp_path, env=env, leaks=False)
    results = _destroy_results(r)
    assert results[(kind, 0, 0, False)] == 5
    assert results[(kind, 0, 0, True)] == 5  # the object stays failed
    assert {k: v for k, v in results.items() if v} == _expected_failures(kind, 0, 0, retry=True)
    injected = [(e["kind"], e["retry"]) for e in r.events("destroy") if e["injected"]]
    assert injected == [(kind, False), (kind, True)]
    first, again = (e for e in r.events("destroy") if e["injected"])
    assert first["handle"] == again["handle"]
    assert r.ops("held")[-1][kind] == 1


def test_uverbs_fault_qp_withholds_one_completion_then_fails_destroy(build, tmp_path):
    env = {"ORBITE_UVERBS_FAULT_KIND": "qp", "ORBITE_UVERBS_FAULT_WITHHOLD_SKIP": "1"}
    r = run(build, "uverbs_fault", "obs_driver_dlopen", "cleanup-qp", tmp_path, env=env, leaks=False)
    assert [w["wr_id"] for w in r.events("withheld")] == [701]
    assert [c["wr_id"] for c in r.ops("cqe")] == [700, 702]
    assert r.ops("destroy")[0]["ret"] == 5
    assert r.ops("quarantined")
    assert [(e["kind"], e["injected"]) for e in r.events("destroy")] == [("qp", True)]


def test_uverbs_fault_refuses_to_arm_with_disassoc_destroy(build, tmp_path):
    env = {"ORBITE_UVERBS_FAULT_KIND": "qp", "RDMAV_ALLOW_DISASSOC_DESTROY": "1"}
    r = run(build, "uverbs_fault", "obs_driver_direct", "cleanup-qp", tmp_path, env=env)
    assert "refusing to arm: RDMAV_ALLOW_DISASSOC_DESTROY is set" in r.stderr
    assert r.ops("destroy")[0]["ret"] == 0
    assert r.events("destroy") == [] and r.events("withheld") == []
    # the verifier's witness of why no fault came (cleanup.fault names it), logged once whatever the contexts
    assert r.events("not_armed") == [{"ev": "not_armed", "reason": "RDMAV_ALLOW_DISASSOC_DESTROY is set"}]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ORBITE_UVERBS_FAULT_KIND": "srq"}, "ORBITE_UVERBS_FAULT_KIND=srq is not one of"),
        ({}, "ORBITE_UVERBS_FAULT_KIND=(unset)"),
        ({"ORBITE_UVERBS_FAULT_KIND": "qp", "ORBITE_UVERBS_FAULT_OCCURRENCE": "0"}, "OCCURRENCE=0 is not an integer"),
    ],
)
def test_uverbs_fault_bad_selection_is_named_and_not_armed(build, env, message, tmp_path):
    r = run(build, "uverbs_fault", "obs_driver_direct", "cleanup-qp", tmp_path, env=env)
    assert message in r.stderr
    assert r.ops("destroy")[0]["ret"] == 0
    (refused,) = r.events("not_armed")
    assert refused["reason"].startswith("ORBITE_UVERBS_FAULT_")


def test_uverbs_fault_device_selector(build, tmp_path):
    env = {"ORBITE_UVERBS_FAULT_KIND": "mr", "ORBITE_UVERBS_FAULT_DEV": "mlx5_1"}
    r = run(build, "uverbs_fault", "obs_driver_direct", "destroy", tmp_path, env=env, leaks=False)
    assert {k: v for k, v in _destroy_results(r).items() if v} == _expected_failures("mr", 1, 0)
    # Only the selected device's descriptor is watched.
    assert Counter(e["kind"] for e in r.events("destroy"))["mr"] == 2
