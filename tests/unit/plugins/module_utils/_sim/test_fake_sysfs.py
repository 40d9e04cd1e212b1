"""Fake host root generator (contract 2): layout, sim lab hosts, safety rules, spec errors."""

import fnmatch
import ipaddress
import os

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._sim import fake_sysfs as fs


def _read(root, rel):
    with open(os.path.join(root, rel)) as handle:
        return handle.read().rstrip("\n")


@pytest.fixture
def sim_root(tmp_path):
    root = tmp_path / "host-a"
    fs.write_host(str(root), fs.sim_host_spec(0, "sim-a"))
    return str(root)


def test_sim_host_writes_contract_layout(sim_root):
    assert _read(sim_root, "proc/sys/kernel/hostname") == "sim-a"
    assert _read(sim_root, "proc/sys/kernel/random/boot_id")
    assert _read(sim_root, "proc/sys/kernel/osrelease") == fs.DEFAULT_OSRELEASE
    assert len(_read(sim_root, "etc/machine-id")) == 32
    assert _read(sim_root, "sys/devices/system/node/node0/cpulist") == "0-3"
    assert _read(sim_root, "sys/devices/system/node/node1/cpulist") == "4-7"
    assert sorted(os.listdir(os.path.join(sim_root, "sys/class/infiniband"))) == ["mlx5_0", "mlx5_1"]
    assert sorted(os.listdir(os.path.join(sim_root, "sys/class/net"))) == ["ens1f0", "ens2f0"]


def test_class_entries_are_relative_links_that_stay_inside_root(sim_root):
    real_root = os.path.realpath(sim_root)
    for cls in ("infiniband", "net", "infiniband_verbs"):
        base = os.path.join(sim_root, "sys/class", cls)
        for name in os.listdir(base):
            link = os.path.join(base, name)
            if (cls, name) == ("infiniband_verbs", "abi_version"):
                continue  # a class attribute, a plain file in real sysfs too
            assert os.path.islink(link)
            assert not os.path.isabs(os.readlink(link))
            assert os.path.realpath(link).startswith(real_root + os.sep)
    device = os.path.join(sim_root, "sys/class/infiniband/mlx5_1/device")
    assert os.path.basename(os.path.realpath(device)) == "0000:86:00.0"
    assert _read(sim_root, "sys/class/infiniband/mlx5_1/device/numa_node") == "1"
    assert os.listdir(os.path.join(sim_root, "sys/class/infiniband/mlx5_1/device/net")) == ["ens2f0"]
    assert _read(sim_root, "sys/class/infiniband/mlx5_1/device/infiniband_verbs/uverbs1/ibdev") == "mlx5_1"


def test_what_libibverbs_reads_is_written(sim_root):
    # rdma-core 44 (libibverbs/init.c): class ABI, per uverbsN ibdev/dev/abi_version, the PCI modalias
    # its provider matches (mlx5: pci:v000015B3d00001017sv*), and the uverbs device link.
    assert _read(sim_root, "sys/class/infiniband_verbs/abi_version") == "6"
    for k in (0, 1):
        uverbs = f"sys/class/infiniband_verbs/uverbs{k}"
        assert (_read(sim_root, uverbs + "/ibdev"), _read(sim_root, uverbs + "/dev"),
                _read(sim_root, uverbs + "/abi_version")) == (f"mlx5_{k}", f"231:{192 + k}", "1")
        assert os.path.realpath(os.path.join(sim_root, uverbs, "device")) == os.path.realpath(
            os.path.join(sim_root, f"sys/class/infiniband/mlx5_{k}/device"))
        modalias = _read(sim_root, f"sys/class/infiniband/mlx5_{k}/device/modalias")
        assert fnmatch.fnmatch(modalias, "pci:v000015B3d00001017sv*")


