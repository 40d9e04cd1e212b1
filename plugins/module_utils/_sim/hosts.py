# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""One fake host of the simulated lab: create it, describe it, destroy it.

Lab layout (everything the lab owns lives under ``lab_dir``)::

    <lab_dir>/<host>/                 the fake host root (contract 1), written by fake_sysfs.write_host,
                                      plus its lock dir run/orbite/locks (0700)
    <lab_dir>/.lab/hosts/<host>.json  the lab's record of the host (kind, index, boot ID, processes)
    <lab_dir>/.lab/ns/<host>/         namespaced hosts only: sshd_config, host key, authorized_keys,
                                      setup.sh, sshd.log

Two kinds of host:

* ``local``: only the root directory; node-side modules read it through their ``root`` option.
* ``namespaced`` (root only): the same root, shown at the real paths (``/sys``, ``/proc/sys/kernel/...``,
  ``/run/orbite/locks``) inside a mount+UTS+PID namespace running sshd on a loopback port (see
  ``_namespace``); modules run there with ``root: /``.

Nothing is deleted unless the lab's record says the lab created it, and nothing is overwritten that
the lab did not write. Each (re)start of a host writes a fresh boot ID: a host that was down has
rebooted. Errors are typed (``SimLabError`` and subclasses) and name the field, value and rule.

Controller side, stdlib only, Python >= 3.9.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import re
import shutil
import stat
import uuid
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ansible_collections.orbite.qualification.plugins.module_utils._common.numbers import ascii_int
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    atomic_write_json,
    private_dir,
    read_regular_bytes,
)
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._sim import namespace as ns
from ansible_collections.orbite.qualification.plugins.module_utils._sim.fake_sysfs import (
    SIM_MAX_INDEX,
    SIM_RNICS,
    FakeSysfsError,
    sim_host_spec,
    write_host,
)

KINDS = ("local", "namespaced")
STATES = ("present", "absent")
LAB_STATE_DIR = ".lab"
RECORD_SCHEMA = "orbite.sim-host"
RECORD_VERSION = 1
LOCK_DIR = "run/orbite/locks"
BOOT_ID_FILE = "proc/sys/kernel/random/boot_id"
HOSTNAME_FILE = "proc/sys/kernel/hostname"
FAKE_HOST_MARKER = ".orbite-fake-host"
ROCE_V2 = "RoCE v2"
# One DNS label, lower case: it is a directory name, a UTS hostname and an inventory name.
_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_PUBLIC_KEY_RE = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]+( .*)?$")


class SimLabError(OrbiteError):
    """Base of every error of the simulated lab."""

    code = "sim.lab"


class SimLabArgumentError(SimLabError):
    """A bad argument: names the field, the value and the rule."""

    def __init__(self, field: str, value, rule: str):
        super().__init__(f"{field}={value!r}: {rule}")
        self.field, self.value, self.rule = field, value, rule


class SimLabStateError(SimLabError):
    """What is on disk (or running) does not allow the request; nothing was changed."""


class SimLabNamespaceError(SimLabError):
    """A namespaced host could not be started or stopped."""


@dataclass(frozen=True)
class HostRequest:
    lab_dir: str
    name: str
    index: int
    kind: str = "local"
    rnics: int = 2
    ssh_address: str = "127.0.0.1"
    ssh_port: Optional[int] = None
    authorized_key_file: Optional[str] = None
    ssh_user: Optional[str] = None
    unshare: str = "unshare"
    sshd: str = "/usr/sbin/sshd"
    ssh_keygen: str = "ssh-keygen"
    created_by: Optional[str] = None

    @property
    def root(self) -> str:
        return os.path.join(self.lab_dir, self.name)

    @property
    def record_path(self) -> str:
        return os.path.join(self.lab_dir, LAB_STATE_DIR, "hosts", self.name + ".json")

    @property
    def state_dir(self) -> str:
        return os.path.join(self.lab_dir, LAB_STATE_DIR, "ns", self.name)


# ---------------------------------------------------------------- arguments


