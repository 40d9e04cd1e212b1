"""playbooks/qualification.yml, the whole gate in one run (docs/qualification.md): in check mode it plans every
case of every mode playbook, each with the profile and workload that playbook plans it with (the witness: each
mode playbook run as a user runs it), under its mode's run prefix; a profile given to it, or cases on two
pairs of hosts, are refused by name; on the simulated lab two cases of two modes run into one verdict."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import gate

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
# A node's host vars the run plan reads (docs/inventory.md): its two rails and (a source's) service address.
RAILS = '[{"device": "mlx5_0", "port": 1, "gid_index": 3}, {"device": "mlx5_1", "port": 1, "gid_index": 3}]'
INVENTORY = """\
localhost ansible_connection=local ansible_python_interpreter={python}
sim-a ansible_connection=local orbite_rails='{rails}' orbite_service_address=127.0.0.11:7471
sim-b ansible_connection=local orbite_rails='{rails}' orbite_service_address=127.0.0.12:7471
sim-c ansible_connection=local orbite_rails='{rails}' orbite_service_address=127.0.0.13:7471
"""
# Every mode playbook (one that imports _preflight.yml), in qualification.yml's order, with its run prefix there
# and what it is given (rail accounting again with the shipped discovery profile). A new mode playbook fails
# test_every_mode_playbook_is_planned until it is listed here and in qualification.yml.
MODES = [("ih", "installed_host", {}), ("ra", "rail_accounting", {}),
         ("rr", "rail_accounting", {"orbite_source": "sim-b", "orbite_requester": "sim-a"}),
         ("rd", "rail_accounting", {"orbite_profile_file": "rail_accounting_discovery.json"}),
         ("rs", "restart", {}), ("in", "interruption", {}), ("lc", "lost_completion", {}),
         ("cf", "cleanup_failure", {}), ("id", "inflight_dma", {}), ("mc", "memory_cleanup", {})]
NOT_GATES = {"qualification", "preflight", "fleet", "fleet_merge", "compare", "build", "sim_lab"}

DUMP = """
- name: Keep what the preflight planned ({name})
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Write the planned cases
      ansible.builtin.copy:
        dest: "{out}/{name}.json"
        content: "{{{{ orbite_cases | to_json }}}}"
        mode: "0600"
      check_mode: false
