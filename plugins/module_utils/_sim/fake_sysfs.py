# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Fake host root generator: a directory that looks like one RNIC host to the node-side modules.

Stdlib only (it runs on nodes of the simulated lab too). ``write_host(root, spec)`` writes, under
``root``, exactly the layout of the cross-helper contract 1::

    proc/sys/kernel/hostname            proc/sys/kernel/random/boot_id   proc/sys/kernel/osrelease
    etc/machine-id (optional)           sys/devices/system/node/nodeN/cpulist
    sys/class/infiniband/<dev>          -> ../../devices/<parent>/infiniband/<dev>
    sys/class/infiniband_verbs/uverbsN  -> ../../devices/<parent>/infiniband_verbs/uverbsN
    sys/class/net/<ifname>              -> ../../devices/<parent>/net/<ifname>

as the kernel shows it for mlx5 RoCE devices: the class entries are relative symlinks into
``sys/devices``, a PCI function directory holds ``vendor``, ``device``, ``modalias``, ``numa_node``,
``local_cpulist``, ``net/<ifname>``, ``infiniband/<dev>`` and ``infiniband_verbs/uverbsN`` (``ibdev``,
``abi_version``, ``dev`` = char device numbers, ``device`` link; the class directory also holds the
uverbs ``abi_version``): what rdma-core's libibverbs reads to enumerate the device; the RDMA
device directory holds ``node_type``, ``node_guid``, ``sys_image_guid``, ``fw_ver``, ``hca_type``,
``board_id``, ``node_desc``, a ``device`` link to its PCI function and
``ports/<n>/{state,phys_state,link_layer,rate,lid,gids/<i>,gid_attrs/types/<i>,gid_attrs/ndevs/<i>}``.
A virtual (rxe-like) device lives under ``sys/devices/virtual/infiniband/``, has no ``device`` link
(nor has its uverbsN) and names its netdev in a ``parent`` file; libibverbs matches it to a provider
by its name (rxe's ``rxe*``), not by a modalias.

Unused GID slots read as the all-zero GID. On a real host their ``gid_attrs`` files fail with EINVAL
when read; a plain file cannot, so here they exist and are empty (the reader's EINVAL path is tested
by making its read function raise). Every GID slot up to ``gid_tbl_len`` is written.

Spec dict (JSON-compatible; integers may also be given as decimal strings)::

    {
      "hostname": "sim-a",                      # required
      "boot_id": "8c1d...-...",                 # required, any text (a UUID on real hosts)
      "osrelease": "6.1.0-orbite-sim",          # optional
      "machine_id": "32 hex chars",             # optional: etc/machine-id only when given
      "numa_nodes": {"0": "0-3", "1": "4-7"},   # NUMA node id -> cpulist text
      "pci": {                                  # PCI functions, by BDF
        "0000:3b:00.0": {"vendor": "0x15b3", "device": "0x1017",
                         "numa_node": 0,        # -1 = unknown, as the kernel writes it
                         "local_cpulist": "0-3",
                         "modalias": null}      # optional: default derived from vendor/device
      },
      "netdevs": [
        {"name": "ens1f0", "mac": "0c:42:a1:00:00:10", "mtu": 1500, "operstate": "up",
         "ifindex": 4, "type": 1,               # 1 Ethernet, 32 InfiniBand (ARPHRD_*)
         "pci": "0000:3b:00.0"}                 # or null: a virtual netdev (sys/devices/virtual/net)
      ],
      "devices": [
        {"name": "mlx5_0",
         "pci": "0000:3b:00.0",                 # null/absent: virtual device, give "parent_netdev"
         "parent_netdev": null,
         "node_type": "1: CA", "node_guid": "0c42:a103:0000:0010",
         "sys_image_guid": "0c42:a103:0000:0010", "fw_ver": "16.35.2000",
         "hca_type": "MT4119", "board_id": "MT_0000000010",   # optional (omitted when null)
         "node_desc": "sim-a mlx5_0",
         "uverbs": "uverbs0",                   # optional: uverbs<N>, char device 231:(192 + N)
         "uverbs_abi_version": 1,               # optional (mlx5: 1, rxe: 2)
         "ports": [
           {"num": 1, "state": "4: ACTIVE", "phys_state": "5: LinkUp",
            "link_layer": "Ethernet", "rate": "100 Gb/sec (4X EDR)", "lid": "0x0",
            "gid_tbl_len": 256,
            "gids": {"0": {"gid": "fe80:0000:0000:0000:0e42:a1ff:fe00:0010",
                           "type": "IB/RoCE v1", "ndev": "ens1f0"}}}
         ]}
      ],
      "raw": {"sys/class/infiniband/mlx5_0/ports/1/state": "garbage"}   # optional overrides
    }

``state``/``phys_state``/``node_type`` take the sysfs text (``"4: ACTIVE"``); a bare known name
(``"ACTIVE"``, ``"LinkUp"``, ``"CA"``) is expanded to it. ``raw`` writes the given text verbatim to
paths relative to ``root`` after everything else (following the class links), to inject garbage.
GID ``ndev`` may be null (InfiniBand ports): the ndev file is then empty.

Safety: ``write_host`` refuses ``/`` and refuses a root that already has ``sys`` or ``proc`` unless
they were written by an earlier ``write_host`` (marker file ``.orbite-fake-host``); those are then
replaced, and anything else under root (the lock dir ``run/orbite/locks``) is kept.
"""

import ipaddress
import os
import shutil

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError

MARKER = ".orbite-fake-host"
DEFAULT_OSRELEASE = "6.1.0-orbite-sim"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
MELLANOX_VENDOR = "0x15b3"
CONNECTX5_DEVICE = "0x1017"
# What rdma-core's libibverbs reads to enumerate a device (docs/inventory.md, "libibverbs"): the
# uverbs class ABI, each uverbsN's char device numbers (the kernel's ib_uverbs major, minors from
# 192) and ABI, and the PCI modalias its providers match (PCI class 02: network controller).
UVERBS_CLASS_ABI = "6"
UVERBS_MAJOR = 231
UVERBS_MINOR_BASE = 192
PCI_CLASS = "020000"
# The lab's RoCE GIDs are loopback addresses: the loopback verbs provider listens on them, and
# 127.0.0.0/8 is local in every network namespace (docs/provider.md).
SIM_IPV4_NET = "127.51.100.0/24"
SIM_MAX_INDEX = 99
# A host of the lab has 2 RNICs, or 4 (sim_lab_rnics: two lanes of a case's two rails, docs/qualification.md).
SIM_RNICS = (2, 4)
# RNICs 2 and 3 of a 4-RNIC host: their own /24, so the first two keep their addresses whatever the count.
SIM_IPV4_NET_EXTRA = "127.51.101.0/24"
# PCI buses of RNIC k (the first two are the 2-RNIC host's).
SIM_BUSES = ("3b", "86", "af", "d8")

PORT_STATES = {"NOP": 0, "DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
PHYS_STATES = {
    "Sleep": 1,
    "Polling": 2,
    "Disabled": 3,
    "PortConfigurationTraining": 4,
    "LinkUp": 5,
    "LinkErrorRecovery": 6,
    "Phy Test": 7,
}
NODE_TYPES = {"CA": 1, "SWITCH": 2, "ROUTER": 3, "RNIC": 4, "USNIC": 5, "USNIC_UDP": 6}


class FakeSysfsError(OrbiteError):
    """A spec that cannot be written, or a root that must not be touched."""

    code = "sim.fake_sysfs"


# ---------------------------------------------------------------- small helpers for specs


def gid_text(address):
    """sysfs text of a GID (8 groups of 4 hex digits) for an IPv6 or IPv4 address (IPv4 -> mapped)."""
    ip = ipaddress.ip_address(address)
    if ip.version == 4:
        ip = ipaddress.IPv6Address("::ffff:" + str(ip))
    packed = ip.packed
    return ":".join(f"{packed[i]:02x}{packed[i + 1]:02x}" for i in range(0, 16, 2))


def link_local_gid(mac):
    """RoCE link-local GID derived from a MAC address (modified EUI-64), as the kernel builds it."""
    try:
        octets = [int(part, 16) for part in mac.split(":")]
    except ValueError:
        octets = []
    if len(octets) != 6 or not all(0 <= o <= 255 for o in octets):
        raise FakeSysfsError(f"mac {mac!r}: expected 6 colon-separated hex octets")
    octets[0] ^= 0x02
    eui = [*octets[:3], 255, 254, *octets[3:]]
    groups = ["fe80", "0000", "0000", "0000"]
    groups += [f"{eui[i]:02x}{eui[i + 1]:02x}" for i in range(0, 8, 2)]
    return ":".join(groups)


def guid_from_mac(mac):
    """node GUID text (4 groups) derived from a MAC, the way mlx5 RoCE firmware usually does."""
    octets = mac.split(":")
    raw = "".join(octets[:3]) + "0300" + "".join(octets[3:])
    return ":".join(raw[i:i + 4] for i in range(0, 16, 4))


def roce_gid_pair(address, ndev):
    """The RoCE v1 and v2 entries the kernel creates for one address on one netdev."""
    text = gid_text(address)
    return [
        {"gid": text, "type": "IB/RoCE v1", "ndev": ndev},
        {"gid": text, "type": "RoCE v2", "ndev": ndev},
    ]


def gid_table(entries, start=0):
    """Index a list of GID entries from ``start`` (a None entry leaves a hole)."""
    table = {}
    for offset, entry in enumerate(entries):
        if entry is not None:
            table[str(start + offset)] = entry
    return table


def mlx5_roce_device(
    name,
    bdf,
    netdev,
    mac,
    *,
    ipv4=None,
    fw_ver="16.35.2000",
    state="ACTIVE",
    gid_tbl_len=256,
    uverbs=None,
    node_desc=None,
):
    """One mlx5-like single-port RoCE device: link-local v1/v2 at 0/1, then IPv4 v1/v2 at 2/3."""
    entries = roce_gid_pair(_ll_address(mac), netdev)
    if ipv4 is not None:
        entries += roce_gid_pair(ipv4, netdev)
    guid = guid_from_mac(mac)
    up = state == "ACTIVE"
    return {
        "name": name,
        "pci": bdf,
        "node_type": "1: CA",
        "node_guid": guid,
        "sys_image_guid": guid,
        "fw_ver": fw_ver,
        "hca_type": "MT4119",
        "board_id": "MT_0000000010",
        "node_desc": node_desc if node_desc is not None else name,
        "uverbs": uverbs,
        "ports": [
            {
                "num": 1,
                "state": state,
                "phys_state": "LinkUp" if up else "Disabled",
                "link_layer": "Ethernet",
                "rate": "100 Gb/sec (4X EDR)",
                "lid": "0x0",
                "gid_tbl_len": gid_tbl_len,
                "gids": gid_table(entries),
            }
        ],
    }


def _ll_address(mac):
    """IPv6 link-local address (text) of a MAC, for gid_text."""
    groups = link_local_gid(mac).split(":")
    return str(ipaddress.IPv6Address(":".join(groups)))


def sim_host_spec(index, hostname, rnics=2):
    """Spec of the simulated lab's host number ``index`` (0..99).

    Two mlx5-like RoCE RNICs ``mlx5_0`` (NUMA 0, netdev ``ens1f0``) and ``mlx5_1`` (NUMA 1, netdev
    ``ens2f0``), one ACTIVE Ethernet port each, with RoCE v1+v2 GID pairs for the IPv6 link-local
    (indexes 0/1) and for an IPv4 of 127.51.100.0/24 (indexes 2/3): ``127.51.100.<10 + 2*index + k>``
    for RNIC k (loopback, so the loopback verbs provider can listen on it). NUMA nodes 0 (cpus 0-3)
    and 1 (cpus 4-7). MACs, GUIDs and the boot ID derive from ``index``, so two hosts of the lab never
    share them. ``rnics=4`` adds ``mlx5_2`` and ``mlx5_3`` (netdevs ``ens3f0``/``ens4f0``, NUMA 0/1) at
    ``127.51.101.<10 + 2*index + k - 2>``; the first two RNICs are the same as a 2-RNIC host's.
    """
    index = _as_int(index, "index")
    if not 0 <= index <= SIM_MAX_INDEX:
        raise FakeSysfsError(f"index {index!r}: must be within 0..{SIM_MAX_INDEX}")
    if not isinstance(hostname, str) or not hostname or "/" in hostname or "\n" in hostname:
        raise FakeSysfsError(f"hostname {hostname!r}: must be a non-empty single-line name without '/'")
    rnics = _as_int(rnics, "rnics")
    if rnics not in SIM_RNICS:
        raise FakeSysfsError(f"rnics {rnics!r}: must be one of {', '.join(map(str, SIM_RNICS))}")
    nets = [ipaddress.IPv4Network(net).network_address for net in (SIM_IPV4_NET, SIM_IPV4_NET_EXTRA)]
    spec = {
        "hostname": hostname,
        "boot_id": f"0b5e1d00-0000-4000-8000-{0xA11CE0000 + index:012x}",
        "osrelease": DEFAULT_OSRELEASE,
        "machine_id": f"{0x5EED0000 + index:032x}",
        "numa_nodes": {"0": "0-3", "1": "4-7"},
        "pci": {},
        "netdevs": [],
        "devices": [],
    }
    for k, bus in enumerate(SIM_BUSES[:rnics]):
        bdf = f"0000:{bus}:00.0"
        netdev = f"ens{k + 1}f0"
        mac = f"0c:42:a1:{index:02x}:{k:02x}:{0x10:02x}"
        ipv4 = str(nets[k // 2] + 10 + 2 * index + k % 2)
        spec["pci"][bdf] = {
            "vendor": MELLANOX_VENDOR,
            "device": CONNECTX5_DEVICE,
            "numa_node": k % 2,
            "local_cpulist": spec["numa_nodes"][str(k % 2)],
        }
        spec["netdevs"].append(
            {
                "name": netdev,
                "mac": mac,
                "mtu": 1500,
                "operstate": "up",
                "ifindex": 4 + k,
                "type": 1,
                "pci": bdf,
            }
        )
        spec["devices"].append(
            mlx5_roce_device(
                f"mlx5_{k}",
                bdf,
                netdev,
                mac,
                ipv4=ipv4,
                uverbs=f"uverbs{k}",
                node_desc=f"{hostname} mlx5_{k}",
            )
        )
    return spec


def _host_base(hostname, boot_id):
    return {
        "hostname": hostname,
        "boot_id": boot_id,
        "osrelease": DEFAULT_OSRELEASE,
        "numa_nodes": {"0": "0-3", "1": "4-7"},
        "pci": {},
        "netdevs": [],
        "devices": [],
    }


def _mlx5_pci(numa_node, cpulist):
    return {
        "vendor": MELLANOX_VENDOR,
        "device": CONNECTX5_DEVICE,
        "numa_node": numa_node,
        "local_cpulist": cpulist,
    }


def _ethernet(name, mac, bdf, ifindex, operstate="up"):
    return {
        "name": name,
        "mac": mac,
        "mtu": 1500,
        "operstate": operstate,
        "ifindex": ifindex,
        "type": 1,
        "pci": bdf,
    }


def dual_port_host_spec(hostname="dual-a"):
    """One mlx5-like RoCE device ``mlx5_0`` with two ACTIVE Ethernet ports (netdevs ``ens1f0`` and
    ``ens1f1`` on the same PCI function, NUMA 0), v1+v2 pairs for link-local and IPv4 on each port."""
    spec = _host_base(hostname, "d0a1d0a1-0000-4000-8000-000000000001")
    bdf = "0000:3b:00.0"
    spec["pci"][bdf] = _mlx5_pci(0, "0-3")
    dev = mlx5_roce_device("mlx5_0", bdf, "ens1f0", "0c:42:a1:d0:00:10", ipv4="198.51.100.201", uverbs="uverbs0")
    spec["netdevs"].append(_ethernet("ens1f0", "0c:42:a1:d0:00:10", bdf, 4))
    spec["netdevs"].append(_ethernet("ens1f1", "0c:42:a1:d0:00:11", bdf, 5))
    second = mlx5_roce_device("mlx5_0", bdf, "ens1f1", "0c:42:a1:d0:00:11", ipv4="198.51.100.202")["ports"][0]
    second["num"] = 2
    dev["ports"].append(second)
    spec["devices"].append(dev)
    return spec


def odd_host_spec(hostname="odd-a"):
    """Every odd case the reader must model, on one host:

    - ``mlx5_0``: RoCE, NUMA node -1 (unknown), sparse GID table: link-local v1/v2 at 0/1, a hole at
      2/3, IPv4 v1/v2 at 4/5, IPv6 global (2001:db8::) v1/v2 at 8/9;
    - ``mlx5_1``: RoCE port DOWN (``1: DOWN`` / ``3: Disabled``), netdev operstate down, NUMA 1;
    - ``mlx5_2``: an InfiniBand port (LID 0x11, GID type ``IB/RoCE v1`` without ndev), IPoIB netdev;
    - ``rxe0``: an rxe-like virtual device (no ``device`` link, ``parent`` = ``enp0s3``, a virtio NIC);
    - ``lo``: a virtual netdev that belongs to no RDMA device.
    """
    spec = _host_base(hostname, "0dd0dd00-0000-4000-8000-000000000001")
    spec["pci"]["0000:3b:00.0"] = _mlx5_pci(-1, "0-7")
    spec["pci"]["0000:86:00.0"] = _mlx5_pci(1, "4-7")
    spec["pci"]["0000:5e:00.0"] = dict(_mlx5_pci(0, "0-3"), device="0x101b")
    spec["pci"]["0000:00:03.0"] = {
        "vendor": "0x1af4",
        "device": "0x1000",
        "numa_node": -1,
        "local_cpulist": "0-7",
    }

    mac0 = "0c:42:a1:0d:00:10"
    dev0 = mlx5_roce_device("mlx5_0", "0000:3b:00.0", "ens1f0", mac0, uverbs="uverbs0")
    entries = roce_gid_pair(_ll_address(mac0), "ens1f0")
    entries += [None, None]
    entries += roce_gid_pair("198.51.100.210", "ens1f0")
    entries += [None, None]
    entries += roce_gid_pair("2001:db8::10", "ens1f0")
    dev0["ports"][0]["gids"] = gid_table(entries)

    mac1 = "0c:42:a1:0d:01:10"
    dev1 = mlx5_roce_device("mlx5_1", "0000:86:00.0", "ens2f0", mac1, state="DOWN", uverbs="uverbs1")

    guid2 = "0c42:a103:000d:0210"
    dev2 = {
        "name": "mlx5_2",
        "pci": "0000:5e:00.0",
        "node_type": "1: CA",
        "node_guid": guid2,
        "sys_image_guid": guid2,
        "fw_ver": "20.39.1002",
        "hca_type": "MT4123",
        "board_id": "MT_0000000222",
        "uverbs": "uverbs2",
        "ports": [
            {
                "num": 1,
                "state": "ACTIVE",
                "phys_state": "LinkUp",
                "link_layer": "InfiniBand",
                "rate": "200 Gb/sec (4X HDR)",
                "lid": "0x11",
                "gid_tbl_len": 128,
                "gids": {"0": {"gid": "fe80:0000:0000:0000:" + guid2, "type": "IB/RoCE v1", "ndev": None}},
            }
        ],
    }

    macr = "52:54:00:0d:03:10"
    rxe = {
        "name": "rxe0",
        "pci": None,
        "parent_netdev": "enp0s3",
        "node_type": "1: CA",
        "node_guid": guid_from_mac(macr),
        "fw_ver": "0.0.0",
        "uverbs": "uverbs3",
        "uverbs_abi_version": 2,  # the kernel's rxe ABI; libibverbs matches rxe by name (no modalias)
        "ports": [
            {
                "num": 1,
                "state": "ACTIVE",
                "phys_state": "LinkUp",
                "link_layer": "Ethernet",
                "rate": "100 Gb/sec (4X EDR)",
                "lid": "0x0",
                "gid_tbl_len": 1024,
                "gids": gid_table(roce_gid_pair(_ll_address(macr), "enp0s3") + roce_gid_pair("192.0.2.5", "enp0s3")),
            }
        ],
    }
    spec["devices"] = [dev0, dev1, dev2, rxe]
    spec["netdevs"] = [
        _ethernet("ens1f0", mac0, "0000:3b:00.0", 4),
        _ethernet("ens2f0", mac1, "0000:86:00.0", 5, operstate="down"),
        {
            "name": "ibp94s0",
            "mac": "00:00:10:49:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:0d:02:10",
            "mtu": 4092,
            "operstate": "up",
            "ifindex": 6,
            "type": 32,
            "pci": "0000:5e:00.0",
        },
        _ethernet("enp0s3", macr, "0000:00:03.0", 2),
        {
            "name": "lo",
            "mac": "00:00:00:00:00:00",
            "mtu": 65536,
            "operstate": "unknown",
            "ifindex": 1,
            "type": 772,
            "pci": None,
        },
    ]
    return spec


def bench_host_spec(devices=16, ports=2, gids=256, hostname="bench-a"):
    """A large host for benchmarks: ``devices`` RoCE devices x ``ports`` ports, every one of the
    ``gids`` slots used (v1/v2 pairs for link-local, IPv4 and IPv6 addresses)."""
    spec = _host_base(hostname, "be9cbe9c-0000-4000-8000-000000000001")
    for d in range(devices):
        bdf = f"0000:{0x10 + d:02x}:00.0"
        spec["pci"][bdf] = _mlx5_pci(d % 2, spec["numa_nodes"][str(d % 2)])
        dev = None
        for p in range(1, ports + 1):
            netdev = f"ens{d}f{p - 1}"
            mac = f"0c:42:a1:be:{d:02x}:{p:02x}"
            spec["netdevs"].append(_ethernet(netdev, mac, bdf, 10 + d * ports + p))
            entries = roce_gid_pair(_ll_address(mac), netdev)
            n = 0
            while len(entries) < gids:
                address = f"10.{d}.{p}.{n}" if n % 2 == 0 else f"2001:db8:{d:x}:{p:x}::{n:x}"
                entries += roce_gid_pair(address, netdev)
                n += 1
            port = mlx5_roce_device(f"mlx5_{d}", bdf, netdev, mac, gid_tbl_len=gids)["ports"][0]
            port["num"] = p
            port["gids"] = gid_table(entries[:gids])
            if dev is None:
                dev = mlx5_roce_device(f"mlx5_{d}", bdf, netdev, mac, uverbs=f"uverbs{d}")
                dev["ports"] = []
            dev["ports"].append(port)
        spec["devices"].append(dev)
    return spec


SCENARIOS = {
    "sim_host": lambda: sim_host_spec(0, "sim-a"),
    "dual_port": dual_port_host_spec,
    "odd_host": odd_host_spec,
}


# ---------------------------------------------------------------- writing


def write_host(root, spec):
    """Write the fake host described by ``spec`` under ``root``; returns {"root", "files", "links"}."""
    root = os.path.abspath(str(root))
    if os.path.realpath(root) == os.path.sep:
        raise FakeSysfsError(f"root {root!r}: refusing to write a fake host over the real root")
    _check_spec(spec)
    _clear_previous(root)
    writer = _Writer(root)
    _write_node(writer, spec)
    pci_dirs = _write_pci(writer, spec)
    _write_netdevs(writer, spec, pci_dirs)
    _write_devices(writer, spec, pci_dirs)
    for rel, text in sorted(spec.get("raw", {}).items()):
        writer.file(os.path.normpath(rel), text, raw=True)
    writer.file(MARKER, "written by orbite.qualification fake_sysfs.write_host\n", raw=True)
    return {"root": root, "files": writer.files, "links": writer.links}


class _Writer:
    def __init__(self, root):
        self.root = root
        self.files = 0
        self.links = 0
        self._made = set()

    def _parent(self, path):
        parent = os.path.dirname(path)
        if parent not in self._made:  # GID tables are thousands of files in a few directories
            os.makedirs(parent, exist_ok=True)
            self._made.add(parent)

    def file(self, rel, text, raw=False):
        path = os.path.join(self.root, rel)
        self._parent(path)
        data = text if raw or text.endswith("\n") or text == "" else text + "\n"
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(data)
        self.files += 1

    def link(self, rel, target_rel):
        """Relative symlink ``rel`` -> ``target_rel`` (both relative to root), like sysfs."""
        path = os.path.join(self.root, rel)
        self._parent(path)
        target = os.path.relpath(os.path.join(self.root, target_rel), os.path.dirname(path))
        os.symlink(target, path)
        self.links += 1


def _clear_previous(root):
    marker = os.path.join(root, MARKER)
    owned = ("sys", "proc", os.path.join("etc", "machine-id"))
    present = [name for name in owned if os.path.lexists(os.path.join(root, name))]
    if present and not os.path.exists(marker):
        raise FakeSysfsError(
            f"root {root!r}: already has {', '.join(present)} not written by write_host; refusing to replace it"
        )
    for name in present:
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def _write_node(writer, spec):
    writer.file("proc/sys/kernel/hostname", spec["hostname"])
    writer.file("proc/sys/kernel/random/boot_id", spec["boot_id"])
    writer.file("proc/sys/kernel/osrelease", spec.get("osrelease", DEFAULT_OSRELEASE))
    if spec.get("machine_id"):
        writer.file("etc/machine-id", spec["machine_id"])
    nodes = spec.get("numa_nodes", {})
    for node in sorted(nodes, key=lambda n: _as_int(n, "numa_nodes key")):
        writer.file(f"sys/devices/system/node/node{_as_int(node, 'numa_nodes key')}/cpulist", nodes[node])


def _pci_dir(bdf):
    # Behind a root port of host bridge 0000:00, as on a typical server: pci0000:00/0000:00:NN.0/<bdf>.
    slot = int(bdf.split(":")[1], 16) % 32
    return f"sys/devices/pci0000:00/0000:00:{slot:02x}.0/{bdf}"


def _write_pci(writer, spec):
    dirs = {}
    for bdf, info in sorted(spec.get("pci", {}).items()):
        base = _pci_dir(bdf)
        dirs[bdf] = base
        writer.file(base + "/vendor", info.get("vendor", MELLANOX_VENDOR))
        writer.file(base + "/device", info.get("device", CONNECTX5_DEVICE))
        writer.file(base + "/numa_node", str(info.get("numa_node", -1)))
        writer.file(base + "/local_cpulist", info.get("local_cpulist", ""))
        writer.file(base + "/modalias", info.get("modalias") or pci_modalias(info))
    return dirs


def pci_modalias(info):
    """The kernel's modalias text of a PCI function (what libibverbs providers match), e.g.
    ``pci:v000015B3d00001017sv000015B3sd00000000bc02sc00i00`` for a ConnectX-5."""
    vendor = int(info.get("vendor", MELLANOX_VENDOR), 16)
    device = int(info.get("device", CONNECTX5_DEVICE), 16)
    cls = PCI_CLASS
    return f"pci:v{vendor:08X}d{device:08X}sv{vendor:08X}sd00000000bc{cls[0:2]}sc{cls[2:4]}i{cls[4:6]}"


def uverbs_dev(uverbs):
    """'major:minor' of ``/dev/infiniband/uverbsN``, as the kernel numbers it (231:192+N)."""
    return f"{UVERBS_MAJOR}:{UVERBS_MINOR_BASE + _as_int(uverbs[len('uverbs'):], 'uverbs number')}"


def _write_netdevs(writer, spec, pci_dirs):
    for net in spec.get("netdevs", []):
        name = net["name"]
        bdf = net.get("pci")
        base = (f"{pci_dirs[bdf]}/net/{name}") if bdf else f"sys/devices/virtual/net/{name}"
        writer.file(base + "/address", net.get("mac", "00:00:00:00:00:00"))
        writer.file(base + "/mtu", str(net.get("mtu", 1500)))
        writer.file(base + "/operstate", net.get("operstate", "up"))
        writer.file(base + "/ifindex", str(net.get("ifindex", 1)))
        writer.file(base + "/type", str(net.get("type", 1)))
        if bdf:
            writer.link(base + "/device", pci_dirs[bdf])
        writer.link(f"sys/class/net/{name}", base)


def _write_devices(writer, spec, pci_dirs):
    if any(dev.get("uverbs") for dev in spec.get("devices", [])):
        writer.file("sys/class/infiniband_verbs/abi_version", UVERBS_CLASS_ABI)
    for dev in spec.get("devices", []):
        name = dev["name"]
        bdf = dev.get("pci")
        parent = pci_dirs[bdf] if bdf else "sys/devices/virtual"
        base = f"{parent}/infiniband/{name}"
        writer.file(base + "/node_type", _expand(dev.get("node_type", "1: CA"), NODE_TYPES))
        writer.file(base + "/node_guid", dev["node_guid"])
        writer.file(base + "/sys_image_guid", dev.get("sys_image_guid", dev["node_guid"]))
        writer.file(base + "/fw_ver", dev.get("fw_ver", ""))
        writer.file(base + "/node_desc", dev.get("node_desc", name))
        for optional in ("hca_type", "board_id"):
            if dev.get(optional) is not None:
                writer.file(base + "/" + optional, dev[optional])
        if bdf:
            writer.link(base + "/device", pci_dirs[bdf])
        else:
            writer.file(base + "/parent", dev["parent_netdev"])
        writer.link(f"sys/class/infiniband/{name}", base)
        if dev.get("uverbs"):
            verbs = "{}/infiniband_verbs/{}".format(parent, dev["uverbs"])
            writer.file(verbs + "/ibdev", name)
            writer.file(verbs + "/abi_version", str(_as_int(dev.get("uverbs_abi_version", 1), "uverbs_abi_version")))
            writer.file(verbs + "/dev", uverbs_dev(dev["uverbs"]))
            if bdf:
                writer.link(verbs + "/device", pci_dirs[bdf])
            writer.link("sys/class/infiniband_verbs/{}".format(dev["uverbs"]), verbs)
        for port in dev.get("ports", []):
            _write_port(writer, f"{base}/ports/{_as_int(port['num'], 'port num')}", port)


def _write_port(writer, base, port):
    writer.file(base + "/state", _expand(port.get("state", "ACTIVE"), PORT_STATES))
    writer.file(base + "/phys_state", _expand(port.get("phys_state", "LinkUp"), PHYS_STATES))
    writer.file(base + "/link_layer", port.get("link_layer", "Ethernet"))
    writer.file(base + "/rate", port.get("rate", "100 Gb/sec (4X EDR)"))
    writer.file(base + "/lid", port.get("lid", "0x0"))
    gids = {_as_int(k, "gid index"): v for k, v in port.get("gids", {}).items()}
    for index in range(_as_int(port.get("gid_tbl_len", 256), "gid_tbl_len")):
        entry = gids.get(index)
        writer.file(f"{base}/gids/{index}", entry["gid"] if entry else ZERO_GID)
        writer.file(f"{base}/gid_attrs/types/{index}", entry["type"] if entry else "")
        ndev = entry.get("ndev") if entry else None
        writer.file(f"{base}/gid_attrs/ndevs/{index}", ndev or "")


def _expand(value, table):
    """'ACTIVE' -> '4: ACTIVE'; anything else is written as given (so garbage can be injected)."""
    value = str(value)
    if value in table:
        return f"{table[value]}: {value}"
    return value


# ---------------------------------------------------------------- spec validation


def _as_int(value, field):
    if isinstance(value, bool):
        raise FakeSysfsError(f"{field} {value!r}: must be an integer")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise FakeSysfsError(f"{field} {value!r}: must be an integer") from None


def _safe_rel(rel, field):
    norm = os.path.normpath(str(rel))
    if os.path.isabs(norm) or norm == ".." or norm.startswith(".." + os.sep):
        raise FakeSysfsError(f"{field} path {rel!r}: must be relative and stay under root")
    return norm


def _name_ok(name):
    return isinstance(name, str) and name != "" and "/" not in name and name not in (".", "..")


def _check_spec(spec):
    if not isinstance(spec, dict):
        raise FakeSysfsError(f"spec: must be a dict, got {type(spec).__name__}")
    for field in ("hostname", "boot_id"):
        if not isinstance(spec.get(field), str) or not spec[field]:
            raise FakeSysfsError(f"spec.{field} {spec.get(field)!r}: required non-empty text")
    for rel in spec.get("raw", {}):
        _safe_rel(rel, "raw")
    pci = spec.get("pci", {})
    netnames = set()
    for i, net in enumerate(spec.get("netdevs", [])):
        if not _name_ok(net.get("name")):
            raise FakeSysfsError(f"spec.netdevs[{i}].name {net.get('name')!r}: must be a name without '/'")
        if net["name"] in netnames:
            raise FakeSysfsError(f"spec.netdevs[{i}].name {net['name']!r}: duplicate netdev")
        netnames.add(net["name"])
        if net.get("pci") and net["pci"] not in pci:
            raise FakeSysfsError(f"spec.netdevs[{i}].pci {net['pci']!r}: not declared in spec.pci")
    devnames = set()
    for i, dev in enumerate(spec.get("devices", [])):
        where = f"spec.devices[{i}]"
        if not _name_ok(dev.get("name")):
            raise FakeSysfsError("{}.name {!r}: must be a name without '/'".format(where, dev.get("name")))
        if dev["name"] in devnames:
            raise FakeSysfsError("{}.name {!r}: duplicate device".format(where, dev["name"]))
        devnames.add(dev["name"])
        if not dev.get("node_guid"):
            raise FakeSysfsError(f"{where}.node_guid: required")
        uverbs = dev.get("uverbs")
        if uverbs and not (isinstance(uverbs, str) and uverbs.startswith("uverbs") and uverbs[6:].isdigit()
                           and uverbs[6:].isascii()):
            raise FakeSysfsError(f"{where}.uverbs {uverbs!r}: must be uverbs<N> (ASCII digits)")
        if dev.get("pci"):
            if dev["pci"] not in pci:
                raise FakeSysfsError("{}.pci {!r}: not declared in spec.pci".format(where, dev["pci"]))
        elif not _name_ok(dev.get("parent_netdev")):
            raise FakeSysfsError(f"{where}: a virtual device (no pci) needs parent_netdev")
        for j, port in enumerate(dev.get("ports", [])):
            length = _as_int(port.get("gid_tbl_len", 256), f"{where}.ports[{j}].gid_tbl_len")
            for key in port.get("gids", {}):
                index = _as_int(key, f"{where}.ports[{j}].gids key")
                if not 0 <= index < length:
                    raise FakeSysfsError(f"{where}.ports[{j}].gids index {index}: outside gid_tbl_len {length}")