def _as_int(field: str, value, low: int, high: int) -> int:
    if isinstance(value, bool):
        raise SimLabArgumentError(field, value, f"must be an integer within {low}..{high}")
    number = ascii_int(value) if isinstance(value, str) else value
    if not isinstance(number, int):
        raise SimLabArgumentError(field, value, f"must be an integer within {low}..{high}")
    if not low <= number <= high:
        raise SimLabArgumentError(field, value, f"must be within {low}..{high}")
    return number


def build_request(params: Dict, state: str = "present") -> HostRequest:
    """Validate and cast module arguments (survey values arrive as strings) into a HostRequest."""
    lab_dir = params.get("lab_dir")
    if not isinstance(lab_dir, str) or not os.path.isabs(lab_dir):
        raise SimLabArgumentError("lab_dir", lab_dir, "must be an absolute path")
    lab_dir = os.path.normpath(lab_dir)
    if lab_dir == os.sep:
        raise SimLabArgumentError("lab_dir", lab_dir, "must not be the filesystem root")
    name = params.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise SimLabArgumentError("name", name, "must be one lower-case DNS label ([a-z0-9-], 1..63 chars)")
    kind = params.get("kind") or "local"
    if kind not in KINDS:
        raise SimLabArgumentError("kind", kind, f"must be one of {', '.join(KINDS)}")
    index = params.get("index")
    if state == "present" or index is not None:
        index = _as_int("index", index, 0, SIM_MAX_INDEX)
    request = {"lab_dir": lab_dir, "name": name, "index": index, "kind": kind}
    rnics = params.get("rnics")
    if rnics is not None and str(rnics).strip() != "":
        request["rnics"] = _as_int("rnics", rnics, min(SIM_RNICS), max(SIM_RNICS))
        if request["rnics"] not in SIM_RNICS:
            raise SimLabArgumentError("rnics", rnics, f"must be one of {', '.join(map(str, SIM_RNICS))}")
    created_by = params.get("created_by")
    if created_by is not None and (not isinstance(created_by, str) or not os.path.isabs(created_by)):
        raise SimLabArgumentError("created_by", created_by,
                                  "must be the absolute path of the collection making the lab")
    if created_by:
        request["created_by"] = os.path.normpath(created_by)
    if kind == "namespaced" and state == "present":
        request["ssh_port"] = _as_int("ssh_port", params.get("ssh_port"), 1, 65535)
        address = params.get("ssh_address") or "127.0.0.1"
        if not re.match(r"^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$", str(address)):
            raise SimLabArgumentError("ssh_address", address, "must be an IPv4 loopback address (127.x.y.z)")
        request["ssh_address"] = str(address)
        key_file = params.get("authorized_key_file")
        if not isinstance(key_file, str) or not os.path.isabs(key_file):
            raise SimLabArgumentError(
                "authorized_key_file", key_file, "must be the absolute path of the controller's public key"
            )
        request["authorized_key_file"] = key_file
        request["ssh_user"] = params.get("ssh_user") or pwd.getpwuid(os.geteuid()).pw_name
        for field in ("unshare", "sshd", "ssh_keygen"):
            if params.get(field):
                request[field] = params[field]
    return HostRequest(**request)


# ---------------------------------------------------------------- records


def load_record(request: HostRequest) -> Optional[Dict]:
    try:
        with open(request.record_path, encoding="utf-8") as handle:
            record = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SimLabStateError(f"host {request.name}: lab record {request.record_path} is unreadable: {exc}") from None
    if not isinstance(record, dict) or record.get("schema") != RECORD_SCHEMA:
        raise SimLabStateError(
            f"host {request.name}: {request.record_path} is not a {RECORD_SCHEMA} record; refusing to touch it"
        )
    return record


def _write_record(request: HostRequest, record: Dict) -> None:
    if request.created_by:
        record["created_by"] = request.created_by
    private_dir(os.path.dirname(request.record_path), "the host record's directory")
    atomic_write_json(request.record_path, record, mode=0o600)


