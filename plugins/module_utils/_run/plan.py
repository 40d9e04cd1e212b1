# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Lay out a run directory on the controller: run.json and one cases/<id>/case.json per case.

One job, done before any node is touched: the verifier later reads exactly this plan (which cases
must exist, which profile each ran), so it is written atomically and never mixed with another run.

The plan binds the run's identity (docs/verifier.md, "Bound identity"): ``run.json`` names the
cases, each case's profile and hosts, the runner kind, the defect switches and (``artifacts``) the
sha256 of every executable the run uses (runner, verbs library, observers); each ``case.json`` names
its supervisor's run ID and the registration ID of each role, which the gate hands to the nodes
(``case_ids``). The verifier checks every receipt against these.

The run directory is private by default: receipts, inventories and verdicts name hosts, devices
and addresses. Every directory this creates (the run directory, its missing parents, ``cases/`` and
each case's) is 0700 and every file 0600; a run directory that already exists keeps the mode its
owner gave it (an ``orbite_output_dir`` shared on purpose), while what is inside stays private.
"""

from __future__ import annotations

import json
import os

from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    atomic_write_json,
    atomic_write_text,
    makedirs_private,
    read_regular_bytes,
)
from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote
from ansible_collections.orbite.qualification.plugins.module_utils._node.pinned import is_sha256
from ansible_collections.orbite.qualification.plugins.module_utils._node.protocol import (
    MAX_LEASE_S,
    MAX_LOCK_TIMEOUT_S,
    number_in_range,
)
from ansible_collections.orbite.qualification.plugins.module_utils._run.relay import DEFECTS as RELAY_SWITCHES
from ansible_collections.orbite.qualification.plugins.module_utils._run import schedule as case_schedule

RUN_SCHEMA = ("orbite.run", 1)
CASE_SCHEMA = ("orbite.case", 1)


class RunPlanError(OrbiteError):
    """Bad input or a run directory that belongs to another run."""

    code = "run_plan.invalid"


DIR_MODE = 0o700
FILE_MODE = 0o600
PLAN_READ_LIMIT = 1 << 20  # an existing run.json is a few hundred bytes


ROLES = ("source", "requester")
RUNNER_KINDS = ("sim", "native")


def case_ids(run_id, case_id):
    """The IDs the gate gives a case's processes: its supervisors' run ID and each role's registration ID."""
    base = f"{run_id}-{case_id}"
    return {"supervisor_run_id": base, "registrations": {role: f"{base}-{role}" for role in ROLES}}


def cast_names(variable, value):
    """A list of switch names from a list or a comma-separated string (an AWX survey sends extra vars as
    strings); anything else, or a name outside the rule, is an error naming the variable, value and rule."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)):
        raise RunPlanError(f"{variable}={quote(value)}: must be a list of defect switch names or one string of "
                           "them separated by commas")
    for index, name in enumerate(value):
        if not names.is_name(name):
            raise RunPlanError(f"{variable}[{index}]={names.quote(name)}: must be {names.NAME_RULE}")
    return list(value)


# The node steps' seconds, by the play variable that gives them: each must be a number (an AWX survey sends "60") in
# the range the supervisor and the runner module take; unset, the runner role's default (roles/runner/defaults,
# held equal by a unit test). The launch plan names each by its key (launch.seconds).
SECONDS = {
    "orbite_lease": ("lease", 0, MAX_LEASE_S, True, 120),
    "orbite_lock_timeout": ("lock_timeout", 0, MAX_LOCK_TIMEOUT_S, False, 30),
    "orbite_runner_ready_timeout": ("ready_timeout", 0, 86400, True, 60),
    "orbite_runner_timeout": ("runner_timeout", 0, 86400, True, 900),
    "orbite_runner_poll": ("poll", 0, 86400, True, 3),
}


def check_seconds(given):
    """The play's node-step seconds ``given`` ({variable: value or None when unset}) as numbers; a value that is
    not a number in its range, or a variable outside SECONDS, is an error naming the variable, value and rule.
    Empty text counts as unset: ansible-core 2.17 renders an unset variable's ``default(none)`` as ''."""
    out = {}
    for variable, value in (given or {}).items():
        if variable not in SECONDS:
            raise RunPlanError(f"timeouts: {quote(variable)} is not one of {', '.join(SECONDS)}")
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        low, high, low_open = SECONDS[variable][1:4]
        try:
            number = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError, OverflowError):
            number = None
        if isinstance(value, bool) or not number_in_range(number, low, high, low_open):
            raise RunPlanError(f"{variable}={quote(value)}: must be a number of seconds in "
                               f"{'(' if low_open else '['}{low:g}, {high:g}]")
        out[variable] = number
    return out


