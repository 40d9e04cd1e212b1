"""What a gate run left on a namespaced fake host, seen from inside it (molecule verify).

Prints one JSON object: `held_locks`, the lock files of the lock dir (argv[1]) some process holds a
flock on (probed non-blocking, released at once), and `processes`, every process of the host's PID
namespace that is neither an sshd, nor this probe or one of its ancestors, nor inside an SSH session (a
descendant of an sshd other than PID 1, the listener): a session's transient processes (Ansible's
`rm -rf <tmp> && sleep 0`, a login shell's rc scripts) come and go with it, while whatever the gate could
leave behind (a supervisor, runner or relay detaches from its session) hangs off PID 1.
Stdlib only, Python >= 3.9: it runs with the host's interpreter.
"""

import fcntl
import json
import os
import sys


def held_locks(lock_dir):
    held = []
    for name in sorted(os.listdir(lock_dir)):
        if not name.endswith(".lock"):
            continue
        path = os.path.join(lock_dir, name)
        with open(path, "rb") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(path)
                continue
            fcntl.flock(handle, fcntl.LOCK_UN)
    return held


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as handle:
        # The command name may hold spaces and parentheses: the fields after its last ')' are fixed.
        return int(handle.read().rsplit(")", 1)[1].split()[1])


def ancestors():
    chain, pid = set(), os.getpid()
    while pid > 1:
        chain.add(pid)
        pid = parent_of(pid)
    return chain


def in_ssh_session(pid, parent_of, is_sshd):
    """True if an sshd other than PID 1 (the listener) is among the ancestors of ``pid``."""
    pid = parent_of(pid)
    while pid > 1:
        if is_sshd(pid):
            return True
        pid = parent_of(pid)
    return False


def _is_sshd(pid):
    return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("sshd")


def _in_session(pid):
    try:
        return in_ssh_session(pid, parent_of, _is_sshd)
    except OSError:  # a process of the chain ended meanwhile, or has no exe (a zombie): not proven
        return False


def leftover_processes():
    mine, left = ancestors(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            exe = os.readlink(f"/proc/{entry}/exe")
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except FileNotFoundError:  # ended meanwhile
            continue
        except OSError:  # a zombie has no exe: it is still left
            exe, cmdline = "", ""
        if os.path.basename(exe).startswith("sshd") or _in_session(int(entry)):
            continue
        left.append({"pid": int(entry), "exe": exe, "cmdline": cmdline})
    return left


if __name__ == "__main__":
    print(json.dumps({"held_locks": held_locks(sys.argv[1]), "processes": leftover_processes()}))
