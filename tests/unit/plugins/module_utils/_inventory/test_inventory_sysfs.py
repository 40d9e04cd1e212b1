"""The read-only sysfs inventory reader: goldens, odd cases, bad input, EINVAL slots, no writes.

Goldens live in tests/fixtures/inventory/<scenario>.json; regenerate them (after checking the change
by eye) with ORBITE_UPDATE_GOLDEN=1.
"""

import builtins
import errno
import hashlib
import io
import json
import os
import subprocess
import sys

import pytest
from helpers.paths import COLLECTIONS, FIXTURES

from ansible_collections.orbite.qualification.plugins.module_utils._sim import fake_sysfs as fs
from ansible_collections.orbite.qualification.plugins.module_utils._inventory import sysfs as si

FIXTURES = str(FIXTURES / "inventory")
PORT = "sys/class/infiniband/mlx5_0/ports/1"


def _host(tmp_path, spec, name="h"):
    root = str(tmp_path / name)
    fs.write_host(root, spec)
    return root


def _small_sim(name="sim-a"):
    """The sim host with 16-slot GID tables (same entries, far fewer files): for trees a test mutates."""
    spec = fs.sim_host_spec(0, name)
    for dev in spec["devices"]:
        dev["ports"][0]["gid_tbl_len"] = 16
    return spec


@pytest.fixture(scope="module")
def sim_root(tmp_path_factory):
    """The real sim host (256-slot tables), shared: tests using it only read it."""
    root = str(tmp_path_factory.mktemp("sim") / "h")
    fs.write_host(root, fs.sim_host_spec(0, "sim-a"))
    return root


@pytest.fixture(scope="module")
def scenario_roots(tmp_path_factory):
    """Each golden scenario written once; the tests using these roots only read them."""
    base = tmp_path_factory.mktemp("scenarios")
    roots = {}
    for name, build in fs.SCENARIOS.items():
        roots[name] = str(base / name)
        fs.write_host(roots[name], build())
    return roots


@pytest.fixture
def odd_inventory(scenario_roots):
    return si.read_inventory(scenario_roots["odd_host"])


def _fail_reads(monkeypatch, failures):
    """Make read_sysfs_file raise OSError(errno) for paths ending with the given suffixes."""
    real = si.read_sysfs_file

    def fake(path):
        for suffix, code in failures.items():
            if path.endswith(suffix):
                raise OSError(code, os.strerror(code), path)
        return real(path)

    monkeypatch.setattr(si, "read_sysfs_file", fake)


# ---------------------------------------------------------------- goldens


@pytest.mark.parametrize("scenario", sorted(fs.SCENARIOS))
def test_golden_inventory(scenario_roots, scenario):
    inventory = si.read_inventory(scenario_roots[scenario])
    golden = os.path.join(FIXTURES, f"{scenario}.json")
    rendered = si.render_inventory(inventory)
    if os.environ.get("ORBITE_UPDATE_GOLDEN") == "1":
        with open(golden, "w", encoding="utf-8") as handle:
            handle.write(rendered)
    with open(golden, encoding="utf-8") as handle:
        assert rendered == handle.read(), f"inventory of {scenario} differs from {golden}"


def test_sim_host_inventory_fields(sim_root):
    inv = si.read_inventory(sim_root)
    assert inv["schema"] == "orbite.rdma-inventory" and inv["version"] == 1
    assert inv["errors"] == []
    assert inv["node"]["hostname"] == "sim-a"
    assert inv["node"]["numa_nodes"] == {"0": {"cpulist": "0-3"}, "1": {"cpulist": "4-7"}}
    dev = inv["devices"]["mlx5_1"]
    assert dev["pci"] == {"bdf": "0000:86:00.0", "vendor": "0x15b3", "device": "0x1017"}
    assert (dev["numa_node"], dev["local_cpulist"], dev["netdevs"], dev["uverbs"]) == (1, "4-7", ["ens2f0"], "uverbs1")
    assert dev["virtual"] is False and dev["hca_type"] == "MT4119"
    port = dev["ports"]["1"]
    assert port["state"] == {"num": 4, "name": "ACTIVE"}
    assert port["phys_state"] == {"num": 5, "name": "LinkUp"}
    assert port["rate"] == {"gbps": 100, "width": "4X EDR"}
    assert (port["gid_tbl_len"], port["gids_unused"], len(port["gids"])) == (256, 252, 4)
    v2 = port["gids"][3]
    assert v2 == {
        "index": 3,
        "gid": "0000:0000:0000:0000:0000:ffff:c633:640b",
        "type": "RoCE v2",
        "ndev": "ens2f0",
        "ipv4": "198.51.100.11",
        "ipv6_kind": "ipv4-mapped",
    }
    assert port["gids"][0]["ipv6_kind"] == "link-local" and port["gids"][0]["ipv4"] is None
    assert inv["netdevs"]["ens2f0"] == {
        "operstate": "up",
        "mac": "0c:42:a1:00:01:10",
        "mtu": 1500,
        "ifindex": 5,
        "type": 1,
        "pci_bdf": "0000:86:00.0",
        "rdma_devices": ["mlx5_1"],
    }
    assert inv["verbs"]["status"] == "not_requested"