def launch_seconds(given):
    """launch.seconds: every node step's seconds by its key, the play's (checked) or the role's default."""
    checked = check_seconds(given)
    return {entry[0]: checked.get(variable, float(entry[-1])) for variable, entry in SECONDS.items()}


def host_rails(rails, host):
    """The rails of inventory host ``host``: its own ``orbite_rails`` host var as roles/preflight gives them
    ({host: orbite_rails}), each rail a mapping naming its device."""
    value = (rails or {}).get(host)
    if not (isinstance(value, list) and value
            and all(isinstance(rail, dict) and names.is_name(rail.get("device")) for rail in value)):
        raise RunPlanError(f"rails.{host}={quote(value)}: must be host {host}'s orbite_rails, a list of "
                           "{device, port, gid_index}")
    return value


def host_service_address(addresses, host):
    """The service address of inventory host ``host``: its own ``orbite_service_address`` host var
    ({host: orbite_service_address}), host:port."""
    value = (addresses or {}).get(host)
    head, port = value.rpartition(":")[::2] if isinstance(value, str) else ("", "")
    if not (head and port.isdigit() and int(port) <= 65535 and "\0" not in value):
        raise RunPlanError(f"service_addresses.{host}={quote(value)}: must be host {host}'s "
                           "orbite_service_address, host:port")
    return value


def check_case_hosts(case_hosts):
    """case_hosts: {case id: {"source": host, "requester": host}} (the case schedule's lane hosts), or nothing."""
    if case_hosts is None:
        return {}
    for case_id, hosts in (case_hosts.items() if isinstance(case_hosts, dict) else [(None, case_hosts)]):
        if not (isinstance(hosts, dict) and all(isinstance(hosts.get(role), str) and hosts[role] for role in ROLES)):
            raise RunPlanError(f"case_hosts.{case_id}={quote(hosts)}: must name the inventory host of each role "
                               f"({', '.join(ROLES)})")
    return case_hosts


def rails_arguments(profile, rails):
    """The runner's rails arguments from the rails of its host: discovery auto gives no pins, a whitelist of
    exactly the locked RNICs and the same blacklist (to check that the whitelist takes precedence); otherwise
    the rails themselves."""
    devices = [rail["device"] for rail in rails]
    if profile.get("discovery") == "auto":
        return {"discovery": {"whitelist": devices, "blacklist": list(devices)}}
    return {"rails": rails}


SIM_RUNNER_FILE = "orbite-sim-runner.pyz"  # the simulated runner's zipapp, in the node's run directory
DEPLOY_DIR = "native"  # the verbs library and observers, under the node's run directory


def _deploy_entry(name, pin, file):
    """{name, src (the controller's), sha256 (the pin), file (under the node's run directory)}; src, sha256 and
    file null where the run pins no such file (the supervisor's deploy names it)."""
    if not pin:
        return {"name": name, "src": None, "sha256": None, "file": None}
    deployed = file or os.path.join(DEPLOY_DIR, os.path.basename(pin["path"]))
    return {"name": name, "src": pin["path"], "sha256": pin["sha256"], "file": deployed}


INTERRUPTION = "installed-interruption"  # the requester reaches the source through the control relay
RELAY_DIR = "relay"  # the control relay's private directory, under the case's on the source node
# The modes whose generations restart the fault role's runner (roles/runner/tasks/restart_first.yml and
# restart_next.yml); every other mode runs one generation of both (generation.yml).
RESTART_MODES = ("installed-restart", INTERRUPTION, "installed-lost-completion", "installed-cleanup-failure")


