"""The preflight through ansible-playbook: valid profile, survey strings, bad input, where profile files
are found, and --check on the gate playbooks (preflight, then stop)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

# A node's host vars the run plan reads (docs/inventory.md): its two rails and (a source's) service address.
RAILS = '[{"device": "mlx5_0", "port": 1, "gid_index": 3}, {"device": "mlx5_1", "port": 1, "gid_index": 3}]'
INVENTORY = """\
localhost ansible_connection=local ansible_python_interpreter={python}
node-a ansible_connection=local orbite_rails='{rails}' orbite_service_address=127.0.0.11:7471
node-b ansible_connection=local orbite_rails='{rails}' orbite_service_address=127.0.0.12:7471
"""


@pytest.fixture(scope="module")
def inventory(tmp_path_factory):
    path = tmp_path_factory.mktemp("inv") / "hosts"
    path.write_text(INVENTORY.format(python=sys.executable, rails=RAILS))
    return path


def _profile(repo_root, name="rail_accounting.json", **changes):
    profile = json.loads((repo_root / "profiles" / name).read_text())
    profile.update(source="node-a", requester="node-b")
    profile.update(changes)
    return profile


def _run(repo_root, ansible_env, inventory, extra, cwd=None):
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
           str(repo_root / "playbooks" / "preflight.yml"), "-e", json.dumps(extra)]
    return subprocess.run(cmd, cwd=cwd or repo_root, env=ansible_env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_valid_profile_prints_the_workload(repo_root, ansible_env, inventory):
    result = _run(repo_root, ansible_env, inventory, {"orbite_profile": _profile(repo_root)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wrs_per_round: 64" in result.stdout
    assert "bytes_per_round: 67108880" in result.stdout


def test_survey_strings_and_json_text(repo_root, ansible_env, inventory):
    survey = {k: (json.dumps(v) if not isinstance(v, str) else v) for k, v in _profile(repo_root).items()}
    result = _run(repo_root, ansible_env, inventory, {"orbite_profile": json.dumps(survey)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wrs_per_round: 64" in result.stdout


# What an AWX project holds (docs/examples/awx): a wrapper that records its own directory, since
# playbook_dir inside an imported collection playbook is the collection's.
WRAPPER = """\
- name: Take relative profile paths from this project
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Record the project directory
      ansible.builtin.set_fact:
        orbite_project_dir: "{{ playbook_dir }}"

- name: Preflight
  ansible.builtin.import_playbook: orbite.qualification.preflight
