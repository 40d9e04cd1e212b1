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
import shutil
import stat
import subprocess
import sys
import types

import pytest
from helpers import bounded
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

    def fake(path, *args):
        for suffix, code in failures.items():
            if path.endswith(suffix):
                raise OSError(code, os.strerror(code), path)
        return real(path, *args)

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
        "gid": "0000:0000:0000:0000:0000:ffff:7f33:640b",
        "type": "RoCE v2",
        "ndev": "ens2f0",
        "ipv4": "127.51.100.11",
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


# ---------------------------------------------------------------- a hostile tree (issue 13)
# The tree under root is input: on a lab node the module runs as root, and a fake or tampered tree
# must not make it read outside root, hang, exhaust memory or crash. Hangs and blow-ups are run in a
# child process under a memory limit and a timeout (helpers.bounded), so they fail, not hang.

_READ_IN_CHILD = """
from ansible_collections.orbite.qualification.plugins.module_utils._inventory import sysfs as si
inventory = si.read_inventory(sys.argv[1])
print(json.dumps({"errors": inventory["errors"], "numa": inventory["node"]["numa_nodes"],
                  "text": si.render_inventory(inventory)}))
"""


def _read_bounded(root, memory=bounded.MEMORY, timeout=30):
    run = bounded.run_bounded(_READ_IN_CHILD, memory=memory, timeout=timeout, args=[root])
    assert not run.hung and run.returncode == 0, run.explain()
    return run.result


def _errors(inventory):
    return [(e["path"], e["error"]) for e in inventory["errors"]]


_CPU_RULE = f"expected CPU numbers below {si.CPU_LIMIT} (the most CPUs a Linux host can have)"


def test_huge_cpulist_range_is_an_error_not_gibibytes(tmp_path):
    root = _host(tmp_path, _small_sim())
    with open(os.path.join(root, "sys/devices/system/node/node0/cpulist"), "w") as handle:
        handle.write("0-99999\n")  # a 5-digit range: past every CPU a Linux host can have
    with open(os.path.join(root, "sys/class/infiniband/mlx5_0/device/local_cpulist"), "w") as handle:
        handle.write("0-999999999\n")
    result = _read_bounded(root, memory=256 << 20)
    assert (
        ("devices/mlx5_0/local_cpulist", "expected a cpulist like '0-3,8-11'"),
        ("node/numa_nodes/0/cpulist", _CPU_RULE),
    ) == tuple(_errors(result))
    assert result["numa"]["0"] == {"cpulist": None} and result["numa"]["1"] == {"cpulist": "4-7"}


def test_cpulist_bound_is_the_largest_nr_cpus():
    assert si.parse_cpulist("0-8191")[-1] == 8191
    with pytest.raises(si.FieldError, match="below 8192"):
        si.parse_cpulist("8192")
    with pytest.raises(si.FieldError, match="expected a cpulist"):
        si.parse_cpulist("0-" + "9" * 5000)  # never reaches int(): 5000 digits is a ValueError there


def _outside_secret(tmp_path):
    secret = tmp_path / "outside" / "shadow"
    secret.parent.mkdir()
    secret.write_text("root:$6$SECRET-HASH:19000:0:99999:7:::\n")
    return secret


def test_file_linked_outside_root_is_not_read(tmp_path):
    root = _host(tmp_path, _small_sim())
    secret = _outside_secret(tmp_path)
    fw_ver = os.path.join(root, "sys/class/infiniband/mlx5_0/fw_ver")
    os.unlink(fw_ver)
    os.symlink(str(secret), fw_ver)
    inventory = si.read_inventory(root)
    assert _errors(inventory) == [("devices/mlx5_0/fw_ver", "link escapes root")]
    assert inventory["devices"]["mlx5_0"]["fw_ver"] is None
    assert "SECRET" not in si.render_inventory(inventory)