def _role_generations(case, role, relay):
    """Per generation, what this role's runner step does: the observers it preloads (an entry with ``generation``
    only in that one) and their own environment (each entry's arming, later entries winning); whether it starts
    a runner (generation 1, or the fault role's replacement), kills the previous one first, is the last
    generation (else it waits for the restart point); the address the source binds (``configured``: its host's;
    ``previous``: the one generation 1 bound, a runtime fact), the requester's peer (``source``: the source's
    ready address; ``relay``: the control relay's) and the grants the relay holds at this restart point."""
    profile = case["profile"]
    observers = (case.get("workload") or {}).get("observers") or []
    generations = int(profile.get("generations") or 1)
    fault_role = profile.get("fault_role")
    plans = []
    for generation in range(1, generations + 1):
        mine = [o for o in observers if o.get("role") == role]
        # The case's own first, then the generation's (installed-cleanup-failure's uverbs_fault: generation 1's).
        entries = [o for o in mine if "generation" not in o] + [o for o in mine if o.get("generation") == generation]
        env = {}
        for entry in entries:
            env.update(entry.get("env") or {})
        # A tool listed case-wide and for one generation is preloaded once.
        tools = list(dict.fromkeys(o["tool"] for o in entries))
        last = generation == generations
        plans.append({"generation": generation, "observers": tools, "env": env,
                      "starts": generation == 1 or role == fault_role,
                      "kill_previous": generation > 1 and role == fault_role, "last": last,
                      "bind": ("configured" if generation == 1 else "previous") if role == "source" else None,
                      "peer": ("relay" if relay else "source") if role == "requester" else None,
                      # With a relay switch (leak_grant) it holds none: the verifier names that.
                      "relay_held": (0 if relay["defects"] else generation) if relay and role == "source"
                      and not last else None})
    return plans


def _relay(case, switches, seconds, address):
    """installed-interruption's control relay on the source node: its directory (under the node's run directory),
    where it listens (the source's host, a port of its own), the round after which it holds a grant, its own
    switches, its lease (an outer bound only: it ends with its node's supervisor well before) and readiness
    timeout; None in every other mode."""
    profile = case["profile"]
    if profile.get("mode") != INTERRUPTION:
        return None
    generations = int(profile.get("generations") or 1)
    return {"state_dir": os.path.join(case["id"], RELAY_DIR), "listen": address.rpartition(":")[0] + ":0",
            "hold_after_round": int(case["workload"]["rounds_per_generation"]), "defects": switches,
            "lease": (seconds["runner_timeout"] + seconds["ready_timeout"]) * generations + seconds["lease"],
            "timeout": seconds["ready_timeout"]}