"""


def test_relative_profile_file_comes_from_the_project_never_the_cwd(repo_root, ansible_env, inventory, tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "gate.yml").write_text(WRAPPER)
    (project / "mine.json").write_text(json.dumps(_profile(repo_root, "installed_host.json")))
    (elsewhere / "mine.json").write_text(json.dumps(_profile(repo_root)))  # a decoy in the cwd
    env = dict(ansible_env, PWD=str(elsewhere))
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(project / "gate.yml"),
           "-e", json.dumps({"orbite_profile_file": "mine.json"})]
    result = subprocess.run(cmd, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wrs_per_round: 96" in result.stdout  # the project's installed-host profile, not the decoy

    # Without the wrapper the base is the playbook's directory: the cwd's file is never taken.
    result = _run(repo_root, env, inventory, {"orbite_profile_file": "mine.json"}, cwd=elsewhere)
    assert result.returncode != 0
    message = result.stdout[result.stdout.index('orbite_profile_file="mine.json": no such file'):]
    assert f"{repo_root / 'playbooks' / 'mine.json'}, {repo_root / 'profiles' / 'mine.json'}" in message
    assert str(elsewhere) not in message.split(" A relative path")[0]
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(("given", "wrs"), [("rail_accounting_discovery.json", 64),
                                            ("profiles/installed_host.json", 96)])
def test_shipped_profile_by_name(repo_root, ansible_env, inventory, tmp_path, given, wrs):
    # Survey answers: strings, the unanswered ones empty.
    result = _run(repo_root, ansible_env, inventory,
                  {"orbite_profile_file": given, "orbite_profile": "", "orbite_source": "node-a",
                   "orbite_requester": "node-b"}, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"wrs_per_round: {wrs}" in result.stdout


def test_missing_or_bad_profile_file_names_the_variable(repo_root, ansible_env, inventory, tmp_path):
    missing = tmp_path / "absent.json"
    result = _run(repo_root, ansible_env, inventory, {"orbite_profile_file": str(missing)})
    assert result.returncode != 0
    assert f'orbite_profile_file="{missing}": no such file (looked for {missing})' in result.stdout
    result = _run(repo_root, ansible_env, inventory, {"orbite_profile_file": str(tmp_path)})  # a directory
    assert result.returncode != 0 and "no such file" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_bad_profile_names_every_rule_and_stops(repo_root, ansible_env, inventory):
    result = _run(repo_root, ansible_env, inventory,
                  {"orbite_profile": _profile(repo_root, parents=15, mask=1)})
    assert result.returncode != 0
    out = result.stdout
    assert "2 violation(s)" in out
    assert "rail-accounting.parents.value" in out and "rail-accounting.mask.value" in out
    assert "Traceback" not in out + result.stderr
    assert "Check that the inventory" not in out  # stopped at validation


def test_host_missing_from_inventory(repo_root, ansible_env, inventory):
    result = _run(repo_root, ansible_env, inventory, {"orbite_profile": _profile(repo_root, requester="ghost")})
    assert result.returncode != 0
    assert 'requester="ghost": must name a host of the inventory' in result.stdout


def test_neither_or_both_profile_sources(repo_root, ansible_env, inventory):
    result = _run(repo_root, ansible_env, inventory, {})
    assert result.returncode != 0 and "got neither" in result.stdout
    result = _run(repo_root, ansible_env, inventory,
                  {"orbite_profile": _profile(repo_root), "orbite_profile_file": "x.json"})
    assert result.returncode != 0 and "got both" in result.stdout


def _gate_check(repo_root, ansible_env, inventory, playbook, extra, work):
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "--check", "-i", str(inventory),
           str(repo_root / "playbooks" / playbook), "-e", json.dumps(extra)]
    return subprocess.run(cmd, cwd=work.parent, env=dict(ansible_env, ORBITE_WORK_DIR=str(work)),
                          capture_output=True, text=True, timeout=120, check=False)


def _recap_hosts(stdout):
    recap = stdout[stdout.index("PLAY RECAP"):]
    return {line.split()[0] for line in recap.splitlines()[1:] if ":" in line}


# Survey answers as AWX sends them: strings, an unanswered question as "".
SURVEY = {"orbite_source": "node-a", "orbite_requester": "node-b", "orbite_output_dir": "", "orbite_profile": "",
          "orbite_lease": "60", "orbite_result_check_fail": "true"}


@pytest.mark.parametrize(("playbook", "cases"), [
    ("rail_accounting.yml", "2 case(s) planned: read-polling, write-events"),
    ("installed_host.yml", "1 case(s) planned: read-polling"),
])
def test_check_mode_runs_the_preflight_then_stops(repo_root, ansible_env, inventory, tmp_path, playbook, cases):
    work = tmp_path / "work"
    result = _gate_check(repo_root, ansible_env, inventory, playbook, SURVEY, work)
    assert result.returncode == 0, result.stdout + result.stderr
    out = " ".join(result.stdout.split())  # the message is wrapped by the yaml callback
    assert "check mode: preflight passed (profile valid, " + cases in out
    assert "no host was touched and no run directory was written" in out
    assert "TASK [Run one case]" not in result.stdout and "TASK [Verify]" not in result.stdout
    assert _recap_hosts(result.stdout) == {"localhost"}  # node-a and node-b never contacted
    assert not work.exists()


@pytest.mark.parametrize(("only", "planned"), [
    ("write-events", "1 case(s) planned: write-events"),  # a survey's text
    (["read-polling", "write-events"], "2 case(s) planned: read-polling, write-events"),
    ("", "2 case(s) planned: read-polling, write-events"),  # unanswered: every case
])
def test_case_only_plans_a_subset_of_the_playbooks_cases(repo_root, ansible_env, inventory, tmp_path, only, planned):
    result = _gate_check(repo_root, ansible_env, inventory, "rail_accounting.yml",
                         dict(SURVEY, orbite_case_only=only), tmp_path / "work")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "check mode: preflight passed (profile valid, " + planned in " ".join(result.stdout.split())


def test_case_only_naming_no_case_of_the_playbook_fails_naming_them(repo_root, ansible_env, inventory, tmp_path):
    result = _gate_check(repo_root, ansible_env, inventory, "rail_accounting.yml",
                         dict(SURVEY, orbite_case_only="write-events, read-events"), tmp_path / "work")
    out = " ".join(result.stdout.split())
    assert result.returncode != 0 and "check mode: preflight passed" not in out
    assert ('orbite_case_only=["write-events", "read-events"]: read-events is not a case of this playbook (its '
            "cases: read-polling, write-events)") in out, out[-3000:]


def test_a_survey_lease_that_is_not_a_number_fails_the_preflight_naming_it(repo_root, ansible_env, inventory,
                                                                            tmp_path):
    # Never cast to 0.0 (| float) and refused on the nodes: the preflight names the variable and the value.
    result = _gate_check(repo_root, ansible_env, inventory, "rail_accounting.yml",
                         dict(SURVEY, orbite_lease="abc", orbite_runner_defects="corrupt_byte,extra_qp"),
                         tmp_path / "work")
    out = " ".join(result.stdout.split())
    assert result.returncode != 0 and "check mode: preflight passed" not in out
    assert "orbite_lease='abc': must be a number of seconds in (0, 604800]" in out, out[-3000:]
    assert _recap_hosts(result.stdout) == {"localhost"}


def test_check_mode_with_a_bad_profile_stops_at_validation(repo_root, ansible_env, inventory, tmp_path):
    result = _gate_check(repo_root, ansible_env, inventory, "installed_host.yml",
                         {"orbite_profile": _profile(repo_root, "installed_host.json", num_lanes="x")}, tmp_path / "w")
    assert result.returncode != 0
    assert "num_lanes" in result.stdout and "check mode: preflight passed" not in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_preflight_playbook_in_check_mode(repo_root, ansible_env, inventory):
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "--check", "-i", str(inventory),
           str(repo_root / "playbooks" / "preflight.yml"), "-e", json.dumps({"orbite_profile": _profile(repo_root)})]
    result = subprocess.run(cmd, cwd=repo_root, env=ansible_env, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wrs_per_round: 64" in result.stdout
    assert "check mode: preflight passed (2 case(s) planned)" not in result.stdout  # one case: the profile
    assert "check mode: preflight passed (1 case(s) planned); no host was touched" in result.stdout


@pytest.mark.parametrize(("extra", "message"), [
    ({"orbite_run_id": "../escape"}, "run_id='../escape': must be 1..64 ASCII letters"),
    ({"orbite_work_dir": "relative/work"}, 'orbite_work_dir="relative/work": must be an absolute path'),
    ({"orbite_work_dir": ""}, 'orbite_work_dir="": must be an absolute path'),
    ({"orbite_output_dir": "{repo}/out/runs"}, "must be an absolute path outside the collection {repo}"),
])
def test_run_directory_is_a_name_under_the_work_dir_outside_the_collection(repo_root, ansible_env, inventory,
                                                                           tmp_path, extra, message):
    extra = {k: v.format(repo=repo_root) for k, v in extra.items()}
    result = _gate_check(repo_root, ansible_env, inventory, "rail_accounting.yml", dict(SURVEY, **extra),
                         tmp_path / "w")
    assert result.returncode != 0
    assert message.format(repo=repo_root) in " ".join(result.stdout.split()), result.stdout
    assert not (repo_root / "out" / "runs" / "ra").exists()
    assert "Traceback" not in result.stdout + result.stderr


def test_a_failed_preflight_still_publishes_a_fail_artifact(repo_root, ansible_env, inventory, tmp_path):
    """AWX reads set_stats: a bad profile stops the gate before any case, and the artifact says FAIL."""
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
           str(repo_root / "playbooks" / "installed_host.yml"), "-e",
           json.dumps({"orbite_profile": _profile(repo_root, "installed_host.json", num_lanes="x")})]
    env = dict(ansible_env, ORBITE_WORK_DIR=str(tmp_path / "w"), ANSIBLE_SHOW_CUSTOM_STATS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode != 0
    stats = json.loads(result.stdout[result.stdout.index("CUSTOM STATS"):].split(":", 2)[2].strip().split("\n")[0])
    assert stats["orbite_verdict"] == "FAIL" and stats["orbite_verdict_failed_codes"] == ["preflight.failed"]
    assert "num_lanes" in stats["orbite_verdict_error"]
    assert "preflight failed, nothing was run" in result.stdout
    assert _recap_hosts(result.stdout[: result.stdout.index("CUSTOM STATS")]) == {"localhost"}


def test_a_case_variants_defect_switches_are_checked_by_name_before_any_node(repo_root, ansible_env, inventory,
                                                                               tmp_path):
    """A defect-matrix variant's switches (docs/reports.md): another mode's switch and an unknown one each stop the
    preflight naming the case, the field, the value and the rule, by the runner's own table (--defect-table);
    no plan is written and no node is contacted (the inventory's nodes do not exist)."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    variants = [{"id": "c1", "defects": ["fabricate_cqe", "retry_destroy", "no_such_switch"], "changes": {}}]
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
           str(repo_root / "playbooks" / "lost_completion.yml"), "-e", json.dumps({
               "orbite_case_variants": variants, "orbite_source": "node-a", "orbite_requester": "node-b",
               "orbite_sim_native_manifest": str(manifest), "orbite_output_dir": str(tmp_path / "runs"),
               "orbite_run_id": "bad-switch"})]
    result = subprocess.run(cmd, cwd=repo_root, env=ansible_env, capture_output=True, text=True, timeout=120,
                            check=False)
    out = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0, out
    assert ('case c1: defects[1]="retry_destroy": is a switch of installed-cleanup-failure, not of '
            'installed-lost-completion') in out
    assert 'case c1: defects[2]="no_such_switch": is not a defect switch of the simulated runner' in out
    assert 'defects[0]="fabricate_cqe"' not in out
    assert "preflight failed, nothing was run" in out
    assert not (tmp_path / "runs" / "bad-switch" / "run.json").exists()