def test_sim_host_gid_table_is_roce_v1_v2_pairs(sim_root):
    port = "sys/class/infiniband/mlx5_0/ports/1"
    assert _read(sim_root, port + "/state") == "4: ACTIVE"
    assert _read(sim_root, port + "/phys_state") == "5: LinkUp"
    assert _read(sim_root, port + "/link_layer") == "Ethernet"
    gids = [_read(sim_root, f"{port}/gids/{i}") for i in range(5)]
    types = [_read(sim_root, f"{port}/gid_attrs/types/{i}") for i in range(4)]
    assert types == ["IB/RoCE v1", "RoCE v2", "IB/RoCE v1", "RoCE v2"]
    assert gids[0] == gids[1] and ipaddress.IPv6Address(gids[0]).is_link_local
    assert gids[2] == gids[3]
    assert ipaddress.IPv6Address(gids[2]).ipv4_mapped == ipaddress.IPv4Address("127.51.100.10")
    assert gids[4] == fs.ZERO_GID
    assert len(os.listdir(os.path.join(sim_root, port, "gids"))) == 256
    assert _read(sim_root, port + "/gid_attrs/ndevs/3") == "ens1f0"
    assert _read(sim_root, port + "/gid_attrs/types/4") == ""  # unused slot: exists, empty


def test_sim_hosts_differ_per_index():
    a, b = fs.sim_host_spec(0, "a"), fs.sim_host_spec(1, "b")
    assert a["boot_id"] != b["boot_id"] and a["machine_id"] != b["machine_id"]
    macs_a = {n["mac"] for n in a["netdevs"]}
    macs_b = {n["mac"] for n in b["netdevs"]}
    assert not macs_a & macs_b

    def ipv4s(spec):
        out = set()
        for dev in spec["devices"]:
            for entry in dev["ports"][0]["gids"].values():
                mapped = ipaddress.IPv6Address(entry["gid"]).ipv4_mapped
                if mapped:
                    out.add(mapped)
        return out

    assert len(ipv4s(a)) == 2 and not ipv4s(a) & ipv4s(b)
    assert all(ip in ipaddress.ip_network(fs.SIM_IPV4_NET) for ip in ipv4s(a) | ipv4s(b))
    assert [d["pci"] for d in a["devices"]] == ["0000:3b:00.0", "0000:86:00.0"]
    assert [a["pci"][d["pci"]]["numa_node"] for d in a["devices"]] == [0, 1]


@pytest.mark.parametrize("index", [-1, fs.SIM_MAX_INDEX + 1, "x"])
def test_sim_host_index_out_of_range(index):
    with pytest.raises(fs.FakeSysfsError, match="index"):
        fs.sim_host_spec(index, "h")


def test_link_local_gid_uses_modified_eui64():
    # Guards link_local_gid's universal/local bit flip (octets[0] ^= 0x02).
    assert fs.link_local_gid("0c:42:a1:00:00:10") == "fe80:0000:0000:0000:0e42:a1ff:fe00:0010"
    assert fs.gid_text("198.51.100.1") == "0000:0000:0000:0000:0000:ffff:c633:6401"
    with pytest.raises(fs.FakeSysfsError, match="mac 'zz:00': expected 6 colon-separated hex octets"):
        fs.link_local_gid("zz:00")


def test_rewrite_replaces_own_tree_and_keeps_lock_dir(tmp_path):
    root = tmp_path / "h"
    fs.write_host(str(root), fs.sim_host_spec(0, "first"))
    locks = root / "run/orbite/locks"
    locks.mkdir(parents=True, mode=0o700)
    (locks / "mlx5_0.lock").write_text("held")
    spec = fs.sim_host_spec(1, "second")
    spec["devices"] = spec["devices"][:1]
    fs.write_host(str(root), spec)
    assert _read(str(root), "proc/sys/kernel/hostname") == "second"
    assert os.listdir(root / "sys/class/infiniband") == ["mlx5_0"]  # the old mlx5_1 is gone
    assert (locks / "mlx5_0.lock").read_text() == "held"


def test_refuses_foreign_tree(tmp_path):
    # Guards _clear_previous: a sys/ without the marker is never removed.
    (tmp_path / "sys").mkdir()
    (tmp_path / "sys" / "keep").write_text("x")
    with pytest.raises(fs.FakeSysfsError, match="not written by write_host"):
        fs.write_host(str(tmp_path), fs.sim_host_spec(0, "h"))
    assert (tmp_path / "sys" / "keep").read_text() == "x"


