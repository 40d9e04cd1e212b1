"""The libibverbs cross-check: rdma-core itself enumerates the fake hosts, and every difference is coded.

Two halves:
- rdma-core's real libibverbs (ctypes, the system's libibverbs.so.1) reads generated trees through
  ``SYSFS_PATH``, in a mount namespace whose private ``/dev`` holds the ``/dev/infiniband/uverbsN``
  nodes made with mknod (root only): the odd host is listed exactly as the inventory says; a wrong
  modalias, a missing device node or a software device no provider knows is a coded mismatch;
- the comparison itself, against an injected enumeration and a stand-in ``pyverbs.device``; and the
  port/GID comparison for real on the loopback verbs provider (docs/provider.md), a libibverbs whose
  contexts open, with the system's pyverbs (binds loopback addresses: run in a network namespace).
"""

import json
import os
import shutil
import subprocess
import sys
import types

import pytest
from helpers.native import verbs_headers_missing
from helpers.paths import COLLECTIONS, FIXTURES, REPO

from ansible_collections.orbite.qualification.plugins.module_utils._inventory import sysfs as si
from ansible_collections.orbite.qualification.plugins.module_utils._inventory import verbs as vc
from ansible_collections.orbite.qualification.plugins.module_utils._sim import fake_sysfs as fs

FIXTURES = str(FIXTURES / "inventory")
COLLECTIONS = str(COLLECTIONS)

# Runs in the namespace: the inventory of argv[1] with the libibverbs cross-check, as JSON.
_READ = (
    "import json, sys; sys.path.insert(0, sys.argv[2]);"
    "from ansible_collections.orbite.qualification.plugins.module_utils._inventory.sysfs import read_inventory;"
    "print(json.dumps(read_inventory(sys.argv[1], verbs=True)))"
)
# A private /dev (nothing is made in the machine's): /dev/null, then the chosen uverbs nodes.
_NAMESPACE = r"""set -eu
mount -t tmpfs -o mode=0755 tmpfs /dev
mknod -m 0666 /dev/null c 1 3
mkdir -m 0755 /dev/infiniband
for spec in $NODES; do
  numbers=${spec#*=}
  mknod -m 0666 "/dev/infiniband/${spec%%=*}" c "${numbers%%:*}" "${numbers#*:}"
done
exec "$@"
"""


def _libibverbs():
    probe = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({vc.LIBRARY!r})"],
                           capture_output=True, check=False)
    return probe.returncode == 0


needs_rdma_core = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not _libibverbs(),
    reason="needs root, unshare and rdma-core's libibverbs.so.1 (apt-get install libibverbs1 ibverbs-providers)",
)


def _enumerated_by_rdma_core(root, nodes):
    """read_inventory(root, verbs=True) in a mount namespace holding /dev/infiniband/<name> for ``nodes``."""
    env = dict(os.environ, NODES=" ".join(f"{name}={numbers}" for name, numbers in sorted(nodes.items())))
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _NAMESPACE, "sh",
         sys.executable, "-c", _READ, str(root), COLLECTIONS],
        capture_output=True, text=True, env=env, check=False, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _nodes(spec):
    """Every uverbs node of a spec, numbered as the generator numbers them (independent of the tree)."""
    return {d["uverbs"]: fs.uverbs_dev(d["uverbs"]) for d in spec["devices"] if d.get("uverbs")}


def _write(tmp_path, spec):
    root = tmp_path / spec["hostname"]
    fs.write_host(str(root), spec)
    return root


def _small(spec):
    """The spec with 16-slot GID tables (the odd host writes ~5000 files; variants need not)."""
    for dev in spec["devices"]:
        for port in dev["ports"]:
            port["gid_tbl_len"] = 16
    return spec


@pytest.fixture(scope="module")
def odd_root(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("odd"), fs.odd_host_spec())


# ---------------------------------------------------------------- rdma-core itself


