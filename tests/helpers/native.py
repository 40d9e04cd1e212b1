"""What the native tests (observers, provider) need from the machine: a C toolchain, rdma-core headers, ASan."""

import os
import shutil
import subprocess

SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")
HELD_KINDS = ("ctx", "pd", "mr", "mw", "cq", "channel", "qp")


def verbs_headers_missing():
    """Why the native code cannot be built here, or None."""
    if shutil.which("gcc") is None or shutil.which("make") is None:
        return "gcc or make is not installed"
    probe = subprocess.run(
        ["gcc", "-E", "-x", "c", "-", "-o", os.devnull],
        input="#include <infiniband/verbs.h>\n#include <linux/seccomp.h>\n",
        capture_output=True,
        text=True,
        check=False,
    )
    return "infiniband/verbs.h is missing (install libibverbs-dev)" if probe.returncode else None


def libasan():
    """The path of gcc's libasan.so (to preload into a non-ASan program), or None."""
    out = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True, check=False)
    path = out.stdout.strip()
    return path if out.returncode == 0 and os.path.isabs(path) and os.path.exists(path) else None