def launch_entries(run_id, case, defects, runner_kind, artifacts, seconds=None, rails=None, service_addresses=None,
                   hosts=None):
    """What each role of ``case`` launches, computed once for the runner role to read verbatim: IDs, runner and
    relay defect switches, the locks and rails arguments and the service address of the role's inventory host
    (``rails``, ``service_addresses``: {host: its host var}; left null when not given), per-generation steps,
    observers and environment, the runner, the verbs library, the deploy list with its pins, the control relay
    and the files fetched beside the receipts, and the node steps' seconds. Node paths are relative to the node's
    run directory (``node_launch``)."""
    ids = case_ids(run_id, case["id"])
    seconds = launch_seconds({}) if seconds is None else seconds
    switches = list(dict.fromkeys(list(defects) + list(case.get("defects") or ())))
    relay_switches = [name for name in switches if name in RELAY_SWITCHES]
    observers = (case.get("workload") or {}).get("observers") or []
    runner = library = None
    pins = {}
    if artifacts is not None:
        pins = artifacts["observers"]
        sha256 = artifacts["runner"]["sha256"]
        if runner_kind == "sim":
            runner = {"interpreter": True, "file": SIM_RUNNER_FILE, "sha256": sha256}
        else:
            runner = {"interpreter": False, "path": artifacts["runner"]["path"], "sha256": sha256}
        pin = artifacts["verbs_library"]
        library = pin and {"file": os.path.join(DEPLOY_DIR, os.path.basename(pin["path"])), "sha256": pin["sha256"]}
    # The inventory host each role runs on: the schedule's lane host (roles/preflight), else the profile's.
    role_hosts = {role: (hosts or {}).get(role) or case["profile"].get(role) for role in ROLES}
    source_address = (None if service_addresses is None
                      else host_service_address(service_addresses, role_hosts["source"]))
    # The source node starts it; the requester's generations read it (their peer).
    relay = _relay(case, relay_switches, seconds, source_address or "")
    roles = {}
    for role in ROLES:
        host = role_hosts[role]
        own_rails = None if rails is None else host_rails(rails, host)
        mine = relay if role == "source" else None
        tools = list(dict.fromkeys(o["tool"] for o in observers if o.get("role") == role))
        deploy = []
        if artifacts is not None and (runner_kind == "sim" or library):
            if runner_kind == "sim":
                deploy.append(_deploy_entry("runner", artifacts["runner"], SIM_RUNNER_FILE))
            deploy.append(_deploy_entry("verbs_library", artifacts["verbs_library"], None))
            deploy.extend(_deploy_entry(tool, pins.get(tool), None) for tool in tools if runner_kind == "sim")
        # A native runner's observers come from its installation on the node (roles/runner/tasks/native.yml).
        preloads = {entry["name"]: {"file": entry["file"], "sha256": entry["sha256"]}
                    for entry in deploy if entry["name"] in tools and entry["file"]}
        roles[role] = {
            "host": host,
            "registration_id": ids["registrations"][role],
            "peer_registration_id": ids["registrations"]["source"] if role == "requester" else None,
            # The relay's own switches go to the relay only, never to a runner (sim/orbite_sim/case.py).
            "defects": [name for name in switches if name not in RELAY_SWITCHES],
            "relay_defects": relay_switches,
            "locks": None if own_rails is None else [rail["device"] for rail in own_rails],
            "rails_arguments": None if own_rails is None else rails_arguments(case["profile"], own_rails),
            "service_address": source_address if role == "source" else None,
            "relay": mine,
            # Fetched beside the receipts (the relay's journal), each under the node's run directory.
            "fetch_files": {"relay.jsonl": os.path.join(mine["state_dir"], "relay.jsonl")} if mine else {},
            "runner": runner, "verbs_library": library, "deploy": deploy, "preloads": preloads,
            # The observer tools this role's runner preloads in the case, whatever the runner kind (a native
            # runner's installation is checked for them, once per run: roles/runner/tasks/prepare.yml).
            "tools": tools,
            "generations": _role_generations(case, role, relay)}
    # The runner role's task file for the case (roles/runner/tasks/main.yml): a restart-roles mode's generations; one
    # generation of both runners, with the discovery inventories around it when the profile asks for them (the
    # profile rules allow discovery: auto in single-generation modes only), so no other case has a task for them.
    if case["profile"].get("mode") in RESTART_MODES:
        flow = "restart"
    else:
        flow = "discovery" if case["profile"].get("discovery") == "auto" else "single"
    return {"supervisor_run_id": ids["supervisor_run_id"], "flow": flow, "seconds": seconds, "roles": roles}


def node_launch(entry, node_run_dir, python):
    """One role's launch entry with its node paths under ``node_run_dir`` and the runner's argv (the node's
    ``python`` for the simulated runner's zipapp): the values the runner role's tasks pass on as they are."""
    def under(item):
        if not item or "file" not in item:
            return item
        rest = {key: value for key, value in item.items() if key != "file"}
        key = "dest" if "src" in item else "path"
        return dict(rest, **{key: None if item["file"] is None else os.path.join(node_run_dir, item["file"])})

    runner = under(entry["runner"]) or {}
    argv = ([python] if runner.get("interpreter") else []) + ([runner["path"]] if runner else [])
    relay = entry.get("relay")
    return dict(entry, runner=runner or None, runner_argv=argv, runner_sha256=runner.get("sha256"),
                verbs_library=under(entry["verbs_library"]), deploy=[under(e) for e in entry["deploy"]],
                preloads={tool: under(pin) for tool, pin in entry["preloads"].items()},
                relay=relay and dict(relay, state_dir=os.path.join(node_run_dir, relay["state_dir"])),
                fetch_files={name: os.path.join(node_run_dir, path)
                             for name, path in (entry.get("fetch_files") or {}).items()})


def case_launch(case_plan, role, host, node_run_dir, python):
    """This node's launch from a case's ``case.json`` document: ``role``'s entry put under ``node_run_dir``
    (``node_launch``) with the role, the source's inventory host (the requester's peer is its), the case's
    supervisor run ID, flow and seconds beside it (the runner role reads every case's once per run:
    ``case_launches``, its prepare entry point). The plan names the inventory host of each role (the schedule's
    lane host): a ``host`` other than that one means the schedule and the run plan disagree, refused by name."""
    launch, case_id = case_plan["launch"], case_plan.get("case_id")
    entry = launch["roles"][role]
    if entry["host"] != host:
        raise RunPlanError(f"case {case_id}: launch.roles.{role}.host={quote(entry['host'])}: is not this host "
                           f"({host}); the case schedule and the run plan disagree (cases/{case_id}/case.json)")
    return dict(node_launch(entry, node_run_dir, python), role=role, source_host=launch["roles"]["source"]["host"],
                supervisor_run_id=launch["supervisor_run_id"], flow=launch["flow"], seconds=launch["seconds"])