@needs_rdma_core
def test_rdma_core_enumerates_the_odd_host_exactly_as_the_inventory_says(odd_root):
    spec = fs.odd_host_spec()
    inventory = _enumerated_by_rdma_core(odd_root, _nodes(spec))
    verbs = inventory["verbs"]
    assert (verbs["status"], verbs["mismatches"], verbs["warnings"]) == ("checked", [], []), verbs
    # IB port, DOWN port, NUMA -1, sparse GIDs, and rxe0 without a PCI parent (matched by its name).
    expected = [{"name": d["name"], "uverbs": d["uverbs"], "node_guid": d["node_guid"],
                 "node_type": {"num": 1, "name": "CA"}} for d in spec["devices"]]
    listed = [{k: e[k] for k in ("name", "uverbs", "node_guid", "node_type")} for e in verbs["enumerated"]]
    assert listed == sorted(expected, key=lambda e: e["name"])
    assert [e["name"] for e in verbs["enumerated"]] == sorted(inventory["devices"])
    assert verbs["devices"] == len(inventory["devices"]) == 4
    # 1 count + 3 fields per device; no driver: no context, said per device, ports and GIDs uncompared.
    assert verbs["comparisons"] == 1 + 3 * 4
    assert [(lim["device"], lim["step"], lim["not_compared"]) for lim in verbs["limits"]] == [
        (name, "ibv_open_device", ["ports", "gids"]) for name in sorted(inventory["devices"])]
    assert all(lim["error"] and "no kernel driver" in lim["why"] for lim in verbs["limits"])


@needs_rdma_core
def test_rdma_core_enumerates_the_sim_lab_host(tmp_path):
    spec = fs.sim_host_spec(3, "sim-d")
    verbs = _enumerated_by_rdma_core(_write(tmp_path, spec), _nodes(spec))["verbs"]
    assert (verbs["status"], verbs["devices"], verbs["mismatches"]) == ("checked", 2, [])
    assert [e["node_guid"] for e in verbs["enumerated"]] == [d["node_guid"] for d in spec["devices"]]


def _only(mismatches, code):
    return [m for m in mismatches if m["code"] == code]


@needs_rdma_core
def test_a_wrong_modalias_is_a_coded_mismatch(tmp_path):
    spec = _small(fs.odd_host_spec())
    spec["raw"] = {"sys/class/infiniband/mlx5_1/device/modalias":
                   "pci:v00001234d00005678sv00001234sd00000000bc02sc00i00\n"}
    verbs = _enumerated_by_rdma_core(_write(tmp_path, spec), _nodes(spec))["verbs"]
    assert verbs["status"] == "checked"
    assert [(m["code"], m["path"], m["sysfs"], m["verbs"]) for m in verbs["mismatches"]] == [
        ("verbs.count", "devices", 4, 3), ("verbs.device_unlisted", "devices/mlx5_1", "present", "absent")]
    why = _only(verbs["mismatches"], "verbs.device_unlisted")[0]["why"]
    assert "no libibverbs provider matched device/modalias 'pci:v00001234d00005678" in why
    assert "no userspace device-specific driver found for mlx5_1" in why


@needs_rdma_core
def test_a_missing_device_node_is_a_coded_mismatch(odd_root):
    nodes = _nodes(fs.odd_host_spec())
    del nodes["uverbs2"]
    verbs = _enumerated_by_rdma_core(odd_root, nodes)["verbs"]
    assert [(m["code"], m["path"]) for m in verbs["mismatches"]] == [
        ("verbs.count", "devices"), ("verbs.device_unlisted", "devices/mlx5_2")]
    assert _only(verbs["mismatches"], "verbs.device_unlisted")[0]["why"] == (
        "/dev/infiniband/uverbs2 (char device 231:194) is missing: libibverbs skips a device without its "
        "character device")


@needs_rdma_core
def test_a_software_device_no_provider_knows_is_a_coded_mismatch(tmp_path):
    # rdma-core matches a device without a PCI parent by its name only (rxe*, siw*, ...).
    spec = _small(fs.odd_host_spec())
    spec["devices"][3]["name"] = "soft0"
    verbs = _enumerated_by_rdma_core(_write(tmp_path, spec), _nodes(spec))["verbs"]
    unlisted = _only(verbs["mismatches"], "verbs.device_unlisted")
    assert [m["path"] for m in unlisted] == ["devices/soft0"]
    assert "no libibverbs provider matches the name 'soft0' of a device without a PCI parent" in unlisted[0]["why"]


@needs_rdma_core
def test_a_tree_no_node_of_which_exists_is_reported_not_crashed_on(tmp_path):
    spec = _small(fs.sim_host_spec(0, "sim-a"))
    verbs = _enumerated_by_rdma_core(_write(tmp_path, spec), {})["verbs"]
    assert verbs["status"] == "checked" and verbs["enumerated"] == [] and verbs["limits"] == []
    assert [m["code"] for m in verbs["mismatches"]] == ["verbs.count", "verbs.device_unlisted",
                                                        "verbs.device_unlisted"]


def test_a_missing_libibverbs_is_a_skip_with_the_reason(tmp_path):
    spec = _small(fs.sim_host_spec(0, "sim-a"))
    root = _write(tmp_path, spec)
    inventory = si.read_inventory(str(root))
    verbs = vc.verbs_crosscheck(inventory, str(root), library="liborbite-no-such-ibverbs.so.1")
    assert verbs["status"] == "skipped" and verbs["reason"].startswith("cannot load liborbite-no-such-ibverbs.so.1")


