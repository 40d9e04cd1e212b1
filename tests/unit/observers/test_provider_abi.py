"""The loopback verbs provider has the whole ABI of rdma-core's libibverbs.so.1 (issue 30).

Programs linked to rdma-core's driver libraries (libmlx5, libefa: perftest, pyverbs' provider
modules, rdma-core's tests) import its IBVERBS_PRIVATE_* symbols with bind-now, so one missing
symbol@version fails them at load.  The entry points the provider has no kernel for fail as the
real ones fail, and librdmacm's ibv_get_sysfs_path is driver.h's const char *(void).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers.native import (
    INSTALLED_LIBIBVERBS,
    build_provider,
    dynamic_symbols,
    provider_env,
    verbs_headers_missing,
    write_provider_host,
)

_MISSING = verbs_headers_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"the provider cannot be built: {_MISSING}")


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    return build_provider(tmp_path_factory.mktemp("prov-abi"))


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return write_provider_host(tmp_path_factory.mktemp("hosts") / "sim-a", 0, "sim-a")


def test_every_symbol_and_version_of_the_installed_libibverbs_is_exported(provider):
    if not os.path.exists(INSTALLED_LIBIBVERBS):
        pytest.skip(f"{INSTALLED_LIBIBVERBS} is not installed (libibverbs1)")
    real = dynamic_symbols(INSTALLED_LIBIBVERBS)
    ours = dynamic_symbols(os.path.join(provider, "libibverbs.so.1"))
    missing = sorted(real - ours)
    assert not missing, f"the provider lacks {len(missing)} symbol@version of libibverbs.so.1: {missing}"
    assert "ibv_cmd_destroy_cq@@IBVERBS_PRIVATE_34" in ours and "ibv_alloc_pd@IBVERBS_1.0" in ours


def _run(provider, host, script):
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=provider_env(provider, host),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_driver_libraries_load_with_bind_now(provider, host):
    """libmlx5/libefa resolve every libibverbs import against the provider at load."""
    libs = [lib for lib in ("libmlx5.so.1", "libefa.so.1") if os.path.exists(f"/usr/lib/x86_64-linux-gnu/{lib}")]
    if not libs:
        pytest.skip("no rdma-core driver library is installed (ibverbs-providers)")
    got = _run(
        provider,
        host,
        f"""
        import ctypes, json, os
        verbs = ctypes.CDLL("libibverbs.so.1", mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        for lib in {libs!r}:
            ctypes.CDLL(lib, mode=os.RTLD_NOW)
        print(json.dumps({{"verbs": verbs._name}}))
        """,
    )
    assert got == {"verbs": "libibverbs.so.1"}


_STUBS = """
import ctypes, json
lib = ctypes.CDLL("libibverbs.so.1", use_errno=True)
vp = ctypes.c_void_p
def call(name, restype, *args):
    fn = getattr(lib, name)
    fn.restype = restype
    ctypes.set_errno(0)
    ret = fn(*args)
    return [ret, ctypes.get_errno()]
lib.ibv_get_device_list.restype = ctypes.POINTER(vp)
lib.ibv_open_device.restype = vp
lib.ibv_open_device.argtypes = [vp]
lib.ibv_close_device.argtypes = [vp]
ctx = lib.ibv_open_device(lib.ibv_get_device_list(None)[0])
lib._ibv_query_gid_table.restype = ctypes.c_ssize_t
lib._ibv_query_gid_table.argtypes = [vp, vp, ctypes.c_size_t, ctypes.c_uint32, ctypes.c_size_t]
entries = ctypes.create_string_buffer(32 * 64)  # struct ibv_gid_entry is 32 bytes
out = {
    "destroy_cq": call("ibv_cmd_destroy_cq", ctypes.c_int, vp(0)),
    "poll_cq": call("ibv_cmd_poll_cq", ctypes.c_int, vp(0), 1, vp(0)),
    "execute_ioctl": call("execute_ioctl", ctypes.c_int, vp(0), vp(0)),
    "alloc_context": call("_verbs_init_and_alloc_context", vp, vp(0), -1, ctypes.c_size_t(64), vp(0), 0),
    "open_device": call("verbs_open_device", vp, vp(0), vp(0)),
    "ibdev_file": call("ibv_read_ibdev_sysfs_file", ctypes.c_int, entries, ctypes.c_size_t(8), vp(0), b"x"),
    "sysfs_path": call("ibv_get_sysfs_path", ctypes.c_char_p)[0].decode(),
    "gid_table": lib._ibv_query_gid_table(ctx, entries, 64, 0, 32),
    "gid_table_short": lib._ibv_query_gid_table(ctx, entries, 1, 0, 32),
}
lib.ibv_close_device(ctx)
print(json.dumps(out))
"""

EOPNOTSUPP, EINVAL = 95, 22


def test_unimplemented_entry_points_fail_in_their_own_convention(provider, host):
    got = _run(provider, host, _STUBS)
    assert got["destroy_cq"] == [EOPNOTSUPP, EOPNOTSUPP]  # ibv_cmd_*: a positive errno
    assert got["execute_ioctl"] == [EOPNOTSUPP, EOPNOTSUPP]
    assert got["poll_cq"] == [-1, EOPNOTSUPP]  # a count, or -1 with errno
    assert got["alloc_context"] == [None, EOPNOTSUPP] and got["open_device"] == [None, EOPNOTSUPP]
    assert got["ibdev_file"] == [-1, EINVAL]  # no sysfs device


def test_sysfs_path_is_the_provider_roots_and_a_short_gid_table_is_einval(provider, host):
    got = _run(provider, host, _STUBS)
    assert got["sysfs_path"] == f"{host}/sys"
    assert got["gid_table"] > 1
    assert got["gid_table_short"] == -EINVAL  # rdma-core's answer to a buffer too short