def _ready_record(result):
    """A start result's ready record ({} without one: a skipped or failed start, or none at all)."""
    ready = result.get("ready") if isinstance(result, dict) else None
    return ready if isinstance(ready, dict) else {}


PEERS = ("source", "relay")  # what a requester's generation reaches, by the plan's word (its launch's peer)


def peer_address(started, registration_id, peer):
    """The requester's peer address, from what its source's node started for the case: ``started`` is [the
    source's runner start result, the control relay's start result] (each {} when that node has none; the runner
    role reads both from the source's hostvars in one lookup), ``registration_id`` the one the plan gives the peer,
    ``peer`` the plan's word (null in the source's own launch: it has no peer, "" then). Only a ready record of
    that registration counts, since a source that did not start in this case (its node failed earlier) leaves an
    earlier case's result behind; "" when there is none, and the requester's start fails naming its
    peer_address."""
    if not isinstance(started, list) or len(started) != len(PEERS):
        raise RunPlanError(f"started={quote(started)}: must be [the source's start result, the relay's]")
    if peer is None:
        return ""
    if peer not in PEERS:
        raise RunPlanError(f"peer={quote(peer)}: is not a peer of the plan ({', '.join(PEERS)})")
    source, relay = (_ready_record(result) for result in started)
    if source.get("registration_id") != registration_id:
        return ""
    return str({"source": source.get("service_address"), "relay": relay.get("address")}[peer] or "")


def case_launches(run_dir, slots, host, node_run_dir, python):
    """{case ID: this host's launch} for each case of ``slots`` (this host's case of each slot of the schedule, None
    where it has none: the preflight's lane cases), its role the source where the slot names this host as the
    source, else the requester: the one place a host's role in a case is decided (the runner role reads it from the
    launch). Each case's ``case.json`` under ``run_dir`` is read once for the run (case_launch), not once per case
    by a task of its own. A slot whose source is not the plan's is refused by name, for either role."""
    if not isinstance(slots, list):
        raise RunPlanError(f"slots={quote(slots)}: must be a list of this host's case per slot (or null)")
    for field, value in (("host", host), ("node_run_dir", node_run_dir), ("python", python)):
        if not isinstance(value, str) or not value:
            raise RunPlanError(f"{field}={quote(value)}: must be a non-empty string")
    launches = {}
    for index, slot in enumerate(slots):
        if slot is None:
            continue
        if not isinstance(slot, dict) or not names.is_name(slot.get("id")) or not isinstance(slot.get("source"), str):
            raise RunPlanError(f"slots[{index}]={quote(slot)}: must be a mapping with the case's id (a name) and its "
                               "source host")
        path = os.path.join(run_dir, "cases", slot["id"], "case.json")
        document = _read_json(path, PLAN_READ_LIMIT, f"slots[{index}] (case {slot['id']}): {path} cannot be read")
        if document is None:
            raise RunPlanError(f"slots[{index}] (case {slot['id']}): {path} cannot be read (no such file)")
        if not isinstance(document, dict) or not isinstance(document.get("launch"), dict):
            raise RunPlanError(f"slots[{index}] (case {slot['id']}): {path} holds no launch plan")
        role = "source" if slot["source"] == host else "requester"
        try:
            launches[slot["id"]] = case_launch(document, role, host, node_run_dir, python)
        except (KeyError, TypeError, AttributeError) as error:
            raise RunPlanError(f"slots[{index}] (case {slot['id']}): {path} has no launch of the {role} "
                               f"({type(error).__name__}: {error})") from None
        if launches[slot["id"]]["source_host"] != slot["source"]:
            raise RunPlanError(f"slots[{index}].source={quote(slot['source'])}: is not the plan's source of case "
                               f"{slot['id']} ({launches[slot['id']]['source_host']}); the case schedule and the run "
                               f"plan disagree ({path})")
    return launches