# ---------------------------------------------------------------- the comparison (injected enumeration)


@pytest.fixture(scope="module")
def sim():
    with open(os.path.join(FIXTURES, "sim_host.json"), encoding="utf-8") as handle:
        return json.load(handle)


def _listed(inventory, opened=False, **changes):
    devices = []
    for name, dev in sorted(inventory["devices"].items()):
        devices.append({"name": name, "uverbs": dev["uverbs"], "node_guid": dev["node_guid"],
                        "node_type": dict(dev["node_type"]), "opened": opened,
                        "open_error": None if opened else "ENXIO (No such device or address)"})
    for name, change in changes.items():
        entry = next(d for d in devices if d["name"] == name)
        entry.update(change)
    return lambda library, sysfs_path: {"devices": devices, "warnings": []}


def test_equal_enumeration_has_no_mismatch_and_says_what_it_could_not_compare(sim):
    verbs = vc.verbs_crosscheck(sim, "/", enumerate_fn=_listed(sim))
    assert (verbs["status"], verbs["devices"], verbs["comparisons"], verbs["mismatches"]) == ("checked", 2, 7, [])
    assert [(lim["device"], lim["error"]) for lim in verbs["limits"]] == [
        ("mlx5_0", "ENXIO (No such device or address)"), ("mlx5_1", "ENXIO (No such device or address)")]
    assert "no kernel driver" in verbs["limits"][0]["why"]


def test_each_enumeration_difference_has_its_code(sim):
    enumerate_fn = _listed(sim, mlx5_0={"node_guid": "0c42:a103:0000:ffff", "node_type": {"num": 4, "name": "RNIC"},
                                        "uverbs": "uverbs7"})
    verbs = vc.verbs_crosscheck(sim, "/", enumerate_fn=enumerate_fn)
    assert [(m["code"], m["path"], m["sysfs"], m["verbs"]) for m in verbs["mismatches"]] == [
        ("verbs.node_guid", "devices/mlx5_0/node_guid", sim["devices"]["mlx5_0"]["node_guid"], "0c42:a103:0000:ffff"),
        ("verbs.node_type", "devices/mlx5_0/node_type", 1, 4),
        ("verbs.uverbs", "devices/mlx5_0/uverbs", "uverbs0", "uverbs7"),
    ]


def test_an_extra_device_and_a_device_listed_twice_are_counted(sim):
    base = _listed(sim)(None, None)["devices"]
    extra = dict(base[0], name="mlx5_9", uverbs="uverbs9")
    twice = dict(base[1], uverbs="uverbs8")

    verbs = vc.verbs_crosscheck(sim, "/", enumerate_fn=lambda *_a: {"devices": [*base, extra, twice]})
    assert [(m["code"], m["path"], m["sysfs"], m["verbs"]) for m in verbs["mismatches"]] == [
        ("verbs.count", "devices", 2, 4), ("verbs.device_extra", "devices/mlx5_9", "absent", "present")]


def test_a_crashed_or_hung_enumeration_is_a_failure_not_a_crash(sim):
    died = vc.verbs_crosscheck(sim, "/", enumerate_fn=lambda *_a: {"failed": "libibverbs enumeration died of SIGSEGV"})
    assert (died["status"], died["reason"]) == ("failed", "libibverbs enumeration died of SIGSEGV")


def test_enumeration_child_reports_a_signal_and_a_timeout(monkeypatch):
    # The real fork path: a child killed by a signal, and a child that never answers.
    monkeypatch.setattr(vc, "_child", lambda *_a: os.kill(os.getpid(), 9))
    assert vc._enumerate(vc.LIBRARY, None) == {"failed": "libibverbs enumeration died of SIGKILL", "warnings": []}
    monkeypatch.setattr(vc, "_child", lambda *_a: __import__("time").sleep(30))
    assert vc._enumerate(vc.LIBRARY, None, timeout=0.5)["failed"] == (
        "libibverbs enumeration did not finish within 0.5 s")


def test_no_rdma_subsystem_is_a_skip(sim):
    empty = dict(sim, devices={})
    verbs = vc.verbs_crosscheck(empty, "/", enumerate_fn=lambda *_a: {"devices": [], "list_error": "ENOSYS (x)"})
    assert verbs["status"] == "skipped" and "no RDMA subsystem" in verbs["reason"]
    verbs = vc.verbs_crosscheck(sim, "/", enumerate_fn=lambda *_a: {"devices": [], "list_error": "ENOSYS (x)"})
    assert verbs["status"] == "checked"
    assert [m["why"] for m in verbs["mismatches"][1:]] == ["ibv_get_device_list failed: ENOSYS (x)"] * 2


