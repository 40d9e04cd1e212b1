# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Cross-check of a sysfs inventory against rdma-core's own libibverbs (docs/inventory.md, ``verbs``).

libibverbs is the independent judge: it enumerates the host with its own reader (its netlink
query, else ``<sysfs>/class/infiniband_verbs``, the PCI ``modalias`` its providers match and the
``/dev/infiniband/uverbsN`` character devices it requires). Every device name, node GUID, node
type, uverbs node and the device count it lists must equal the inventory's; each difference is a
mismatch with a code (``verbs.*``). Where libibverbs cannot go further (no kernel driver behind
the character device: opening a context, querying ports and GIDs), the record lists it in
``limits`` with the error libibverbs gave; nothing is skipped silently.

Node side, stdlib only: libibverbs is called through ctypes (``ibv_get_device_list``,
``ibv_get_device_guid``, ``ibv_open_device``) in a forked child, so a provider that crashes or
hangs on a strange tree is a reported failure, never the module's. For a ``root`` other than ``/``
(a fake host), libibverbs reads ``<root>/sys`` (its ``SYSFS_PATH``); the character devices are
always the machine's ``/dev/infiniband`` (the simulated lab makes them in each host's mount
namespace). pyverbs (optional) compares port state, link layer and GID types on the devices whose
context opened.
"""

import ctypes
import errno
import importlib
import json
import os
import select
import signal
import socket
import stat
import sys
import time

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import QUOTE_LIMIT, OrbiteError, quote
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import read_regular_bytes

LIBRARY = "libibverbs.so.1"
CDEV_DIR = "/dev/infiniband"
ENUMERATE_TIMEOUT = 20.0
NETLINK_RDMA = 20  # linux/netlink.h
_READ_LIMIT = 4096
_PIPE_LIMIT = 1 << 20
_WARNINGS_LIMIT = 20
LINK_LAYERS = {1: "InfiniBand", 2: "Ethernet"}  # IBV_LINK_LAYER_* (0 = unspecified)
GID_TYPES = {0: "IB/RoCE v1", 1: "RoCE v2"}  # ibv_query_gid_type: IBV_GID_TYPE_SYSFS_*
# enum ibv_node_type; 1..6 are also the kernel's sysfs node_type numbers.
NODE_TYPES = {-1: "UNKNOWN", 1: "CA", 2: "SWITCH", 3: "ROUTER", 4: "RNIC", 5: "USNIC", 6: "USNIC_UDP",
              7: "UNSPECIFIED"}
NO_DRIVER_ERRNOS = (errno.ENOENT, errno.ENXIO, errno.ENODEV)


def _record(status, reason, sysfs=None, **extra):
    record = {"status": status, "reason": reason, "library": LIBRARY, "sysfs": sysfs, "enumerated": [],
              "devices": 0, "comparisons": 0, "mismatches": [], "limits": [], "warnings": []}
    record.update(extra)
    return record


def not_requested():
    return _record("not_requested", "verbs: false")


def verbs_crosscheck(inventory, root="/", module_name="pyverbs.device", library=LIBRARY, enumerate_fn=None):
    """Compare ``inventory`` (read under ``root``) with what libibverbs enumerates; never raises."""
    fake = os.path.realpath(str(root)) != os.path.sep
    sysfs = os.path.join(os.path.realpath(str(root)), "sys")
    # A fake tree (a fake root, or a namespaced sim host's /sys) cannot be judged by a libibverbs that
    # takes the device list from the kernel's RDMA netlink.
    if _rdma_netlink() and not _is_sysfs_mount(sysfs):
        return _record("skipped", f"the kernel answers RDMA netlink here, so libibverbs lists the kernel's devices "
                                  f"and would not read the tree {quote(sysfs)} (not a sysfs mount)", sysfs)
    try:
        listed = (enumerate_fn or _enumerate)(library, sysfs if fake else None)
    except OSError as exc:  # no pipe or no fork (EMFILE, EAGAIN): the check could not run
        return _record("failed", f"cannot start the libibverbs enumeration: {_why(exc)}", sysfs)
    if "unavailable" in listed:
        return _record("skipped", listed["unavailable"], sysfs, warnings=listed.get("warnings", []))
    if "failed" in listed:
        return _record("failed", listed["failed"], sysfs, warnings=listed.get("warnings", []))
    sysfs_devices = inventory.get("devices") or {}
    if listed.get("list_error") and not sysfs_devices:
        return _record("skipped", f"no RDMA subsystem: libibverbs ibv_get_device_list failed: {listed['list_error']}",
                       sysfs, warnings=listed.get("warnings", []))
    checker = _Checker(sysfs, listed, fake)
    checker.enumeration(sysfs_devices)
    checker.deeper(sysfs_devices, module_name)
    return _record("checked", None, sysfs, enumerated=listed["devices"], devices=len(listed["devices"]),
                   comparisons=checker.comparisons, mismatches=checker.mismatches, limits=checker.limits,
                   warnings=listed.get("warnings", []))


# ---------------------------------------------------------------- the environment


def _rdma_netlink():
    """True when this kernel answers RDMA netlink (ib_core loaded): libibverbs then asks it, not sysfs."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA)
    except OSError:
        return False
    sock.close()
    return True


