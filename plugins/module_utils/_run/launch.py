# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Start an engine runner as a child of the node's lock supervisor, and wait for it.

One job: turn the gate's view of a case (role, generation, profile, rails, addresses) into the
runner contract's case file (docs/runner-contract.md), launch the runner through the supervisor
with the mode's environment, and report the receipts' paths. The source is "started" only once it
has written ``ready.json`` (an explicit readiness barrier, watched together with the child's life).

What runs is pinned: the runner (the binary, or the zipapp an interpreter runs) to its sha256, the
case file recorded whole in the journal, every LD_PRELOAD observer to its sha256 (the supervisor
hands over sealed copies), and the verbs library the case names to its sha256 (checked here first,
and again by the runner on the bytes it loads). Stdlib only, Python >= 3.9.
"""

from __future__ import annotations

import calendar
import json
import os
import time

from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    atomic_write_json,
    private_dir,
    read_regular_bytes,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (
    SupervisorClient,
    SupervisorError,
    SupervisorRequestError,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node.pinned import PinError, PinMismatch, pin_file

PROTOCOL = "orbite-installed-host-v4"
CASE_SCHEMA = ("orbite.runner-case", 1)
READY_NAME = "ready.json"
# installed-restart: the runner's receipt that its generation's rounds are done and drained (docs/restart.md).
RESTART_POINT_NAME = "restart-point.json"
LEDGER_NAME = "ledger.json"
# The runner's progress receipt (docs/receipts.md section 3), rewritten as it goes; informational.
PROGRESS_NAME = "progress.json"
# Leases shorter than this (seconds) are not polled: the controller's pause between two calls of the polled
# wait (module transfer and start, worse on a loaded controller) must stay well inside the lease.
POLL_MIN_LEASE_S = 30.0
CASE_NAME = "case.json"
ROLES = ("source", "requester")
# The observer log format the gate gives the preloaded observers, and the file name saying it.
OBSERVER_LOG_SUFFIXES = {"binary": ".bin", "json": ".jsonl"}
READY_POLL_S = 0.02  # how often a wait for ready.json asks the supervisor whether the source exited
RESTART_POLL_S = 0.1  # the same, for restart-point.json (a wait of seconds)
# How often those waits read their file: a poll is a failed open (~10 us), and its period is the wait's slack.
FILE_POLL_S = 0.01
# ready.json is a small object (pid, service address, ...): anything larger is not a ready file.
READY_MAX_BYTES = 64 * 1024


class RunnerError(OrbiteError):
    """A runner could not be started or did not behave; ``code`` is stable."""

    code = "runner.error"

    def __init__(self, code, msg, **details):
        super().__init__(msg)
        self.code = code
        self.details = details


def bad_input(msg: str, **details) -> RunnerError:
    """The error of a runner argument that breaks a rule: msg names field, value and rule."""
    return RunnerError("runner.bad_input", msg, **details)


def check_names(params):
    """Run, registration and RNIC names follow the one name grammar (they name files and locks)."""
    checks = [("run_id", params.get("run_id")), ("registration_id", params.get("registration_id"))]
    if params.get("peer_registration_id") is not None:
        checks.append(("peer_registration_id", params["peer_registration_id"]))
    for index, rail in enumerate(params.get("rails") or []):
        checks.append((f"rails[{index}].device", rail.get("device") if isinstance(rail, dict) else rail))
    for which in ("whitelist", "blacklist"):
        for index, device in enumerate((params.get("discovery") or {}).get(which) or []):
            checks.append((f"discovery.{which}[{index}]", device))
    for index, tool in enumerate(params.get("observers") or []):
        checks.append((f"observers[{index}]", tool))
    for field, value in checks:
        if not names.is_name(value):
            raise bad_input(f"{field}={quote(value)}: must be {names.NAME_RULE}")


def check_preload(libraries):
    """Every LD_PRELOAD library must exist and match its pinned sha256.

    This early check gives a clear error before anything is written; the supervisor checks the
    hash again on the very bytes it preloads (a copy it makes, see _node/pinned.py).
    """
    pinned = []
    for index, entry in enumerate(libraries or []):
        field = f"ld_preload[{index}]"
        if not isinstance(entry, dict) or not entry.get("path") or not entry.get("sha256"):
            raise bad_input(f"{field}={quote(entry)}: needs path and sha256 (only hash-pinned "
                            "libraries)")
        path = entry["path"]
        if not isinstance(path, str) or not os.path.isabs(path):
            raise bad_input(f"{field}.path={quote(path)}: must be an existing absolute file")
        try:
            with pin_file(path, entry["sha256"], f"{field}.path"):
                pass
        except PinMismatch as error:
            raise RunnerError("runner.hash_mismatch", str(error), path=path) from None
        except PinError as error:
            raise bad_input(str(error), path=path) from None
        pinned.append({"path": path, "sha256": entry["sha256"]})
    return pinned


def check_verbs_library(spec):
    """The verbs library the case names must exist and match its pin (the runner checks it again on the
    bytes it loads; this gives a clear error before anything is launched). None = the system's."""
    if spec is None:
        return None
    path = spec.get("path") if isinstance(spec, dict) else None
    if not isinstance(path, str) or not os.path.isabs(path) or not spec.get("sha256"):
        raise bad_input(f"verbs_library={quote(spec)}: needs an absolute path and its sha256")
    try:
        with pin_file(path, spec["sha256"], "verbs_library.path", executable=False):
            pass
    except PinMismatch as error:
        raise RunnerError("runner.hash_mismatch", str(error), path=path) from None
    except PinError as error:
        raise bad_input(str(error), path=path) from None
    return {"path": path, "sha256": spec["sha256"]}


def build_case(params):
    """The case file of the runner contract, from the module's parameters."""
    role = params["role"]
    case = {
        "schema": CASE_SCHEMA[0], "version": CASE_SCHEMA[1], "protocol": PROTOCOL,
        "run_id": params["run_id"], "role": role, "generation": params["generation"],
        "profile": params["profile"], "root": params["root"],
        "registration_id": params["registration_id"],
        "observers": list(params.get("observers") or []),
    }
    if params["profile"].get("discovery") == "auto":
        case["discovery"] = params.get("discovery") or {"whitelist": [], "blacklist": []}
    else:
        if not params.get("rails"):
            raise bad_input("rails=[]: required unless the profile asks for discovery: auto")
        case["rails"] = params["rails"]
    if role == "source":
        if not params.get("service_address"):
            raise bad_input("service_address: required for the source")
        case["service_address"] = params["service_address"]
    else:
        if not params.get("peer_address"):
            raise bad_input("peer_address: required for the requester (the source's ready address; none "
                            "when the source runner did not become ready)")
        case["peer_address"] = params["peer_address"]
    for optional in ("peer_registration_id", "seed", "timeouts"):
        if params.get(optional) is not None:
            case[optional] = params[optional]
    if params.get("defects"):
        case["defects"] = list(params["defects"])
    if params.get("verbs_library"):
        case["verbs_library"] = dict(params["verbs_library"])
    return case


def prepare_output(output_dir):
    """A fresh private output directory: receipts of an earlier attempt must never be mistaken for ours."""
    if os.path.exists(os.path.join(output_dir, LEDGER_NAME)) or os.path.exists(os.path.join(output_dir, READY_NAME)):
        raise RunnerError("runner.output_not_empty", f"output_dir={output_dir}: already holds receipts of another run; "
                          "use a new directory per role and generation")
    # The case's and the role's directories too (the role makes no directory of its own): 0700 each.
    private_dir(output_dir, "output_dir")


def start(params, check_mode=False):
    """Write the case file, launch the runner under the supervisor; for the source, wait until ready.

    The environment goes to the supervisor as given: it keeps only its allowlist (never an LD_* or
    RDMAV_* variable but the pinned LD_PRELOAD) and says what it dropped (``env_stripped``).
    """
    check_names(params)
    case = build_case(params)
    preload = check_preload(params.get("ld_preload"))
    check_verbs_library(case.get("verbs_library"))
    output_dir = params["output_dir"]
    env = {str(k): str(v) for k, v in (params.get("env") or {}).items()}
    fmt = env.get("ORBITE_OBSERVER_LOG_FORMAT", "binary")
    if fmt not in OBSERVER_LOG_SUFFIXES:
        raise bad_input(f"env.ORBITE_OBSERVER_LOG_FORMAT={quote(fmt)}: the observer log format is "
                        "binary (the default) or json (JSON lines, for debugging)")
    if check_mode:
        return {"changed": True, "case": case, "ld_preload": [p["path"] for p in preload]}
    prepare_output(output_dir)
    case_path = os.path.join(output_dir, CASE_NAME)
    atomic_write_json(case_path, case, mode=0o600)
    if preload and case["observers"]:
        # The native observers write their log where the contract says, in binary records unless the
        # caller asks for JSON lines (debugging); the file name says which (docs/receipts.md 2).
        env["ORBITE_OBSERVER_LOG_FORMAT"] = fmt
        env["ORBITE_OBSERVER_LOG"] = os.path.join(output_dir, f"observer-{case['observers'][0]}"
                                                              f"{OBSERVER_LOG_SUFFIXES[fmt]}")
    client = SupervisorClient(params["supervisor_run_dir"])
    runner_argv = list(params["runner_argv"])
    argv = [*runner_argv, "--case", case_path, "--output", output_dir]
    # The runner proper is the last element of runner_argv (the binary, or the zipapp an interpreter
    # runs): pinned to its sha256; the case file pinned too and journaled whole (what it was told).
    runner_index, case_index = len(runner_argv) - 1, len(runner_argv) + 1
    argv_pins = {case_index: None}
    exe_sha256 = params.get("runner_sha256")
    if exe_sha256 and runner_index > 0:
        argv_pins[runner_index] = exe_sha256
        exe_sha256 = None
    try:
        child = client.launch(argv, env=env, cwd=output_dir, ld_preload=preload,
                              stdout_path=os.path.join(output_dir, "runner.stdout"),
                              stderr_path=os.path.join(output_dir, "runner.stderr"),
                              exe_sha256=exe_sha256, argv_pins=argv_pins, record_json=[case_index])
    except SupervisorRequestError as error:
        code = "runner.hash_mismatch" if error.code == "supervisor.hash_mismatch" else "runner.launch_failed"
        raise RunnerError(code, f"the supervisor refused to launch the {case['role']} runner: {error}") from None
    except SupervisorError as error:
        raise RunnerError("runner.launch_failed",
                          f"the supervisor refused to launch the {case['role']} runner: {error}") from None
    stripped = child.pop("env_stripped", [])
    result = {"changed": True, "case_path": case_path, "output_dir": output_dir, "child": child,
              "ledger": os.path.join(output_dir, LEDGER_NAME), "ready": None, "env_stripped": stripped}
    if case["role"] == "source":
        result["ready"] = wait_ready(client, child, output_dir, params["ready_timeout"])
    if params.get("poll"):
        # The first wait in the same call (the requester, whose start is the last step before the wait): one
        # round trip less per generation. The child's state is the wait's, the launch's result otherwise kept.
        result.update(poll_finished(dict(params, child_id=child["child_id"])), changed=True)
    return result


def read_ready(ready_path):
    """The ready file as an object; None while it is not complete yet (a partial JSON write).

    A FIFO, device or symlink is never opened for reading, a file over READY_MAX_BYTES is not read,
    and JSON that is complete but not an object is an error: RunnerError("runner.ready_invalid"), never a
    traceback or a hang.
    """
    try:
        raw = read_regular_bytes(ready_path, READY_MAX_BYTES, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise RunnerError("runner.ready_invalid", f"{ready_path}: cannot be read ({error.strerror or error})") from None
    except OrbiteError as error:  # not a regular file, too large
        raise RunnerError("runner.ready_invalid", f"{error}; rule: a regular JSON file of at most {READY_MAX_BYTES} "
                          "bytes") from None
    try:
        ready = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise RunnerError("runner.ready_invalid", f"{ready_path}: is not UTF-8 text") from None
    except RecursionError:
        raise RunnerError("runner.ready_invalid", f"{ready_path}: JSON nested too deeply") from None
    except ValueError:
        return None  # being written: read again
    if not isinstance(ready, dict):
        raise RunnerError("runner.ready_invalid", f"{ready_path}: holds {quote(ready)}; rule: a JSON object "
                          "(pid, service_address, ...)")
    return ready


def wait_ready(client, child, output_dir, timeout):
    """Return ready.json once the source wrote it; fail at once if the source exits first."""
    ready_path = os.path.join(output_dir, READY_NAME)
    ready, state = _await_json(client, child["child_id"], ready_path, time.monotonic() + timeout, READY_POLL_S)
    if ready is not None:
        if ready.get("pid") != child["pid"]:
            raise RunnerError("runner.ready_mismatch", f"{ready_path}: written by pid {quote(ready.get('pid'))}, "
                              f"the supervised source is pid {child['pid']}")
        return ready
    if state is not None:
        raise RunnerError("runner.exited_before_ready",
                          f"the source runner exited before it was ready (exit code {state.get('exit_code')}, "
                          f"signal {state.get('exit_signal_name')}); see {output_dir}/runner.stderr", child=state)
    detail = f"{ready_path} is not complete JSON" if os.path.lexists(ready_path) else f"no {ready_path}"
    raise RunnerError("runner.ready_timeout", f"the source runner was not ready within {timeout} s ({detail}); "
                      f"it is still running as pid {child['pid']}")


def _await_json(client, child_id, path, deadline, check_s, between=None):
    """Poll path (read_ready) for a runner's JSON object every FILE_POLL_S, and ask the supervisor whether the child
    exited every ``check_s`` and past the deadline. Return (object, None) once written, (None, state) when the child
    exited without writing it, (None, None) past the deadline; between() runs before each sleep.

    A read of the file costs ~10 us, the supervisor's round trip ~40 times that (client and supervisor): the file
    is read often (its wait is on a case's path), the supervisor asked no more often than before."""
    next_check = 0.0
    while True:
        found = read_ready(path)
        if found is not None:
            return found, None
        now = time.monotonic()
        if now >= next_check or now > deadline:
            state = client.wait(child_id, timeout=0)
            if not state["timed_out"]:
                # It may have written the file and exited since the read above: the file then counts.
                found = read_ready(path)
                return (found, None) if found is not None else (None, state)
            now = time.monotonic()
            if now > deadline:
                return None, None
            next_check = now + check_s
        if between is not None:
            between()
        time.sleep(FILE_POLL_S)


def _wait_renewing(client, child_id, seconds):
    """Wait up to ``seconds`` for the child to exit, in slices of a third of the lease, renewing between them:
    a controller that is alive keeps its locks; one that died lets the lease expire and the supervisor clean up.
    """
    deadline = time.monotonic() + seconds
    lease = float(client.status().get("lease_s") or 60)
    while True:
        remaining = deadline - time.monotonic()
        state = client.wait(child_id, timeout=max(0.0, min(remaining, lease / 3)))
        if not state["timed_out"] or remaining <= 0:
            return state
        client.renew()


def finish(params):
    """Wait for a runner child to exit, renewing the supervisor's lease meanwhile; return its status.

    With ``poll`` (seconds): wait at most that long, then return ``finished`` false with the runner's
    progress, for the action plugin to show and call again; ``timeout`` then bounds the
    child's whole run time (from the supervisor's record of its start)."""
    if params.get("poll"):
        return poll_finished(params)
    client = SupervisorClient(params["supervisor_run_dir"])
    try:
        state = _wait_renewing(client, params["child_id"], params["timeout"])
    except SupervisorError as error:
        raise RunnerError("runner.wait_failed", f"waiting for child {params['child_id']} failed: {error}") from None
    if state["timed_out"]:
        raise RunnerError("runner.timeout", f"runner child {params['child_id']} (pid {state.get('pid')}) still runs "
                                            f"after {params['timeout']} s", child=state)
    ledger = os.path.join(params["output_dir"], LEDGER_NAME) if params.get("output_dir") else None
    return {"changed": False, "child": state, "ledger": ledger}


def wait_restart_point(params):
    """installed-restart: wait until the runner wrote its generation's restart point (rounds done and drained,
    cached QPs and MRs live), the only point at which the controller may kill the fault role. Fails at once
    when the runner exits first; renews the supervisor's lease meanwhile, as ``finish`` does."""
    client = SupervisorClient(params["supervisor_run_dir"])
    path = os.path.join(params["output_dir"], RESTART_POINT_NAME)
    deadline = time.monotonic() + params["timeout"]
    try:
        lease = float(client.status().get("lease_s") or 60)
        # Renewed on entry and at the point too: the kill and the replacement's start follow at once,
        # and neither renews.
        client.renew()
        renewed = time.monotonic()

        def renew_by_lease():
            nonlocal renewed
            now = time.monotonic()
            if now - renewed > lease / 3:
                client.renew()
                renewed = now

        point, state = _await_json(client, params["child_id"], path, deadline, RESTART_POLL_S, renew_by_lease)
        if point is not None:
            if point.get("pid") != params["pid"]:
                raise RunnerError("runner.restart_point_mismatch", f"{path}: written by pid {quote(point.get('pid'))}, "
                                  f"the supervised runner is pid {params['pid']}")
            client.renew()
            return {"changed": False, "restart_point": point}
        if state is not None:
            raise RunnerError("runner.exited_before_restart_point",
                              f"the runner (pid {params['pid']}) exited before its restart point (exit code "
                              f"{state.get('exit_code')}, signal {state.get('exit_signal_name')}); see "
                              f"{params['output_dir']}/runner.stderr", child=state)
        raise RunnerError("runner.timeout", f"no {path} within {params['timeout']} s; the runner (pid "
                          f"{params['pid']}) still runs")
    except SupervisorError as error:
        raise RunnerError("runner.wait_failed", f"waiting for the restart point of child {params['child_id']} failed: "
                          f"{error}") from None


def read_progress(output_dir):
    """The runner's progress receipt as an object, or None (none yet, being replaced, or not one):
    informational, so a bad file never fails the wait. Bounded and never a FIFO, like ready.json."""
    if not output_dir:
        return None
    try:
        raw = read_regular_bytes(os.path.join(output_dir, PROGRESS_NAME), READY_MAX_BYTES, follow_symlinks=False)
        progress = json.loads(raw.decode("utf-8"))
    except (OSError, OrbiteError, ValueError, RecursionError):
        return None
    return progress if isinstance(progress, dict) and progress.get("schema") == "orbite.runner-progress" else None


def _int(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def progress_line(label, progress, seconds):
    """One line of where the runner is, e.g. ``case read-polling requester g1 round 2/3, 51 posted, 43 completed of
    64 WRs (12.4 s)``: the round's running counts, as the runner last wrote them."""
    head = f"case {label}" if label else "runner"
    ran = f" ({seconds:.1f} s)" if seconds is not None else ""
    if not progress:
        return f"{head}: no progress reported yet{ran}"
    role = progress.get("role") if names.is_name(progress.get("role")) else "runner"
    where = f"{head} {role} g{_int(progress.get('generation'))} round {_int(progress.get('round'))}/" \
            f"{_int(progress.get('rounds'))}"
    total, done, posted = (_int(progress.get(field)) for field in ("wrs_total", "wrs_done", "wrs_posted"))
    if progress.get("phase") == "drained":
        what = f"drained, {done} of {total} WRs" if total else "drained"
    elif total:
        what = (f"{posted} posted, " if posted is not None else "") + f"{done} completed of {total} WRs"
    else:
        what = "waiting for the peer"
    return f"{where}, {what}{ran}"


def _run_seconds(state):
    """Seconds since the supervisor started the child (its ISO ``started_at``), or None."""
    started = state.get("started_at")
    try:
        when = calendar.timegm(time.strptime(started.split(".")[0].rstrip("Z"), "%Y-%m-%dT%H:%M:%S"))
    except (AttributeError, TypeError, ValueError):
        return None
    return max(0.0, time.time() - when)


def poll_finished(params):
    """Wait at most ``poll`` seconds for the runner, renewing the lease; return ``finished`` and the progress.

    ``finished`` false: the child still runs; call again. Fails with ``timeout`` once the child has run
    longer than ``timeout`` seconds (the overall limit of the wait). Under a lease shorter than
    POLL_MIN_LEASE_S the call waits up to that limit (no pause between calls could outlast the lease)."""
    client = SupervisorClient(params["supervisor_run_dir"])
    try:
        client.renew()
        budget = min(params["poll"], params["timeout"])
        if float(client.status().get("lease_s") or 60) < POLL_MIN_LEASE_S:
            # A short lease cannot absorb the controller's pause between two calls: wait in this one call
            # (renewing as it goes) up to the overall limit, as without poll.
            budget = max(0.0, params["timeout"] - (_run_seconds(client.wait(params["child_id"], timeout=0)) or 0.0))
        state = _wait_renewing(client, params["child_id"], budget)
        if state["timed_out"]:
            client.renew()  # the pause before the next call starts from a whole lease
    except SupervisorError as error:
        raise RunnerError("runner.wait_failed", f"waiting for child {params['child_id']} failed: {error}") from None
    progress = read_progress(params.get("output_dir"))
    seconds = _run_seconds(state)
    line = progress_line(params.get("label"), progress, seconds)
    result = {"changed": False, "child": state, "progress": progress, "progress_line": line,
              "finished": not state["timed_out"]}
    if state["timed_out"] and seconds is not None and seconds > params["timeout"]:
        raise RunnerError("runner.timeout", f"runner child {params['child_id']} (pid {state.get('pid')}) still runs "
                                            f"after {params['timeout']} s; last progress: {line}", child=state,
                          progress=progress)
    if not state["timed_out"]:
        result["ledger"] = os.path.join(params["output_dir"], LEDGER_NAME) if params.get("output_dir") else None
    return result