def test_a_fake_tree_is_not_judged_when_the_kernel_answers_rdma_netlink(monkeypatch, tmp_path, sim):
    monkeypatch.setattr(vc, "_rdma_netlink", lambda: True)
    verbs = vc.verbs_crosscheck(sim, str(tmp_path), enumerate_fn=pytest.fail)
    assert verbs["status"] == "skipped" and "not a sysfs mount" in verbs["reason"]
    # Root /: a real node is judged; a namespaced sim host (its /sys a bind mount of a fake tree) is not.
    monkeypatch.setattr(vc, "_is_sysfs_mount", lambda path: path == "/sys")  # a real node: /sys is sysfs
    assert vc.verbs_crosscheck(sim, "/", enumerate_fn=lambda *_a: {"devices": []})["status"] == "checked"
    monkeypatch.setattr(vc, "_is_sysfs_mount", lambda path: False)
    verbs = vc.verbs_crosscheck(sim, "/", enumerate_fn=pytest.fail)
    assert verbs["status"] == "skipped"
    assert verbs["reason"].endswith("would not read the tree '/sys' (not a sysfs mount)")


def test_sysfs_mount_detection():
    assert vc._is_sysfs_mount("/sys/class") == os.path.ismount("/sys")
    assert not vc._is_sysfs_mount("/usr")


# -- the port/GID comparison on devices whose context opened (stand-in pyverbs)


class _Port:
    def __init__(self, state=4, link_layer=2):
        self.state = state
        self.link_layer = link_layer


class _Context:
    """Stand-in for pyverbs.device.Context over a dict: name -> {port: (state, link_layer, {index: type})}."""

    def __init__(self, name):
        if name not in self.devices:
            raise RuntimeError(f"no device {name}")
        self.name = name
        self.opened.append(name)

    def query_port(self, num):
        state, link_layer, _ = self.devices[self.name][num]
        return _Port(state, link_layer)

    def query_gid_type(self, num, index):
        return self.devices[self.name][num][2][index]

    def close(self):
        self.closed.append(self.name)


def _fake_pyverbs(monkeypatch, devices):
    module = types.ModuleType("fake_pyverbs_device")
    module.Context = type("Context", (_Context,), {"devices": devices, "opened": [], "closed": []})
    monkeypatch.setitem(sys.modules, "fake_pyverbs_device", module)
    return module.Context


def _sim_ports():
    gid_types = {0: 0, 1: 1, 2: 0, 3: 1}
    return {"mlx5_0": {1: (4, 2, dict(gid_types))}, "mlx5_1": {1: (4, 2, dict(gid_types))}}


def test_opened_devices_compare_ports_and_gids(monkeypatch, sim):
    context = _fake_pyverbs(monkeypatch, _sim_ports())
    verbs = vc.verbs_crosscheck(sim, "/", module_name="fake_pyverbs_device", enumerate_fn=_listed(sim, opened=True))
    assert (verbs["comparisons"], verbs["mismatches"], verbs["limits"]) == (7 + 12, [], [])
    assert context.opened == context.closed == ["mlx5_0", "mlx5_1"]  # every context closed


def test_port_and_gid_mismatches_are_coded(monkeypatch, sim):
    ports = _sim_ports()
    ports["mlx5_1"][1] = (1, 1, {0: 0, 1: 0, 2: 0, 3: 1})  # DOWN, InfiniBand, GID 1 reads v1
    del ports["mlx5_0"]  # listed, then cannot be opened through pyverbs
    _fake_pyverbs(monkeypatch, ports)
    verbs = vc.verbs_crosscheck(sim, "/", module_name="fake_pyverbs_device", enumerate_fn=_listed(sim, opened=True))
    assert [(m["code"], m["path"], m["sysfs"], m["verbs"]) for m in verbs["mismatches"]] == [
        ("verbs.open_failed", "devices/mlx5_0", "present", "open failed: RuntimeError: no device mlx5_0"),
        ("verbs.port_state", "devices/mlx5_1/ports/1/state", 4, 1),
        ("verbs.link_layer", "devices/mlx5_1/ports/1/link_layer", "Ethernet", "InfiniBand"),
        ("verbs.gid_type", "devices/mlx5_1/ports/1/gids[1]/type", "RoCE v2", "IB/RoCE v1"),
    ]


