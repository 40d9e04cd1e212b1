"""The preflight role through ansible-playbook: valid profile, survey strings, bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

INVENTORY = """\
localhost ansible_connection=local ansible_python_interpreter={python}
node-a ansible_connection=local
node-b ansible_connection=local
"""


@pytest.fixture(scope="module")
def inventory(tmp_path_factory):
    path = tmp_path_factory.mktemp("inv") / "hosts"
    path.write_text(INVENTORY.format(python=sys.executable))
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


def test_profile_file_relative_to_cwd(repo_root, ansible_env, inventory, tmp_path):
    (tmp_path / "mine.json").write_text(json.dumps(_profile(repo_root, "installed_host.json")))
    env = dict(ansible_env, PWD=str(tmp_path))
    result = _run(repo_root, env, inventory, {"orbite_profile_file": "mine.json"}, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wrs_per_round: 96" in result.stdout


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
