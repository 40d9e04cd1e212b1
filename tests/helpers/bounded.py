"""Run Python code in a child process under a memory limit (RLIMIT_AS) and a timeout: hostile-input tests.

A reader that hangs on a FIFO or expands a cpulist into GiBs must make a test fail, not take the
test run (or the machine) down with it: the child gets ``memory`` bytes of address space and
``timeout`` seconds, and a hang or a blow-up is reported as such.
"""

import json
import os
import signal
import subprocess
import sys
import time

from helpers.paths import COLLECTIONS, TESTS

MEMORY = 768 << 20  # the interpreter, ansible's module_utils and netaddr need about 100 MiB of it
TIMEOUT = 60.0

_PRELUDE = f"""
import json, sys
sys.path[:0] = [{str(COLLECTIONS)!r}, {str(TESTS)!r}]
"""


class Bounded:
    """Outcome of run_bounded: ``hung``, ``returncode``, ``stdout``, ``stderr``, ``seconds``, ``result``."""

    def __init__(self, hung, returncode, stdout, stderr, seconds):
        self.hung, self.returncode, self.stdout, self.stderr, self.seconds = hung, returncode, stdout, stderr, seconds

    @property
    def result(self):
        """The JSON value the code printed on its last line (see run_bounded)."""
        lines = self.stdout.strip().splitlines()
        return json.loads(lines[-1]) if lines else None

    def explain(self):
        state = f"hung (killed after {self.seconds:.1f} s)" if self.hung else f"exit {self.returncode}"
        return f"{state}\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}"


# Sets the limit, then becomes the command: no preexec_fn (unsafe with threads, e.g. xdist's).
_LAUNCHER = "import os, resource, sys; m = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_AS, (m, m)); " \
    "os.execvp(sys.argv[2], sys.argv[2:])"


def run_command_bounded(argv, memory=MEMORY, timeout=TIMEOUT, **options):
    """Run ``argv`` in a session of its own under the limits; on timeout its whole tree is killed.

    ``options`` go to subprocess.Popen (env, cwd, input is not supported). Returns a Bounded.
    """
    start = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-c", _LAUNCHER, str(memory), *map(str, argv)],
        start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options,
    )
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(child.pid)
        out, err = child.communicate()
        return Bounded(True, None, out, err, time.monotonic() - start)
    return Bounded(False, child.returncode, out, err, time.monotonic() - start)


def _children():
    """{ppid: [pid, ...]} of every process, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    return children


def _kill_tree(pid):
    """SIGKILL ``pid`` and every descendant. Not the process group alone: ansible's workers call
    setsid(), so a killpg would leave them (and a hung module) running. The tree is stopped first,
    so that nothing forks or is reparented while it is collected."""
    seen = set()
    for _ in range(3):
        children, todo = _children(), [pid]
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                try:
                    os.kill(current, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
            todo.extend(children.get(current, []))
    for current in seen:
        try:
            os.kill(current, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_bounded(code, memory=MEMORY, timeout=TIMEOUT, args=()):
    """Run ``code`` (``sys.argv[1:]`` = ``args``; the collection and tests/helpers importable).

    The code should ``print(json.dumps(...))`` its result as its last line.
    """
    return run_command_bounded([sys.executable, "-c", _PRELUDE + code, *map(str, args)], memory, timeout)
