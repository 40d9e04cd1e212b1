# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Read-only RDMA discovery inventory of one host, from sysfs and procfs under ``root``.

Node-side: Python >= 3.9, stdlib only (netaddr is used when present, else ``ipaddress``; both give
the same answers). Shares no code with the engine. Every file is read through ``read_sysfs_file``,
which opens read-only; nothing is ever opened for writing (``node_desc`` is writable in real sysfs
and is not even read). Garbage in a file becomes an entry of ``inventory["errors"]`` naming the
field path, the file, the value and the rule; it never raises. Only a root that cannot be a host
root raises ``InventoryRootError``.

The tree under ``root`` is input, not trusted: a file or directory whose real path leaves ``root``
is not read (sysfs is full of links, so links are resolved and their target must stay under
``root``), only regular files are read (a FIFO or a device is never opened), at most 64 KiB each,
numbers are ASCII digits of bounded length, directory names that should be numbers are checked,
and a cpulist may only name CPUs a Linux host can have (``CPU_LIMIT``).

The schema is documented in docs/inventory.md.
"""

import errno
import functools
import json
import os
import re
import stat

try:  # controller side: netaddr (a collection requirement); nodes may not have it
    import netaddr

    IP_BACKEND = "netaddr"
except ImportError:  # pragma: no cover - exercised by forcing the fallback in tests
    netaddr = None
    IP_BACKEND = "ipaddress"
import ipaddress

from ansible_collections.orbite.qualification.plugins.module_utils._common.numbers import ascii_int, is_ascii_digits
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    FileTooLarge,
    NotRegularFile,
    atomic_write_text,
    file_kind,
    read_regular_bytes,
)
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import QUOTE_LIMIT, OrbiteError, quote
from ansible_collections.orbite.qualification.plugins.module_utils._inventory.verbs import (
    not_requested,
    verbs_crosscheck,
)

SCHEMA = "orbite.rdma-inventory"
VERSION = 1

GID_TYPES = ("IB/RoCE v1", "RoCE v2")
LINK_LAYERS = ("InfiniBand", "Ethernet")
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")

# Numbers in sysfs text are ASCII digits of bounded length (int() takes other scripts' digits,
# and refuses more than 4300 of them with a ValueError).
_NUMBERED = re.compile(r"^([0-9]{1,9}):[ \t]*(\S.*)$", re.ASCII)
_RATE = re.compile(r"^([0-9]{1,9}(?:\.[0-9]{1,9})?) Gb/sec \((\S.*)\)$", re.ASCII)
_LID = re.compile(r"^(?:0[xX])?[0-9a-fA-F]{1,8}$", re.ASCII)
_GUID = re.compile(r"^[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){3}$")
_GID = re.compile(r"^[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){7}$")
_HEX_ID = re.compile(r"^0x[0-9a-fA-F]{4}$")
_MAC = re.compile(r"^[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2})+$")
_CPULIST = re.compile(r"^(?:[0-9]{1,5}(?:-[0-9]{1,5})?(?:,[0-9]{1,5}(?:-[0-9]{1,5})?)*)?$", re.ASCII)
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_ZERO_GID = ipaddress.IPv6Address(0)
_FC00 = ipaddress.IPv6Network("fc00::/7")
_FEC0 = ipaddress.IPv6Network("fec0::/10")

# The most CPUs a Linux host can have: the largest CONFIG_NR_CPUS (x86_64 MAXSMP, powerpc). A cpulist
# naming a CPU at or past it is garbage, and is refused before any range is expanded.
CPU_LIMIT = 8192
# Every file is read whole or not at all: sysfs attributes are at most a page, procfs lines shorter.
READ_LIMIT = 64 * 1024
# An error entry quotes at most this much of the value it refuses.
VALUE_LIMIT = QUOTE_LIMIT


class InventoryError(OrbiteError):
    """Base of the reader's errors."""

    code = "inventory.error"


class InventoryRootError(InventoryError):
    """``root`` does not exist or is not a host root (no sys/ and no proc/)."""