def _is_sysfs_mount(path):
    """Whether ``path`` lies on a sysfs mount (from /proc/self/mountinfo: the longest mount point above it)."""
    path = os.path.realpath(path)
    best, fstype = "", None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                fields = line.split(" - ", 1)
                parts = fields[0].split()
                if len(fields) != 2 or len(parts) < 5:
                    continue
                point = parts[4].replace("\\040", " ")
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, fstype = point, fields[1].split()[0]
    except OSError:
        return False
    return fstype == "sysfs"


# ---------------------------------------------------------------- libibverbs, in a forked child


class _IbvDevice(ctypes.Structure):
    """struct ibv_device (infiniband/verbs.h; stable since IBVERBS_1.1)."""

    _fields_ = [
        ("_dummy1", ctypes.c_void_p),
        ("_dummy2", ctypes.c_void_p),
        ("node_type", ctypes.c_int),
        ("transport_type", ctypes.c_int),
        ("name", ctypes.c_char * 64),
        ("dev_name", ctypes.c_char * 64),
        ("dev_path", ctypes.c_char * 256),
        ("ibdev_path", ctypes.c_char * 256),
    ]


def _errno_text(number):
    return f"{errno.errorcode.get(number, str(number))} ({os.strerror(number)})"


def _guid_text(value):
    """ibv_get_device_guid's big-endian 64 bits as sysfs writes a GUID: xxxx:xxxx:xxxx:xxxx."""
    raw = value.to_bytes(8, sys.byteorder).hex()
    return ":".join(raw[i:i + 4] for i in range(0, 16, 4))


