"""Other Python interpreters on this machine (a node may run another version than the controller)."""

import glob
import os
import shutil
import subprocess
import sys


def other_interpreter(version):
    """A working interpreter of that version other than this one (on PATH or pyenv's), or None."""
    if version == f"{sys.version_info[0]}.{sys.version_info[1]}":
        return None
    for candidate in [shutil.which(f"python{version}"),
                      *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python{version}")))]:
        if candidate and subprocess.run([candidate, "-c", "pass"], check=False, capture_output=True).returncode == 0:
            return candidate
    return None