class InventorySaveError(InventoryError):
    """``save_to`` cannot or must not be written."""


class FieldError(InventoryError):
    """A file's content breaks its rule; recorded in ``errors``, never raised to the caller."""

    def __init__(self, value, rule):
        super().__init__(rule)
        self.value = value
        self.rule = rule


class SysfsReadRefused(InventoryError):
    """A file the reader will not read: outside ``root``, not a regular file, or too large."""

    code = "inventory.read_refused"


def read_sysfs_file(path, real_root=os.sep, dirs=None):
    """The one place the reader opens a file: read-only, regular files under ``real_root``, whole.

    ``path`` may go through links (sysfs class entries are links into sys/devices); the directory
    holding the file is opened, its real path (from the open descriptor, so it cannot change under
    us) must be ``real_root`` or under it, and the file is then opened relative to that descriptor
    without following a link. A file that is itself a link is resolved once and checked the same
    way. FIFOs, devices and sockets are never opened; a file over READ_LIMIT is refused whole.
    ``dirs`` (a _Directories) keeps checked directories open across calls. Raises OSError,
    UnicodeDecodeError or SysfsReadRefused. Returns the stripped text.

    Tests replace this function to make a read fail like real sysfs does (EINVAL, ENODEV).
    """
    return _read_under(os.fspath(path), real_root, 1, dirs).decode("utf-8").strip()


def _read_under(path, real_root, hops, dirs):
    parent, name = os.path.split(path)
    if dirs is not None:
        dir_fd = dirs.open(parent)
    else:
        dir_fd = _open_dir(parent, real_root)
    try:
        try:
            return read_regular_bytes(name, READ_LIMIT, dir_fd=dir_fd, follow_symlinks=False)
        except NotRegularFile:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileTooLarge:
            raise SysfsReadRefused(f"file larger than {READ_LIMIT} bytes") from None
    finally:
        if dirs is None:
            os.close(dir_fd)
    if not stat.S_ISLNK(st.st_mode):
        raise SysfsReadRefused(f"not a regular file ({file_kind(st.st_mode)})")
    target = os.path.realpath(path)
    if not _inside(target, real_root):
        raise SysfsReadRefused("link escapes root")
    if hops <= 0:  # realpath resolved every link: another one means the tree changed under us
        raise SysfsReadRefused("link changed while it was read")
    return _read_under(target, real_root, hops - 1, dirs)