RECORD_READ_LIMIT = 1 << 16  # a host record is a few hundred bytes


def _lab_makers(lab_dir: str) -> List[str]:
    """The collections (checkouts or installed copies) the lab's host records say made them."""
    makers: List[str] = []
    for path in sorted(glob.glob(os.path.join(lab_dir, LAB_STATE_DIR, "hosts", "*.json"))):
        try:  # the collection's bounded reader: another lab's state may hold anything
            maker = json.loads(read_regular_bytes(path, RECORD_READ_LIMIT)).get("created_by")
        except (OSError, ValueError, AttributeError, OrbiteError):
            continue
        if isinstance(maker, str) and maker not in makers:
            makers.append(maker)
    return makers


def _whose_lab(request: HostRequest) -> str:
    """Whose lab holds what was found, and how to run another beside it: two checkouts share one default work dir."""
    makers = _lab_makers(request.lab_dir)
    whose = (f"it is the lab {', '.join(makers)} made" if makers else "no lab record there names who made it")
    return (f"{whose} (lab {request.lab_dir}, work directory {os.path.dirname(request.lab_dir)}); for a lab of "
            "your own beside it, pick another work directory: ORBITE_WORK_DIR=<dir> (or -e orbite_work_dir=<dir>)")


# ---------------------------------------------------------------- the host root


def rails_of(spec: Dict) -> List[Dict]:
    """Per RNIC port: the RoCE v2 IPv4 GID index, as a runner case names a rail."""
    netdevs = {net["name"]: net for net in spec.get("netdevs", [])}
    pci = spec.get("pci", {})
    rails = []
    for device in spec.get("devices", []):
        for port in device.get("ports", []):
            for key, gid in sorted(port.get("gids", {}).items(), key=lambda item: int(item[0])):
                if gid.get("type") == ROCE_V2 and gid["gid"].startswith("0000:0000:0000:0000:0000:ffff:"):
                    words = gid["gid"].split(":")[6:]
                    ipv4 = ".".join(str(int(w[i:i + 2], 16)) for w in words for i in (0, 2))
                    rails.append(
                        {
                            "device": device["name"],
                            "port": int(port["num"]),
                            "gid_index": int(key),
                            "netdev": gid.get("ndev"),
                            "ipv4": ipv4,
                            "numa_node": pci.get(device.get("pci"), {}).get("numa_node"),
                            "mac": netdevs.get(gid.get("ndev"), {}).get("mac"),
                        }
                    )
                    break
    return rails


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _root_intact(request: HostRequest) -> bool:
    root = request.root
    lock_dir = os.path.join(root, LOCK_DIR)
    try:
        lock_mode = stat.S_IMODE(os.stat(lock_dir).st_mode)
    except OSError:
        return False
    return (
        os.path.exists(os.path.join(root, FAKE_HOST_MARKER))
        and _read_text(os.path.join(root, HOSTNAME_FILE)) == request.name
        and bool(_read_text(os.path.join(root, BOOT_ID_FILE)))
        and lock_mode == 0o700
    )


def _write_root(request: HostRequest, whose: str) -> str:
    """Write the fake host root with a fresh boot ID and its private lock dir; return the boot ID. ``whose``:
    whose lab it was before this request rewrote the host's record (for the refusal)."""
    spec = sim_host_spec(request.index, request.name, request.rnics)
    spec["boot_id"] = str(uuid.uuid4())
    try:
        write_host(request.root, spec)
    except FakeSysfsError as exc:
        raise SimLabStateError(f"host {request.name}: cannot write its root {request.root}: {exc}; {whose}") from None
    lock_dir = os.path.join(request.root, LOCK_DIR)
    private_dir(lock_dir, "the host's lock dir")
    return spec["boot_id"]


def _reboot(request: HostRequest) -> str:
    """A fresh boot ID for a host whose namespace (re)starts."""
    boot_id = str(uuid.uuid4())
    with open(os.path.join(request.root, BOOT_ID_FILE), "w", encoding="ascii") as handle:
        handle.write(boot_id + "\n")
    return boot_id


