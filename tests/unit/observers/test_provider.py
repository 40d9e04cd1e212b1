"""Loopback verbs provider (observers/provider, issue 12): a stand-in libibverbs.so.1 doing RC RDMA in user space.

Builds the provider, the observers and the C test driver twice (plain, and AddressSanitizer +
UBSan), writes two fake hosts with fake_sysfs (GIDs on 127.0.1.x and 127.0.2.x), and runs the
driver as two processes, one per fake host: a server that owns memory and a client that runs one
scenario and checks every byte itself.  The observers preloaded here are the real ones
(liborbite_*.so), so their logs witness what the provider really completed.  Loopback addresses
and ephemeral ports only: no fixed port, so nothing collides with a simulated lab.
"""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import observer_log
from helpers.native import HELD_KINDS, SANITIZER_MARKS, libasan, verbs_headers_missing, write_provider_host
from helpers.paths import REPO


OBSERVERS = REPO / "observers"
HELD = HELD_KINDS
# ibv_wc_status / ibv_qp_state values the driver reports
SUCCESS, LOC_LEN_ERR, LOC_PROT_ERR, WR_FLUSH_ERR = 0, 1, 4, 5
REM_INV_REQ_ERR, REM_ACCESS_ERR, RETRY_EXC_ERR, RNR_RETRY_EXC_ERR = 9, 10, 12, 13
QPS_RTS, QPS_ERR = 3, 6
EIO, EBUSY, ENOMEM = 5, 16, 12


_MISSING = verbs_headers_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"the provider cannot be built: {_MISSING}")


class Build:
    def __init__(self, out, asan_lib):
        self.out = Path(out)
        self.asan_lib = asan_lib
        self.provider = self.out / "provider"
        self.driver = self.provider / "tests" / "prov_driver"

    def observer(self, tool):
        return self.out / f"liborbite_{tool}.so"