def _text(value):
    """A C string from libibverbs: bytes that are not UTF-8 are shown escaped, never a crash."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)


def _list_devices(library):
    """What libibverbs enumerates (runs in the child): {"devices": [...]} or {"list_error": text}."""
    lib = ctypes.CDLL(library, use_errno=True)
    lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.POINTER(_IbvDevice))
    lib.ibv_get_device_list.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.ibv_get_device_guid.restype = ctypes.c_uint64
    lib.ibv_get_device_guid.argtypes = [ctypes.POINTER(_IbvDevice)]
    lib.ibv_open_device.restype = ctypes.c_void_p
    lib.ibv_open_device.argtypes = [ctypes.POINTER(_IbvDevice)]
    lib.ibv_close_device.argtypes = [ctypes.c_void_p]
    lib.ibv_free_device_list.argtypes = [ctypes.POINTER(ctypes.POINTER(_IbvDevice))]
    count = ctypes.c_int(0)
    listed = lib.ibv_get_device_list(ctypes.byref(count))
    if not listed:
        return {"devices": [], "list_error": _errno_text(ctypes.get_errno())}
    devices = []
    try:
        for index in range(count.value):
            device = listed[index].contents
            kind = int(device.node_type)
            entry = {
                "name": _text(device.name),
                "uverbs": _text(device.dev_name),
                "node_guid": _guid_text(lib.ibv_get_device_guid(listed[index])),
                "node_type": {"num": kind, "name": NODE_TYPES.get(kind, "UNKNOWN")},
                "opened": False,
                "open_error": None,
            }
            ctypes.set_errno(0)
            context = lib.ibv_open_device(listed[index])
            if context:
                lib.ibv_close_device(context)
                entry["opened"] = True
            else:
                entry["open_error"] = _errno_text(ctypes.get_errno())
            devices.append(entry)
    finally:
        lib.ibv_free_device_list(listed)
    devices.sort(key=lambda d: (d["name"], d["uverbs"]))
    return {"devices": devices}


def _child(write_fd, library, sysfs_path, stderr_fd):
    os.dup2(stderr_fd, 2)
    if sysfs_path is None:
        os.environ.pop("SYSFS_PATH", None)
    else:
        os.environ["SYSFS_PATH"] = sysfs_path
    os.environ["IBV_SHOW_WARNINGS"] = "1"  # name the devices no provider matched
    try:
        result = _list_devices(library)
    except OSError as exc:  # libibverbs.so.1 not loadable: rdma-core is not installed
        result = {"unavailable": f"cannot load {library}: {_cut(str(exc))}"}
    except Exception as exc:  # the child reports anything; the parent never crashes
        result = {"failed": f"libibverbs enumeration raised {type(exc).__name__}: {_cut(str(exc))}"}
    data = json.dumps(result).encode()
    while data:
        data = data[os.write(write_fd, data):]


def _enumerate(library, sysfs_path, timeout=ENUMERATE_TIMEOUT):
    """Run ``_list_devices`` in a forked child, bounded in time; a crash or hang is a ``failed`` result.

    The child's result and its stderr (libibverbs' warnings) come back through two pipes: nothing is
    written to any file.
    """
    result_r, result_w = os.pipe()
    try:
        err_r, err_w = os.pipe()
    except OSError:
        os.close(result_r)
        os.close(result_w)
        raise
    try:
        pid = os.fork()
    except OSError:
        for fd in (result_r, result_w, err_r, err_w):
            os.close(fd)
        raise
    if pid == 0:  # pragma: no cover - the child's lines run in the child
        code = 0
        try:
            os.close(result_r)
            os.close(err_r)
            _child(result_w, library, sysfs_path, err_w)
        except BaseException:  # whatever happens, the child never returns into the caller
            code = 70
        os._exit(code)
    os.close(result_w)
    os.close(err_w)
    open_fds = [result_r, err_r]
    data = {result_r: b"", err_r: b""}
    deadline, timed_out = time.monotonic() + timeout, False
    try:
        while open_fds:
            left = deadline - time.monotonic()
            ready = select.select(open_fds, [], [], left)[0] if left > 0 else []
            if not ready:
                timed_out = True
                break
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    open_fds.remove(fd)
                    os.close(fd)
                elif len(data[fd]) < _PIPE_LIMIT:  # beyond it, read and drop: the child never blocks
                    data[fd] += chunk
    finally:
        for fd in open_fds:
            os.close(fd)
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        status = os.waitpid(pid, 0)[1]
    warnings = [_cut(line) for line in data[err_r][:_READ_LIMIT].decode("utf-8", "replace").splitlines()
                if line.strip()][:_WARNINGS_LIMIT]
    if timed_out:
        return {"failed": f"libibverbs enumeration did not finish within {timeout:g} s", "warnings": warnings}
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return {"failed": f"libibverbs enumeration died of {name}", "warnings": warnings}
    try:
        result = json.loads(data[result_r].decode())
    except ValueError:
        return {"failed": f"libibverbs enumeration exited with status {os.waitstatus_to_exitcode(status)} "
                          "without a result", "warnings": warnings}
    result["warnings"] = warnings
    return result


# ---------------------------------------------------------------- comparison


def _cut(text):
    return text if len(text) <= QUOTE_LIMIT else text[: QUOTE_LIMIT - 3] + "..."


def _why(exc):
    """'<class>: <message>' of an exception raised by pyverbs, cut to a bounded length."""
    return _cut(f"{type(exc).__name__}: {exc}")


def _read(path):
    try:
        return read_regular_bytes(path, _READ_LIMIT).decode("utf-8", "replace").strip()
    except (OSError, OrbiteError):  # a diagnosis never fails the check
        return None


def _no_driver(error_text):
    """Whether ibv_open_device's error says no kernel driver serves the character device."""
    return (error_text or "").split(" ")[0] in {errno.errorcode[n] for n in NO_DRIVER_ERRNOS}