def _file(where, value, fields=("path", "sha256")):
    """An artifact entry {path, sha256} (plus kind for the runner), exactly those fields."""
    if not isinstance(value, dict):
        raise RunPlanError(f"{where}={quote(value)}: must be a mapping of {', '.join(fields)}")
    unknown = sorted(set(value) - set(fields), key=str)
    if unknown:
        raise RunPlanError(f"{where}.{unknown[0]}: is not a field (the fields are {', '.join(fields)})")
    for key in fields:
        if key not in value or value[key] is None:
            raise RunPlanError(f"{where}.{key}: is required")
    path, sha256 = value["path"], value["sha256"]
    if not (isinstance(path, str) and path.startswith("/") and "\0" not in path):
        raise RunPlanError(f"{where}.path={quote(path)}: must be an absolute path")
    if not is_sha256(sha256):
        raise RunPlanError(f"{where}.sha256={quote(sha256)}: must be 64 lowercase hex digits")
    return {key: value[key] for key in fields}


def check_artifacts(artifacts, runner_kind):
    """The plan's ``artifacts`` section, checked and normalised; None when not given.

    {"runner": {"kind", "path", "sha256"}, "verbs_library": {"path", "sha256"} or None,
     "observers": {tool: {"path", "sha256"}}}: what the verifier holds every journaled exec against.
    """
    if artifacts is None:
        return None
    if not isinstance(artifacts, dict):
        raise RunPlanError(f"artifacts={quote(artifacts)}: must be a mapping of runner, verbs_library, observers")
    unknown = sorted(set(artifacts) - {"runner", "verbs_library", "observers"}, key=str)
    if unknown:
        raise RunPlanError(f"artifacts.{unknown[0]}: is not a field (the fields are runner, verbs_library, "
                           "observers)")
    runner = _file("artifacts.runner", artifacts.get("runner"), ("kind", "path", "sha256"))
    if runner["kind"] != runner_kind:
        raise RunPlanError(f"artifacts.runner.kind={quote(runner['kind'])}: must be the run's runner_kind "
                           f"{runner_kind!r}")
    library = artifacts.get("verbs_library")
    observers = artifacts.get("observers")
    observers = {} if observers is None else observers
    if not isinstance(observers, dict):
        raise RunPlanError(f"artifacts.observers={quote(observers)}: must be a mapping of observer tool to "
                           "{path, sha256}")
    for tool in observers:
        if not names.is_name(tool):
            raise RunPlanError(f"artifacts.observers key {names.quote(tool)}: must be {names.NAME_RULE}")
    return {
        "runner": runner,
        "verbs_library": None if library is None else _file("artifacts.verbs_library", library),
        "observers": {tool: _file(f"artifacts.observers.{tool}", entry) for tool, entry in sorted(observers.items())},
    }


def check_origin(origin, case_ids_planned):
    """A rerun's ``origin``: {"run_id", "run_dir", "cases"}, the cases all planned here; None when not given."""
    if origin is None:
        return None
    if not isinstance(origin, dict):
        raise RunPlanError(f"origin={quote(origin)}: must be a mapping of run_id, run_dir, cases")
    unknown = sorted(set(origin) - {"run_id", "run_dir", "cases"}, key=str)
    if unknown:
        raise RunPlanError(f"origin.{unknown[0]}: is not a field (the fields are run_id, run_dir, cases)")
    if not names.is_name(origin.get("run_id")):
        raise RunPlanError(f"origin.run_id={names.quote(origin.get('run_id'))}: must be {names.NAME_RULE}")
    run_dir = origin.get("run_dir")
    if not (isinstance(run_dir, str) and run_dir.startswith("/") and "\0" not in run_dir):
        raise RunPlanError(f"origin.run_dir={quote(run_dir)}: must be an absolute path")
    cases = origin.get("cases")
    if not isinstance(cases, list) or sorted(cases, key=str) != sorted(case_ids_planned, key=str):
        raise RunPlanError(f"origin.cases={quote(cases)}: must be exactly the cases planned "
                           f"{sorted(case_ids_planned)} (a rerun plans the cases that did not pass there)")
    return {"run_id": origin["run_id"], "run_dir": run_dir, "cases": list(cases)}


