"""Hash pinning on the bytes that run: pin_file, and the runner's LD_PRELOAD under a swapping attacker.

On main the runner hashed the preload library by path and the supervisor handed the same path to the
loader later: swapping the file in between loaded an unpinned copy (5 of 200 launches). Here a process
swaps a pinned library A and an unpinned B (same name, atomic rename, about every millisecond) while 200
runners are launched through the runner's code path; each library's constructor appends its letter
to a witness file, so the test counts what was really loaded.
"""

import hashlib
import os
import shutil
import stat
import subprocess
import sys

import pytest
from helpers.node_root import make_root
from ansible_collections.orbite.qualification.plugins.module_utils._node import pinned as pinned_mod
from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (
    SupervisorClient,
    start_supervisor,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node.pinned import (
    PinError,
    PinMismatch,
    pin_file,
)
from ansible_collections.orbite.qualification.plugins.module_utils._run import launch

MARK_C = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    const char *path = getenv("ORBITE_TEST_MARK");
    if (!path) return;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0600);
    if (fd < 0) return;
    (void)write(fd, LETTER "\n", 2);
    close(fd);
}
"""


def _sha(path):
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    """libA.so (the pinned one) and libB.so (an attacker's), each marking its letter when loaded."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler to build the two preload libraries")
    out = tmp_path_factory.mktemp("libs")
    source = out / "mark.c"
    source.write_text(MARK_C)
    built = {}
    for letter in "AB":
        lib = out / f"lib{letter}.so"
        subprocess.run([cc, "-shared", "-fPIC", f'-DLETTER="{letter}"', "-o", str(lib), str(source)], check=True)
        built[letter] = lib
    return built


# ---------------------------------------------------------------------------------------------
# pin_file


def test_pin_copies_and_seals_the_checked_bytes(libraries, tmp_path):
    lib = tmp_path / "lib.so"
    shutil.copy(libraries["A"], lib)
    with pin_file(str(lib), _sha(lib)) as pinned:
        assert pinned.kind == "memfd" and pinned.sha256 == _sha(lib)
        lib.write_bytes(b"rewritten after the check")  # the copy does not follow the file
        with open(pinned.proc_path, "rb") as handle:
            assert hashlib.sha256(handle.read()).hexdigest() == _sha(libraries["A"])
        with pytest.raises(OSError):  # sealed: not even its owner can change it
            os.write(os.open(pinned.proc_path, os.O_WRONLY), b"x")


def test_pin_refuses_a_mismatch_symlink_fifo_and_directory(libraries, tmp_path):
    lib = tmp_path / "lib.so"
    shutil.copy(libraries["B"], lib)
    with pytest.raises(PinMismatch) as caught:
        pin_file(str(lib), _sha(libraries["A"]))
    assert caught.value.found == _sha(lib) and caught.value.code == "pin.mismatch"
    link = tmp_path / "link.so"
    link.symlink_to(lib)
    with pytest.raises(PinError, match="symbolic link"):
        pin_file(str(link), _sha(lib))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(PinError, match="regular file"):  # opened non-blocking: never a hang
        pin_file(str(fifo))
    with pytest.raises(PinError, match="regular file"):
        pin_file(str(tmp_path))
    with pytest.raises(PinError, match="absolute path"):
        pin_file("lib.so")
    with pytest.raises(PinError, match="64 lowercase hex"):
        pin_file(str(lib), "ABC")


def test_pin_without_memfd_uses_an_unreachable_private_copy(libraries, tmp_path, monkeypatch):
    monkeypatch.setattr(pinned_mod.os, "memfd_create", None, raising=False)
    script = tmp_path / "tool"
    script.write_text("#!/bin/sh\necho pinned-run\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    with pin_file(str(script), _sha(script)) as pinned:
        assert pinned.kind == "private-copy"
        assert os.readlink(pinned.proc_path).endswith("(deleted)")  # no name reaches it
        run = subprocess.run([str(script)], executable=pinned.proc_path, pass_fds=(pinned.fd,),
                             capture_output=True, text=True, check=False)
        assert run.stdout.strip() == "pinned-run"


def test_pin_is_bounded(tmp_path, monkeypatch):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 4096)
    monkeypatch.setattr(pinned_mod, "MAX_PINNED_BYTES", 1024)
    with pytest.raises(PinError, match="more than 1024"):
        pin_file(str(big))


# ---------------------------------------------------------------------------------------------
# the runner's preload under a swapping attacker


# A process of its own (not a fork of this possibly multi-threaded worker, whose locks a forked child
# can inherit held): atomically replace the target with B, A, B, A, ... (each for about 1 ms).
_SWAPPER = """
import os, sys, time
directory, target, sources = sys.argv[1], sys.argv[2], sys.argv[3:]
n = 0
while True:
    for source in sources:
        temporary = os.path.join(directory, ".swap-%d" % n)
        os.link(source, temporary)
        os.rename(temporary, target)
        n += 1
        time.sleep(0.001)
"""


@pytest.mark.slow
def test_swapping_the_preload_never_loads_an_unpinned_copy(libraries, tmp_path):
    true = shutil.which("true")
    if true is None:
        pytest.skip("needs a dynamically linked `true`")
    root = make_root(tmp_path / "root")
    run_dir = os.path.join(root, "run", "orbite", "supervisors", "swap")
    start_supervisor(run_dir, "swap", ["mlx5_0"], os.path.join(root, "run", "orbite", "locks"), root=root,
                     lease=300, lock_timeout=5)
    client = SupervisorClient(run_dir)
    swap_dir = tmp_path / "deploy"
    swap_dir.mkdir()
    target = swap_dir / "liborbite_accounting.so"
    shutil.copy(libraries["A"], target)
    witness = tmp_path / "loaded"
    swapper = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(swap_dir), str(target),
                                str(libraries["B"]), str(libraries["A"])])
    refused, launched = 0, []
    attempts = 0
    try:
        # At least 200 launches, and on until the swapper has raced both ways (bounded).
        while attempts < 200 or (not (launched and refused) and attempts < 1000):
            index = attempts
            attempts += 1
            params = {
                "role": "requester", "run_id": "swap", "generation": 1, "profile": {}, "root": root,
                "registration_id": f"reg-{index}", "observers": [], "peer_address": "127.0.0.1:1",
                "rails": [{"device": "mlx5_0", "port": 1, "gid_index": 0}],
                "ld_preload": [{"path": str(target), "sha256": _sha(libraries["A"])}],
                "env": {"ORBITE_TEST_MARK": str(witness)},
                "output_dir": str(tmp_path / "out" / str(index)), "supervisor_run_dir": run_dir,
                "runner_argv": [true], "ready_timeout": 10,
            }
            try:
                launched.append(launch.start(params)["child"])
            except launch.RunnerError as error:
                assert error.code == "runner.hash_mismatch", error
                refused += 1
    finally:
        swapper.kill()
        swapper.wait(10)
    for child in launched:
        assert client.wait(child["child_id"], timeout=20)["exit_code"] == 0
    client.stop()
    marks = witness.read_text().split() if witness.exists() else []
    print(f"{len(launched)} launched, {refused} refused (hash_mismatch), loaded: A={marks.count('A')} "
          f"B={marks.count('B')}", file=sys.stderr)
    assert marks.count("B") == 0, f"an unpinned library was loaded {marks.count('B')} times"
    assert marks.count("A") == len(launched) and len(launched) + refused == attempts
    assert launched and refused  # the swapper really raced both ways