def _check_not_foreign(request: HostRequest, action: str) -> None:
    root = request.root
    if os.path.lexists(root) and (not os.path.isdir(root) or os.listdir(root)):
        raise SimLabStateError(
            f"host {request.name}: {root} exists but the lab has no record of creating it "
            f"({request.record_path}); refusing to {action} it; {_whose_lab(request)}"
        )


def describe(request: HostRequest, record: Dict) -> Dict:
    """What playbooks and inventories need to know about a created host."""
    spec = sim_host_spec(record["index"], request.name, record.get("rnics", 2))
    namespaced = record["kind"] == "namespaced"
    info = {
        "name": request.name,
        "kind": record["kind"],
        "index": record["index"],
        "root": request.root,
        "orbite_root": "/" if namespaced else request.root,
        "lock_dir": "/" + LOCK_DIR if namespaced else os.path.join(request.root, LOCK_DIR),
        "hostname": request.name,
        "boot_id": _read_text(os.path.join(request.root, BOOT_ID_FILE)),
        "rails": rails_of(spec),
    }
    if namespaced:
        ssh = record.get("ssh", {})
        info["ssh"] = {
            "address": ssh.get("address"),
            "port": ssh.get("port"),
            "user": ssh.get("user"),
            "host_key": ssh.get("host_key"),
            "known_hosts_line": "[{}]:{} {}".format(
                ssh.get("address"), ssh.get("port"), " ".join(str(ssh.get("host_key", "")).split()[:2])
            ),
        }
        info["processes"] = record.get("processes")
    return info


# ---------------------------------------------------------------- present / absent


def ensure_present(request: HostRequest, check_mode: bool = False) -> Tuple[bool, Dict]:
    record = load_record(request)
    if record is not None:
        for field in ("kind", "index", "rnics"):
            if record.get(field, 2 if field == "rnics" else None) != getattr(request, field):
                raise SimLabStateError(
                    f"host {request.name}: exists as {field}={record.get(field)!r}, requested "
                    f"{field}={getattr(request, field)!r}; destroy it first (state=absent)"
                )
    else:
        _check_not_foreign(request, "overwrite")
    if request.kind == "namespaced":
        return _present_namespaced(request, record, check_mode)
    if record is not None and record.get("status") == "ready" and _root_intact(request):
        return False, describe(request, record)
    if check_mode:
        return True, {"name": request.name, "kind": request.kind, "root": request.root}
    record = {
        "schema": RECORD_SCHEMA,
        "version": RECORD_VERSION,
        "name": request.name,
        "kind": request.kind,
        "index": request.index,
        "status": "creating",
        **_rnics_field(request),
    }
    whose = _whose_lab(request)
    _write_record(request, record)  # first: a crash from here on still leaves a destroyable host
    _write_root(request, whose)
    record["status"] = "ready"
    _write_record(request, record)
    return True, describe(request, record)


def _rnics_field(request: HostRequest) -> Dict:
    """The record's RNIC count, written only where it is not the lab's default 2 (such records stay as they were)."""
    return {} if request.rnics == 2 else {"rnics": request.rnics}


def _authorized_keys(request: HostRequest) -> str:
    path = request.authorized_key_file
    text = _read_text(path)
    if text is None:
        raise SimLabArgumentError("authorized_key_file", path, "must be a readable public key file")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not all(_PUBLIC_KEY_RE.match(line.strip()) for line in lines):
        raise SimLabArgumentError("authorized_key_file", path, "must hold OpenSSH public key lines only")
    return "\n".join(line.strip() for line in lines) + "\n"


def _require_namespace_tools(request: HostRequest) -> None:
    if os.geteuid() != 0:
        raise SimLabNamespaceError(
            f"host {request.name}: kind=namespaced needs root (mount, UTS and PID namespaces); use kind=local"
        )
    for field in ("unshare", "sshd", "ssh_keygen"):
        value = getattr(request, field)
        if not shutil.which(value):
            raise SimLabArgumentError(field, value, "must name an executable (is openssh-server installed?)")