def _open_dir(path, real_root):
    """An open descriptor of directory ``path``, whose real path must be under ``real_root``."""
    dir_fd = os.open(path or os.curdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    if not _inside(_fd_path(dir_fd, path or os.curdir), real_root):
        os.close(dir_fd)
        raise SysfsReadRefused("link escapes root")
    return dir_fd


class _Directories:
    """The last few checked directories, kept open: a GID table reads 3 files in each of 3 dirs per slot."""

    SIZE = 16

    def __init__(self, real_root):
        self.real_root = real_root
        self.fds = {}

    def open(self, path):
        dir_fd = self.fds.get(path)
        if dir_fd is None:
            dir_fd = _open_dir(path, self.real_root)
            if len(self.fds) >= self.SIZE:
                oldest = next(iter(self.fds))
                os.close(self.fds.pop(oldest))
            self.fds[path] = dir_fd
        return dir_fd

    def close(self):
        for dir_fd in self.fds.values():
            os.close(dir_fd)
        self.fds.clear()


_PROC_FD = os.path.join(os.sep, "proc", "self", "fd")


def _fd_path(fd, fallback):
    """Real path of an open directory: from /proc (what was opened), else realpath of its name."""
    try:
        return os.readlink(os.path.join(_PROC_FD, str(fd)))
    except OSError:  # no /proc mounted (a minimal container): resolve the name instead
        return os.path.realpath(fallback)


def _inside(real, real_root):
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def _cut(value):
    """An error entry's value: the text read, cut to VALUE_LIMIT characters."""
    if isinstance(value, str) and len(value) > VALUE_LIMIT:
        return value[: VALUE_LIMIT - 3] + "..."
    return value


# ---------------------------------------------------------------- parsers (pure)


def parse_numbered(text):
    """'4: ACTIVE' -> {"num": 4, "name": "ACTIVE"}."""
    match = _NUMBERED.match(text)
    if not match:
        raise FieldError(text, "expected '<number>: <NAME>'")
    return {"num": int(match.group(1)), "name": match.group(2)}


def parse_rate(text):
    """'100 Gb/sec (4X EDR)' -> {"gbps": 100, "width": "4X EDR"}."""
    match = _RATE.match(text)
    if not match:
        raise FieldError(text, "expected '<number> Gb/sec (<width>)'")
    gbps = float(match.group(1))
    return {"gbps": int(gbps) if gbps.is_integer() else gbps, "width": match.group(2)}


def parse_lid(text):
    if not _LID.match(text):
        raise FieldError(text, "expected a hexadecimal LID like '0x11'")
    return int(text, 16)


def parse_guid(text):
    if not _GUID.match(text):
        raise FieldError(text, "expected a GUID of 4 groups of 4 hex digits")
    return text.lower()


def parse_gid(text):
    """GID text (8 groups of 4 hex digits) -> (normalised text, IPv6Address)."""
    if not _GID.match(text):
        raise FieldError(text, "expected a GID of 8 groups of 4 hex digits")
    # int() of the 32 hex digits is much cheaper than parsing IPv6 text (tables hold 256+ slots).
    return text.lower(), ipaddress.IPv6Address(int(text.replace(":", ""), 16))


def parse_int(text, minimum=None):
    """ASCII decimal digits; a leading '-' only where ``minimum`` is negative (numa_node's -1)."""
    negative = minimum is not None and minimum < 0 and isinstance(text, str) and text.startswith("-")
    value = ascii_int(text[1:] if negative else text)
    if value is not None and negative:
        value = -value
    if value is None:
        raise FieldError(text, "expected a decimal integer")
    if minimum is not None and value < minimum:
        raise FieldError(text, f"expected an integer >= {minimum}")
    return value


def parse_choice(text, choices):
    if text not in choices:
        raise FieldError(text, "expected one of " + ", ".join(repr(c) for c in choices))
    return text


def parse_pattern(text, pattern, rule):
    if not pattern.match(text):
        raise FieldError(text, rule)
    return text.lower()


def parse_cpulist(text):
    """Validate a kernel cpulist ('0-3,8-11'); returns the CPUs as a sorted list of ints.

    Every CPU number must be below CPU_LIMIT, checked before a range is expanded: '0-999999999'
    is an error, never a billion-element set.
    """
    if not _CPULIST.match(text):
        raise FieldError(text, "expected a cpulist like '0-3,8-11'")
    ranges = []
    for part in filter(None, text.split(",")):
        low, _dash, high = part.partition("-")
        low, high = int(low), int(high or low)
        if high < low:
            raise FieldError(text, "expected ranges low-high with low <= high")
        if high >= CPU_LIMIT:
            raise FieldError(text, f"expected CPU numbers below {CPU_LIMIT} (the most CPUs a Linux host can have)")
        ranges.append((low, high))
    cpus = set()
    for low, high in ranges:
        cpus.update(range(low, high + 1))
    return sorted(cpus)


def classify_gid(address, backend=None):
    """(decoded IPv4 text or None, IPv6 kind) of a GID address, with netaddr when available."""
    return _classify(int(address), backend or IP_BACKEND)


@functools.lru_cache(maxsize=4096)  # v1/v2 pairs and repeated tables share addresses
def _classify(address, backend):
    if backend == "netaddr":
        ip = netaddr.IPAddress(address, 6)
        if ip.is_ipv4_mapped():
            return str(ip.ipv4()), "ipv4-mapped"
        checks = (
            (ip.is_link_local(), "link-local"),
            (ip.is_loopback(), "loopback"),
            (ip.is_multicast(), "multicast"),
            (ip.is_ipv6_unique_local(), "unique-local"),
            (int(ip) >> 118 == int(_FEC0.network_address) >> 118, "site-local"),
        )
    else:
        ip = ipaddress.IPv6Address(address)
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped), "ipv4-mapped"
        checks = (
            (ip.is_link_local, "link-local"),
            (ip.is_loopback, "loopback"),
            (ip.is_multicast, "multicast"),
            (ip in _FC00, "unique-local"),
            (ip in _FEC0, "site-local"),
        )
    for hit, kind in checks:
        if hit:
            return None, kind
    return None, "global"


