"""The gate from the built tarball, installed read-only, as a user or an execution environment gets it.

`scripts/installed-collection.sh` builds and installs the collection into a temporary collections
path, which is then made read-only (chmod, and for root a read-only bind mount in a private mount
namespace, since root ignores file modes). From an empty directory, with no ansible.cfg and a fresh
HOME, `ansible-playbook orbite.qualification.sim_lab` and `ansible-playbook -i <installed>/inventories/sim
orbite.qualification.rail_accounting` must reach a PASS verdict with everything under the default
work directory ~/.cache/orbite; the AWX wrapper example (docs/examples/awx) runs its preflight in
check mode with a profile relative to its project. As root, all of it runs in a network namespace
of its own, so the lab's fixed loopback addresses cannot meet another test's lab.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow

# Runs the scenario with the collections path bind-mounted read-only over itself (private mount
# namespace) and a fresh network namespace; refuses to go on if root can still write there.
READ_ONLY = """set -eu
ip link set lo up
mount --bind "$1" "$1"
mount -o remount,bind,ro "$1"
if touch "$1/.write-probe" 2>/dev/null; then echo "the collections path is still writable" >&2; exit 97; fi
shift
exec "$@"
"""

SCENARIO = """set -u
cd "$CWD"
ansible-playbook orbite.qualification.sim_lab >"$LOGS/sim_lab.log" 2>&1 || exit 11
ansible-playbook -i "$COLL/inventories/sim" orbite.qualification.rail_accounting -e orbite_run_id=installed \
  >"$LOGS/gate.log" 2>&1 || exit 12
ansible-playbook --check -i "$COLL/inventories/sim" "$PROJECT/rail_accounting.yml" \
  -e '{"orbite_profile_file": "lab/discovery.json", "orbite_source": "", "orbite_lease": "60"}' \
  >"$LOGS/awx_check.log" 2>&1 || exit 13
ansible-playbook orbite.qualification.sim_lab -e sim_lab_state=absent >"$LOGS/destroy.log" 2>&1 || exit 14
"""
STEPS = {11: "sim_lab.log", 12: "gate.log", 13: "awx_check.log", 14: "destroy.log"}


def _tree(root):
    """Every entry under root with what a write would change (mode, size, mtime)."""
    found = {}
    for path in [root, *root.rglob("*")]:
        stat = path.lstat()
        found[str(path.relative_to(root))] = (stat.st_mode, stat.st_size, stat.st_mtime_ns)
    return found


def _can_isolate():
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return False
    probe = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, check=False)
    return probe.returncode == 0


def test_installed_read_only_collection_runs_the_gate_into_the_work_dir(repo_root, tmp_path):
    built = subprocess.run(["bash", str(repo_root / "scripts" / "installed-collection.sh"), str(tmp_path / "inst")],
                           env=dict(os.environ, ANSIBLE_GALAXY=str(BIN / "ansible-galaxy")),
                           capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stdout + built.stderr
    collections = tmp_path / "inst" / "collections"
    coll = Path(built.stdout.split()[-1])
    assert coll == collections / "ansible_collections" / "orbite" / "qualification" and coll.is_dir()

    # The AWX project: the example wrapper and a profile of its own, by a path relative to it.
    project = tmp_path / "project"
    shutil.copytree(repo_root / "docs" / "examples" / "awx", project)
    (project / "lab").mkdir()
    shutil.copy(repo_root / "profiles" / "rail_accounting_discovery.json", project / "lab" / "discovery.json")

    home, cwd, logs = tmp_path / "home", tmp_path / "cwd", tmp_path / "logs"
    for directory in (home, cwd, logs):
        directory.mkdir()
    # Nothing from the checkout or the caller: no ansible.cfg, no work-dir variables, a fresh HOME.
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("ANSIBLE_", "ORBITE_", "XDG_", "MOLECULE_"))}
    env.update(HOME=str(home), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
               ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_NOCOLOR="1", CWD=str(cwd), LOGS=str(logs),
               COLL=str(coll), PROJECT=str(project))

    before = _tree(collections)
    subprocess.run(["chmod", "-R", "a-w", str(collections)], check=True)
    command = ["bash", "-c", SCENARIO]
    # Root ignores file modes: a read-only mount makes it real. Other users are held by chmod alone.
    if _can_isolate():
        command = ["unshare", "--net", "--mount", "--propagation", "private",
                   "bash", "-c", READ_ONLY, "read-only", str(collections), *command]
    try:
        ran = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=False)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(collections)], check=False)  # so tmp_path can be removed
    if ran.returncode in STEPS:
        log = (logs / STEPS[ran.returncode]).read_text()
        pytest.fail(f"{STEPS[ran.returncode]} failed:\n{log[-6000:]}")
    assert ran.returncode == 0, ran.stdout + ran.stderr

    # Everything went to the default work directory of the (fresh) controller user.
    work = home / ".cache" / "orbite"
    sim_lab_log = " ".join((logs / "sim_lab.log").read_text().split())
    assert f"local lab {work}/sim-lab: sim-a, sim-b reached through -i {coll}/inventories/sim" in sim_lab_log
    verdict = json.loads((work / "runs" / "installed" / "verdict.json").read_text())
    assert verdict["verdict"] == "PASS" and verdict["complete"], verdict.get("failed_codes")
    assert [case["case"] for case in verdict["cases"]] == ["read-polling", "write-events"]
    written = {p.name for p in (work / "runs" / "installed").iterdir()}
    assert {"verdict.md", "verdict.xml", "verdict.html", "run.json", "cases"} <= written

    # The wrapper took the project's profile (discovery: auto) and stopped after the preflight.
    awx = " ".join((logs / "awx_check.log").read_text().split())
    assert "check mode: preflight passed (profile valid, 2 case(s) planned: read-polling, write-events" in awx
    # Check mode wrote no run; the runs index (docs/reports.md) names the one run.
    assert sorted(p.name for p in (work / "runs").iterdir()) == ["index.html", "index.json", "index.lock", "installed"]
    assert [run["run_id"] for run in json.loads((work / "runs" / "index.json").read_text())["runs"]] == ["installed"]

    # Nothing written into the collection, the directory the commands ran in, or elsewhere in HOME
    # (~/.ansible is ansible-core's own local temp).
    assert _tree(collections) == before
    assert list(cwd.iterdir()) == []
    assert sorted(p.name for p in home.iterdir()) <= [".ansible", ".cache"]
    assert [p.name for p in (home / ".cache").iterdir()] == ["orbite"]
    # The lab was destroyed, the verdict stays, and so does the lean node steps' payload (docs/node-steps.md): private.
    assert sorted(p.name for p in work.iterdir()) == ["cache", "runs"]
    assert oct((work / "cache").stat().st_mode & 0o777) == "0o700"
    (kept,) = (work / "cache").iterdir()  # this installation's own
    assert oct(kept.stat().st_mode & 0o777) == "0o700" and (kept / "node-steps.json").is_file()