def test_odd_cases(odd_inventory):
    devs = odd_inventory["devices"]
    assert odd_inventory["errors"] == []
    # NUMA -1 is kept as unknown (None), not as a node.
    assert devs["mlx5_0"]["numa_node"] is None
    # Sparse holes: the zero slots between entries are counted, not listed.
    assert [g["index"] for g in devs["mlx5_0"]["ports"]["1"]["gids"]] == [0, 1, 4, 5, 8, 9]
    assert devs["mlx5_0"]["ports"]["1"]["gids_unused"] == 250
    assert devs["mlx5_0"]["ports"]["1"]["gids"][4]["ipv6_kind"] == "global"
    # DOWN port.
    assert devs["mlx5_1"]["ports"]["1"]["state"] == {"num": 1, "name": "DOWN"}
    assert devs["mlx5_1"]["ports"]["1"]["phys_state"] == {"num": 3, "name": "Disabled"}
    assert odd_inventory["netdevs"]["ens2f0"]["operstate"] == "down"
    # InfiniBand port: LID, no ndev.
    ib = devs["mlx5_2"]["ports"]["1"]
    assert (ib["link_layer"], ib["lid"], ib["rate"]) == ("InfiniBand", 0x11, {"gbps": 200, "width": "4X HDR"})
    assert ib["gids"][0]["ndev"] is None and ib["gids"][0]["type"] == "IB/RoCE v1"
    # rxe-like virtual device: no PCI, parent netdev, uverbs found through the class directory.
    rxe = devs["rxe0"]
    assert (rxe["virtual"], rxe["pci"], rxe["numa_node"]) == (True, None, None)
    assert (rxe["parent_netdev"], rxe["netdevs"], rxe["uverbs"]) == ("enp0s3", ["enp0s3"], "uverbs3")
    assert (rxe["hca_type"], rxe["board_id"]) == (None, None)
    assert odd_inventory["netdevs"]["enp0s3"]["rdma_devices"] == ["rxe0"]
    assert odd_inventory["netdevs"]["lo"]["rdma_devices"] == []


# ---------------------------------------------------------------- EINVAL / ENODEV slots


def test_einval_type_read_counts_slot_unused(monkeypatch, sim_root):
    # Guards gid_attrs: `if exc.errno == errno.EINVAL: return _UNUSED, _UNUSED`.
    _fail_reads(monkeypatch, {f"{PORT}/gid_attrs/types/3": errno.EINVAL})
    port = si.read_inventory(sim_root)["devices"]["mlx5_0"]["ports"]["1"]
    assert [g["index"] for g in port["gids"]] == [0, 1, 2]
    assert port["gids_unused"] == 253
    assert si.read_inventory(sim_root)["errors"] == []


def test_einval_ndev_read_counts_slot_unused(monkeypatch, sim_root):
    _fail_reads(monkeypatch, {f"{PORT}/gid_attrs/ndevs/0": errno.EINVAL})
    inv = si.read_inventory(sim_root)
    port = inv["devices"]["mlx5_0"]["ports"]["1"]
    assert [g["index"] for g in port["gids"]] == [1, 2, 3]
    assert port["gids_unused"] == 253 and inv["errors"] == []


def test_enodev_ndev_is_a_valid_entry_without_netdev(monkeypatch, sim_root):
    # Guards gid_attrs: ENODEV on ndevs (valid entry, no netdev: IB) is not an error.
    _fail_reads(monkeypatch, {f"{PORT}/gid_attrs/ndevs/1": errno.ENODEV})
    inv = si.read_inventory(sim_root)
    entry = inv["devices"]["mlx5_0"]["ports"]["1"]["gids"][1]
    assert (entry["index"], entry["ndev"], entry["type"]) == (1, None, "RoCE v2")
    assert inv["errors"] == []


def test_other_read_failure_is_an_error_entry(monkeypatch, sim_root):
    _fail_reads(monkeypatch, {f"{PORT}/gid_attrs/types/2": errno.EIO})
    inv = si.read_inventory(sim_root)
    assert inv["errors"] == [
        {
            "path": "devices/mlx5_0/ports/1/gids/2/type",
            "file": f"{PORT}/gid_attrs/types/2",
            "value": None,
            "error": "read failed: EIO (Input/output error)",
        }
    ]
    assert inv["devices"]["mlx5_0"]["ports"]["1"]["gids"][2]["type"] is None