def test_directory_linked_outside_root_is_neither_listed_nor_read(tmp_path):
    root = _host(tmp_path, _small_sim())
    secret = _outside_secret(tmp_path)
    # A class entry leading out of root: its files must not be read through it ...
    outside_dev = tmp_path / "outside" / "mlx5_1"
    outside_dev.mkdir()
    for name in ("node_type", "node_guid", "sys_image_guid"):
        (outside_dev / name).write_text(secret.read_text())
    os.mkdir(outside_dev / "ports")
    link = os.path.join(root, "sys/class/infiniband/mlx5_1")
    os.unlink(link)
    os.symlink(str(outside_dev), link)
    # ... and a listed directory leading out of root is not listed.
    outside_net = tmp_path / "outside" / "net"
    (outside_net / "evil0").mkdir(parents=True)
    shutil.rmtree(os.path.join(root, "sys/class/net"))
    os.symlink(str(outside_net), os.path.join(root, "sys/class/net"))
    inventory = si.read_inventory(root)
    text = si.render_inventory(inventory)
    assert "SECRET" not in text and "evil0" not in text
    assert ("netdevs", "link escapes root") in _errors(inventory)
    assert ("devices/mlx5_1/node_guid", "link escapes root") in _errors(inventory)
    assert ("devices/mlx5_1/ports", "link escapes root") in _errors(inventory)


def test_links_inside_root_are_followed(tmp_path):
    # Real sysfs is full of links inside /sys: a file that is a link staying under root is read.
    root = _host(tmp_path, _small_sim())
    fw_ver = os.path.join(root, "sys/class/infiniband/mlx5_0/fw_ver")
    real_dir = os.path.realpath(os.path.dirname(fw_ver))  # the class entry is itself a link
    os.rename(fw_ver, os.path.join(root, "sys", "fw_ver.real"))
    os.symlink(os.path.relpath(os.path.join(root, "sys", "fw_ver.real"), real_dir), fw_ver)
    inventory = si.read_inventory(root)
    assert inventory["errors"] == [] and inventory["devices"]["mlx5_0"]["fw_ver"] == "16.35.2000"


def test_fifo_is_not_opened_and_never_hangs(tmp_path):
    root = _host(tmp_path, _small_sim())
    fw_ver = os.path.join(root, "sys/class/infiniband/mlx5_0/fw_ver")
    os.unlink(fw_ver)
    os.mkfifo(fw_ver)
    result = _read_bounded(root, timeout=20)
    assert _errors(result) == [("devices/mlx5_0/fw_ver", "not a regular file (a FIFO)")]


def test_fifo_swapped_in_after_the_check_never_hangs(tmp_path):
    # The race: the path was a file when checked and is a FIFO when opened. The open is
    # non-blocking and fstat-checked, so the reader still returns at once.
    from ansible_collections.orbite.qualification.plugins.module_utils._common import files

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    real_stat = os.stat
    fake = types.SimpleNamespace(st_mode=stat.S_IFREG | 0o644)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "stat", lambda *a, **k: fake if str(a[0]).endswith("fifo") else real_stat(*a, **k))
        with pytest.raises(files.NotRegularFile, match="is a FIFO"):
            files.read_regular_bytes(str(fifo), 100)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_device_node_is_not_read(tmp_path):
    root = _host(tmp_path, _small_sim())
    fw_ver = os.path.join(root, "sys/class/infiniband/mlx5_0/fw_ver")
    os.unlink(fw_ver)
    os.mknod(fw_ver, stat.S_IFCHR | 0o444, os.makedev(1, 5))  # /dev/zero: endless NULs
    inventory = si.read_inventory(root)
    assert _errors(inventory) == [("devices/mlx5_0/fw_ver", "not a regular file (a character device)")]


def test_file_over_the_read_limit_is_refused_whole(tmp_path):
    root = _host(tmp_path, _small_sim())
    with open(os.path.join(root, "sys/class/infiniband/mlx5_0/fw_ver"), "w") as handle:
        handle.write("1" * (si.READ_LIMIT + 1))  # cut at the limit, it would pass for a version
    inventory = si.read_inventory(root)
    assert _errors(inventory) == [("devices/mlx5_0/fw_ver", f"file larger than {si.READ_LIMIT} bytes")]


@pytest.mark.parametrize("name", ["\u00b2", "\u0661", "01", "1 ", "port1"])
def test_port_directory_that_is_not_an_ascii_number_is_an_error_entry(tmp_path, name):
    root = _host(tmp_path, _small_sim())
    os.mkdir(os.path.join(root, "sys/class/infiniband/mlx5_0/ports", name))
    inventory = si.read_inventory(root)
    assert _errors(inventory) == [
        ("devices/mlx5_0/ports", "expected a port number (ASCII digits, no leading zero)")
    ]
    assert inventory["errors"][0]["value"] == name
    assert list(inventory["devices"]["mlx5_0"]["ports"]) == ["1"]