@pytest.fixture(scope="module", params=["plain", "asan"])
def build(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("prov") / request.param
    args = ["make", "-s", "-C", str(OBSERVERS), f"OUT={out}", "provider-tests"]
    asan_lib = None
    if request.param == "asan":
        asan_lib = libasan()
        if asan_lib is None:
            pytest.skip("libasan is not installed (gcc's AddressSanitizer runtime)")
        args.append("SAN=1")
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return Build(out, asan_lib)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    out = tmp_path_factory.mktemp("prov-plain")
    done = subprocess.run(
        ["make", "-s", "-C", str(OBSERVERS), f"OUT={out}", "provider-tests"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return Build(out, None)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    base = tmp_path_factory.mktemp("hosts")
    return (write_provider_host(base / "sim-a", 0, "sim-a"), write_provider_host(base / "sim-b", 1, "sim-b"))


# ----------------------------------------------------------------- running --


class Pair:
    def __init__(self, client, server, stderr, log):
        self.client = client
        self.server = server
        self.stderr = stderr
        self.log = log

    def ops(self, op):
        return [line for line in self.client if line["op"] == op]

    def one(self, op, **match):
        found = [x for x in self.ops(op) if all(x.get(k) == v for k, v in match.items())]
        assert len(found) == 1, (op, match, self.client)
        return found[0]

    def events(self, ev):
        return [e for e in self.log if e.get("ev") == ev]


def _env(build, root, preload=(), extra=None, leaks=True):
    env = dict(os.environ, LD_LIBRARY_PATH=str(build.provider), ORBITE_PROVIDER_ROOT=str(root))
    for key in list(env):
        faults = ("ORBITE_UVERBS_FAULT", "ORBITE_CQ_FAULT", "ORBITE_INFLIGHT_FAULT", "ORBITE_PROVIDER_")
        if key.startswith(faults) and key != "ORBITE_PROVIDER_ROOT":
            del env[key]
    env.pop("LD_PRELOAD", None)
    preload = [str(build.observer(tool)) for tool in preload]
    if build.asan_lib:
        # The sanitizer runtime must come first in the process.
        preload.insert(0, build.asan_lib)
        env["ASAN_OPTIONS"] = f"detect_leaks={1 if leaks else 0}:exitcode=23"
        env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    env.update(extra or {})
    return env


def run_pair(build, hosts, tmp_path, scenario, *args, preload=(), client_env=None, server_env=None, leaks=True):
    """Server on host A, client (the requester) on host B; both must end cleanly."""
    rendezvous = tmp_path / f"rv-{scenario}"
    log = tmp_path / f"observer-{scenario}.log"
    cenv = dict(client_env or {})
    if preload:
        cenv.setdefault("ORBITE_OBSERVER_LOG", str(log))
    server = subprocess.Popen(
        [str(build.driver), "server", str(rendezvous), "mlx5_0"],
        env=_env(build, hosts[0], extra=server_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        client = subprocess.run(
            [str(build.driver), "client", str(rendezvous), "mlx5_0", scenario, *args],
            env=_env(build, hosts[1], preload, cenv, leaks),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        sout, serr = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    for mark in SANITIZER_MARKS:
        assert mark not in client.stderr, client.stderr
        assert mark not in serr, serr
    assert client.returncode == 0, client.stderr
    assert server.returncode == 0, serr
    lines = [json.loads(x) for x in client.stdout.splitlines()]
    assert lines[-1] == {"op": "done"}
    assert [json.loads(x) for x in sout.splitlines()] == [{"op": "done"}]
    events = observer_log.decode(log.read_bytes()) if log.exists() else []
    return Pair(lines, sout, client.stderr, events)


# -------------------------------------------------------------------- build --


def test_make_builds_an_abi_compatible_libibverbs(plain):
    lib = plain.provider / "libibverbs.so.1"
    dyn = subprocess.run(["readelf", "-d", "-W", str(lib)], capture_output=True, text=True, check=True).stdout
    assert "Library soname: [libibverbs.so.1]" in dyn
    needed = [line for line in dyn.splitlines() if "(NEEDED)" in line]
    assert needed and not [line for line in needed if "libibverbs" in line]  # never loads the real one
    syms = subprocess.run(["objdump", "-T", str(lib)], capture_output=True, text=True, check=True).stdout
    exported = {tuple(line.split()[-2:]) for line in syms.splitlines() if " DF .text" in line}
    # The default versions of rdma-core's libibverbs: programs built against it load this one.
    for version, name in (
        ("IBVERBS_1.1", "ibv_open_device"),
        ("IBVERBS_1.1", "ibv_reg_mr"),
        ("IBVERBS_1.0", "ibv_create_comp_channel"),
        ("IBVERBS_1.8", "ibv_reg_mr_iova2"),
        ("IBVERBS_1.11", "_ibv_query_gid_ex"),
        ("IBVERBS_PRIVATE_34", "ibv_query_gid_type"),
        ("ORBITE_PROVIDER_1", "orbite_provider_held"),
        ("ORBITE_PROVIDER_1", "orbite_ibv_post_send"),
    ):
        assert (version, name) in exported, (version, name)


# ------------------------------------------------------------------- ctypes --

_CTYPES_SMOKE = textwrap.dedent(
    """
    import ctypes, json, os, sys
    lib = ctypes.CDLL("libibverbs.so.1", use_errno=True)
    vp = ctypes.c_void_p
    lib.ibv_get_device_list.restype = ctypes.POINTER(vp)
    lib.ibv_get_device_name.restype = ctypes.c_char_p
    lib.ibv_get_device_name.argtypes = [vp]
    lib.ibv_open_device.restype = vp
    lib.ibv_open_device.argtypes = [vp]
    lib.ibv_close_device.argtypes = [vp]
    lib.ibv_alloc_pd.restype = vp
    lib.ibv_alloc_pd.argtypes = [vp]
    lib.ibv_dealloc_pd.argtypes = [vp]
    lib.ibv_reg_mr.restype = vp
    lib.ibv_reg_mr.argtypes = [vp, vp, ctypes.c_size_t, ctypes.c_int]
    lib.ibv_dereg_mr.argtypes = [vp]
    lib.ibv_query_gid.argtypes = [vp, ctypes.c_uint8, ctypes.c_int, ctypes.c_char * 16]
    lib.ibv_get_device_guid.restype = ctypes.c_uint64
    lib.ibv_get_device_guid.argtypes = [vp]
    lib.orbite_provider_held.restype = ctypes.c_long
    lib.orbite_provider_held.argtypes = [ctypes.c_char_p]
    held = lambda: {k: lib.orbite_provider_held(k.encode()) for k in
                    ("ctx", "pd", "mr", "mw", "cq", "channel", "qp")}
    lib.orbite_provider_key_query.restype = ctypes.c_long
    lib.orbite_provider_key_query.argtypes = [vp, ctypes.c_uint32, ctypes.c_char_p]
    query = lambda key: [lib.orbite_provider_key_query(ctx, key, w) for w in (b"kind", b"windows", b"length")]

    class MR(ctypes.Structure):  # struct ibv_mr
        _fields_ = [("context", vp), ("pd", vp), ("addr", vp), ("length", ctypes.c_size_t),
                    ("handle", ctypes.c_uint32), ("lkey", ctypes.c_uint32), ("rkey", ctypes.c_uint32)]

    n = ctypes.c_int()
    devs = lib.ibv_get_device_list(ctypes.byref(n))
    names = [lib.ibv_get_device_name(devs[i]).decode() for i in range(n.value)]
    guid = lib.ibv_get_device_guid(devs[0])
    ctx = lib.ibv_open_device(devs[0])
    lib.ibv_free_device_list(devs)
    gid = (ctypes.c_char * 16)()
    assert lib.ibv_query_gid(ctx, 1, 3, gid) == 0
    pd = lib.ibv_alloc_pd(ctx)
    buf = ctypes.create_string_buffer(1 << 16)
    mr = lib.ibv_reg_mr(pd, ctypes.addressof(buf), len(buf), 1 | 2 | 4)
    m = MR.from_address(mr)
    during = held()
    bad = lib.ibv_reg_mr(pd, ctypes.addressof(buf), len(buf), 2)  # REMOTE_WRITE without LOCAL_WRITE
    bad_errno = ctypes.get_errno()
    key_live = query(m.lkey)
    assert lib.ibv_dereg_mr(mr) == 0
    key_released = query(m.lkey)
    assert lib.ibv_dealloc_pd(pd) == 0 and lib.ibv_close_device(ctx) == 0
    print(json.dumps({"key_live": key_live, "key_released": key_released,
                      "names": names, "guid": guid, "gid": bytes(gid).hex(), "lkey": m.lkey, "rkey": m.rkey,
                      "length": m.length, "addr_ok": m.addr == ctypes.addressof(buf),
                      "held_during": during, "held_after": held(), "bad": bad, "bad_errno": bad_errno}))
    """
)


def test_ctypes_opens_a_device_and_registers_memory(plain, hosts):
    """How the simulated runner will drive the provider: ctypes, nothing compiled."""
    done = subprocess.run(
        [sys.executable, "-c", _CTYPES_SMOKE],
        env=_env(plain, hosts[0]),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["names"] == ["mlx5_0", "mlx5_1"]
    # node GUID 0c42:a103:0000:0010 from sysfs, big-endian in memory
    assert got["guid"].to_bytes(8, "little").hex() == "0c42a10300000010"
    assert got["gid"] == "00000000000000000000ffff7f00010a"  # ::ffff:127.0.1.10, RoCE v2 slot 3
    assert got["lkey"] == got["rkey"] != 0 and got["length"] == 1 << 16 and got["addr_ok"]
    assert got["held_during"] == {"ctx": 1, "pd": 1, "mr": 1, "mw": 0, "cq": 0, "channel": 0, "qp": 0}
    assert got["held_after"] == dict.fromkeys(HELD, 0)
    assert got["bad"] is None and got["bad_errno"] == 22
    # orbite_provider_key_query: the key domain answers for the live MR (kind 1, no window, its length), not after
    assert got["key_live"] == [1, 0, 1 << 16] and got["key_released"] == [0, -1, -1]


def test_a_device_whose_gid_addresses_are_not_local_names_them(plain, tmp_path):
    """198.51.100.x is not configured here: creating a QP fails with EADDRNOTAVAIL and says why."""
    root = write_provider_host(tmp_path / "far", 5, "far", address=lambda k: f"198.51.100.{200 + k}")
    script = textwrap.dedent(
        """
        import ctypes
        lib = ctypes.CDLL("libibverbs.so.1", use_errno=True)
        vp = ctypes.c_void_p
        signatures = {
            "ibv_get_device_list": (ctypes.POINTER(vp), [vp]),
            "ibv_open_device": (vp, [vp]),
            "ibv_alloc_pd": (vp, [vp]),
            "ibv_create_cq": (vp, [vp, ctypes.c_int, vp, vp, ctypes.c_int]),
            "ibv_create_qp": (vp, [vp, vp]),
        }
        for name, (res, args) in signatures.items():
            getattr(lib, name).restype, getattr(lib, name).argtypes = res, args
        ctx = lib.ibv_open_device(lib.ibv_get_device_list(None)[0])
        pd = lib.ibv_alloc_pd(ctx)
        cq = lib.ibv_create_cq(ctx, 16, None, None, 0)
        attr = (ctypes.c_uint8 * 64)()
        ctypes.c_void_p.from_buffer(attr, 8).value = cq   # send_cq
        ctypes.c_void_p.from_buffer(attr, 16).value = cq  # recv_cq
        ctypes.c_uint32.from_buffer(attr, 32).value = 4   # cap.max_send_wr
        ctypes.c_uint32.from_buffer(attr, 36).value = 4   # cap.max_recv_wr
        ctypes.c_uint32.from_buffer(attr, 40).value = 1
        ctypes.c_uint32.from_buffer(attr, 44).value = 1
        ctypes.c_int.from_buffer(attr, 52).value = 2      # IBV_QPT_RC
        qp = lib.ibv_create_qp(pd, attr)
        print(qp, ctypes.get_errno())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=_env(plain, root), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "99"]  # EADDRNOTAVAIL
    assert "mlx5_0" in done.stderr and "198.51.100.200" in done.stderr and "add them to lo" in done.stderr


def test_real_pyverbs_runs_on_the_provider(plain, hosts):
    """ABI check with a real rdma-core consumer: the system's pyverbs (Cython, linked to libibverbs)."""
    system_python = "/usr/bin/python3"
    if (
        not os.path.exists(system_python)
        or subprocess.run([system_python, "-c", "import pyverbs.device"], capture_output=True, check=False).returncode
    ):
        pytest.skip("the system python3 has no pyverbs (Debian python3-pyverbs)")
    script = textwrap.dedent(
        """
        import json
        import pyverbs.device as d
        import pyverbs.enums as e
        from pyverbs.pd import PD
        from pyverbs.mr import MR
        from pyverbs.cq import CQ, CompChannel
        from pyverbs.qp import QP, QPCap, QPInitAttr
        names = [x.name.decode() for x in d.get_device_list()]
        ctx = d.Context(name="mlx5_1")
        port = ctx.query_port(1)
        pd = PD(ctx)
        mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ)
        ch = CompChannel(ctx)
        cq = CQ(ctx, 16, None, ch, 0)
        qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(max_send_wr=8, max_recv_wr=8)))
        out = {"names": names, "state": port.state, "link_layer": port.link_layer, "gid": str(ctx.query_gid(1, 3)),
               "gid_type": ctx.query_gid_type(1, 3), "lkey": mr.lkey, "qpn": qp.qp_num, "qp_state": qp.qp_state}
        for obj in (qp, cq, ch, mr, pd, ctx):
            obj.close()
        print(json.dumps(out))
        """
    )
    done = subprocess.run(
        [system_python, "-c", script],
        env=_env(plain, hosts[0]),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["names"] == ["mlx5_0", "mlx5_1"]
    assert (got["state"], got["link_layer"]) == (4, 2)  # ACTIVE, Ethernet
    assert got["gid"] == "0000:0000:0000:0000:0000:ffff:7f00:010b" and got["gid_type"] == 1  # RoCE v2
    assert got["lkey"] != 0 and got["qpn"] >> 8 > 0 and got["qp_state"] == 0  # RESET


_PYVERBS_EXTENDED = r"""
import json, time
import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.pd import PD
from pyverbs.mr import MR
from pyverbs.cq import CQEX, CqInitAttrEx
from pyverbs.qp import QPEx, QPCap, QPInitAttrEx, QPAttr, QP, QPInitAttr
from pyverbs.srq import SRQ, SrqInitAttr, SrqAttr
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.wr import SGE, RecvWR
ctx = d.Context(name="mlx5_0")
dx = ctx.query_device_ex()
pd = PD(ctx)
A = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_ATOMIC
mr = MR(pd, 1 << 16, A)
flags = e.IBV_WC_EX_WITH_BYTE_LEN | e.IBV_WC_EX_WITH_QP_NUM | e.IBV_WC_EX_WITH_SRC_QP | e.IBV_WC_EX_WITH_IMM
cqa = CQEX(ctx, CqInitAttrEx(cqe=64, wc_flags=flags))
cqb = CQEX(ctx, CqInitAttrEx(cqe=64, wc_flags=flags))
srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=8, max_sge=1)))
ops = (e.IBV_QP_EX_WITH_RDMA_WRITE | e.IBV_QP_EX_WITH_SEND | e.IBV_QP_EX_WITH_RDMA_READ |
       e.IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
qa = QPEx(ctx, QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=cqa, rcq=cqa, pd=pd, cap=cap,
                             comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                             send_ops_flags=ops))
qb = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cqb, rcq=cqb, srq=srq, cap=cap))
gid = ctx.query_gid(1, 3)
def connect(qp, dqpn):
    gr = GlobalRoute(dgid=gid, sgid_index=3)
    ah = AHAttr(gr=gr, is_global=1, port_num=1)
    attr = QPAttr(qp_state=e.IBV_QPS_INIT, port_num=1)
    attr.qp_access_flags = A
    qp.to_init(attr)
    attr = QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=e.IBV_MTU_1024)
    attr.dest_qp_num = dqpn; attr.ah_attr = ah; attr.max_dest_rd_atomic = 4; attr.min_rnr_timer = 12
    qp.to_rtr(attr)
    attr = QPAttr(qp_state=e.IBV_QPS_RTS)
    attr.timeout = 14; attr.retry_cnt = 7; attr.rnr_retry = 7; attr.max_rd_atomic = 4
    qp.to_rts(attr)
connect(qa, qb.qp_num); connect(qb, qa.qp_num)
mr.write(b"hello-extended!!", 16, 0)
def poll(cq):
    from pyverbs.cq import PollCqAttr
    for _ in range(20000):
        if cq.start_poll(PollCqAttr()) == 2:  # ENOENT: nothing to read, no end_poll
            time.sleep(0.001); continue
        r = dict(wr_id=cq.wr_id, status=cq.status, opcode=cq.read_opcode(), byte_len=cq.read_byte_len(),
                 qp_num=cq.read_qp_num())
        cq.end_poll()
        return r
    raise SystemExit("no completion")
qa.wr_start(); qa.wr_id = 1; qa.wr_flags = e.IBV_SEND_SIGNALED
qa.wr_rdma_write(mr.rkey, mr.buf + 4096); qa.wr_set_sge(SGE(mr.buf, 16, mr.lkey)); qa.wr_complete()
w1 = poll(cqa)
srq.post_recv(RecvWR(wr_id=77, num_sge=1, sg=[SGE(mr.buf + 8192, 64, mr.lkey)]))
qa.wr_start(); qa.wr_id = 2; qa.wr_send(); qa.wr_set_sge(SGE(mr.buf, 16, mr.lkey)); qa.wr_complete()
w2 = poll(cqa); wb = poll(cqb)
mr.write((41).to_bytes(8, "little"), 8, 12288)
qa.wr_start(); qa.wr_id = 3; qa.wr_atomic_fetch_add(mr.rkey, mr.buf + 12288, 1)
qa.wr_set_sge(SGE(mr.buf + 16384, 8, mr.lkey)); qa.wr_complete()
w3 = poll(cqa)
print(json.dumps(dict(ports_ex=dx.phys_port_cnt_ex, atomic=dx.orig_attr.atomic_caps, w1=w1, w2=w2, wb=wb, w3=w3,
      written=mr.read(16, 4096).decode(), sent=mr.read(16, 8192).decode(),
      orig=int.from_bytes(mr.read(8, 16384), "little"), now=int.from_bytes(mr.read(8, 12288), "little"),
      srq=srq.query().srq_limit)))
for o in (qa, qb, srq, cqa, cqb, mr, pd, ctx):
    o.close()
"""


def test_real_pyverbs_extended_verbs_on_the_provider(plain, hosts):
    """pyverbs' QPEx (wr_*), CQEX (start_poll and read_*) and SRQ on a loopback RC pair in one process."""
    system_python = "/usr/bin/python3"
    if (
        not os.path.exists(system_python)
        or subprocess.run([system_python, "-c", "import pyverbs.qp"], capture_output=True, check=False).returncode
    ):
        pytest.skip("the system python3 has no pyverbs (Debian python3-pyverbs)")
    done = subprocess.run(
        [system_python, "-c", _PYVERBS_EXTENDED],
        env=_env(plain, hosts[0]),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert (got["ports_ex"], got["atomic"]) == (1, 1)  # IBV_ATOMIC_HCA
    assert [got[w]["wr_id"] for w in ("w1", "w2", "w3")] == [1, 2, 3]
    assert [got[w]["opcode"] for w in ("w1", "w2", "w3")] == [1, 0, 4]  # RDMA_WRITE, SEND, FETCH_ADD
    assert got["wb"] == {"wr_id": 77, "status": 0, "opcode": 128, "byte_len": 16, "qp_num": got["wb"]["qp_num"]}
    assert got["wb"]["qp_num"] != got["w1"]["qp_num"]  # the SRQ's receive completed on the responder QP
    assert got["written"] == got["sent"] == "hello-extended!!"
    assert (got["orig"], got["now"], got["srq"]) == (41, 42, 0)


# ------------------------------------------------------------ data movement --


def _payload_env(payload):
    return {"ORBITE_PROVIDER_PAYLOAD": payload}


@pytest.mark.parametrize("payload", ["auto", "tcp"])
def test_read_and_write_are_byte_exact_between_two_processes(build, hosts, tmp_path, payload):
    env = _payload_env(payload)
    pair = run_pair(build, hosts, tmp_path, "rw", client_env=env, server_env=env)
    # auto: the two fake hosts' processes (same user) reach each other's memory: single copy
    path = pair.one("payload")
    assert path["direct"] == (payload == "auto"), path
    sizes = [1, 4096, (1 << 20) + 3, 8 << 20, 32 << 20]
    assert [x["size"] for x in pair.ops("read")] == sizes
    assert [x["size"] for x in pair.ops("write")] == sizes
    for op in ("sge", "pipelined", "unsignaled", "inline", "write_imm", "send"):
        assert pair.one(op)["ok"] is True
    assert pair.one("write_imm")["imm"] == 0x12345678
    counters = pair.one("counters")
    # both providers counted the same bytes, and exactly the ones the engine asked for
    assert counters["client_read_landed"] == counters["server_read_served"] == counters["expect_read"]
    assert counters["client_write_sent"] == counters["server_write_landed"] == counters["expect_write"]
    # per context (one device each): the endpoints' contexts moved it all, the other device's nothing
    assert counters["client_ctx_read_landed"] == counters["server_ctx_read_served"] == counters["expect_read"]
    assert counters["client_ctx_write_sent"] == counters["server_ctx_write_landed"] == counters["expect_write"]
    assert (counters["server_other_ctx"], counters["unknown_name"]) == (0, -1)


ACCESS_CASES = ("bad_rkey", "out_of_bounds", "mr_no_remote_read", "mr_no_remote_write", "qp_no_remote_write")


@pytest.mark.parametrize("payload", ["auto", "tcp"])
def test_keys_bounds_and_access_flags_are_checked(build, hosts, tmp_path, payload):
    env = _payload_env(payload)
    pair = run_pair(build, hosts, tmp_path, "errors", client_env=env, server_env=env)
    for case in ACCESS_CASES:
        # the responder refuses: REM_ACCESS_ERR, the WR behind it flushed, both QPs in ERR (as rxe)
        assert pair.one("error_case", case=case) == {
            "op": "error_case",
            "case": case,
            "status": REM_ACCESS_ERR,
            "next": WR_FLUSH_ERR,
            "client_state": QPS_ERR,
            "server_state": QPS_ERR,
        }
    # a bad lkey never reaches the wire: the peer's QP stays in RTS
    bad_lkey = pair.one("error_case", case="bad_lkey")
    assert (bad_lkey["status"], bad_lkey["next"], bad_lkey["client_state"], bad_lkey["server_state"]) == (
        LOC_PROT_ERR,
        WR_FLUSH_ERR,
        QPS_ERR,
        QPS_RTS,
    )
    assert pair.one("error_case", case="local_no_write")["status"] == LOC_PROT_ERR
    gone = pair.one("error_case", case="peer_gone")
    assert gone["status"] == RETRY_EXC_ERR and gone["client_state"] == QPS_ERR
    too_long = pair.one("send_too_long")
    assert (too_long["status"], too_long["receiver_status"]) == (REM_INV_REQ_ERR, LOC_LEN_ERR)
    rnr = pair.one("rnr")
    assert (rnr["status"], rnr["client_state"]) == (RNR_RETRY_EXC_ERR, QPS_ERR)
    for op in ("reg_rules", "post_states", "reset_reuse"):
        assert pair.one(op)["ok"] is True


def test_send_queue_depth_is_enforced(build, hosts, tmp_path):
    pair = run_pair(build, hosts, tmp_path, "sqfull")
    assert pair.one("sq_list") == {"op": "sq_list", "rc": ENOMEM, "bad_index": 4}
    assert pair.one("sq_unpolled")["rc"] == ENOMEM  # completed but not polled: still held
    assert pair.one("sq_after_poll")["rc"] == 0
    assert pair.one("sq_unsignaled")["ok"] is True


def test_completion_channel_events(build, hosts, tmp_path):
    pair = run_pair(build, hosts, tmp_path, "events")
    events = pair.ops("event")
    assert events[0] == {"op": "event", "armed": True, "readable": True}
    assert events[1] == {"op": "event", "armed": False, "readable": False}
    assert events[2] == {"op": "event", "solicited_only": True, "error_fires": True}


def test_memory_windows_type_1_and_2(build, hosts, tmp_path):
    pair = run_pair(build, hosts, tmp_path, "mw")
    assert pair.one("mw", type=1) == {"op": "mw", "type": 1, "inside": SUCCESS, "outside": REM_ACCESS_ERR}
    own = [x for x in pair.ops("mw") if x["type"] == 2]
    assert own[0] == {"op": "mw", "type": 2, "own_qp": SUCCESS, "other_qp": REM_ACCESS_ERR}
    assert own[1] == {"op": "mw", "type": 2, "after_invalidate": REM_ACCESS_ERR}
    # SEND_WITH_INV naming the peer's type-2 window: the SEND lands, the receive carries
    # IBV_WC_WITH_INV and the key, and the key is dead for the next READ
    assert pair.one("send_inv") == {
        "op": "send_inv",
        "status": SUCCESS,
        "recv_status": SUCCESS,
        "recv_opcode": WC_RECV,
        "byte_len": 16,
        "with_inv": 1,
        "rkey_match": 1,
        "after": REM_ACCESS_ERR,
    }
    # naming an MR's key (not remotely invalidable): refused on both sides, both QPs in ERR (as rxe)
    assert pair.one("send_inv_mr") == {
        "op": "send_inv_mr",
        "status": REM_INV_REQ_ERR,
        "recv_status": REM_INV_REQ_ERR,
        "client_state": QPS_ERR,
        "server_state": QPS_ERR,
    }


# ----------------------------------------------------------- extended verbs --
# ibv_wc_opcode values
WC_SEND, WC_RDMA_WRITE, WC_RDMA_READ, WC_RECV, WC_RECV_RDMA_WITH_IMM = 0, 1, 2, 128, 129
WC_BIND_MW, WC_LOCAL_INV = 5, 6
EOPNOTSUPP, EINVAL, ENOENT = 95, 22, 2


def test_extended_device_query_and_extended_cq_poll(build, hosts, tmp_path):
    pair = run_pair(build, hosts, tmp_path, "ext_cq")
    query = pair.one("query_device_ex")
    # the same device as ibv_query_device; no completion timestamps modelled
    assert query == {"op": "query_device_ex", "orig_equal": 1, "ports": 1, "ports_ex": 1, "ts_mask": 0}
    assert pair.one("cq_ex_refused", what="timestamp") == {
        "op": "cq_ex_refused", "what": "timestamp", "null": 1, "errno": EOPNOTSUPP}
    assert pair.one("cq_ex_refused", what="pd") == {"op": "cq_ex_refused", "what": "pd", "null": 1, "errno": EINVAL}
    assert pair.one("cq_ex_empty") == {"op": "cq_ex_empty", "rc": ENOENT, "ts_reader": 0}
    # the extended poll reads what poll_cq reads, field by field, on the same CQs
    assert pair.one("cq_ex_poll") == {
        "op": "cq_ex_poll",
        "same": 1,
        "send_ops": [WC_SEND, WC_RDMA_WRITE, WC_RDMA_WRITE, WC_RDMA_READ],
        "recv_ops": [WC_RECV, WC_RECV_RDMA_WITH_IMM],
        "imm": [0x1000, 0x1001],
        "src_qp_ok": 1,
        "recv_flags": [2, 2],  # IBV_WC_WITH_IMM
    }


def test_extended_post_goes_through_the_same_checks_and_queue(build, hosts, tmp_path):
    pair = run_pair(build, hosts, tmp_path, "ext_post")
    refused = {x["what"]: (x["null"], x["errno"]) for x in pair.ops("qp_ex_refused")}
    assert refused == {
        "atomic_write": (1, EOPNOTSUPP),  # not modelled
        "tso": (1, EOPNOTSUPP),
        "no_pd": (1, EINVAL),  # an RC QP needs its PD
        "unknown_mask": (1, EINVAL),
    }
    # a pointer per asked opcode; ibv_qp_to_qp_ex is NULL without send_ops_flags
    assert pair.one("qp_ex_ops") == {
        "op": "qp_ex_ops", "write": 1, "send": 0, "read": 0, "classic_qp_ex": 0, "pd_only_qp_ex": 0}
    # one batch of every RC opcode: completions in order, every byte where it belongs and nowhere else
    assert pair.one("ext_batch") == {
        "op": "ext_batch",
        "rc": 0,
        "completions_ok": 1,
        "send_ops": [WC_RDMA_WRITE, WC_RDMA_WRITE, WC_SEND, WC_SEND, WC_RDMA_READ],
        # the responder's receives: WRITE_WITH_IMM (two SGEs), SEND inline, SEND_WITH_IMM inline list
        "recv": [[WC_RECV_RDMA_WITH_IMM, 1000, 0xABC], [WC_RECV, 64, 0], [WC_RECV, 40, 0xDEF]],
        "write": 0, "write_imm": 0, "send": 0, "send_imm": 0, "read": 0, "around": 0,
    }
    # wr_abort drops the batch: no completion, no send-queue slot, no byte moved
    assert pair.one("ext_abort") == {"op": "ext_abort", "quiet": 1, "outstanding": 0, "untouched": 0}
    # a failing WR fails wr_complete with its errno and, as mlx5, drops the batch before it too
    for op in ("ext_bad_sge", "ext_bad_post"):
        assert pair.one(op) == {"op": op, "rc": EINVAL, "quiet": 1, "outstanding": 0, "untouched": 0}
    assert pair.one("ext_bad_inline") == {"op": "ext_bad_inline", "rc": EINVAL, "quiet": 1}
    # the keys are checked as for post_send
    assert pair.one("ext_bad_rkey") == {"op": "ext_bad_rkey", "rc": 0, "wr_id": 0xF6, "status": REM_ACCESS_ERR}
    # a type-2 window bound and invalidated through wr_bind_mw / wr_local_inv
    assert pair.one("ext_mw") == {
        "op": "ext_mw",
        "bind": [0x80, SUCCESS, WC_BIND_MW],
        "inv": [0x81, SUCCESS, WC_LOCAL_INV],
        "length": 4096,
        "bound_after": 0,
    }


WC_COMP_SWAP, WC_FETCH_ADD, ATOMIC_HCA = 3, 4, 1


def test_rc_atomics(build, hosts, tmp_path):
    pair = run_pair(build, hosts, tmp_path, "atomics")
    values = pair.one("atomic_values")
    assert values["cap"] == ATOMIC_HCA
    assert values["status"] == [SUCCESS] * 5
    assert values["opcodes"] == [WC_COMP_SWAP, WC_COMP_SWAP, WC_FETCH_ADD, WC_COMP_SWAP, WC_FETCH_ADD]
    assert values["byte_len"] == 8
    # 5 -> swap(5, 9) -> 9, swap(1, 7) leaves 9, add 2^32 + 1; then 100 -> swap(100, 200) -> add 22
    assert values["orig"] == [5, 9, 9, 100, 200]
    assert values["remote"] == [9 + 0x100000001, 222]
    assert values["around"] == 0  # 8 bytes each, nothing else touched
    assert pair.one("not_modelled") == {"op": "not_modelled", "atomic_write": EOPNOTSUPP, "tso": EOPNOTSUPP}
    assert pair.one("atomic_errors") == {
        "op": "atomic_errors",
        "misaligned": REM_INV_REQ_ERR,
        "mr_no_atomic": REM_ACCESS_ERR,
        "qp_no_atomic": REM_ACCESS_ERR,
        "out_of_bounds": REM_ACCESS_ERR,
    }
    concurrent = pair.one("atomic_concurrent")
    assert concurrent["counter"] == concurrent["expect"] == 800 and concurrent["distinct"] == 1


EVENT_SRQ_LIMIT_REACHED = 15


def test_shared_receive_queue(build, hosts, tmp_path):
    pair = run_pair(build, hosts, tmp_path, "srq")
    assert pair.one("srq_caps") == {"op": "srq_caps", "max_srq": 1 << 16, "max_srq_wr": 32767, "max_srq_sge": 30}
    assert pair.one("srq_refused") == {"op": "srq_refused", "max_wr": EINVAL, "max_sge": EINVAL}
    assert pair.one("srq_ex_xrc") == {"op": "srq_ex_xrc", "null": 1, "errno": EOPNOTSUPP}  # not modelled
    # two QPs take the SRQ's receives in order (bytes checked where each receive pointed)
    assert pair.one("srq_shared") == {
        "op": "srq_shared",
        "wr_ids": [0x50, 0x51, 0x52, 0x53],
        "qp_post_recv": EINVAL,
        "too_many_sge": EINVAL,
    }
    assert pair.one("srq_sizes") == {"op": "srq_sizes", "full": ENOMEM, "shrink_below_queued": EINVAL, "max_wr": 16}
    # armed at 6 with 8 queued: the event comes when the third receive leaves 5, not before
    assert pair.one("srq_limit") == {
        "op": "srq_limit",
        "too_high": EINVAL,
        "armed": 6,
        "readable": [0, 0, 1],
        "event": EVENT_SRQ_LIMIT_REACHED,
        "is_srq": 1,
    }
    # fired once, disarmed; an empty SRQ holds a SEND back until a receive is posted
    assert pair.one("srq_after_event") == {"op": "srq_after_event", "limit": 0, "waited": 1}
    assert pair.one("srq_destroy") == {
        "op": "srq_destroy",
        "in_use": EBUSY,
        "still_in_use": EBUSY,
        "held": 1,
        "free": 0,
        "held_after": 0,
    }


def test_a_responder_destroying_its_qp_on_its_receive_completion_does_not_lose_the_ack(build, hosts, tmp_path):
    # The responder's QP is destroyed the moment its receive completes, while the driver holds every TCP
    # send of the responder's process back 300 ms (prov_driver.c, teardown): an ACK sent only after the receive
    # completed is lost with its QP and the requester retries until RETRY_EXC_ERR (the provider before 8527141
    # did that: ibv_srq_pingpong's "transport retry counter exceeded"); one sent on receipt gets through.
    pair = run_pair(build, hosts, tmp_path, "teardown")
    recv_opcodes = {"SEND": 128, "RDMA_WRITE_WITH_IMM": 129}  # IBV_WC_RECV, IBV_WC_RECV_RDMA_WITH_IMM
    for wr, opcode in recv_opcodes.items():
        assert pair.one("teardown", wr=wr) == {
            "op": "teardown",
            "wr": wr,
            "status": SUCCESS,
            "recv_polled": 1,
            "recv_status": SUCCESS,
            "recv_opcode": opcode,
            "destroy": 0,
        }


# ------------------------------------------------------------ destroy, EBUSY --


def test_dependencies_make_destroy_fail_with_ebusy(build, hosts, tmp_path):
    pair = run_pair(build, hosts, tmp_path, "ebusy")
    assert {x["what"]: x["rc"] for x in pair.ops("ebusy")} == {
        "cq_with_qp": EBUSY,
        "pd_with_qp": EBUSY,
        "channel_with_cq": EBUSY,
        "pd_with_mr": EBUSY,
        "pd_with_mw2": EBUSY,
        "mr_with_bound_mw": EBUSY,
    }


KINDS = ("qp", "mr", "mw", "cq", "pd", "channel")


@pytest.mark.parametrize("kind", KINDS)
def test_uverbs_fault_fails_the_real_destroy_command(build, hosts, tmp_path, kind):
    """The REAL uverbs_fault observer's seccomp filter sees the provider's destroy command on the
    context's uverbs descriptor and fails it with EIO: the object stays and works, a retry fails too."""
    pair = run_pair(
        build,
        hosts,
        tmp_path,
        "destroy",
        kind,
        preload=("uverbs_fault",),
        client_env={"ORBITE_UVERBS_FAULT_KIND": kind},
        leaks=False,  # the failed object is held until exit, on purpose
    )
    result = pair.one("destroy")
    assert result == {
        "op": "destroy",
        "kind": kind,
        "rc": EIO,
        "retry_rc": EIO,
        "held_before": result["held_before"],
        "held_after": result["held_before"],
        "usable": True,
    }
    assert result["held_before"] >= 1
    destroys = [e for e in pair.events("destroy") if e["kind"] == kind]
    assert [(e["errno"], e["injected"], e["retry"]) for e in destroys] == [(EIO, True, False), (EIO, True, True)]
    assert destroys[0]["handle"] == destroys[1]["handle"]
    if kind == "qp":
        # the qp selector withholds one successful completion first: send-queue debt at destroy
        assert pair.one("withheld") == {"op": "withheld", "posted": 2, "seen": 1}
        assert len(pair.events("withheld")) == 1


@pytest.mark.parametrize("kind", ["cq", "channel", "pd"])
def test_uverbs_fault_observes_a_dependency_ebusy_and_rejects_the_retry(build, hosts, tmp_path, kind):
    """Dependency mode (docs/cleanup_failure.md): nothing is injected; the destroy fails EBUSY by itself from the
    dependent object the driver keeps, the observer logs that result (cq, pd: after the uverbs command went
    through the descriptor) and rejects the retry with EIO without reaching the provider: the object stays."""
    pair = run_pair(build, hosts, tmp_path, "dependency", kind, preload=("uverbs_fault",),
                    client_env={"ORBITE_UVERBS_FAULT_KIND": kind, "ORBITE_UVERBS_FAULT_DEPENDENCY": "1"},
                    leaks=False)  # the failed object and its dependent are held until exit, on purpose
    result = pair.one("dependency")
    assert (result["rc"], result["retry_rc"], result["held_after"]) == (EBUSY, EIO, result["held_before"])
    mine = [e for e in pair.events("destroy") if e["kind"] == kind]
    # the driver's own teardown destroys its other objects of the kind (logged with errno 0) at the end
    destroys = [e for e in mine if e["handle"] == mine[0]["handle"]]
    assert [(e["errno"], e["injected"], e["retry"], e.get("dependency")) for e in destroys] == [
        (EBUSY, False, False, True), (EIO, False, True, None)]
    assert destroys[0]["command"] is (kind != "channel")
    assert all(e["errno"] == 0 for e in mine if e["handle"] != mine[0]["handle"])


@pytest.mark.parametrize("layout", ["write", "invoke_write"])
def test_uverbs_fault_recognises_the_legacy_command_layouts(build, hosts, tmp_path, layout):
    pair = run_pair(
        build,
        hosts,
        tmp_path,
        "destroy",
        "mr",
        preload=("uverbs_fault",),
        client_env={"ORBITE_UVERBS_FAULT_KIND": "mr", "ORBITE_PROVIDER_CMD": layout},
        leaks=False,
    )
    assert pair.one("destroy")["rc"] == EIO and pair.one("destroy")["usable"] is True
    assert [(e["kind"], e["injected"], e["retry"]) for e in pair.events("destroy")] == [
        ("mr", True, False),
        ("mr", True, True),
    ]


def test_unselected_destroys_reach_the_provider(build, hosts, tmp_path):
    """Armed for an occurrence that never comes: every destroy is logged with errno 0 and the
    provider's own answers (EBUSY of the dependencies) are what the program sees."""
    pair = run_pair(
        build,
        hosts,
        tmp_path,
        "ebusy",
        preload=("uverbs_fault",),
        client_env={"ORBITE_UVERBS_FAULT_KIND": "pd", "ORBITE_UVERBS_FAULT_OCCURRENCE": "99"},
    )
    assert {x["rc"] for x in pair.ops("ebusy")} == {EBUSY}
    destroys = pair.events("destroy")
    assert destroys and all(e["errno"] == 0 and not e["injected"] for e in destroys)
    kinds = [e["kind"] for e in destroys]
    # the refused destroys went through the descriptor too: pd with a QP, an MR, a window; then
    # the real ones (the scenario's second PD and the client's own at close)
    assert (kinds.count("pd"), kinds.count("cq"), kinds.count("mw")) == (5, 3, 2)


@pytest.mark.parametrize(
    ("client", "server", "why"),
    [
        ("auto", "auto", "process_vm_readv/writev with pid "),
        ("tcp", "auto", "tcp: ORBITE_PROVIDER_PAYLOAD=tcp"),
        ("auto", "tcp", "tcp: the peer keeps to TCP (its ORBITE_PROVIDER_PAYLOAD)"),
    ],
)
def test_the_payload_path_is_chosen_per_qp_and_logged_with_its_reason(build, hosts, tmp_path, client, server, why):
    cenv = {**_payload_env(client), "ORBITE_PROVIDER_PAYLOAD_LOG": "1"}
    pair = run_pair(build, hosts, tmp_path, "rw", client_env=cenv, server_env=_payload_env(server))
    path = pair.one("payload")
    assert path["direct"] == (client == server == "auto") and path["why"].startswith(why), path
    logged = [line for line in pair.stderr.splitlines() if "payload by" in line]
    assert logged and all(line.endswith(path["why"]) for line in logged), pair.stderr


def test_a_responder_that_cannot_prove_its_pid_gets_no_single_copy(build, hosts, tmp_path):
    pair = run_pair(build, hosts, tmp_path, "handshake", "rogue_responder", str(HELLO_MS))
    got = {x["nonce"]: (x["direct"], x["proof_failed"]) for x in pair.ops("rogue_responder")}
    # a socket answering "single copy, pid P" without P holding the hello's nonce: TCP, and why;
    # the same answer with the nonce really there is taken (the proof is what decides)
    assert got == {"absent": (0, 1), "copied": (1, 0)}


# ---------------------------------------------------------- rogue handshakes --

# The server's hello deadline in these tests (ORBITE_PROVIDER_HELLO_MS; 5000 by default).
HELLO_MS = 1000
MAX_HANDSHAKES = 8  # ORBITE_PROVIDER_MAX_HANDSHAKES, orbite_provider.h


def _handshake(build, hosts, tmp_path, case):
    server_env = {"ORBITE_PROVIDER_HELLO_MS": str(HELLO_MS)}
    return run_pair(build, hosts, tmp_path, "handshake", case, str(HELLO_MS), server_env=server_env)


def test_silent_connections_do_not_delay_the_real_peer(build, hosts, tmp_path):
    pair = _handshake(build, hosts, tmp_path, "silent")
    # three silent TCP connections reached the QP's responder first; the real peer's first WR
    # does not wait for any of them (a blocking accept loop would hold it a hello deadline each)
    assert pair.one("hs_silent")["first_wr_ms"] < HELLO_MS
    # and none is left open once the QP serves its peer
    assert pair.one("hs_silent_closed")["closed"] == 3


def test_the_whole_hello_has_one_deadline_from_accept(build, hosts, tmp_path):
    pair = _handshake(build, hosts, tmp_path, "trickle")
    got = pair.one("hs_trickle")
    # one byte every 100 ms keeps the connection busy but never makes a hello: it is closed at
    # the deadline counted from accept, while bytes were still coming
    assert HELLO_MS - 100 <= got["closed_ms"] <= HELLO_MS + 1000, got
    assert got["sent"] < 63


def test_destroy_qp_ends_promptly_with_a_half_sent_hello_pending(build, hosts, tmp_path):
    pair = _handshake(build, hosts, tmp_path, "destroy")
    got = pair.one("hs_destroy_pending")
    assert got["rc"] == 0 and 0 <= got["destroy_ms"] < 1000, got


def test_connections_beyond_the_handshake_slots_are_closed_at_once(build, hosts, tmp_path):
    pair = _handshake(build, hosts, tmp_path, "overflow")
    got = pair.one("hs_overflow")
    assert got["connections"] == MAX_HANDSHAKES + 2
    assert got["closed_at_once"] == 2
    # the real peer's requester, refused while the slots were full, got in once they expired
    assert got["first_wr_ms"] < HELLO_MS + 1500
    assert pair.one("hs_overflow_closed")["closed"] == MAX_HANDSHAKES + 2


# ---------------------------------------------------------- partial copies --


@pytest.mark.parametrize("payload", ["auto", "tcp"])
def test_qp_error_stops_a_wr_part_way_exactly_at_the_stall_point(build, hosts, tmp_path, payload):
    env = _payload_env(payload)
    pair = run_pair(build, hosts, tmp_path, "partial", client_env=env, server_env=env)
    counted, stalls = {}, {}
    for opcode, length, stall in (("RDMA_READ", 4 << 20, (1 << 20) + 12345), ("RDMA_WRITE", 16 << 20, (5 << 20) + 7)):
        got = pair.one("partial", opcode=opcode)
        # flushed; exactly the bytes before the stall landed, the rest and every other byte untouched
        assert got["status"] == WR_FLUSH_ERR and got["len"] == length
        assert got["landed"] == stall and got["dirty"] == 0
        counted[opcode], stalls[opcode] = (got["server_at_stall"], got["server_at_cqe"]), stall
    # the responder's count (WRITE landed, READ served) is exactly the moved prefix: single copy, as soon as the
    # requester reached the stall point, before the QP moves; TCP, a WRITE's by its flush completion (the
    # responder lands on its own time, and serves a READ chunks ahead)
    if payload == "auto":
        assert counted == {op: (stall, stall) for op, stall in stalls.items()}
    else:
        assert counted["RDMA_WRITE"][1] == stalls["RDMA_WRITE"]


def test_stall_hook_from_the_environment(build, hosts, tmp_path):
    stall = 3 * (1 << 20) + 5
    pair = run_pair(
        build,
        hosts,
        tmp_path,
        "partial_env",
        client_env={"ORBITE_PROVIDER_STALL": f"0:{stall}", "PARTIAL_STALL": str(stall)},
    )
    got = pair.one("partial")
    assert (got["status"], got["landed"], got["dirty"]) == (WR_FLUSH_ERR, stall, 0)


def test_paced_chunks_land_a_prefix(build, hosts, tmp_path):
    chunk = 64 * 1024
    pair = run_pair(
        build,
        hosts,
        tmp_path,
        "partial_pace",
        client_env={"ORBITE_PROVIDER_CHUNK": str(chunk), "ORBITE_PROVIDER_PACE_US": "5000"},
    )
    for opcode in ("RDMA_READ", "RDMA_WRITE"):
        got = pair.one("partial", opcode=opcode)
        assert got["status"] == WR_FLUSH_ERR and got["dirty"] == 0
        assert 0 < got["landed"] < got["len"] and got["landed"] % chunk == 0
    # single copy, moved to ERR while a landed piece was not yet reported: its report still reached the
    # responder, which counted every landed byte by the flush completion
    assert got["server_at_cqe"] == got["landed"], got


# ---------------------------------------------------------------- observers --


def _driver_wrs(pair):
    return {(w["qpn"], w["wr_id"]): (w["opcode"], w["bytes"]) for w in pair.ops("wr")}


def test_accounting_observer_logs_what_the_provider_completed(build, hosts, tmp_path):
    pair = run_pair(build, hosts, tmp_path, "observe", preload=("accounting",))
    wrs = _driver_wrs(pair)
    logged = {(w["qpn"], w["wr_id"]): (w["opcode"], w["bytes"]) for w in pair.events("wr")}
    assert logged == wrs and len(wrs) == 12
    assert {w["dev"] for w in pair.events("wr")} == {"mlx5_0"}
    seen = {(c["qpn"], c["wr_id"], c["status"]) for c in pair.ops("cqe")}
    assert {(c["qpn"], c["wr_id"], c["status"]) for c in pair.events("cqe")} == seen
    assert len(seen) == 12 and {s for _, _, s in seen} == {SUCCESS}
    (summary,) = pair.events("summary")
    assert (summary["accepted_wrs"], summary["joined"], summary["unjoined"]) == (12, 12, 0)
    assert pair.one("observed")["wr_completed"] == 12


def test_cq_fault_withholds_completions_the_provider_really_delivered(build, hosts, tmp_path):
    pair = run_pair(
        build,
        hosts,
        tmp_path,
        "observe",
        preload=("cq_fault",),
        client_env={"ORBITE_CQ_FAULT_ARMED": "1", "ORBITE_CQ_FAULT_SKIP": "3"},
    )
    observed = pair.one("observed")
    withheld = {(w["qpn"], w["wr_id"]) for w in pair.events("withheld")}
    assert observed["seen"] == 3 and len(withheld) == 9
    # the engine never saw them, but every READ landed and the provider completed all twelve
    assert observed["reads_landed"] is True and observed["wr_completed"] == 12
    assert withheld <= set(_driver_wrs(pair))
    assert not withheld & {(c["qpn"], c["wr_id"]) for c in pair.ops("cqe")}


def _driver_pattern(seed, length):
    """prov_common.h pattern(seed, i) for i < length: the driver's seeded content."""
    mask, mixed = (1 << 64) - 1, (seed << 32) | seed
    out = bytearray(length)
    for i in range(length):
        x = (((i + 1) * 0x9E3779B97F4A7C15) & mask) ^ mixed
        x ^= x >> 29
        out[i] = ((x * 0xBF58476D1CE4E5B9) & mask) >> 56
    return bytes(out)


@pytest.mark.parametrize("opcode", ["RDMA_READ", "RDMA_WRITE"])
def test_inflight_fault_stops_the_selected_wr_part_way_with_modify_qp(build, hosts, tmp_path, opcode):
    stall = (1 << 20) + 4099
    scenario = "inflight_read" if opcode == "RDMA_READ" else "inflight_write"
    env = {"ORBITE_INFLIGHT_FAULT_ARMED": "1", "ORBITE_INFLIGHT_FAULT_SKIP": "3",
           "ORBITE_INFLIGHT_FAULT_BYTES": str(stall)}
    pair = run_pair(build, hosts, tmp_path, scenario, preload=("inflight_fault",), client_env=env)
    got = pair.one("inflight")
    # three healthy WRs, then the fourth flushed with exactly the bytes before the stall point landed
    assert got["status"] == [SUCCESS, SUCCESS, SUCCESS, WR_FLUSH_ERR]
    assert (got["landed"], got["dirty"]) == (stall, 0)
    (fault,) = pair.events("inflight_fault")
    assert (fault["qpn"], fault["wr_id"], fault["opcode"], fault["bytes"]) == (got["qpn"], 93, opcode, 4 << 20)
    assert (fault["stall_bytes"], fault["stalled"], fault["modify_qp"], fault["post_ret"]) == (stall, 1, 0, 0)
    assert (fault["state_before"], fault["state_after"]) == (QPS_RTS, QPS_ERR)
    assert fault["port_state_before"] == fault["port_state_after"] == 4  # IBV_PORT_ACTIVE: no port touched
    assert fault["landed_local"] == (stall if opcode == "RDMA_READ" else -1)
    # the error completion the provider delivered, joined by CQ, QPN and WR ID
    (cqe,) = pair.events("inflight_cqe")
    assert (cqe["ctx"], cqe["cq"], cqe["qpn"], cqe["wr_id"]) == (fault["ctx"], fault["cq"], got["qpn"], 93)
    assert (cqe["status"], cqe["status_name"]) == (WR_FLUSH_ERR, "Work Request Flushed Error")
    assert [c["status"] for c in pair.events("cqe") if c["wr_id"] == 93] == [WR_FLUSH_ERR]
    if opcode == "RDMA_READ":  # the local destination at the error CQE: the landed prefix, the rest sentinel
        want = _driver_pattern(83, stall) + bytes([0x5A]) * ((4 << 20) - stall)  # prov_driver.c: seed 83, SENT_C
        assert cqe["dest_sha256"] == hashlib.sha256(want).hexdigest()
    else:
        assert cqe["dest_sha256"] is None
    (destroy,) = pair.events("inflight_destroy")
    assert (destroy["qpn"], destroy["ret"], destroy["after_cqe"]) == (got["qpn"], 0, 1)


def test_inflight_fault_not_armed_interrupts_nothing(build, hosts, tmp_path):
    pair = run_pair(build, hosts, tmp_path, "rw", preload=("inflight_fault",),
                    client_env={"ORBITE_INFLIGHT_FAULT_SKIP": "0", "ORBITE_INFLIGHT_FAULT_BYTES": "7"})
    assert not pair.events("inflight_fault") and not pair.events("inflight_destroy")
    assert [e["reason"] for e in pair.events("not_armed")] == ["ORBITE_INFLIGHT_FAULT_ARMED is not 1"]
