"""The gate through ansible-playbook on a local simulated lab: the lab, a run, its verdict, and what it left held."""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def sim_lab(tmp_path_factory, repo_root, ansible_env, count=None, rnics=None):
    """Generator for a module fixture: a fresh lab from playbooks/sim_lab.yml, removed afterwards; ``count``
    hosts (sim_lab_count, with a generated inventory <lab>/inventory.yml) instead of inventories/sim's two;
    ``rnics`` RNICs a host (sim_lab_rnics: 4 also generates the inventory)."""
    lab_dir = tmp_path_factory.mktemp("lab") / "sim-lab"
    cmd = [str(BIN / "ansible-playbook"), "playbooks/sim_lab.yml", "-e", f"sim_lab_dir={lab_dir}"]
    if count is not None:
        cmd += ["-e", f"sim_lab_count={count}"]
    if rnics is not None:
        cmd += ["-e", f"sim_lab_rnics={rnics}"]
    subprocess.run(cmd, cwd=repo_root, env=ansible_env, check=True, capture_output=True, timeout=300)
    yield lab_dir
    subprocess.run([*cmd, "-e", "sim_lab_state=absent"], cwd=repo_root, env=ansible_env, check=False,
                   capture_output=True, timeout=300)


def run_gate(repo_root, ansible_env, lab, runs, playbook, extra, timeout=600, inventory="inventories/sim", **popen):
    """One playbook on the sim inventory (or ``inventory``); with Popen keywords it is started, not waited for
    (its output is discarded: nobody reads it, and an unread pipe would stall the play)."""
    cmd = [str(BIN / "ansible-playbook"), "-i", str(inventory), f"playbooks/{playbook}",
           "-e", f"sim_lab_dir={lab}", "-e", f"orbite_output_dir={runs}", "-e", json.dumps(extra)]
    if popen:
        return subprocess.Popen(cmd, cwd=repo_root, env=ansible_env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, **popen)
    return subprocess.run(cmd, cwd=repo_root, env=ansible_env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def verdict(runs):
    """(verdict.json, run directory) of the one run under `runs`."""
    (run_dir,) = [p for p in Path(runs).iterdir() if p.is_dir()]
    return json.loads((run_dir / "verdict.json").read_text()), run_dir


def locks_free(lab):
    """Every RNIC lock of both hosts can be taken at once (an independent flock probe)."""
    for lock in Path(lab).glob("*/run/orbite/locks/*.lock"):
        with open(lock) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(handle, fcntl.LOCK_UN)
    return True


def supervisor_pids(lab):
    """The pids of the lab's supervisors still alive, by their pid files."""
    pids = []
    for pid_file in Path(lab).glob("*/run/orbite/supervisors/*/supervisor.pid"):
        try:
            pid = int(pid_file.read_text().split()[0])
            os.kill(pid, 0)
            pids.append(pid)
        except (ValueError, IndexError, ProcessLookupError, FileNotFoundError):
            continue
    return pids


def process_alive(pid):
    """Whether ``pid`` is a running process: gone, or a zombie (exited, not yet reaped), is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def kill_when(proc, ready, seconds):
    """SIGKILL the gate's whole session once `ready()` holds; it must still be running then."""
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and proc.poll() is None:
            if ready():
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the gate finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def direct_pair_module(module):
    """A direct-pair test module (tests/unit/sim/<module>.py), loaded for its tables."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "unit" / "sim" / f"{module}.py"
    spec = importlib.util.spec_from_file_location(f"orbite_direct_pairs_{module}", path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def direct_pair_table(module, name="_DEFECT_CASES"):
    """The values of a direct-pair test module's switch table (``name``: pytest.param rows such as (switch, fault
    role, code)): the one source of each switch's expected code, which the gate's defect matrices run again end
    to end."""
    return [tuple(param.values) for param in getattr(direct_pair_module(module), name)]


def check_defect_matrix(verdict, run_dir, expected):
    """One run whose first cases each carry one switch (``expected``: case ID -> its switches and its codes): each case
    fails exactly its codes and run.diagnostic, and every code another case expects PASSes in it where it applies
    (or is SKIPped: masked by the failed one, docs/verifier.md "Masking")."""
    assert verdict["verdict"] == "FAIL" and verdict["complete"], verdict["failed_codes"]
    assert [c["case"] for c in verdict["cases"]][:len(expected)] == list(expected)
    plan = json.loads((Path(run_dir) / "run.json").read_text())
    assert plan["defects"] == [] and plan["case_defects"] == {c: list(s) for c, (s, _) in expected.items()}
    others = {code for _, codes in expected.values() for code in codes}
    for case in verdict["cases"][:len(expected)]:
        statuses = {f["code"]: f["status"] for f in case["findings"]}
        codes = set(expected[case["case"]][1])
        failed = {code for code, status in statuses.items() if status == "FAIL"}
        assert failed == {"run.diagnostic", *codes}, (case["case"], failed)
        assert all(statuses.get(code) in (None, "PASS", "SKIP") for code in others - codes), (case["case"], statuses)
    assert {"run.diagnostic", *others} <= set(verdict["failed_codes"]), verdict["failed_codes"]


def run_defect_matrix(repo_root, ansible_env, lab, runs, playbook, variants, expected):
    """One run of ``playbook`` with ``variants`` (the first ones each carrying the switches ``expected`` names),
    checked by check_defect_matrix; with no other variant the run fails exactly those codes. Every lock is free and
    no supervisor is left afterwards. Returns (verdict, run directory)."""
    result = run_gate(repo_root, ansible_env, lab, runs, playbook, {"orbite_case_variants": variants}, timeout=2400)
    assert result.returncode != 0, result.stdout[-4000:]
    try:
        found, run_dir = verdict(runs)
    except (FileNotFoundError, ValueError) as error:  # no verdict: the playbook's own words say why
        raise AssertionError(f"{error}\n{result.stdout[-4000:]}") from None
    check_defect_matrix(found, run_dir, expected)
    if len(variants) == len(expected):
        assert set(found["failed_codes"]) == {"run.diagnostic", *(c for _s, codes in expected.values() for c in codes)}
    assert locks_free(lab) and not supervisor_pids(lab)
    return found, run_dir


def launch_mismatches(launch, role, events):
    """What the supervisor journal ``events`` of one role says it exec'd, against that role's entry of the plan's
    ``launch`` (case.json): the supervisor's run ID, and per runner start (child_start) the runner and its pin, the
    registration IDs, the defect switches, the verbs library, the generation's observers, preloads and
    environment, the rails (or discovery lists) and the address it serves or reaches. Each difference is one line
    naming the field, the plan's value and the journal's."""
    plan = launch["roles"][role]
    out = []

    def differ(what, planned, seen):
        if planned != seen:
            out.append(f"{role} {what}: plan {planned!r}, journal {seen!r}")

    opened = [e for e in events if e.get("ev") == "journal_open"]
    differ("supervisor run_id", [launch["supervisor_run_id"]], [e.get("run_id") for e in opened])
    starts = [e for e in events if e.get("ev") == "child_start"]
    if not starts:
        out.append(f"{role}: the journal has no child_start")
    for start in starts:
        pins = {p["what"]: p for p in start["pinned"]}
        runner_index = 1 if plan["runner"]["interpreter"] else 0
        runner = pins[f"argv[{runner_index}]"] if runner_index else start["exe"]
        told = next(p["json"] for p in start["pinned"] if "json" in p)
        gen = plan["generations"][told["generation"] - 1]
        where = f"g{told['generation']} {start['child_id']}"
        differ(f"{where} runner", (plan["runner"]["sha256"], True),
               (runner["sha256"], start["argv"][runner_index].endswith("/" + plan["runner"].get("file", ""))))
        for field in ("registration_id", "peer_registration_id", "observers", "defects"):
            planned = gen["observers"] if field == "observers" else plan[field]
            differ(f"{where} {field}", planned, told.get(field, [] if field == "defects" else None))
        library = plan["verbs_library"] and plan["verbs_library"]["sha256"]
        differ(f"{where} verbs_library", library, (told.get("verbs_library") or {}).get("sha256"))
        differ(f"{where} ld_preload", [plan["preloads"][tool]["sha256"] for tool in gen["observers"]],
               [lib["sha256"] for lib in start["ld_preload"]])
        missing = sorted(set(gen["env"]) - set(start["env_keys"]))
        differ(f"{where} env keys missing", [], missing)
        if plan.get("rails_arguments") is not None:
            differ(f"{where} rails", plan["rails_arguments"],
                   {key: told[key] for key in ("rails", "discovery") if key in told})
        told_address = told.get("service_address") or told.get("peer_address")
        planned_address = _planned_address(launch, role, gen, starts)
        if planned_address.endswith(":*"):  # the relay's port is its own pick: compare the host
            told_address = told_address.rpartition(":")[0] + ":*"
        differ(f"{where} address", planned_address, told_address)
    return out


def _planned_address(launch, role, gen, starts):
    """The address a runner start is told by the plan's word: the source's configured service address (a
    replacement, bind previous: the one generation 1 was told); the requester's peer, the source's address or the
    relay's host (``host:*``: the relay picks its port)."""
    source = launch["roles"]["source"]
    if role == "source" and gen["bind"] == "previous":
        first = next(p["json"] for p in starts[0]["pinned"] if "json" in p)
        return first["service_address"]
    if role == "requester" and gen["peer"] == "relay":
        return source["relay"]["listen"].rpartition(":")[0] + ":*"
    return source["service_address"]


def launched_as_planned(run_dir):
    """launch_mismatches over every case and role of a run, from its case.json and the fetched journals."""
    out = []
    for case_dir in sorted((Path(run_dir) / "cases").iterdir()):
        launch = json.loads((case_dir / "case.json").read_text())["launch"]
        for role in launch["roles"]:
            lines = (case_dir / role / "journal.jsonl").read_text().splitlines()
            out += [f"{case_dir.name}: {line}" for line in
                    launch_mismatches(launch, role, [json.loads(line) for line in lines])]
    return out