def test_refuses_real_root():
    with pytest.raises(fs.FakeSysfsError, match="real root"):
        fs.write_host("/", fs.sim_host_spec(0, "h"))


def test_raw_override_injects_text_and_stays_under_root(tmp_path):
    spec = fs.sim_host_spec(0, "h")
    spec["raw"] = {"sys/class/infiniband/mlx5_0/ports/1/state": "garbage"}
    fs.write_host(str(tmp_path / "h"), spec)
    assert _read(str(tmp_path / "h"), "sys/class/infiniband/mlx5_0/ports/1/state") == "garbage"
    spec["raw"] = {"../escape": "x"}
    with pytest.raises(fs.FakeSysfsError, match=r"raw path '\.\./escape'"):
        fs.write_host(str(tmp_path / "h2"), spec)
    assert not (tmp_path / "h2").exists()  # refused before anything is written


def _bad(mutate):
    spec = fs.sim_host_spec(0, "h")
    mutate(spec)
    return spec


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.pop("hostname"), r"spec.hostname None: required"),
        (lambda s: s["devices"][0].update(pci="0000:99:00.0"), r"spec.devices\[0\].pci '0000:99:00.0'"),
        (lambda s: s["devices"][1].update(name="mlx5_0"), r"spec.devices\[1\].name 'mlx5_0': duplicate"),
        (lambda s: s["devices"][0].update(pci=None), r"spec.devices\[0\]: a virtual device .* parent_netdev"),
        (lambda s: s["devices"][0]["ports"][0].update(gid_tbl_len=2), r"gids index 2: outside gid_tbl_len 2"),
        (lambda s: s["netdevs"][0].update(name="a/b"), r"spec.netdevs\[0\].name 'a/b'"),
        (lambda s: s["devices"][0].update(uverbs="uverbs/../x"), r"spec.devices\[0\].uverbs 'uverbs/../x': must be"),
    ],
)
def test_spec_errors_name_the_field(tmp_path, mutate, message):
    with pytest.raises(fs.FakeSysfsError, match=message):
        fs.write_host(str(tmp_path / "h"), _bad(mutate))
    assert not (tmp_path / "h").exists()  # nothing written before the spec is checked


def test_odd_host_models_virtual_ib_down_and_unknown_numa(tmp_path):
    root = str(tmp_path / "odd")
    fs.write_host(root, fs.odd_host_spec())
    assert not os.path.lexists(os.path.join(root, "sys/class/infiniband/rxe0/device"))
    assert _read(root, "sys/class/infiniband/rxe0/parent") == "enp0s3"
    assert _read(root, "sys/class/infiniband/mlx5_0/device/numa_node") == "-1"
    assert _read(root, "sys/class/infiniband/mlx5_1/ports/1/state") == "1: DOWN"
    assert _read(root, "sys/class/infiniband/mlx5_2/ports/1/link_layer") == "InfiniBand"
    assert _read(root, "sys/class/infiniband/mlx5_0/ports/1/gids/2") == fs.ZERO_GID  # the hole
    assert _read(root, "sys/class/infiniband_verbs/uverbs3/ibdev") == "rxe0"
    # rxe: no parent device (so no uverbs device link nor modalias), the kernel's rxe ABI 2.
    assert not os.path.lexists(os.path.join(root, "sys/class/infiniband_verbs/uverbs3/device"))
    assert _read(root, "sys/class/infiniband_verbs/uverbs3/abi_version") == "2"
    assert _read(root, "sys/class/infiniband/mlx5_2/device/modalias").startswith("pci:v000015B3d0000101Bsv")


def test_bench_host_fills_every_slot():
    spec = fs.bench_host_spec(devices=2, ports=2, gids=8)
    assert [len(d["ports"]) for d in spec["devices"]] == [2, 2]
    for dev in spec["devices"]:
        for port in dev["ports"]:
            assert sorted(int(i) for i in port["gids"]) == list(range(8))