def test_zero_gid_slot_never_reads_its_attrs(monkeypatch, sim_root):
    # Real sysfs fails those reads with EINVAL; the reader must not even try for an all-zero GID.
    _fail_reads(monkeypatch, {f"{PORT}/gid_attrs/types/200": errno.EIO})
    assert si.read_inventory(sim_root)["errors"] == []


# ---------------------------------------------------------------- garbage and bad roots


@pytest.mark.parametrize(
    ("rel", "content", "path", "rule"),
    [
        (f"{PORT}/state", "garbage", "devices/mlx5_0/ports/1/state", "expected '<number>: <NAME>'"),
        (f"{PORT}/phys_state", "LinkUp", "devices/mlx5_0/ports/1/phys_state", "expected '<number>: <NAME>'"),
        (f"{PORT}/gids/1", "not-a-gid", "devices/mlx5_0/ports/1/gids/1", "expected a GID of 8 groups"),
        (f"{PORT}/gid_attrs/types/2", "RoCE v3", "devices/mlx5_0/ports/1/gids/2/type", "expected one of"),
        (f"{PORT}/rate", "fast", "devices/mlx5_0/ports/1/rate", "expected '<number> Gb/sec (<width>)'"),
        (f"{PORT}/lid", "zz", "devices/mlx5_0/ports/1/lid", "expected a hexadecimal LID"),
        (f"{PORT}/link_layer", "Token Ring", "devices/mlx5_0/ports/1/link_layer", "expected one of"),
        ("sys/class/infiniband/mlx5_0/node_guid", "xyz", "devices/mlx5_0/node_guid", "expected a GUID"),
        ("sys/class/infiniband/mlx5_0/device/numa_node", "one", "devices/mlx5_0/numa_node", "expected a decimal"),
        ("sys/class/infiniband/mlx5_0/device/vendor", "15b3", "devices/mlx5_0/pci/vendor", "expected 0xNNNN"),
        ("sys/class/net/ens1f0/mtu", "big", "netdevs/ens1f0/mtu", "expected a decimal integer"),
        ("sys/class/net/ens1f0/operstate", "sideways", "netdevs/ens1f0/operstate", "expected one of"),
        ("proc/sys/kernel/random/boot_id", "nope", "node/boot_id", "expected a UUID"),
        ("sys/devices/system/node/node1/cpulist", "4-x", "node/numa_nodes/1/cpulist", "expected a cpulist"),
    ],
)
def test_garbage_becomes_a_field_error(tmp_path, rel, content, path, rule):
    spec = _small_sim()
    spec["raw"] = {rel: content + "\n"}
    inv = si.read_inventory(_host(tmp_path, spec))
    assert len(inv["errors"]) == 1, inv["errors"]
    error = inv["errors"][0]
    assert (error["path"], error["value"]) == (path, content)
    assert error["error"].startswith(rule)
    assert os.path.realpath(os.path.join(tmp_path, "h", error["file"])) == os.path.realpath(
        os.path.join(tmp_path, "h", rel)
    )


def test_garbage_state_leaves_the_rest_of_the_port(tmp_path):
    spec = _small_sim()
    spec["raw"] = {f"{PORT}/state": "garbage", f"{PORT}/gids/1": "zzzz"}
    inv = si.read_inventory(_host(tmp_path, spec))
    port = inv["devices"]["mlx5_0"]["ports"]["1"]
    assert port["state"] is None and port["link_layer"] == "Ethernet"
    assert [g["index"] for g in port["gids"]] == [0, 2, 3]  # the garbage GID is neither listed nor unused
    assert port["gids_unused"] == 12
    assert [e["path"] for e in inv["errors"]] == ["devices/mlx5_0/ports/1/gids/1", "devices/mlx5_0/ports/1/state"]


def test_non_utf8_content_is_a_field_error(tmp_path):
    root = _host(tmp_path, _small_sim())
    with open(os.path.join(root, "sys/class/infiniband/mlx5_0/fw_ver"), "wb") as handle:
        handle.write(b"\xff\xfe\n")
    inv = si.read_inventory(root)
    assert [(e["path"], e["error"]) for e in inv["errors"]] == [("devices/mlx5_0/fw_ver", "content is not UTF-8 text")]


def test_missing_required_file_is_a_field_error(tmp_path):
    root = _host(tmp_path, _small_sim())
    os.unlink(os.path.join(root, PORT, "link_layer"))
    inv = si.read_inventory(root)
    assert [(e["path"], e["error"]) for e in inv["errors"]] == [("devices/mlx5_0/ports/1/link_layer", "file missing")]


