"""Modes of what the gate leaves on the controller: run directory, plan, fetched receipts, verdict, sim lab.

They name hosts, devices and addresses, so they are private by default: 0700 directories and 0600
files (docs/security.md, "Inputs"). One playbook drives the real modules and role tasks on
localhost: run_plan, fetch_receipts (localhost as the node), result_check and the
sim_lab role (local kind).
"""

import os
import stat
import subprocess
import sys
import textwrap

import pytest

PLAYBOOK = """
- name: Controller outputs
  hosts: localhost
  gather_facts: false
  vars:
    run_dir: "{work}/runs/r1"
  tasks:
    - name: Plan the run
      orbite.qualification.run_plan:
        run_dir: "{{{{ run_dir }}}}"
        run_id: r1
        cases:
          - id: c1
            profile: {{source: sim-a, requester: sim-b, mode: installed-host}}

    - name: Fetch a node's receipts (localhost plays the node), as the runner role does
      orbite.qualification.fetch_receipts:
        src: "{node}/source"
        dest: "{{{{ run_dir }}}}/cases/c1/source"

    - name: Verify (the run is incomplete, so a FAIL verdict, still written)
      orbite.qualification.result_check:
        run_dir: "{{{{ run_dir }}}}"
      ignore_errors: true

    - name: Create a local sim lab
      ansible.builtin.include_role:
        name: orbite.qualification.sim_lab
      vars:
        sim_lab_dir: "{work}/sim-lab"
        sim_lab_kind: local
        sim_lab_hosts: [sim-a]
"""


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.slow
def test_controller_outputs_are_private(tmp_path, ansible_env, repo_root):
    work, node = tmp_path / "work", tmp_path / "node"
    receipts = node / "source" / "g1"
    receipts.mkdir(parents=True)
    for name in ("ledger.json", "inventory-before.json", "ready.json", "runner.stdout"):
        (receipts / name).write_text("{}\n")
        (receipts / name).chmod(0o644)
    playbook = tmp_path / "play.yml"
    playbook.write_text(textwrap.dedent(PLAYBOOK).format(work=work, node=node))
    run = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)],
        env=dict(ansible_env, ORBITE_WORK_DIR=str(work)), cwd=repo_root, capture_output=True, text=True,
        check=False, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    run_dir = work / "runs" / "r1"
    fetched = run_dir / "cases" / "c1" / "source" / "g1" / "inventory-before.json"
    assert fetched.read_text() == "{}\n"
    verdicts = [run_dir / f"verdict.{ext}" for ext in ("json", "xml", "md")]
    assert all(v.exists() for v in verdicts)
    loose = []
    for base, dirs, files in os.walk(work / "runs"):
        loose += [(os.path.join(base, d), oct(_mode(os.path.join(base, d)))) for d in dirs
                  if _mode(os.path.join(base, d)) != 0o700]
        loose += [(os.path.join(base, f), oct(_mode(os.path.join(base, f)))) for f in files
                  if _mode(os.path.join(base, f)) != 0o600]
    assert loose == [], "not private: " + ", ".join(f"{p} {m}" for p, m in loose)
    assert _mode(work) == _mode(work / "runs") == _mode(run_dir) == 0o700  # made by run_plan
    assert _mode(work / "sim-lab") == 0o700