# ---------------------------------------------------------------- reader


def read_inventory(root="/", verbs=False):
    """Inventory of the host under ``root`` (a dict, see docs/inventory.md).

    ``verbs``: also cross-check with rdma-core's libibverbs (``inventory["verbs"]``, verbs.py: what it
    enumerates must equal the inventory; skipped with a reason when libibverbs is absent).
    """
    inventory = _Reader(root).run()
    inventory["verbs"] = verbs_crosscheck(inventory, root) if verbs else not_requested()
    return inventory


def render_inventory(inventory):
    """The saved form: stable JSON (sorted keys, 2-space indent, final newline)."""
    return json.dumps(inventory, indent=2, sort_keys=True) + "\n"


# A saved inventory names the host, its addresses and its devices: private to its owner.
SAVE_MODE = 0o600


def save_inventory(text, path, root="/", dry_run=False):
    """Write ``text`` to ``path`` atomically (mode 0600); returns True when the file changes.

    Refuses paths inside sysfs/procfs (of the real host or of ``root``) and an existing ``path`` that
    is a FIFO, device, socket or directory (never opened); a link there is replaced, not written
    through. A file with the same text but another mode is rewritten (changed). With ``dry_run``
    nothing is written and the return value says whether it would change.
    """
    path = os.path.abspath(str(path))
    real = os.path.realpath(path)
    for top in ("sys", "proc"):
        for base in (os.path.realpath(os.path.join(os.sep, top)), os.path.realpath(os.path.join(str(root), top))):
            if real == base or real.startswith(base + os.sep):
                raise InventorySaveError(f"save_to {quote(path)}: inside {base}; refusing to write there")
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise InventorySaveError(f"save_to {quote(path)}: directory {quote(parent)} does not exist")
    if os.path.isdir(path):
        raise InventorySaveError(f"save_to {quote(path)}: is a directory")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise InventorySaveError(f"save_to {quote(path)}: cannot be examined: {exc.strerror or exc}") from None
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):  # a link is replaced
        raise InventorySaveError(
            f"save_to {quote(path)}: is {file_kind(st.st_mode)}, not a regular file; refusing to replace it"
        )
    if st is not None and stat.S_IMODE(st.st_mode) == SAVE_MODE:
        try:
            if read_regular_bytes(path, len(text.encode("utf-8")), follow_symlinks=False) == text.encode("utf-8"):
                return False
        except (OSError, OrbiteError):
            pass  # unreadable, longer, or swapped meanwhile: it will be replaced
    if dry_run:
        return True
    try:
        atomic_write_text(path, text, mode=SAVE_MODE)
    except OSError as exc:
        raise InventorySaveError(f"save_to {quote(path)}: cannot write: {exc.strerror or exc}") from None
    return True