class _Checker:
    def __init__(self, sysfs, listed, fake):
        self.sysfs = sysfs
        self.listed = listed
        self.root_is_host = not fake
        self.comparisons = 0
        self.mismatches = []
        self.limits = []

    def mismatch(self, code, path, sysfs, verbs, why=None):
        self.mismatches.append({"code": code, "path": path, "sysfs": sysfs, "verbs": verbs, "why": why})

    def compare(self, code, path, sysfs, verbs):
        self.comparisons += 1
        if sysfs != verbs:
            self.mismatch(code, path, sysfs, verbs)

    def limit(self, device, step, error, why):
        self.limits.append({"device": device, "step": step, "error": error, "not_compared": ["ports", "gids"],
                            "why": why})

    # -- enumeration: names, count, node GUIDs, node types, uverbs nodes

    def enumeration(self, sysfs_devices):
        enumerated = self.listed["devices"]
        by_name = {}
        for entry in enumerated:
            by_name.setdefault(entry["name"], entry)
        self.compare("verbs.count", "devices", len(sysfs_devices), len(enumerated))
        for name in sorted(set(by_name) | set(sysfs_devices)):
            path = f"devices/{name}"
            if name not in sysfs_devices:
                self.mismatch("verbs.device_extra", path, "absent", "present",
                              "libibverbs lists a device the inventory does not have")
                continue
            if name not in by_name:
                self.mismatch("verbs.device_unlisted", path, "present", "absent",
                              self.unlisted_why(name, sysfs_devices[name]))
                continue
            dev, entry = sysfs_devices[name], by_name[name]
            self.compare("verbs.node_guid", path + "/node_guid", dev.get("node_guid"), entry["node_guid"])
            self.compare("verbs.node_type", path + "/node_type", (dev.get("node_type") or {}).get("num"),
                         entry["node_type"]["num"])
            self.compare("verbs.uverbs", path + "/uverbs", dev.get("uverbs"), entry["uverbs"])

    def unlisted_why(self, name, dev):
        """Why libibverbs left a device out, from what it reads (the cause it would not say itself)."""
        if self.listed.get("list_error"):
            return f"ibv_get_device_list failed: {self.listed['list_error']}"
        uverbs = dev.get("uverbs")
        if not uverbs:
            return "no uverbs class entry names it: libibverbs lists only devices with a uverbsN"
        numbers = _read(os.path.join(self.sysfs, "class", "infiniband_verbs", uverbs, "dev"))
        cdev = os.path.join(CDEV_DIR, uverbs)
        try:
            mode = os.stat(cdev).st_mode
        except OSError as exc:
            state = "is missing" if exc.errno == errno.ENOENT else f"cannot be examined: {_errno_text(exc.errno)}"
            return (f"{cdev} (char device {numbers}) {state}: libibverbs skips a device without its "
                    "character device")
        if not stat.S_ISCHR(mode):
            return f"{cdev} is not a character device"
        said = [w for w in self.listed.get("warnings", []) if name in w]
        modalias = _read(os.path.join(self.sysfs, "class", "infiniband", name, "device", "modalias"))
        if dev.get("virtual"):
            return (f"no libibverbs provider matches the name {quote(name)} of a device without a PCI parent "
                    f"(rxe matches rxe*, siw siw*); libibverbs: {said or 'nothing'}")
        return f"no libibverbs provider matched device/modalias {quote(modalias)}; libibverbs: {said or 'nothing'}"

    # -- what needs a kernel driver: a context, its ports and GIDs

    def deeper(self, sysfs_devices, module_name):
        opened = []
        for entry in self.listed["devices"]:
            name = entry["name"]
            if name not in sysfs_devices:
                continue
            if not entry["opened"]:
                why = ("no kernel driver serves the character device (a fake host: libibverbs enumerates it but "
                       "cannot open a context)") if _no_driver(entry["open_error"]) else "the open failed"
                self.limit(name, "ibv_open_device", entry["open_error"], why)
            elif not self.root_is_host:
                self.limit(name, "pyverbs", None, "ports and GIDs are compared through pyverbs on root '/' only")
            else:
                opened.append(name)
        if not opened:
            return
        try:
            device_mod = importlib.import_module(module_name)
        except ImportError as exc:
            for name in opened:
                self.limit(name, "pyverbs", f"not importable: {_cut(str(exc))}", "ports and GIDs need pyverbs")
            return
        for name in opened:
            self.device(device_mod, name, sysfs_devices[name])

    def device(self, device_mod, name, dev):
        try:
            ctx = device_mod.Context(name=name)
        except Exception as exc:  # any pyverbs error is recorded, never raised
            self.mismatch("verbs.open_failed", f"devices/{name}", "present", f"open failed: {_why(exc)}")
            return
        try:
            for num, port in (dev.get("ports") or {}).items():
                self.port(ctx, f"devices/{name}/ports/{num}", int(num), port)
        finally:
            ctx.close()

    def port(self, ctx, path, num, port):
        try:
            attr = ctx.query_port(num)
        except Exception as exc:  # any pyverbs error is recorded
            self.mismatch("verbs.query_failed", path, "present", f"query_port failed: {_why(exc)}")
            return
        self.compare("verbs.port_state", path + "/state", (port.get("state") or {}).get("num"), int(attr.state))
        self.compare("verbs.link_layer", path + "/link_layer", port.get("link_layer"),
                     LINK_LAYERS.get(int(attr.link_layer)))
        for entry in port.get("gids") or []:
            where = f"{path}/gids[{entry['index']}]/type"
            try:
                verbs_type = GID_TYPES.get(int(ctx.query_gid_type(num, entry["index"])))
            except Exception as exc:  # any pyverbs error is recorded
                self.mismatch("verbs.query_failed", where, entry.get("type"), f"query_gid_type failed: {_why(exc)}")
                continue
            self.compare("verbs.gid_type", where, entry.get("type"), verbs_type)