def _host_files(request: HostRequest) -> Dict[str, str]:
    return {
        "sshd_config": ns.sshd_config_text(request.name, request.ssh_address, request.ssh_port, request.ssh_user),
        "authorized_keys": _authorized_keys(request),
        "setup.sh": ns.SETUP_SCRIPT,
    }


def _present_namespaced(request: HostRequest, record: Optional[Dict], check_mode: bool) -> Tuple[bool, Dict]:
    _require_namespace_tools(request)
    if check_mode and record is None and not os.path.exists(str(request.authorized_key_file)):
        # A check run of the role: the client key would be created by an earlier task of the run.
        return True, {"name": request.name, "kind": request.kind, "root": request.root}
    files = _host_files(request)
    running = record is not None and ns.host_running(record.get("processes"))
    same_files = all(_read_text(os.path.join(request.state_dir, n)) == t.strip() for n, t in files.items())
    if running and same_files and record.get("status") == "ready" and _root_intact(request):
        return False, describe(request, record)
    if check_mode:
        return True, {"name": request.name, "kind": request.kind, "root": request.root}
    if record is not None:
        try:
            ns.stop_host(record.get("processes"))  # a changed or half-dead host restarts from scratch
        except ns.NamespaceError as exc:
            raise SimLabNamespaceError(f"host {request.name}: cannot restart: {exc}") from None
    record = {
        "schema": RECORD_SCHEMA,
        "version": RECORD_VERSION,
        "name": request.name,
        "kind": request.kind,
        "index": request.index,
        "status": "creating",
        **_rnics_field(request),
    }
    whose = _whose_lab(request)
    _write_record(request, record)
    if _root_intact(request):
        _reboot(request)
    else:
        _write_root(request, whose)
    # The host's own /var/tmp (node work dir: receipts, deployed runner), kept in its root.
    var_tmp = os.path.join(request.root, "var", "tmp")
    os.makedirs(var_tmp, exist_ok=True)
    os.chmod(var_tmp, 0o1777)
    private_dir(request.state_dir, "state_dir")
    for name, text in files.items():
        path = os.path.join(request.state_dir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
    try:
        host_key = ns.generate_host_key(request.state_dir, request.name, request.ssh_keygen)
        record["ssh"] = {
            "address": request.ssh_address,
            "port": request.ssh_port,
            "user": request.ssh_user,
            "host_key": host_key,
        }
        record["processes"] = ns.start_host(
            name=request.name,
            root=request.root,
            state_dir=request.state_dir,
            address=request.ssh_address,
            port=request.ssh_port,
            unshare=shutil.which(request.unshare),
            sshd=shutil.which(request.sshd),
        )
    except ns.NamespaceError as exc:
        raise SimLabNamespaceError(str(exc)) from None
    record["status"] = "ready"
    _write_record(request, record)
    return True, describe(request, record)


def ensure_absent(request: HostRequest, check_mode: bool = False) -> Tuple[bool, Dict]:
    record = load_record(request)
    if record is None:
        _check_not_foreign(request, "delete")
        if os.path.isdir(request.root):
            if not check_mode:
                os.rmdir(request.root)  # empty leftover directory
            return True, {"name": request.name, "ended_pids": []}
        return False, {"name": request.name, "ended_pids": []}
    if check_mode:
        return True, {"name": request.name, "ended_pids": []}
    ended = []
    if record.get("processes"):
        try:
            ended = ns.stop_host(record["processes"])
        except ns.NamespaceError as exc:
            raise SimLabNamespaceError(f"host {request.name}: {exc}") from None
        if ns.host_running(record["processes"]):
            raise SimLabNamespaceError(f"host {request.name}: its namespace is still running after SIGKILL")
    for path in (request.root, request.state_dir):
        if os.path.lexists(path):
            shutil.rmtree(path)
    os.unlink(request.record_path)
    return True, {"name": request.name, "kind": record.get("kind"), "ended_pids": ended}