"""


def _inventory(tmp_path):
    path = tmp_path / "hosts"
    path.write_text(INVENTORY.format(python=sys.executable, rails=RAILS))
    return path


def _check(repo_root, ansible_env, tmp_path, playbook, extra=None):
    cmd = [str(BIN / "ansible-playbook"), "--check", "-i", str(_inventory(tmp_path)), str(playbook)]
    if extra:
        cmd += ["-e", json.dumps(extra)]
    return subprocess.run(cmd, cwd=tmp_path, env=dict(ansible_env, ORBITE_WORK_DIR=str(tmp_path / "work")),
                          capture_output=True, text=True, timeout=600, check=False)


def test_every_mode_playbook_is_planned(repo_root):
    gates = {p.stem for p in (repo_root / "playbooks").glob("[a-z]*.yml") if "_preflight.yml" in p.read_text()}
    assert gates - NOT_GATES == {name for _, name, _ in MODES}, "a mode playbook is missing from MODES"
    text = (repo_root / "playbooks" / "qualification.yml").read_text()
    planned = re.findall(r"^      - \{plan: (\w+)", text, re.MULTILINE)
    assert planned == [name for _, name, _ in MODES], planned


def test_check_mode_plans_every_case_of_every_mode_with_its_profile(repo_root, ansible_env, tmp_path):
    # One ansible-playbook: each mode playbook as a user runs it, then qualification.yml, each followed by a play
    # that keeps its planned cases.
    out = tmp_path / "planned"
    out.mkdir()
    plays = []
    for prefix, name, extra in MODES:
        plays.append(f"- ansible.builtin.import_playbook: orbite.qualification.{name}\n  vars: {json.dumps(extra)}\n")
        plays.append(DUMP.format(name=prefix, out=out))
    plays.append("- ansible.builtin.import_playbook: orbite.qualification.qualification\n")
    plays.append(DUMP.format(name="qualification", out=out))
    wrapper = tmp_path / "all.yml"
    wrapper.write_text("---\n" + "".join(plays))
    result = _check(repo_root, ansible_env, tmp_path, wrapper)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert not (tmp_path / "work").exists()  # check mode: no run directory

    expected = []
    for prefix, name, _ in MODES:
        cases = json.loads((out / f"{prefix}.json").read_text())
        assert cases, name
        expected += [dict(case, id=f"{prefix}-{case['id']}") for case in cases]
    planned = json.loads((out / "qualification.json").read_text())
    assert [c["id"] for c in planned] == [c["id"] for c in expected]
    assert planned == expected  # the same profile and workload per case as its mode playbook plans it
    modes = {c["profile"]["mode"] for c in planned}
    assert modes == {"installed-host", "installed-rail-accounting", "installed-restart", "installed-interruption",
                     "installed-lost-completion", "installed-cleanup-failure", "installed-inflight-dma",
                     "installed-memory-cleanup"}  # the seed's eight profiles
    assert {c["id"] for c in planned if c["profile"].get("discovery") == "auto"} == {"rd-read-polling",
                                                                                      "rd-write-events"}
    assert len(planned) == 33
    reversed_ = {c["id"]: (c["profile"]["source"], c["profile"]["requester"]) for c in planned if c["id"][:3] == "rr-"}
    assert reversed_ == {"rr-read-polling": ("sim-b", "sim-a"), "rr-write-events": ("sim-b", "sim-a")}
    assert {(c["profile"]["source"], c["profile"]["requester"]) for c in planned if c["id"][:3] != "rr-"} == {
        ("sim-a", "sim-b")}
    out_text = " ".join(result.stdout.split())
    assert "preflight passed (profile valid, 33 case(s) planned: ih-read-polling, ra-read-polling" in out_text


def test_a_profile_given_to_the_whole_gate_is_refused_by_name(repo_root, ansible_env, tmp_path):
    result = _check(repo_root, ansible_env, tmp_path, repo_root / "playbooks" / "qualification.yml",
                    {"orbite_profile_file": "rail_accounting.json"})
    out = " ".join(result.stdout.split())
    assert result.returncode != 0 and "check mode: preflight passed" not in out
    assert ('orbite_profile_file="rail_accounting.json": not used by this playbook, whose cases each name their own '
            "profile file (ih-read-polling: installed_host.json, ra-read-polling: rail_accounting.json,") in out, out
    assert "Traceback" not in result.stdout + result.stderr


def test_cases_on_two_pairs_of_hosts_are_refused(repo_root, ansible_env, tmp_path):
    # One run is one pair (reversed or not): a variant on a third host is named, before any host is touched.
    variants = [{"id": "ab", "profile_file": "rail_accounting.json", "changes": {}},
                {"id": "ba", "profile_file": "rail_accounting.json", "changes": {}, "reverse_hosts": True},
                {"id": "ac", "profile_file": "restart_source.json", "changes": {"requester": "sim-c"}}]
    result = _check(repo_root, ansible_env, tmp_path, repo_root / "playbooks" / "qualification.yml",
                    {"orbite_case_variants": variants})
    out = " ".join(result.stdout.split())
    assert result.returncode != 0 and "check mode: preflight passed" not in out
    assert ('profile field source="sim-a, sim-b": must name a host of the inventory, and every case of the run the '
            "same two hosts (the run's cases use sim-a, sim-b, sim-c; hosts:") in out, out[-3000:]


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo_root, ansible_env):
    yield from gate.sim_lab(tmp_path_factory, repo_root, ansible_env)


def test_two_cases_of_two_modes_run_into_one_verdict(repo_root, ansible_env, lab, tmp_path):
    # The installed host on sim-a -> sim-b, then rail accounting with the hosts reversed, in one run.
    only = ["ih-read-polling", "rr-write-events"]
    result = gate.run_gate(repo_root, ansible_env, lab, tmp_path, "qualification.yml",
                           {"orbite_case_only": ", ".join(only)}, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:]
    verdict, run_dir = gate.verdict(tmp_path)
    assert run_dir.name.startswith("qual-")
    assert verdict["verdict"] == "PASS" and verdict["complete"], verdict.get("summary")
    assert [c["case"] for c in verdict["cases"]] == only
    plan = json.loads((run_dir / "run.json").read_text())
    assert [(c, plan["profiles"][c]["mode"]) for c in plan["cases"]] == [
        ("ih-read-polling", "installed-host"), ("rr-write-events", "installed-rail-accounting")]
    assert plan["hosts"] == {"ih-read-polling": {"source": "sim-a", "requester": "sim-b"},
                             "rr-write-events": {"source": "sim-b", "requester": "sim-a"}}
    statuses = {c["case"]: {f["code"]: f["status"] for f in c["findings"]} for c in verdict["cases"]}
    # Each case verified under its own mode: the rail rules apply to the rail-accounting case only.
    assert any(code.startswith("accounting.") and s == "PASS" for code, s in statuses["rr-write-events"].items())
    assert not any(code.startswith("accounting.") and s == "PASS" for code, s in statuses["ih-read-polling"].items())
    # Each case's receipts came from the host of its role: the supervisor journals name the host.
    for case, hosts in plan["hosts"].items():
        for role, host in hosts.items():
            journal = (run_dir / "cases" / case / role / "journal.jsonl").read_text()
            assert f'"hostname": "{host}"' in journal, (case, role, host)
    assert gate.locks_free(lab)
