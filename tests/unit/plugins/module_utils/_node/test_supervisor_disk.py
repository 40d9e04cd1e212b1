"""The supervisor journal on a full disk: whole lines only, clean error answers, locks still released.

On main a full disk left a half-written journal line, and the supervisor died on the write error
(the stop got no answer). Here the run directory is a small tmpfs mounted in a private mount
namespace (``unshare -m``, root only); the scenario runs in a child process inside it and reports
what it saw as JSON.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers.node_root import make_root
from helpers.paths import COLLECTIONS

SCENARIO = r"""
import errno, json, os, sys, time
from ansible_collections.orbite.qualification.plugins.module_utils._node import locks as rnic_lock
from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (
    SupervisorClient, SupervisorError, SupervisorRequestError, start_supervisor)

mount, root = sys.argv[1], sys.argv[2]
run_dir = os.path.join(mount, "run-1")
lock_dir = os.path.join(root, "run", "orbite", "locks")
seen = {}
ready = start_supervisor(run_dir, "run-1", ["mlx5_0"], lock_dir, root=root, lease=60, lock_timeout=2)
seen["pid"] = ready["pid"]
client = SupervisorClient(run_dir)
child = client.launch([sys.executable, "-c", "import time; time.sleep(60)"])
seen["child_pid"] = child["pid"]
filler = os.open(os.path.join(mount, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)  # fill the disk
try:
    while os.write(filler, b"\0" * 4096):
        pass
except OSError as exc:
    seen["fill_errno"] = exc.errno
os.close(filler)
renewals, seen["renew_errors"] = 0, []
while True:  # the journal's last page still has room for a few lines: renew until an event does not fit
    try:
        client.renew()
    except SupervisorRequestError as exc:
        # os_error: renewed and journaled, but lease.json could not be rewritten (also a clean answer)
        seen["renew_errors"].append(exc.code)
        if exc.code != "supervisor.os_error":
            seen["renew_error"] = [exc.code, str(exc)]
            break
    renewals += 1
    if renewals > 300:
        seen["renew_error"] = None
        break
seen["renewals"] = renewals
try:
    client.launch([sys.executable, "-c", "import time; time.sleep(60)"])
    seen["launch_error"] = None
except SupervisorRequestError as exc:
    seen["launch_error"] = [exc.code, str(exc)]
seen["status_journal_error"] = client.status()["journal_error"]
try:
    client.stop(force=True, timeout=30, escalate=False)
    seen["stop"] = ["ok"]
except SupervisorRequestError as exc:
    seen["stop"] = [exc.code, exc.response.get("locks_released"), exc.response.get("children_killed")]
except SupervisorError as exc:
    seen["stop"] = ["no answer", str(exc)]
deadline = time.monotonic() + 10
while os.path.exists("/proc/%d" % seen["pid"]) and time.monotonic() < deadline:
    time.sleep(0.02)
seen["lock_free"] = rnic_lock.probe(lock_dir, "mlx5_0")
with open(os.path.join(run_dir, "journal.jsonl"), "rb") as handle:
    raw = handle.read()
seen["ends_with_newline"] = raw.endswith(b"\n")
lines = raw.split(b"\n")[:-1]
parsed = []
for line in lines:
    try:
        parsed.append(json.loads(line))
    except ValueError:
        parsed.append({"ev": "UNPARSABLE", "raw": line[:80].decode("utf-8", "replace")})
seen["events"] = [e["ev"] for e in parsed]
seen["seqs"] = [e.get("seq") for e in parsed]
print(json.dumps(seen))
"""


def _kill_all_under(path):
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as handle:
                    if path.encode() in handle.read():
                        os.kill(int(name), 9)
            except OSError:
                continue


@pytest.mark.root
def test_full_disk_gives_whole_lines_and_clean_error_answers(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private tmpfs")
    root = tmp_path / "root"
    make_root(root)
    mount = tmp_path / "small"
    mount.mkdir()
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO)
    env = dict(os.environ, PYTHONPATH=str(COLLECTIONS))
    # 512 KiB: the copied supervisor program (about 150 KiB) must fit before the disk is filled.
    command = (f"mount -t tmpfs -o size=512k,mode=0700 orbite-test {mount} && "
               f"exec {sys.executable} {script} {mount} {root}")
    try:
        run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", command], env=env,
                             capture_output=True, text=True, timeout=180, check=False)
    finally:
        _kill_all_under(str(root))
    if run.returncode != 0 and "mount" in run.stderr and "permission" in run.stderr.lower():
        pytest.skip(f"cannot mount a tmpfs here: {run.stderr.strip()}")
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["fill_errno"] == 28  # ENOSPC: the disk really was full
    assert seen["renew_error"] is not None and seen["renew_error"][0] == "supervisor.journal_error", seen
    assert "could not be written" in seen["renew_error"][1]
    assert set(seen["renew_errors"]) <= {"supervisor.os_error", "supervisor.journal_error"}
    assert seen["launch_error"] is not None and seen["launch_error"][0] == "supervisor.journal_error", seen
    assert seen["status_journal_error"]
    # stop answered (an error that says the journal is incomplete), killed the child, released the lock
    assert seen["stop"][0] == "supervisor.journal_error" and seen["stop"][1] is True, seen
    assert seen["lock_free"] is True
    # every line whole: no half line, no gap in seq
    assert seen["ends_with_newline"] and "UNPARSABLE" not in seen["events"], seen["events"]
    assert seen["seqs"] == list(range(len(seen["seqs"]))), seen["seqs"]
    assert seen["events"][:1] == ["journal_open"] and "lease_renew" in seen["events"]