def plan_documents(run_id, cases, allow_dirty=False, runner_kind="sim", defects=(), artifacts=None, origin=None,
                   timeouts=None, rails=None, service_addresses=None, case_hosts=None):
    """run.json and each case.json, checked: case ids unique and path-safe, each with a profile; ``timeouts``
    (the play's node-step seconds), ``rails`` and ``service_addresses`` (each case host's host var) go into
    each case's launch plan; ``case_hosts`` ({case id: {role: inventory host}}, the case schedule's lane hosts)
    names the host whose rails and address each case role takes (default: the profile's)."""
    if not names.is_name(run_id):  # it names the run directory (an AWX survey may send anything)
        raise RunPlanError(f"run_id={names.quote(run_id)}: must be {names.NAME_RULE}")
    if runner_kind not in RUNNER_KINDS:
        raise RunPlanError(f"runner_kind={quote(runner_kind)}: must be one of {', '.join(RUNNER_KINDS)}")
    defects = cast_names("defects", defects)
    artifacts = check_artifacts(artifacts, runner_kind)
    seconds = launch_seconds(timeouts)
    case_hosts = check_case_hosts(case_hosts)
    seen = set()
    for index, case in enumerate(cases):
        case_id = case.get("id") if isinstance(case, dict) else None
        if not names.is_name(case_id):
            raise RunPlanError(f"cases[{index}].id={names.quote(case_id)}: must be {names.NAME_RULE}")
        if case_id in seen:
            raise RunPlanError(f"cases[{index}].id={case_id!r}: must be unique in the run")
        if not isinstance(case.get("profile"), dict):
            raise RunPlanError(f"cases[{index}].profile: must be the validated profile (a mapping)")
        ids = case_ids(run_id, case_id)
        for name in (ids["supervisor_run_id"], *ids["registrations"].values()):
            if not names.is_name(name):  # they name locks, files and rendezvous peers on the nodes
                raise RunPlanError(f"cases[{index}].id={case_id!r}: the ID {name!r} (run_id-case_id[-role]) must "
                                   f"be {names.NAME_RULE}; use a shorter run_id or case ID")
        for field in ("defects", "leave_out"):
            for index2, name in enumerate(case.get(field) or ()):
                if not names.is_name(name):
                    raise RunPlanError(f"cases[{index}].{field}[{index2}]={names.quote(name)}: must be "
                                       f"{names.NAME_RULE}")
        seen.add(case_id)
    # A case's own switches (a defect matrix: one case per switch), beside the run's.
    case_defects = {c["id"]: list(c["defects"]) for c in cases if c.get("defects")}
    # And the observers a diagnostic case left out of its preload.
    case_left_out = {c["id"]: list(c["leave_out"]) for c in cases if c.get("leave_out")}
    hosts = {c["id"]: {role: c["profile"].get(role) for role in ROLES} for c in cases}
    run = {"schema": RUN_SCHEMA[0], "version": RUN_SCHEMA[1], "run_id": run_id,
           "cases": [c["id"] for c in cases], "profiles": {c["id"]: c["profile"] for c in cases}, "hosts": hosts,
           "allow_dirty": bool(allow_dirty), "runner_kind": runner_kind, "defects": defects}
    if case_defects:
        run["case_defects"] = case_defects
    if case_left_out:
        run["case_left_out"] = case_left_out
    if artifacts is not None:
        run["artifacts"] = artifacts
    origin = check_origin(origin, run["cases"])
    if origin is not None:
        run["origin"] = origin
    launches = {c["id"]: launch_entries(run_id, c, defects, runner_kind, artifacts, seconds, rails, service_addresses,
                                        case_hosts.get(c["id"])) for c in cases}
    per_case = {c["id"]: {"schema": CASE_SCHEMA[0], "version": CASE_SCHEMA[1], "case_id": c["id"],
                          "profile": c["profile"], "hosts": hosts[c["id"]], **case_ids(run_id, c["id"]),
                          **({"defects": case_defects[c["id"]]} if c["id"] in case_defects else {}),
                          "launch": launches[c["id"]]}
                for c in cases}
    return run, per_case