def test_without_pyverbs_opened_devices_are_a_stated_limit(sim):
    verbs = vc.verbs_crosscheck(sim, "/", module_name="orbite_no_such_pyverbs.device",
                                enumerate_fn=_listed(sim, opened=True))
    assert verbs["mismatches"] == []
    assert [(lim["device"], lim["step"]) for lim in verbs["limits"]] == [("mlx5_0", "pyverbs"), ("mlx5_1", "pyverbs")]
    assert verbs["limits"][0]["error"].startswith("not importable: No module named")


def test_device_name_that_is_not_utf8_is_compared_not_a_crash():
    assert vc._text(b"bad\xff") == "bad\\xff"
    assert vc._guid_text(int.from_bytes(bytes.fromhex("0c42a1030000ff10"), sys.byteorder)) == "0c42:a103:0000:ff10"


def test_pyverbs_error_text_is_cut(monkeypatch, sim):
    module = types.ModuleType("fake_pyverbs_device")

    def huge(name):
        raise OSError("x" * 100000)

    module.Context = huge
    monkeypatch.setitem(sys.modules, "fake_pyverbs_device", module)
    verbs = vc.verbs_crosscheck(sim, "/", module_name="fake_pyverbs_device", enumerate_fn=_listed(sim, opened=True))
    said = [m["verbs"] for m in verbs["mismatches"]]
    assert len(said) == 2 and all(len(text) < 300 and text.endswith("...") for text in said)


def test_no_fork_is_a_failure_not_a_traceback(monkeypatch, sim):
    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    before = len(os.listdir("/proc/self/fd"))
    verbs = vc.verbs_crosscheck(sim, "/")
    assert (verbs["status"], verbs["reason"]) == ("failed", "cannot start the libibverbs enumeration: "
                                                  "BlockingIOError: [Errno 11] Resource temporarily unavailable")
    assert len(os.listdir("/proc/self/fd")) == before  # the pipes are closed again


# -- the same, for real, on the loopback verbs provider: a libibverbs whose contexts open


SYSTEM_PYTHON = "/usr/bin/python3"
_CROSSCHECK = (
    "import json, sys; sys.path.insert(0, sys.argv[2]);"
    "from ansible_collections.orbite.qualification.plugins.module_utils._inventory import sysfs, verbs;"
    "inventory = sysfs.read_inventory(sys.argv[1]);"
    "port = inventory['devices']['mlx5_1']['ports']['1'];"
    "port.update(state={'num': 1, 'name': 'DOWN'}) if sys.argv[3] == 'down' else None;"
    "print(json.dumps(verbs.verbs_crosscheck(inventory, '/')))"
)


@pytest.fixture(scope="module")
def loopback_provider(tmp_path_factory):
    missing = verbs_headers_missing()
    if missing:
        pytest.skip(missing)
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import pyverbs.device"], capture_output=True, check=False)
    if probe.returncode:
        pytest.skip("the system python3 has no pyverbs (Debian python3-pyverbs)")
    out = tmp_path_factory.mktemp("native")
    done = subprocess.run(["make", "-s", "-C", str(REPO / "observers"), f"OUT={out}", "provider"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return out / "provider"


@pytest.mark.parametrize("inventory_says", ["as_read", "down"])
def test_opened_contexts_compare_ports_and_gids_through_pyverbs(tmp_path, loopback_provider, inventory_says):
    # The provider's libibverbs.so.1 reads ORBITE_PROVIDER_ROOT (docs/provider.md) and opens contexts:
    # the ctypes child opens each one, then the system's pyverbs queries every port and listed GID.
    root = _write(tmp_path, _small(fs.sim_host_spec(7, "sim-h")))  # IPv4 GIDs on loopback
    env = dict(os.environ, LD_LIBRARY_PATH=str(loopback_provider), ORBITE_PROVIDER_ROOT=str(root))
    out = subprocess.run([SYSTEM_PYTHON, "-c", _CROSSCHECK, str(root), COLLECTIONS, inventory_says], env=env,
                         capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    verbs = json.loads(out.stdout)
    assert verbs["status"] == "checked" and verbs["limits"] == [], verbs
    assert [(e["name"], e["opened"]) for e in verbs["enumerated"]] == [("mlx5_0", True), ("mlx5_1", True)]
    # count + 3 per device, then per device: state, link layer and the 4 listed GIDs' types.
    assert verbs["comparisons"] == 1 + 3 * 2 + 2 * (2 + 4)
    expected = [] if inventory_says == "as_read" else [
        {"code": "verbs.port_state", "path": "devices/mlx5_1/ports/1/state", "sysfs": 1, "verbs": 4, "why": None}]
    assert verbs["mismatches"] == expected
