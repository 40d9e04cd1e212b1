"""Optional pyverbs cross-check: skipped with a reason, or compared field by field.

The compared path runs against a stand-in ``pyverbs.device`` module (this machine has no RDMA);
the "raises" path also runs against the real pyverbs of the system Python when it is installed
(Debian python3-pyverbs), where get_device_list raises PyverbsRDMAError without an RDMA subsystem.
"""

import json
import os
import subprocess
import sys
import types

import pytest
from helpers.paths import COLLECTIONS, FIXTURES

from ansible_collections.orbite.qualification.plugins.module_utils._inventory import verbs as vc

FIXTURES = str(FIXTURES / "inventory")
SYSTEM_PYTHON = "/usr/bin/python3"
COLLECTIONS = str(COLLECTIONS)


@pytest.fixture(scope="module")
def sim():
    with open(os.path.join(FIXTURES, "sim_host.json"), encoding="utf-8") as handle:
        return json.load(handle)


class _Port:
    def __init__(self, state=4, link_layer=2):
        self.state = state
        self.link_layer = link_layer


class _Context:
    """Stand-in for pyverbs.device.Context over a dict: name -> {port: (state, link_layer, {index: type})}."""

    opened = []
    closed = []

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


def _fake_pyverbs(monkeypatch, devices, list_error=None):
    module = types.ModuleType("fake_pyverbs_device")

    def get_device_list():
        if list_error:
            raise list_error
        return [types.SimpleNamespace(name=name.encode()) for name in devices]

    context = type("Context", (_Context,), {"devices": devices, "opened": [], "closed": []})
    module.get_device_list = get_device_list
    module.Context = context
    monkeypatch.setitem(sys.modules, "fake_pyverbs_device", module)
    return context


def _sim_verbs():
    gid_types = {0: 0, 1: 1, 2: 0, 3: 1}
    return {"mlx5_0": {1: (4, 2, dict(gid_types))}, "mlx5_1": {1: (4, 2, dict(gid_types))}}


def test_matching_verbs_view_has_no_mismatch(monkeypatch, sim):
    context = _fake_pyverbs(monkeypatch, _sim_verbs())
    result = vc.verbs_crosscheck(sim, "/", module_name="fake_pyverbs_device")
    assert result == {"status": "checked", "reason": None, "devices": 2, "comparisons": 12, "mismatches": []}
    assert context.opened == context.closed == ["mlx5_0", "mlx5_1"]  # every context closed


def test_mismatches_are_listed_by_path(monkeypatch, sim):
    verbs = _sim_verbs()
    verbs["mlx5_1"][1] = (1, 1, {0: 0, 1: 0, 2: 0, 3: 1})  # DOWN, InfiniBand, GID 1 reads v1
    verbs["mlx5_9"] = {1: (4, 2, {})}
    _fake_pyverbs(monkeypatch, verbs)
    result = vc.verbs_crosscheck(sim, "/", module_name="fake_pyverbs_device")
    assert result["mismatches"] == [
        {"path": "devices/mlx5_1/ports/1/state", "sysfs": 4, "verbs": 1},
        {"path": "devices/mlx5_1/ports/1/link_layer", "sysfs": "Ethernet", "verbs": "InfiniBand"},
        {"path": "devices/mlx5_1/ports/1/gids[1]/type", "sysfs": "RoCE v2", "verbs": "IB/RoCE v1"},
        {"path": "devices/mlx5_9", "sysfs": "absent", "verbs": "present"},
    ]


def test_device_that_verbs_cannot_open(monkeypatch, sim):
    verbs = _sim_verbs()
    _fake_pyverbs(monkeypatch, verbs)
    del verbs["mlx5_1"]  # listed by get_device_list, then gone when opened
    monkeypatch.setattr(
        sys.modules["fake_pyverbs_device"],
        "get_device_list",
        lambda: [types.SimpleNamespace(name=b"mlx5_0"), types.SimpleNamespace(name=b"mlx5_1")],
    )
    result = vc.verbs_crosscheck(sim, "/", module_name="fake_pyverbs_device")
    assert result["mismatches"] == [
        {"path": "devices/mlx5_1", "sysfs": "present", "verbs": "open failed: RuntimeError: no device mlx5_1"}
    ]


def test_get_device_list_raising_is_a_skip(monkeypatch, sim):
    # Guards the try/except around get_device_list: a host without RDMA makes pyverbs raise.
    _fake_pyverbs(monkeypatch, {}, list_error=OSError("Failed to get devices list"))
    result = vc.verbs_crosscheck(sim, "/", module_name="fake_pyverbs_device")
    assert result["status"] == "skipped"
    assert result["reason"] == "pyverbs get_device_list raised OSError: Failed to get devices list"


def test_absent_pyverbs_is_a_skip(sim):
    result = vc.verbs_crosscheck(sim, "/", module_name="orbite_no_such_pyverbs.device")
    assert result["status"] == "skipped" and result["reason"].startswith("pyverbs not importable: No module named")


def test_fake_root_is_a_skip(tmp_path, sim):
    result = vc.verbs_crosscheck(sim, str(tmp_path))
    assert result["status"] == "skipped" and "is not '/'" in result["reason"]


def _system_pyverbs():
    if not os.path.exists(SYSTEM_PYTHON):
        return False
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import pyverbs.device"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(not _system_pyverbs(), reason="system python3 has no pyverbs (apt-get install python3-pyverbs)")
def test_real_pyverbs_without_rdma_raises_and_is_skipped():
    if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
        pytest.skip("this host has RDMA devices: get_device_list does not raise here")
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1]);"
        "from ansible_collections.orbite.qualification.plugins.module_utils._inventory import verbs as vc;"
        "print(json.dumps(vc.verbs_crosscheck({'devices': {}}, '/')))"
    )
    out = subprocess.run([SYSTEM_PYTHON, "-c", code, COLLECTIONS], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["status"] == "skipped"
    assert result["reason"].startswith("pyverbs get_device_list raised PyverbsRDMAError")


def test_device_name_that_is_not_utf8_is_compared_not_a_crash(monkeypatch, sim):
    # pyverbs hands names over as bytes; a name that does not decode must not end the module.
    _fake_pyverbs(monkeypatch, _sim_verbs())
    monkeypatch.setattr(
        sys.modules["fake_pyverbs_device"],
        "get_device_list",
        lambda: [types.SimpleNamespace(name=b"mlx5_0"), types.SimpleNamespace(name=b"mlx5_1"),
                 types.SimpleNamespace(name=b"bad\xff")],
    )
    result = vc.verbs_crosscheck(sim, "/", module_name="fake_pyverbs_device")
    assert result["mismatches"] == [{"path": "devices/bad\\xff", "sysfs": "absent", "verbs": "present"}]


def test_pyverbs_error_text_is_cut(monkeypatch, sim):
    _fake_pyverbs(monkeypatch, {}, list_error=OSError("x" * 100000))
    result = vc.verbs_crosscheck(sim, "/", module_name="fake_pyverbs_device")
    assert result["status"] == "skipped" and len(result["reason"]) < 300 and result["reason"].endswith("...")