def test_gid_directory_names_are_parsed_strictly(tmp_path):
    root = _host(tmp_path, _small_sim())
    gids = os.path.join(root, PORT, "gids")
    with open(os.path.join(gids, "\u00b2"), "w") as handle:
        handle.write("fe80:0000:0000:0000:0000:0000:0000:0001\n")
    with open(os.path.join(gids, "03"), "w") as handle:  # would be a second slot 3
        handle.write("fe80:0000:0000:0000:0000:0000:0000:0002\n")
    inventory = si.read_inventory(root)
    port = inventory["devices"]["mlx5_0"]["ports"]["1"]
    assert port["gid_tbl_len"] == 16 and [g["index"] for g in port["gids"]] == [0, 1, 2, 3]
    assert sorted((e["file"].rsplit("/", 1)[1], e["error"]) for e in inventory["errors"]) == [
        ("03", "expected a GID index number (ASCII digits, no leading zero)"),
        ("\u00b2", "expected a GID index number (ASCII digits, no leading zero)"),
    ]


def test_numa_directory_with_other_digits_is_not_another_node(tmp_path):
    # int() of an Arabic-Indic one is 1: 'node' + that digit read as node 1 would replace node1's cpulist.
    root = _host(tmp_path, _small_sim())
    for name in ("node\u0661", "node\u00b2", "node01"):
        os.mkdir(os.path.join(root, "sys/devices/system/node", name))
        with open(os.path.join(root, "sys/devices/system/node", name, "cpulist"), "w") as handle:
            handle.write("99\n")
    inventory = si.read_inventory(root)
    assert inventory["node"]["numa_nodes"] == {"0": {"cpulist": "0-3"}, "1": {"cpulist": "4-7"}}
    assert sorted(e["value"] for e in inventory["errors"]) == sorted(["01", "\u0661", "\u00b2"])
    assert {e["error"] for e in inventory["errors"]} == {"expected a NUMA node number (ASCII digits, no leading zero)"}


@pytest.mark.parametrize(
    ("rel", "content", "rule"),
    [
        (f"{PORT}/state", "9" * 5000 + ": ACTIVE", "expected '<number>: <NAME>'"),  # int() refuses 4300+ digits
        (f"{PORT}/state", "\u0664: ACTIVE", "expected '<number>: <NAME>'"),  # int() of an Arabic-Indic 4 is 4
        (f"{PORT}/rate", "\u0661\u0660\u0660 Gb/sec (4X EDR)", "expected '<number> Gb/sec (<width>)'"),
        (f"{PORT}/lid", "0x1_1", "expected a hexadecimal LID"),  # int('0x1_1', 16) == 17
        (f"{PORT}/lid", "f" * 5000, "expected a hexadecimal LID"),
        ("sys/class/net/ens1f0/mtu", "\u0661\u0665\u0660\u0660", "expected a decimal integer"),
    ],
)
def test_numbers_in_files_are_bounded_ascii_digits(tmp_path, rel, content, rule):
    spec = _small_sim()
    spec["raw"] = {rel: content + "\n"}
    inventory = si.read_inventory(_host(tmp_path, spec))
    assert len(inventory["errors"]) == 1 and inventory["errors"][0]["error"].startswith(rule), inventory["errors"]


def test_error_entry_value_is_cut(tmp_path):
    spec = _small_sim()
    spec["raw"] = {f"{PORT}/state": "x" * 10000 + "\n"}
    inventory = si.read_inventory(_host(tmp_path, spec))
    value = inventory["errors"][0]["value"]
    assert len(value) == si.VALUE_LIMIT and value.endswith("...")


def test_numa_node_minus_one_is_unknown_not_an_error(tmp_path):
    # The kernel writes -1 for a device without NUMA affinity.
    spec = _small_sim()
    spec["raw"] = {"sys/class/infiniband/mlx5_0/device/numa_node": "-1\n"}
    inventory = si.read_inventory(_host(tmp_path, spec))
    assert inventory["errors"] == [] and inventory["devices"]["mlx5_0"]["numa_node"] is None
    with pytest.raises(si.FieldError):
        si.parse_int("-1")  # only where a negative minimum is given