def test_link_escaping_root_is_an_error_not_followed(tmp_path):
    root = _host(tmp_path, _small_sim())
    link = os.path.join(root, "sys/class/net/ens1f0/device")
    os.unlink(link)
    os.symlink("/sys/devices", link)
    inv = si.read_inventory(root)
    assert [(e["path"], e["error"]) for e in inv["errors"]] == [("netdevs/ens1f0/device", "link escapes root")]
    assert inv["netdevs"]["ens1f0"]["pci_bdf"] is None


def test_missing_root_raises_a_clear_error(tmp_path):
    with pytest.raises(si.InventoryRootError, match=r"root '.*nowhere': does not exist"):
        si.read_inventory(str(tmp_path / "nowhere"))


def test_root_without_sys_or_proc_raises(tmp_path):
    with pytest.raises(si.InventoryRootError, match="neither sys/ nor proc/"):
        si.read_inventory(str(tmp_path))


def test_host_without_rdma_has_no_devices(tmp_path):
    spec = _small_sim("plain")
    spec["devices"] = []
    inv = si.read_inventory(_host(tmp_path, spec))
    assert inv["devices"] == {} and inv["errors"] == []
    assert inv["netdevs"]["ens1f0"]["rdma_devices"] == []


# ---------------------------------------------------------------- read-only


def _tree_digest(root):
    digest = hashlib.sha256()
    for base, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(base, name)
            stat = os.lstat(path)
            digest.update(f"{path}:{stat.st_mtime_ns}:{stat.st_mode}".encode())
            if not os.path.islink(path):
                with open(path, "rb") as handle:
                    digest.update(handle.read())
    return digest.hexdigest()


def test_reader_opens_nothing_for_writing_and_leaves_the_tree_unchanged(monkeypatch, scenario_roots):
    root = scenario_roots["odd_host"]
    before = _tree_digest(root)
    opened = []
    real_open, real_os_open = builtins.open, os.open

    def spy_open(file, mode="r", *args, **kwargs):
        opened.append((str(file), mode))
        return real_open(file, mode, *args, **kwargs)

    def spy_os_open(path, flags, *args, **kwargs):
        opened.append((str(path), "w" if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) else "r"))
        return real_os_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(io, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    si.read_inventory(root, verbs=True)
    monkeypatch.undo()
    assert opened, "the spy saw no reads"
    assert all(set(mode) <= {"r", "b"} for _, mode in opened), [o for o in opened if set(o[1]) - {"r", "b"}]
    assert not any(path.endswith("/node_desc") for path, _ in opened)
    assert _tree_digest(root) == before


# ---------------------------------------------------------------- IP decoding backends


def test_ipaddress_fallback_gives_the_same_inventory(monkeypatch, scenario_roots):
    root = scenario_roots["odd_host"]
    with_netaddr = si.read_inventory(root)
    monkeypatch.setattr(si, "IP_BACKEND", "ipaddress")
    assert si.read_inventory(root) == with_netaddr


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("::ffff:198.51.100.7", ("198.51.100.7", "ipv4-mapped")),
        ("fe80::1", (None, "link-local")),
        ("fd12::1", (None, "unique-local")),
        ("fec0::1", (None, "site-local")),
        ("ff02::1", (None, "multicast")),
        ("::1", (None, "loopback")),
        ("2001:db8::1", (None, "global")),
    ],
)
def test_classify_gid_both_backends(address, expected):
    import ipaddress

    ip = ipaddress.IPv6Address(address)
    assert si.classify_gid(ip, "netaddr") == expected
    assert si.classify_gid(ip, "ipaddress") == expected


def test_reader_works_without_netaddr(scenario_roots):
    """Nodes are stdlib only: import the reader with netaddr made unimportable, in a fresh process."""
    root = scenario_roots["odd_host"]
    collections = str(COLLECTIONS)
    code = (
        "import sys, json; sys.modules['netaddr'] = None; sys.path.insert(0, sys.argv[1]);"
        "from ansible_collections.orbite.qualification.plugins.module_utils._inventory import sysfs as si;"
        "print(json.dumps([si.IP_BACKEND, si.read_inventory(sys.argv[2])]))"
    )
    out = subprocess.run([sys.executable, "-c", code, collections, root], capture_output=True, text=True, check=True)
    backend, inventory = json.loads(out.stdout)
    assert backend == "ipaddress"
    assert inventory == json.loads(json.dumps(si.read_inventory(root)))


# ---------------------------------------------------------------- parsers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100 Gb/sec (4X EDR)", {"gbps": 100, "width": "4X EDR"}),
        ("2.5 Gb/sec (1X SDR)", {"gbps": 2.5, "width": "1X SDR"}),
    ],
)
def test_parse_rate(text, expected):
    assert si.parse_rate(text) == expected


def test_parse_cpulist():
    assert si.parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert si.parse_cpulist("") == []
    with pytest.raises(si.FieldError, match="low <= high"):
        si.parse_cpulist("3-1")
