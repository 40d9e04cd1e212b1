"""Concurrent cases (docs/qualification.md "Concurrent cases"): on 4-RNIC hosts, playbooks/qualification.yml runs
the cases of one slot side by side, each on its own lane's two RNICs, each with its own supervisor, journal, receipts
and verdict row; the verdict is the same as the serial switch's, case by case and finding by finding; bad input
(the switch, a host's rails) is refused by name before any host is touched."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import gate

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
# Rail accounting (with its hosts reversed, and with discovery: auto whitelisting exactly the locked RNICs of a
# four-RNIC host) and restart: three slots of two in lanes.
CASES = ["ra-read-polling", "ra-write-events", "rd-read-polling", "rd-write-events", "rs-source-g2-read-polling",
         "rs-requester-g2-write-events"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo_root, ansible_env):
    yield from gate.sim_lab(tmp_path_factory, repo_root, ansible_env, rnics=4)


def _journals(run_dir, case):
    return {role: [json.loads(line) for line in (run_dir / "cases" / case / role / "journal.jsonl").open()]
            for role in ("source", "requester")}


def _span(events):
    times = {e["ev"]: e["t"] for e in events}
    return times["journal_open"], times["journal_close"]


def _findings(verdict):
    return {(c["case"], f["code"], f["status"]) for c in verdict["cases"] for f in c["findings"]}


def _run(repo_root, ansible_env, lab, runs, schedule):
    result = gate.run_gate(repo_root, ansible_env, lab, runs, "qualification.yml",
                           {"orbite_case_only": ",".join(CASES), "orbite_case_schedule": schedule},
                           inventory=lab / "inventory.yml", timeout=900)
    assert result.returncode == 0, result.stdout[-4000:]
    return gate.verdict(runs)


def test_lanes_run_side_by_side_on_disjoint_rnics_with_the_serial_verdict(repo_root, ansible_env, lab, tmp_path):
    lanes, lanes_dir = _run(repo_root, ansible_env, lab, tmp_path / "lanes", "lanes")
    serial, serial_dir = _run(repo_root, ansible_env, lab, tmp_path / "serial", " Serial ")  # survey text
    for verdict in (lanes, serial):
        assert verdict["verdict"] == "PASS" and verdict["complete"], verdict.get("summary")
        assert [c["case"] for c in verdict["cases"]] == CASES
    assert _findings(lanes) == _findings(serial)

    plan = json.loads((lanes_dir / "schedule.json").read_text())
    assert plan["mode"] == "lanes"
    assert [[e["id"] for e in slot] for slot in plan["slots"]] == [CASES[0:2], CASES[2:4], CASES[4:6]]
    serial_plan = json.loads((serial_dir / "schedule.json").read_text())
    assert serial_plan["mode"] == "serial"
    assert [[(e["id"], e["lane"]) for e in slot] for slot in serial_plan["slots"]] == [[(c, 0)] for c in CASES]
    for slot in plan["slots"]:
        first, second = (_journals(lanes_dir, e["id"]) for e in slot)
        for role in ("source", "requester"):
            # Each case's own supervisor, on its lane's RNICs, of the same machine.
            starts = [next(e for e in j[role] if e["ev"] == "supervisor_start") for j in (first, second)]
            assert starts[0]["run_id"] != starts[1]["run_id"]
            assert starts[0]["lock_dir"] == starts[1]["lock_dir"]
            assert not set(starts[0]["locks"]) & set(starts[1]["locks"]), starts
            (a0, a1), (b0, b1) = _span(first[role]), _span(second[role])
            assert a0 < b1 and b0 < a1, (slot, role)  # the two cases' supervisors overlap in time
    serial_spans = sorted(_span(_journals(serial_dir, c)["source"]) for c in CASES)
    assert all(a[1] <= b[0] for a, b in zip(serial_spans, serial_spans[1:]))  # serial: one case at a time
    assert gate.locks_free(lab)


INVENTORY = """\
localhost ansible_connection=local ansible_python_interpreter={python}
[sim]
sim-a ansible_connection=local orbite_service_address=127.0.0.11:7471 orbite_rails='{a}'
sim-b ansible_connection=local orbite_service_address=127.0.0.12:7471 orbite_rails='{b}'
"""


def _rails(devices):
    return json.dumps([{"device": d, "port": 1, "gid_index": 3} for d in devices])


@pytest.mark.parametrize("rails_b, extra, message", [
    (["mlx5_0", "mlx5_1", "mlx5_2"], {}, "host sim-b: orbite_rails="),
    (["mlx5_0", "mlx5_1", "mlx5_0", "mlx5_3"], {}, "device mlx5_0 is listed twice"),
    (["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"], {"orbite_case_schedule": "parallel"},
     "orbite_case_schedule='parallel': must be one of lanes, serial"),
])
def test_bad_schedule_input_is_refused_before_any_host_is_touched(repo_root, ansible_env, tmp_path, rails_b, extra,
                                                                 message):
    inventory = tmp_path / "hosts"
    inventory.write_text(INVENTORY.format(python=sys.executable, a=_rails(["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]),
                                          b=_rails(rails_b)))
    cmd = [str(BIN / "ansible-playbook"), "--check", "-i", str(inventory), "playbooks/qualification.yml",
           "-e", json.dumps(dict(extra, orbite_case_only="ra-read-polling"))]
    result = subprocess.run(cmd, cwd=repo_root, env=dict(ansible_env, ORBITE_WORK_DIR=str(tmp_path / "work")),
                            capture_output=True, text=True, timeout=600, check=False)
    out = " ".join(result.stdout.split())
    assert result.returncode != 0 and "check mode: preflight passed" not in out
    assert "schedule.invalid: " in out and message in out, out[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "work").exists()
