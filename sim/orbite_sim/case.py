# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Load and validate a runner case file (docs/runner-contract.md section 2).

Every rule broken gives a CaseError whose message names the field, the value and the rule. Nothing
is opened or contacted before this passes.
"""

import json
import os
import re

from . import PROTOCOL
from .errors import CaseError

SUPPORTED_MODES = ("installed-host", "installed-rail-accounting", "installed-restart", "installed-interruption",
                   "installed-lost-completion", "installed-cleanup-failure", "installed-inflight-dma",
                   "installed-memory-cleanup")
RESTART_MODE = "installed-restart"
# installed-interruption runs the restart roles with one authorization held before each restart.
INTERRUPTION_MODE = "installed-interruption"
# installed-lost-completion runs them with one round's completions withheld by cq_fault before each restart.
LOST_MODE = "installed-lost-completion"
# installed-cleanup-failure (docs/cleanup_failure.md) runs them with a native destroy failed before the kill.
CLEANUP_MODE = "installed-cleanup-failure"
RESTART_MODES = (RESTART_MODE, INTERRUPTION_MODE, LOST_MODE, CLEANUP_MODE)
# installed-inflight-dma (docs/inflight_dma.md): one generation, one WR interrupted part way, both engines survive.
INFLIGHT_MODE = "installed-inflight-dma"
INFLIGHT_MAX_BLOCK = 16 << 20
# The cleanup kinds this runner implements: qp (requester.py), cq, channel and pd (cleanup_kinds.py).
CLEANUP_KINDS = ("qp", "cq", "channel", "pd")
# installed-memory-cleanup (docs/memory_cleanup.md): one process per role, two engines in it (the old one's MR or
# MW release fails, a fresh engine replaces it at the same addresses).
MEMORY_MODE = "installed-memory-cleanup"
MEMORY_KINDS = ("mr", "mw")
FAULT_ROLES = ("source", "requester")
RESTART_GENERATIONS = (2, 3)
OBSERVERS = ("accounting", "cq_fault", "uverbs_fault", "inflight_fault")
DEFECTS = (
    "corrupt_byte",
    "overwrite_guard",
    "extra_qp",
    "no_qp_reuse",
    "skew_native_counter",
    "skip_drain",
    "mr_one_context",
    "payload_over_rendezvous",
    "wrong_slicing",
    "stale_input",
    "exceed_sq_depth",
    "understate_sq_depth",
    "single_rail",
    "serial_parents",
    "serial_round_two",
)
# installed-restart only (docs/restart.md): each breaks one restart rule (tests/unit/sim/test_sim_restart.py).
RESTART_DEFECTS = (
    "stale_epoch_accepted",
    "stale_epoch_qp",
    "stale_epoch_wr",
    "survivor_reregisters",
    "reuse_epoch",
    "drop_cached_qps",
    "keep_a_dead_peers_qp",
)
# installed-interruption only (docs/interruption.md): each breaks one interruption rule
# (tests/unit/sim/test_sim_interruption.py). The relay's own switch (leak_grant) is the relay's.
INTERRUPTION_DEFECTS = (
    "free_busy_ok",
    "bytes_while_held",
    "qp_while_held",
    "skip_rq_drain",
    "survivor_reports_bytes",
)
# installed-lost-completion only (docs/lost_completion.md): each breaks one lost_completion rule
# (tests/unit/sim/test_sim_lost_completion.py).
LOST_DEFECTS = (
    "fabricate_cqe",
    "lost_debt_cleared",
    "lost_reports_bytes",
    "drain_before_destroy",
    "source_keeps_grants",
    "drain_first_renumbered",
)
# installed-cleanup-failure only (docs/cleanup_failure.md): each breaks one cleanup rule
# (tests/unit/sim/test_sim_cleanup_failure.py).
CLEANUP_DEFECTS = (
    "retry_destroy",
    "drain_after_eio",
    "free_unquiesced_ok",
    "cpu_write_ok",
    "release_quarantined",
    "drop_charges",
    "keep_released",
    "premature_device_close",
)
# installed-memory-cleanup only (docs/memory_cleanup.md): each breaks one memory_cleanup rule
# (tests/unit/sim/test_sim_memory_cleanup.py); the fresh engine accepting an old epoch is the restart
# switch stale_epoch_accepted.
MEMORY_DEFECTS = (
    "retry_dereg",
    "release_registration",
    "release_window",
    "pd_destroy_ok",
    "free_quarantine_early",
)
# installed-inflight-dma only (docs/inflight_dma.md): each breaks one inflight_dma rule
# (tests/unit/sim/test_sim_inflight_dma.py).
INFLIGHT_DEFECTS = (
    "inflight_fabricate_success",
    "inflight_reports_bytes",
    "inflight_drain_first",
    "inflight_full_copy",
    "inflight_untouched",
    "inflight_no_survival",
)
ALL_DEFECTS = (DEFECTS + RESTART_DEFECTS + INTERRUPTION_DEFECTS + LOST_DEFECTS + CLEANUP_DEFECTS + INFLIGHT_DEFECTS
               + MEMORY_DEFECTS)
# The one table of which switch belongs to which mode (the others go with any mode): the runner's check below and
# the controller's preflight (it asks the runner: orbite-sim-runner --defect-table) read it.
SWITCH_MODES = {name: mode for mode, switches in ((INTERRUPTION_MODE, INTERRUPTION_DEFECTS), (LOST_MODE, LOST_DEFECTS),
                                                  (CLEANUP_MODE, CLEANUP_DEFECTS), (INFLIGHT_MODE, INFLIGHT_DEFECTS),
                                                  (MEMORY_MODE, MEMORY_DEFECTS))
                for name in switches}


def defect_table():
    """{mode: the defect switches a case of that mode may carry}, from SWITCH_MODES."""
    return {mode: [name for name in ALL_DEFECTS if SWITCH_MODES.get(name, mode) == mode] for mode in SUPPORTED_MODES}


TOP_FIELDS = (
    "schema", "version", "protocol", "run_id", "role", "generation", "profile", "root", "rails",
    "discovery", "service_address", "peer_address", "registration_id", "peer_registration_id",
    "observers", "observer_log_dir", "seed", "timeouts", "defects", "verbs_library",
)
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
RAIL_COUNT = 2
MAX_PARENTS = 32
MAX_PAYLOAD = 32 << 20
MAX_LANES = 3
# The gate's bound on payload WRs a round (the profile model's MAX_WRS_PER_ROUND, refused in the preflight), kept
# here as this runner's own: a case past it is refused before anything is set up.
MAX_WRS_PER_ROUND = 32768
DEFAULT_CONNECT_S = 30.0
DEFAULT_ROUND_S = 300.0
# How long a process idles at a restart point for the controller's kill (the fault role) or for its
# peer's death and replacement (the survivor).
DEFAULT_RESTART_S = 300.0
# installed-interruption: how long the requester waits for a grant the relay holds (each wait times out).
DEFAULT_GRANT_S = 1.0
TIMEOUTS = ("connect_s", "round_s", "restart_s", "grant_s")


def _short(value):
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fail(field, value, rule):
    raise CaseError(f"case field {field} = {_short(value)}: {rule}")


def _int(obj, field, path, low=None, high=None, default=None, required=True):
    if field not in obj:
        if required:
            _fail(path, None, "is required")
        return default
    value = obj[field]
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(path, value, "must be an integer")
    if low is not None and value < low:
        _fail(path, value, f"must be >= {low}")
    if high is not None and value > high:
        _fail(path, value, f"must be <= {high}")
    return value


def _str(obj, field, path, required=True, default=None, max_len=None):
    if field not in obj:
        if required:
            _fail(path, None, "is required")
        return default
    value = obj[field]
    if not isinstance(value, str) or not value:
        _fail(path, value, "must be a non-empty string")
    if max_len is not None and len(value) > max_len:
        _fail(path, value, f"must be at most {max_len} characters")
    return value


def parse_address(text, path):
    """'host:port' or '[v6]:port' -> (host, port)."""
    if not isinstance(text, str) or ":" not in text:
        _fail(path, text, "must be 'host:port' (IPv6 as '[addr]:port')")
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            _fail(path, text, "IPv6 addresses must be written '[addr]:port'")
    else:
        host, _sep, port = text.rpartition(":")
        if ":" in host:
            _fail(path, text, "IPv6 addresses must be written '[addr]:port'")
    if not host or not port.isdigit() or int(port) > 65535:
        _fail(path, text, "must be 'host:port' with a port 0..65535")
    return host, int(port)


def format_address(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def load_case(path):
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except OSError as exc:
        raise CaseError(f"case file {path!r}: cannot be read ({exc.strerror})") from None
    except ValueError as exc:
        raise CaseError(f"case file {path!r}: is not valid JSON ({exc})") from None
    return validate_case(raw)


def validate_case(raw):
    """Validated, normalized case dict (defaults filled)."""
    if not isinstance(raw, dict):
        _fail("(top level)", raw, "must be a JSON object")
    unknown = sorted(set(raw) - set(TOP_FIELDS))
    if unknown:
        _fail(unknown[0], raw[unknown[0]], "is not a case field (see docs/runner-contract.md section 2)")
    if raw.get("schema") != "orbite.runner-case":
        _fail("schema", raw.get("schema"), "must be 'orbite.runner-case'")
    if raw.get("version") != 1:
        _fail("version", raw.get("version"), "must be 1")
    if raw.get("protocol") != PROTOCOL:
        _fail("protocol", raw.get("protocol"), f"must be {PROTOCOL!r}")
    case = {"protocol": PROTOCOL}
    case["run_id"] = _str(raw, "run_id", "run_id")
    role = raw.get("role")
    if role not in ("source", "requester"):
        _fail("role", role, "must be 'source' or 'requester'")
    case["role"] = role
    case["generation"] = _int(raw, "generation", "generation", low=1)
    case["profile"] = _validate_profile(raw.get("profile"))
    root = raw.get("root", "/")
    if not isinstance(root, str) or not os.path.isabs(root):
        _fail("root", root, "must be an absolute path")
    case["root"] = root
    auto = case["profile"].get("discovery") == "auto"
    if auto:
        if "rails" in raw:
            _fail("rails", raw["rails"], "must be absent with profile.discovery 'auto' (no device pins)")
        case["discovery"] = _validate_discovery(raw.get("discovery"))
        case["rails"] = None
    else:
        if "discovery" in raw:
            _fail("discovery", raw["discovery"], "is only allowed with profile.discovery 'auto'")
        case["rails"] = _validate_rails(raw.get("rails"))
        case["discovery"] = None
    if role == "source":
        case["service_address"] = _str(raw, "service_address", "service_address")
        parse_address(case["service_address"], "service_address")
        case["peer_address"] = raw.get("peer_address")
    else:
        case["peer_address"] = _str(raw, "peer_address", "peer_address")
        _host, port = parse_address(case["peer_address"], "peer_address")
        if port == 0:
            _fail("peer_address", case["peer_address"], "must name the source's real port (not 0)")
        case["service_address"] = raw.get("service_address")
    case["registration_id"] = _str(raw, "registration_id", "registration_id", max_len=128)
    case["peer_registration_id"] = _str(raw, "peer_registration_id", "peer_registration_id",
                                        required=False, max_len=128)
    case["observers"] = _name_list(raw, "observers", OBSERVERS)
    case["observer_log_dir"] = _str(raw, "observer_log_dir", "observer_log_dir", required=False)
    case["seed"] = _int(raw, "seed", "seed", low=0, high=(1 << 64) - 1, required=False)
    case["timeouts"] = _validate_timeouts(raw.get("timeouts", {}))
    case["defects"] = _name_list(raw, "defects", ALL_DEFECTS)
    case["verbs_library"] = _validate_verbs_library(raw.get("verbs_library"))
    generations = case["profile"].get("generations", 1)
    if case["generation"] > generations:
        _fail("generation", case["generation"], f"must be <= profile.generations ({generations})")
    restart = case["profile"]["mode"] in RESTART_MODES
    case["survivor"] = restart and role != case["profile"]["fault_role"]
    if restart:
        case["timeouts"].setdefault("restart_s", DEFAULT_RESTART_S)
    if case["profile"]["mode"] in (INTERRUPTION_MODE, LOST_MODE, CLEANUP_MODE):
        # lost completions: how long each batch of the lost round waits for completions that never come;
        # cleanup: the wait for a withheld completion.
        case["timeouts"].setdefault("grant_s", DEFAULT_GRANT_S)
    for i, name in enumerate(case["defects"]):
        owner = SWITCH_MODES.get(name)
        if owner is not None and owner != case["profile"]["mode"]:
            _fail(f"defects[{i}]", name, f"is an {owner} switch")
    if case["survivor"] and case["generation"] != 1:
        _fail("generation", case["generation"], "the survivor of installed-restart starts once, in generation 1")
    return case


def _validate_verbs_library(spec):
    """None (the system's libibverbs.so.1) or {path, sha256}: the pinned verbs provider to load."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        _fail("verbs_library", spec, "must be null or an object with path and sha256")
    extra = sorted(set(spec) - {"path", "sha256"})
    if extra:
        _fail(f"verbs_library.{extra[0]}", spec[extra[0]], "is not a verbs_library field (path, sha256)")
    path = spec.get("path")
    if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
        _fail("verbs_library.path", path, "must be an absolute path")
    sha256 = spec.get("sha256")
    if not isinstance(sha256, str) or not SHA256_RE.match(sha256):
        _fail("verbs_library.sha256", sha256, "must be 64 lower-case hex digits (the library's sha256)")
    return {"path": path, "sha256": sha256}


def _validate_profile(profile):
    if not isinstance(profile, dict):
        _fail("profile", profile, "must be an object (the validated profile)")
    p = dict(profile)
    mode = p.get("mode")
    if mode not in SUPPORTED_MODES:
        _fail("profile.mode", mode, "the simulated runner supports " + ", ".join(SUPPORTED_MODES))
    if p.get("operation") not in ("read", "write"):
        _fail("profile.operation", p.get("operation"), "must be 'read' or 'write'")
    if not isinstance(p.get("rdma_events"), bool):
        _fail("profile.rdma_events", p.get("rdma_events"), "must be a boolean")
    _int(p, "parents", "profile.parents", low=1, high=MAX_PARENTS)
    _int(p, "payload", "profile.payload", low=1, high=MAX_PAYLOAD)
    _int(p, "block", "profile.block", low=1)
    _int(p, "num_lanes", "profile.num_lanes", low=1, high=MAX_LANES)
    mask = _int(p, "mask", "profile.mask", low=1, high=3)
    del mask
    if "discovery" in p and p["discovery"] != "auto":
        _fail("profile.discovery", p["discovery"], "must be 'auto' when present")
    if mode in RESTART_MODES:
        if p.get("fault_role") not in FAULT_ROLES:
            _fail("profile.fault_role", p.get("fault_role"), f"must be 'source' or 'requester' ({mode})")
        if p.get("generations") not in RESTART_GENERATIONS:
            _fail("profile.generations", p.get("generations"), f"must be 2 or 3 ({mode})")
        if mode in (INTERRUPTION_MODE, LOST_MODE) and p["payload"] > p["block"]:
            _fail("profile.payload", p["payload"], f"must be <= profile.block ({p['block']}): one slice per parent "
                  f"({mode})")
        if mode == CLEANUP_MODE:
            _validate_cleanup(p)
    elif p.get("generations", 1) != 1:
        _fail("profile.generations", p.get("generations"), f"must be 1 in mode {mode}")
    if mode == MEMORY_MODE:
        _validate_memory(p)
    if mode == INFLIGHT_MODE:
        _validate_inflight(p)
    # ceil() bounds what wrong_slicing can produce too.
    wrs = p["parents"] * -(-p["payload"] // p["block"])
    if wrs > MAX_WRS_PER_ROUND:
        _fail("profile.block", p["block"],
              f"gives {wrs} payload WRs per round; the simulated runner allows at most {MAX_WRS_PER_ROUND}")
    return p


def _validate_inflight(p):
    """installed-inflight-dma (docs/profiles.md): one parent, one lane, one rail, one WR of at most 16 MiB that
    can stop part way."""
    for field, allowed in (("parents", (1,)), ("num_lanes", (1,)), ("mask", (1, 2))):
        if p[field] not in allowed:
            _fail(f"profile.{field}", p[field], f"must be one of {list(allowed)} ({INFLIGHT_MODE})")
    if p["payload"] != p["block"] or not 2 <= p["block"] <= INFLIGHT_MAX_BLOCK:
        _fail("profile.block", p["block"], f"must equal profile.payload ({p['payload']}), 2 .. {INFLIGHT_MAX_BLOCK} "
              f"bytes: one WR ({INFLIGHT_MODE})")


def _validate_cleanup(p):
    """installed-cleanup-failure (docs/profiles.md): the requester's one parent, one slice, one lane, one rail,
    two generations; the cleanup kind defaults to qp."""
    kind = p.setdefault("cleanup_kind", "qp")
    if kind not in CLEANUP_KINDS:
        _fail("profile.cleanup_kind", kind, "the simulated runner implements " + ", ".join(CLEANUP_KINDS)
              + " (installed-cleanup-failure)")
    _apply_rules(p, (("fault_role", p["fault_role"] == "requester", "must be 'requester'"),
                     ("generations", p["generations"] == 2, "must be 2"), *_one_slice_one_rail(p),
                     ("rdma_events", kind != "channel" or p["rdma_events"] is True,
                      "must be true when cleanup_kind is channel (channel failure needs event progress)")),
                 CLEANUP_MODE)


def _one_slice_one_rail(p):
    """The shape both cleanup modes share (docs/profiles.md): one parent, one slice, one lane, one rail."""
    return (("parents", p["parents"] == 1, "must be 1"),
            ("payload", p["payload"] <= p["block"], f"must be <= profile.block ({p['block']})"),
            ("num_lanes", p["num_lanes"] == 1, "must be 1"),
            ("mask", p["mask"] in (1, 2), "must be 1 or 2"))


def _apply_rules(p, rules, mode):
    """(field, ok, rule) triples: the first broken one is a CaseError naming field, value, rule and mode."""
    for field, ok, rule in rules:
        if not ok:
            _fail(f"profile.{field}", p.get(field), f"{rule} ({mode})")


def _validate_memory(p):
    """installed-memory-cleanup (docs/profiles.md): one parent, one slice, one lane, one rail; an MR failure of
    either role, an MW failure of the source."""
    kind = p.get("cleanup_kind")
    if kind not in MEMORY_KINDS:
        _fail("profile.cleanup_kind", kind, "must be 'mr' or 'mw' (installed-memory-cleanup)")
    roles = FAULT_ROLES if kind == "mr" else ("source",)
    _apply_rules(p, (("fault_role", p.get("fault_role") in roles, "must be " + " or ".join(map(repr, roles))
                      + f" with cleanup_kind {kind!r}"), *_one_slice_one_rail(p)), MEMORY_MODE)


def _validate_rails(rails):
    if not isinstance(rails, list) or len(rails) != RAIL_COUNT:
        _fail("rails", rails, f"must be a list of exactly {RAIL_COUNT} rails (index = rail number)")
    out = []
    for i, rail in enumerate(rails):
        path = f"rails[{i}]"
        if not isinstance(rail, dict):
            _fail(path, rail, "must be an object with device, port, gid_index")
        extra = sorted(set(rail) - {"device", "port", "gid_index"})
        if extra:
            _fail(f"{path}.{extra[0]}", rail[extra[0]], "is not a rail field (device, port, gid_index)")
        device = _str(rail, "device", f"{path}.device")
        if "/" in device or device in (".", ".."):
            _fail(f"{path}.device", device, "must be a device name without '/'")
        out.append({
            "device": device,
            "port": _int(rail, "port", f"{path}.port", low=1, high=255),
            "gid_index": _int(rail, "gid_index", f"{path}.gid_index", low=0, high=255),
        })
    if out[0]["device"] == out[1]["device"] and out[0]["port"] == out[1]["port"]:
        _fail("rails[1]", rails[1], "must name a different RNIC port than rails[0]")
    return out


def _validate_discovery(disc):
    if not isinstance(disc, dict):
        _fail("discovery", disc, "must be an object with whitelist and blacklist")
    extra = sorted(set(disc) - {"whitelist", "blacklist"})
    if extra:
        _fail(f"discovery.{extra[0]}", disc[extra[0]], "is not a discovery field (whitelist, blacklist)")
    out = {}
    for key in ("whitelist", "blacklist"):
        value = disc.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            _fail(f"discovery.{key}", value, "must be a list of device names")
        out[key] = list(value)
    return out


def _validate_timeouts(timeouts):
    if not isinstance(timeouts, dict):
        _fail("timeouts", timeouts, "must be an object with connect_s, round_s, restart_s and/or grant_s")
    out = {"connect_s": DEFAULT_CONNECT_S, "round_s": DEFAULT_ROUND_S}
    for key, value in timeouts.items():
        if key not in TIMEOUTS:
            _fail(f"timeouts.{key}", value, "is not a timeout (connect_s, round_s, restart_s, grant_s)")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            _fail(f"timeouts.{key}", value, "must be a positive number of seconds")
        out[key] = float(value)
    return out


def _name_list(raw, field, allowed):
    value = raw.get(field, [])
    if not isinstance(value, list):
        _fail(field, value, "must be a list")
    for i, name in enumerate(value):
        if name not in allowed:
            _fail(f"{field}[{i}]", name, "must be one of " + ", ".join(allowed))
    if len(set(value)) != len(value):
        _fail(field, value, "must not repeat a name")
    return list(value)