def write_plan(run_dir, run_id, cases, check_mode=False, schedule=None, **options):
    """Write the plan; returns changed. Refuses a directory holding another run's plan. ``schedule`` (the case
    schedule, when given) is written beside run.json as schedule.json: which case ran on which lane's RNICs."""
    run, per_case = plan_documents(run_id, cases, **options)
    run_json = os.path.join(run_dir, "run.json")
    if os.path.lexists(run_json):
        existing = _read_json(run_json, PLAN_READ_LIMIT, f"run_dir={run_dir}: run.json exists but cannot be read")
        if not isinstance(existing, dict):
            raise RunPlanError(f"run_dir={run_dir}: run.json holds {quote(existing)}, not a run plan; "
                               "receipts of two runs must never mix")
        if existing.get("run_id") != run_id:
            raise RunPlanError(f"run_dir={run_dir}: holds run {quote(existing.get('run_id'))}, not {run_id!r}; "
                               "receipts of two runs must never mix")
        if existing == run:
            return False
    if check_mode:
        return True
    makedirs_private(run_dir)
    if schedule:
        atomic_write_text(os.path.join(run_dir, "schedule.json"), case_schedule.render(schedule))
    for case_id, case in per_case.items():
        case_dir = os.path.join(run_dir, "cases", case_id)
        makedirs_private(case_dir)
        atomic_write_json(os.path.join(case_dir, "case.json"), case, mode=FILE_MODE)
    atomic_write_json(run_json, run, mode=FILE_MODE)  # last: a run.json always describes case dirs that exist
    return True


VERDICT_READ_LIMIT = 256 << 20  # a verdict of many cases with every finding's text


def _read_json(path, limit, problem):
    """The JSON document of ``path`` (read within ``limit`` bytes), None when there is no such file; else
    RunPlanError "<problem> (<why>)". The plan's one reader of its own and an earlier run's files."""
    try:
        return json.loads(read_regular_bytes(path, limit).decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError, OrbiteError) as error:
        raise RunPlanError(f"{problem} ({error})") from None


def rerun_origin(run_dir, verdict=None):
    """What a rerun of ``run_dir`` plans: the cases that did not pass there (FAIL, or not verified), each with
    the profile and hosts it ran with. {"origin": {"run_id", "run_dir", "cases"}, "profiles": {case: profile},
    "hosts": {case: hosts}, "verdict": the run's verdict or None}.

    The cases come from the run's plan (run.json) and its verdict (verdict.json): a planned case the verdict
    does not name as PASS did not pass (a run never verified passed none). A run whose every case passed has
    nothing to rerun (an error, not an empty run). ``verdict``: the run's verdict as just verified, read instead
    of its verdict.json.
    """
    run_dir = os.path.normpath(run_dir) if isinstance(run_dir, str) else run_dir
    if not (isinstance(run_dir, str) and run_dir.startswith("/")):
        raise RunPlanError(f"rerun_from={quote(run_dir)}: must be an absolute run directory")
    plan_path = os.path.join(run_dir, "run.json")
    plan = _read_json(plan_path, PLAN_READ_LIMIT, f"rerun_from: {plan_path}: the plan (run.json) cannot be read")
    if not isinstance(plan, dict) or plan.get("schema") != RUN_SCHEMA[0] or not names.is_name(plan.get("run_id")):
        raise RunPlanError(f"rerun_from={run_dir}: holds no run plan (run.json of schema {RUN_SCHEMA[0]})")
    planned, profiles = plan.get("cases"), plan.get("profiles")
    if not isinstance(planned, list) or not isinstance(profiles, dict) or not all(
            names.is_name(c) and isinstance(profiles.get(c), dict) for c in planned):
        raise RunPlanError(f"rerun_from={run_dir}: run.json cases={quote(planned)}: each must be a case ID with its "
                           "profile in profiles")
    if verdict is None:
        verdict_path = os.path.join(run_dir, "verdict.json")
        verdict = _read_json(verdict_path, VERDICT_READ_LIMIT,
                             f"rerun_from: {verdict_path}: the verdict (verdict.json) cannot be read")
    passed = set()
    if isinstance(verdict, dict) and verdict.get("run_id") == plan["run_id"]:
        passed = {c.get("case") for c in verdict.get("cases") or []
                  if isinstance(c, dict) and c.get("verdict") == "PASS"}
    again = [case for case in planned if case not in passed]
    if not again:
        raise RunPlanError(f"rerun_from={run_dir}: every planned case of run {plan['run_id']} passed "
                           f"({', '.join(planned)}): nothing to rerun", code="run_plan.nothing_to_rerun")
    hosts = plan.get("hosts") if isinstance(plan.get("hosts"), dict) else {}
    return {"origin": {"run_id": plan["run_id"], "run_dir": run_dir, "cases": again},
            "profiles": {case: profiles[case] for case in again},
            "hosts": {case: hosts.get(case) for case in again},
            "verdict": verdict.get("verdict") if isinstance(verdict, dict) else None}