class _Reader:
    def __init__(self, root):
        root = str(root)
        if not os.path.isdir(root):
            raise InventoryRootError(f"root {quote(root)}: does not exist or is not a directory")
        if not any(os.path.isdir(os.path.join(root, top)) for top in ("sys", "proc")):
            raise InventoryRootError(f"root {quote(root)}: has neither sys/ nor proc/; not a host root")
        self.root = root
        self.real_root = os.path.realpath(root)
        self.errors = []
        self.dirs = _Directories(self.real_root)

    # -- low level: every access below goes through these

    def _error(self, path, rel, value, rule):
        self.errors.append({"path": path, "file": rel, "value": _cut(value), "error": rule})

    def read(self, rel):
        return read_sysfs_file(os.path.join(self.root, rel), self.real_root, self.dirs)

    def text(self, rel, path, optional=False):
        """Text of ``rel`` (relative to root) or None with an error entry (none if ``optional``)."""
        try:
            return self.read(rel)
        except FileNotFoundError:
            if not optional:
                self._error(path, rel, None, "file missing")
        except UnicodeDecodeError:
            self._error(path, rel, None, "content is not UTF-8 text")
        except OSError as exc:
            self._error(path, rel, None, _os_error(exc))
        except SysfsReadRefused as exc:
            self._error(path, rel, None, str(exc))
        return None

    def field(self, rel, path, parser, *args, optional=False):
        raw = self.text(rel, path, optional=optional)
        if raw is None:
            return None
        try:
            return parser(raw, *args)
        except FieldError as exc:
            self._error(path, rel, exc.value, exc.rule)
            return None

    def listdir(self, rel, path, optional=True):
        """Sorted names in directory ``rel``; a directory whose real path leaves root is not listed."""
        try:
            dir_fd = _open_dir(os.path.join(self.root, rel), self.real_root)
        except FileNotFoundError:
            if not optional:
                self._error(path, rel, None, "directory missing")
            return []
        except OSError as exc:
            self._error(path, rel, None, _os_error(exc))
            return []
        except SysfsReadRefused as exc:
            self._error(path, rel, None, str(exc))
            return []
        try:
            return sorted(os.listdir(dir_fd))
        except OSError as exc:
            self._error(path, rel, None, _os_error(exc))
            return []
        finally:
            os.close(dir_fd)

    def numbered(self, rel, path, names, what):
        """The entries of ``names`` that are numbers (ASCII digits, no leading zero) as ints; every
        other entry is an error entry: a directory named '²' or '01' is garbage, never a crash."""
        numbers = []
        for name in names:
            if is_ascii_digits(name) and (name == "0" or not name.startswith("0")):
                numbers.append(int(name))
            else:
                self._error(path, f"{rel}/{name}", name, f"expected a {what} number (ASCII digits, no leading zero)")
        return sorted(numbers)

    def link_target(self, rel, path):
        """Real path of a link under root, or None (missing); links escaping root are errors."""
        full = os.path.join(self.root, rel)
        if not os.path.lexists(full):
            return None
        real = os.path.realpath(full)
        if not _inside(real, self.real_root):
            self._error(path, rel, os.readlink(full) if os.path.islink(full) else None, "link escapes root")
            return None
        return real

    # -- sections

    def run(self):
        try:
            return self._run()
        finally:
            self.dirs.close()

    def _run(self):
        inventory = {
            "schema": SCHEMA,
            "version": VERSION,
            "node": self.node(),
            "devices": {},
            "netdevs": {},
            "errors": self.errors,
        }
        netdevs, by_pci = self.netdevs()
        verbs_nodes = self.verbs_nodes()
        for name in self.listdir("sys/class/infiniband", "devices"):
            inventory["devices"][name] = self.device(name, by_pci, verbs_nodes)
        for dev_name, dev in inventory["devices"].items():
            for net in dev["netdevs"]:
                if net in netdevs:
                    netdevs[net]["rdma_devices"].append(dev_name)
        inventory["netdevs"] = netdevs
        self.errors.sort(key=lambda e: (e["path"], e["file"]))
        return inventory

    def node(self):
        numa = {}
        top = "sys/devices/system/node"
        # Besides node<N>, the directory holds has_cpu, online, possible, power, uevent, ...
        entries = [e[4:] for e in self.listdir(top, "node/numa_nodes") if e.startswith("node")]
        for number in self.numbered(top + "/node", "node/numa_nodes", entries, "NUMA node"):
            rel = f"{top}/node{number}/cpulist"
            numa[str(number)] = {"cpulist": self.field(rel, f"node/numa_nodes/{number}/cpulist", _cpulist_text)}
        return {
            "hostname": self.field("proc/sys/kernel/hostname", "node/hostname", _non_empty),
            "boot_id": self.field(
                "proc/sys/kernel/random/boot_id", "node/boot_id", parse_pattern, _UUID, "expected a UUID"
            ),
            "osrelease": self.field("proc/sys/kernel/osrelease", "node/osrelease", _non_empty),
            "machine_id": self.field("etc/machine-id", "node/machine_id", _non_empty, optional=True),
            "numa_nodes": dict(sorted(numa.items(), key=lambda kv: int(kv[0]))),
        }

    def netdevs(self):
        """(netdev name -> record, PCI function real path -> netdev names)."""
        out = {}
        by_pci = {}
        for name in self.listdir("sys/class/net", "netdevs"):
            base = f"sys/class/net/{name}"
            path = f"netdevs/{name}"
            pci_real = self.link_target(base + "/device", path + "/device")
            out[name] = {
                "operstate": self.field(base + "/operstate", path + "/operstate", parse_choice, OPERSTATES),
                "mac": self.field(base + "/address", path + "/mac", parse_pattern, _MAC, "expected hex octets"),
                "mtu": self.field(base + "/mtu", path + "/mtu", parse_int, 0),
                "ifindex": self.field(base + "/ifindex", path + "/ifindex", parse_int, 0, optional=True),
                "type": self.field(base + "/type", path + "/type", parse_int, 0, optional=True),
                "pci_bdf": os.path.basename(pci_real) if pci_real else None,
                "rdma_devices": [],
            }
            if pci_real:
                by_pci.setdefault(pci_real, []).append(name)
        return out, by_pci

    def verbs_nodes(self):
        """ibdev name -> uverbsN, from sys/class/infiniband_verbs/*/ibdev (covers virtual devices)."""
        nodes = {}
        for entry in self.listdir("sys/class/infiniband_verbs", "devices"):
            if not entry.startswith("uverbs"):
                continue
            ibdev = self.text(f"sys/class/infiniband_verbs/{entry}/ibdev", f"uverbs/{entry}/ibdev")
            if ibdev:
                nodes.setdefault(ibdev, entry)
        return nodes

    def device(self, name, netdevs_by_pci, verbs_nodes):
        base = f"sys/class/infiniband/{name}"
        path = f"devices/{name}"
        pci_real = self.link_target(base + "/device", path + "/device")
        dev = {
            "node_type": self.field(base + "/node_type", path + "/node_type", parse_numbered),
            "node_guid": self.field(base + "/node_guid", path + "/node_guid", parse_guid),
            "sys_image_guid": self.field(base + "/sys_image_guid", path + "/sys_image_guid", parse_guid),
            "fw_ver": self.field(base + "/fw_ver", path + "/fw_ver", _any_text, optional=True),
            "hca_type": self.field(base + "/hca_type", path + "/hca_type", _non_empty, optional=True),
            "board_id": self.field(base + "/board_id", path + "/board_id", _non_empty, optional=True),
            "virtual": pci_real is None,
            "parent_netdev": None,
            "pci": None,
            "numa_node": None,
            "local_cpulist": None,
            "netdevs": [],
            "uverbs": None,
            "ports": {},
        }
        if pci_real is not None:
            pci = base + "/device"
            dev["pci"] = {
                "bdf": os.path.basename(pci_real),
                "vendor": self.field(pci + "/vendor", path + "/pci/vendor", parse_pattern, _HEX_ID, "expected 0xNNNN"),
                "device": self.field(pci + "/device", path + "/pci/device", parse_pattern, _HEX_ID, "expected 0xNNNN"),
            }
            numa = self.field(pci + "/numa_node", path + "/numa_node", parse_int, -1, optional=True)
            dev["numa_node"] = numa if numa is not None and numa >= 0 else None  # -1: unknown
            dev["local_cpulist"] = self.field(
                pci + "/local_cpulist", path + "/local_cpulist", _cpulist_text, optional=True
            )
            dev["netdevs"] = sorted(netdevs_by_pci.get(pci_real, []))
            verbs_dir = self.listdir(pci + "/infiniband_verbs", path + "/uverbs")
            dev["uverbs"] = verbs_dir[0] if verbs_dir else None
        else:
            parent = self.field(base + "/parent", path + "/parent_netdev", _non_empty, optional=True)
            dev["parent_netdev"] = parent
            dev["netdevs"] = [parent] if parent else []
        if dev["uverbs"] is None:
            dev["uverbs"] = verbs_nodes.get(name)
        listed = self.listdir(base + "/ports", path + "/ports", optional=False)
        for port in self.numbered(base + "/ports", path + "/ports", listed, "port"):
            dev["ports"][str(port)] = self.port(f"{base}/ports/{port}", f"{path}/ports/{port}")
        return dev

    def port(self, base, path):
        port = {
            "state": self.field(base + "/state", path + "/state", parse_numbered),
            "phys_state": self.field(base + "/phys_state", path + "/phys_state", parse_numbered),
            "link_layer": self.field(base + "/link_layer", path + "/link_layer", parse_choice, LINK_LAYERS),
            "rate": self.field(base + "/rate", path + "/rate", parse_rate),
            "lid": self.field(base + "/lid", path + "/lid", parse_lid),
        }
        listed = self.listdir(base + "/gids", path + "/gids", optional=False)
        indexes = self.numbered(base + "/gids", path + "/gids", listed, "GID index")
        port["gid_tbl_len"] = len(indexes)
        port["gids_unused"], port["gids"] = self.gid_table(base, path, indexes)
        return port

    def gid_table(self, base, path, indexes):
        unused = 0
        entries = []
        for index in indexes:
            where = f"{path}/gids/{index}"
            parsed = self.field(f"{base}/gids/{index}", where, parse_gid)
            if parsed is None:
                continue
            text, address = parsed
            if address == _ZERO_GID:
                unused += 1
                continue
            gid_type, gid_ndev = self.gid_attrs(base, where, index)
            if gid_type is _UNUSED or gid_ndev is _UNUSED:
                unused += 1
                continue
            ipv4, kind = classify_gid(address)
            entries.append(
                {"index": index, "gid": text, "type": gid_type, "ndev": gid_ndev, "ipv4": ipv4, "ipv6_kind": kind}
            )
        return unused, entries

    def gid_attrs(self, base, where, index):
        """(type, ndev) of a used-looking slot; _UNUSED where the kernel says EINVAL (slot not valid)."""
        values = []
        for attr in ("types", "ndevs"):
            rel = f"{base}/gid_attrs/{attr}/{index}"
            try:
                values.append(self.read(rel))
            except SysfsReadRefused as exc:
                self._error(f"{where}/{attr[:-1]}", rel, None, str(exc))
                values.append(None)
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    return _UNUSED, _UNUSED
                if attr == "ndevs" and exc.errno == errno.ENODEV:  # valid entry without netdev (IB)
                    values.append("")
                    continue
                self._error(f"{where}/{attr[:-1]}", rel, None, _os_error(exc))
                values.append(None)
            except UnicodeDecodeError:
                self._error(f"{where}/{attr[:-1]}", rel, None, "content is not UTF-8 text")
                values.append(None)
        gid_type, ndev = values
        if gid_type is not None:
            try:
                gid_type = parse_choice(gid_type, GID_TYPES)
            except FieldError as exc:
                self._error(f"{where}/type", f"{base}/gid_attrs/types/{index}", exc.value, exc.rule)
                gid_type = None
        return gid_type, (ndev or None)


_UNUSED = object()


def _os_error(exc):
    name = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else type(exc).__name__
    return f"read failed: {name} ({exc.strerror or exc})"


def _non_empty(text):
    if not text:
        raise FieldError(text, "expected non-empty text")
    return text


def _cpulist_text(text):
    parse_cpulist(text)
    return text


def _any_text(text):
    return text
