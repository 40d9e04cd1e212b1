"""The profile_info module on hostile profiles: each is a failed task with a stable code, never a traceback."""

import json
import os
import sys
import textwrap

import pytest
from helpers import bounded
from helpers.modules import run_module

BOMB = "a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")
)
GOOD = {
    "source": "sim-a", "requester": "sim-b", "source_kind": "cpu", "requester_kind": "cpu", "transport": "rdma",
    "mode": "installed-host", "operation": "read", "rdma_events": False, "parents": 1, "payload": 4096,
    "block": 4096, "num_lanes": 1, "mask": 1,
}

PLAYBOOK = """
- name: profile_info on hostile input
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Each file
      orbite.qualification.profile_info:
        path: "{{{{ item }}}}"
      loop: {files}
      register: results
      ignore_errors: true

    - name: Results
      ansible.builtin.copy:
        dest: "{out}/results.json"
        content: "{{{{ results.results | to_json }}}}"
        mode: "0600"
"""


@pytest.mark.slow
def test_hostile_profiles_fail_with_codes(tmp_path, ansible_env, repo_root):
    cases = {
        "bomb.yml": (BOMB, "profile.yaml_alias"),
        "twice.json": (json.dumps(GOOD)[:-1] + ', "mode": "installed-restart"}', "profile.duplicate_key"),
        "deep.json": ('{"mode": ' + "[" * 1000 + "]" * 1000 + "}", "profile.nesting"),
        "host.json": (json.dumps(dict(GOOD, requester="sim-b\n" + "x" * 10_000)), "profile.invalid"),
        "fifo.json": (None, "profile.invalid"),
    }
    files = []
    for name, (text, _code) in cases.items():
        path = tmp_path / name
        if text is None:
            os.mkfifo(path)
        else:
            path.write_text(text)
        files.append(str(path))
    playbook = tmp_path / "play.yml"
    playbook.write_text(textwrap.dedent(PLAYBOOK).format(files=json.dumps(files), out=tmp_path))
    # Bounded: on a loader without limits the bomb takes GiBs and the FIFO hangs forever.
    run = bounded.run_command_bounded(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)],
        memory=2 << 30, timeout=180, env=ansible_env, cwd=repo_root,
    )
    assert not run.hung and run.returncode == 0, run.explain()
    results = json.loads((tmp_path / "results.json").read_text())
    by_name = {os.path.basename(r["item"]): r for r in results}
    for name, (_text, code) in cases.items():
        result = by_name[name]
        assert result["failed"] is True and "Traceback" not in json.dumps(result), result
        assert len(result["msg"]) < 1000, result["msg"][:300]
        violations = result.get("violations", [])
        assert code in (result["code"], *(v["code"] for v in violations)), result
    assert [v["code"] for v in by_name["host.json"]["violations"]] == ["requester.hostname"]
    assert by_name["fifo.json"]["violations"][0]["code"] == "profile.file"


def test_cases_are_validated_in_one_call_each_with_its_changes(tmp_path, repo_root):
    profiles = repo_root / "profiles"
    result = run_module("profile_info", tmp_path, {"cases": [
        {"id": "ra-write-events", "path": str(profiles / "rail_accounting.json"),
         "changes": {"operation": "write", "rdma_events": True}},
        {"id": "ih", "profile": GOOD, "changes": {"requester": "sim-c"}},
    ]})
    assert result.get("failed") is not True, result
    first, second = result["cases"]
    assert (first["profile"]["mode"], first["profile"]["operation"], first["workload"]["progress"]) == (
        "installed-rail-accounting", "write", "events")
    assert first["workload"]["wrs_per_round"] == 64
    assert (second["profile"]["mode"], second["profile"]["requester"]) == ("installed-host", "sim-c")


def test_every_broken_case_is_named_with_its_violations(tmp_path, repo_root):
    result = run_module("profile_info", tmp_path, {"cases": [
        {"id": "fine", "profile": GOOD},
        {"id": "few-parents", "path": str(repo_root / "profiles" / "rail_accounting.json"),
         "changes": {"parents": 15}},
        {"path": str(tmp_path / "absent.json")},  # no ID: named by its position
    ]})
    assert result["failed"] is True and result["code"] == "profile.invalid", result
    assert [(v["case"], v["code"]) for v in result["violations"]] == [
        ("few-parents", "rail-accounting.parents.value"), ("3", "profile.file")]
    assert result["msg"].startswith("invalid qualification profile: 2 violation(s) in case(s) few-parents, 3: ")
    assert "few-parents: parents = 15" in result["msg"] and "absent.json" in result["msg"]
    # A lone case without an ID reads as a single profile does.
    alone = run_module("profile_info", tmp_path, {"cases": [{"profile": dict(GOOD, parents=0)}]})
    assert alone["msg"].startswith("invalid qualification profile: 1 violation(s): parents = 0"), alone["msg"]
    assert "case" not in alone["violations"][0]
    # profile and path of one case, or cases beside profile: refused by the argument spec, not a traceback.
    both = run_module("profile_info", tmp_path, {"cases": [{"profile": GOOD, "path": "/x.json"}]})
    assert both["failed"] is True and "mutually exclusive" in both["msg"], both
    beside = run_module("profile_info", tmp_path, {"profile": GOOD, "cases": [{"profile": GOOD}]})
    assert beside["failed"] is True and "mutually exclusive" in beside["msg"], beside


def test_a_case_may_reverse_its_hosts_after_its_changes(tmp_path, repo_root):
    path = str(repo_root / "profiles" / "rail_accounting.json")
    result = run_module("profile_info", tmp_path, {"cases": [
        {"id": "ab", "path": path, "changes": {"source": "rnic-1", "requester": "rnic-2"}},
        {"id": "ba", "path": path, "changes": {"source": "rnic-1", "requester": "rnic-2"}, "reverse_hosts": True},
    ]})
    assert [(c["profile"]["source"], c["profile"]["requester"]) for c in result["cases"]] == [
        ("rnic-1", "rnic-2"), ("rnic-2", "rnic-1")], result
    assert result["cases"][0]["workload"] == result["cases"][1]["workload"]  # the workload names no host


def test_an_absurd_round_is_refused_in_the_preflight_naming_field_value_and_bound(tmp_path):
    # Issue 32: 32 parents of ~8 MiB with block 1 is 268 million WRs a round, inside every other bound.
    result = run_module("profile_info", tmp_path, {"profile": dict(GOOD, parents=32, payload=8380416, block=1)})
    assert result["failed"] is True and result["code"] == "profile.invalid", result
    assert [v["code"] for v in result["violations"]] == ["wrs.range"]
    assert "parents*ceil(payload/block) = '32*ceil(8380416/1)'" in result["msg"], result["msg"]
    assert "gives 268173312 payload WRs per round; the gate bound is 32768" in result["msg"]
    just_under = run_module("profile_info", tmp_path, {"profile": dict(GOOD, parents=32, payload=8380416, block=8192)})
    assert just_under.get("failed") is not True and just_under["workload"]["wrs_per_round"] == 32736, just_under

