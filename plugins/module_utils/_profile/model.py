# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The qualification profile model: parse, validate against the gate's rules, derive the workload.

One job: turn a profile (dict, JSON or YAML text, or a file) into a normalized profile plus the
workload the gate must see, or into *every* rule it breaks. Each broken rule is a ``Violation``
naming the field, the value and the rule, with a stable ``code`` that tests and docs refer to.
Any exception other than ``ProfileError`` escaping this module is a bug.

A profile is input from whoever fills the survey or writes the file, so loading is bounded: at
most MAX_PROFILE_BYTES of text, read only from a regular file, YAML without aliases or merge keys
(a few hundred bytes of aliases expand to GiBs), no duplicate key in JSON or YAML (the last one
would silently win), nesting at most MAX_DEPTH levels and at most MAX_NODES values; host names
follow the collection's name grammar; every value a message or a violation shows is cut.

Stdlib only (PyYAML is used when present for YAML text), Python >= 3.9.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._common.numbers import DIGITS_MAX, ascii_int
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import QUOTE_LIMIT, OrbiteError, quote
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    FileTooLarge,
    NotRegularFile,
    read_regular_bytes,
)

PROTOCOL = "orbite-installed-host-v4"

KIB = 1 << 10
MIB = 1 << 20

# Gate-wide bounds (seed 000, "Run the two-host profile").
MAX_BACKING_PER_PEER = 256 * MIB
MIN_PARENTS, MAX_PARENTS = 1, 32
MIN_PAYLOAD, MAX_PAYLOAD = 1, 32 * MIB
MIN_LANES, MAX_LANES = 1, 3
RAIL_COUNT = 2
VALID_MASKS = (1, 2, 3)

# Guard bytes on *each* side of every destination region; they count towards the backing bound.
GUARD_BYTES = 4 * KIB

# This design's reading of "only installed-inflight-dma allows blocks up to 16 MiB": every other
# mode caps the block at 1 MiB.
DEFAULT_MAX_BLOCK = 1 * MIB
INFLIGHT_MAX_BLOCK = 16 * MIB

ROUNDS_PER_GENERATION = 3
SEND_QUEUE_DEPTH = 8  # payload WRs in flight per QP, at most
# Payload WRs a round, at most, counted as parents x ceil(payload / block) (the most slices any slicing of the
# profile makes): what the runners (sim/orbite_sim/case.py, runners/reference/src/case.rs: each its own constant),
# the ledgers' WR columns and the verifier's receipt caps (_verify/reading.py) are sized for. Within every other
# bound a profile could ask for 268 million (32 parents of 8 MiB, block 1): hours of churn, receipts past their caps.
MAX_WRS_PER_ROUND = 32768

# Frozen rail-accounting profile (seed 000, "Physical rail accounting").
RAIL_ACCOUNTING_PARENTS = 16
RAIL_ACCOUNTING_PAYLOAD = 4194305
RAIL_ACCOUNTING_BLOCK = 1 * MIB
RAIL_ACCOUNTING_MIN_OUTSTANDING_PER_RAIL_QP = 2

LOST_COMPLETION_PAYLOAD = 1 * MIB
LOST_COMPLETION_SHAPES = ((8, 1), (16, 3))  # (parents, num_lanes)

# installed-inflight-dma (docs/inflight_dma.md): the rounds both engines run after the interrupted one, and the
# smallest payload whose copy can stop part way (some bytes landed, some not).
INFLIGHT_SURVIVAL_ROUNDS = 3
INFLIGHT_MIN_PAYLOAD = 2

MODES = (
    "installed-host",
    "installed-rail-accounting",
    "installed-restart",
    "installed-interruption",
    "installed-lost-completion",
    "installed-cleanup-failure",
    "installed-inflight-dma",
    "installed-memory-cleanup",
)
OPERATIONS = ("read", "write")
KINDS = ("cpu",)
TRANSPORTS = ("rdma",)
FAULT_ROLES = ("source", "requester")
CLEANUP_FAILURE_KINDS = ("qp", "cq", "channel", "pd")
MEMORY_CLEANUP_KINDS = ("mr", "mw")
# installed-cleanup-failure: the kinds whose cleanup round reuses a withheld completion (the pd case is idle).
CLEANUP_WITHHELD_KINDS = ("qp", "cq", "channel")
# Seed 000, "CQ, completion-channel and PD dependency failures": per kind, the object whose destroy fails EBUSY,
# the dependent object the fixture keeps that blocks it, and which owners must stay retained / be released
# after the fixture drops its handles (provider object kinds; "allocation" is the batch's backing, "grant" the
# survivor's grant, "sq"/"batch" the quarantined batch's charges). "released" also names what the engine's own
# quiesce releases on the fault rail: the batch's QP (cq), its QP and engine CQ (channel), every QP, MR, CQ and
# channel of the rail (pd: "PD and device only").
CLEANUP_OWNERS = {
    "cq": {"destroy": "cq", "blocker": "qp", "retained": ("cq", "pd", "ctx", "grant", "sq", "batch", "allocation"),
           "released": ("qp",)},
    "channel": {"destroy": "channel", "blocker": "cq", "retained": ("channel", "ctx", "pd", "grant", "allocation"),
                "released": ("qp", "cq")},
    "pd": {"destroy": "pd", "blocker": "mw", "retained": ("pd", "ctx"),
           "released": ("qp", "mr", "cq", "channel", "grant", "batch", "allocation")},
}

# Which native observer each mode loads, and into which role's runner.
_OBSERVERS = {
    "installed-rail-accounting": ("accounting", "requester"),
    "installed-lost-completion": ("cq_fault", "requester"),
    "installed-cleanup-failure": ("uverbs_fault", "requester"),
    "installed-inflight-dma": ("inflight_fault", "requester"),
    "installed-memory-cleanup": ("uverbs_fault", "fault_role"),
    # The survivor's log witnesses its stale-epoch attempts (docs/restart.md): one process, one log.
    "installed-restart": ("accounting", "survivor"),
}

# Typed errors (docs/receipts.md 1.7) a mode provokes on purpose in the ledgers' `errors` (top
# level and per round), as (error, operation). The healthy modes provoke none (the strict GID 255
# request of `discovery: auto` is recorded in `discovery.strict_gid_request`, not there); each
# fault mode's issue adds its own with its rules. Never the runner's `expected` flag.
PROVOKED_ERRORS = {
    "installed-host": (),
    "installed-rail-accounting": (),
    # The survivor's stale-epoch attempts (docs/restart.md): both must fail EpochMismatch.
    "installed-restart": (("EpochMismatch", "open_segment"), ("EpochMismatch", "submit")),
    # docs/interruption.md: the restart's, plus the held round's wait timeouts and busy free() calls, and a
    # surviving requester's batches failed when the source died holding their grant.
    "installed-interruption": (("EpochMismatch", "open_segment"), ("EpochMismatch", "submit"), ("Timeout", "wait"),
                               ("BatchBusy", "free"), ("PeerLost", "wait")),
    # docs/lost_completion.md: the restart's, plus the lost round's wait timeouts and busy free() calls, and
    # a surviving requester's batches failed when the source died with their completions lost.
    "installed-lost-completion": (("EpochMismatch", "open_segment"), ("EpochMismatch", "submit"),
                                  ("Timeout", "wait"), ("BatchBusy", "free"), ("PeerLost", "wait")),
    # docs/cleanup_failure.md: the restart's, plus the cleanup round's: the wait for the withheld completion
    # times out, the close fails Unquiesced (twice: the repeated close too), free() is busy and a CPU write
    # into the quarantined allocation is refused.
    "installed-cleanup-failure": (("EpochMismatch", "open_segment"), ("EpochMismatch", "submit"),
                                  ("Timeout", "wait"), ("Unquiesced", "close"), ("BatchBusy", "free"),
                                  ("Unquiesced", "write")),
    # docs/memory_cleanup.md: the fault role's failed dereg_mr / dealloc_mw (the old engine's close fails
    # Unquiesced); the fresh engines' refusals of the old epochs are in their own section.
    "installed-memory-cleanup": (("Unquiesced", "close"),),
    # docs/inflight_dma.md: the interrupted WR's batch fails (its wait sees the error completion).
    "installed-inflight-dma": (("TransferFailed", "wait"),),
}

# The strict GID index the separate engine of `discovery: auto` requests (docs/runner-contract.md §6).
STRICT_GID_INDEX = 255

REQUIRED_FIELDS = (
    "source",
    "requester",
    "source_kind",
    "requester_kind",
    "transport",
    "mode",
    "operation",
    "rdma_events",
    "parents",
    "payload",
    "block",
    "num_lanes",
    "mask",
)
OPTIONAL_FIELDS = ("discovery", "fault_role", "generations", "cleanup_kind")
KNOWN_FIELDS = REQUIRED_FIELDS + OPTIONAL_FIELDS
INT_FIELDS = ("parents", "payload", "block", "num_lanes", "mask", "generations")

# Survey values arrive as text. Only ASCII decimal digits count: str.isdigit() also takes a
# superscript two, and int() Arabic-Indic or mathematical bold digits. No sign: every integer field
# is a positive size or count. The length bound keeps int() cheap and far from Python's 4300-digit
# limit; the largest valid value has 8 digits.
INT_DIGITS_MAX = DIGITS_MAX
INT_LIMIT = 10**INT_DIGITS_MAX
INT_RULE = f"must be a whole number written with 1 to {INT_DIGITS_MAX} ASCII digits 0-9 (no sign)"

# Loading bounds. A profile is a flat mapping of about 15 scalars (a few hundred bytes).
MAX_PROFILE_BYTES = 64 * KIB
MAX_DEPTH = 32  # the mapping is level 1; no field holds a structure
MAX_NODES = 4096  # mappings, lists and scalars together
MAX_FIELDS = 64  # keys of the profile mapping

HOST_FIELDS = ("source", "requester")
HOST_RULE = f"must be an inventory host name: {names.HOSTNAME_RULE}, or {names.NAME_RULE}"

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_BOOL_TEXT = re.compile(r"[ \t]*([A-Za-z01]{1,5})[ \t]*", re.ASCII)
BOOL_RULE = f"must be a boolean: true or false ({', '.join(_TRUE)} / {', '.join(_FALSE)}, any case)"


@dataclass(frozen=True)
class Violation:
    """One broken rule: ``code`` is stable, ``message`` names field, value and rule.

    ``value`` is kept as given only when it is a short scalar; anything else (a long string, a
    structure) is replaced by its cut quote(), so a violation is always small and printable.
    """

    code: str
    field: str
    value: object
    rule: str

    def __post_init__(self):
        object.__setattr__(self, "value", _bounded(self.value))

    @property
    def message(self) -> str:
        shown = "(absent)" if self.value is None else f"= {_shown(self.value)}"
        return f"{self.field} {shown}: {self.rule} [{self.code}]"

    def as_dict(self) -> dict:
        return {
            "code": self.code,
            "field": self.field,
            "value": _jsonable(self.value),
            "rule": self.rule,
            "message": self.message,
        }


class ProfileError(OrbiteError):
    """The profile breaks one or more rules; ``violations`` lists every one of them."""

    code = "profile.invalid"

    def __init__(self, violations):
        self.violations = list(violations)
        super().__init__("; ".join(v.message for v in self.violations))


def _bounded(value):
    if value is None or isinstance(value, bool) or (isinstance(value, int) and -INT_LIMIT < value < INT_LIMIT):
        return value
    if isinstance(value, float) or (isinstance(value, str) and len(value) <= QUOTE_LIMIT):
        return value
    if isinstance(value, str):
        return value[: QUOTE_LIMIT - 3] + "..."
    return _shown(value)


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError, RecursionError):
        return _shown(value)


def _shown(value) -> str:
    """quote() of a value for a message; a value repr() cannot show (an int past 4300 digits, a
    structure nested too deep) is named by its type instead, never an exception."""
    try:
        return quote(value)
    except (ValueError, RecursionError):
        return f"<{type(value).__name__}>"


def _key_text(key) -> str:
    try:
        return str(key)
    except (ValueError, RecursionError):
        return f"<{type(key).__name__}>"


# --------------------------------------------------------------------------------------------
# Loading


class _Refused(Exception):
    """Raised inside the parsers' hooks: becomes one violation, and stops the parse at once."""

    def __init__(self, code, value, rule):
        super().__init__(rule)
        self.code, self.value, self.rule = code, value, rule


def _duplicate_rule(key):
    return f"key {_shown(key)} appears twice in one mapping (the last would silently win)"


def _json_pairs(pairs):
    mapping = {}
    for key, value in pairs:
        if key in mapping:
            raise _Refused("profile.duplicate_key", key, _duplicate_rule(key))
        mapping[key] = value
    return mapping


_NESTING_RULE = f"nests deeper than {MAX_DEPTH} levels (a profile is one flat mapping)"
_SIZE_RULE = f"is longer than {MAX_PROFILE_BYTES} characters (a profile is a few hundred)"


def _yaml_loader(yaml):
    """A SafeLoader that refuses aliases and merge keys, duplicate keys, and nesting past MAX_DEPTH.

    Aliases are refused while composing, before anything is built: an alias bomb never expands.
    """

    class Loader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                anchor = self.peek_event().anchor
                raise _Refused("profile.yaml_alias", f"*{anchor}", "YAML aliases (*name) are not accepted in a profile")
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise _Refused("profile.nesting", f"{self.depth} levels", _NESTING_RULE)
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node, deep=False):
            seen = []
            for key_node, _value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise _Refused("profile.yaml_alias", "<<", "YAML merge keys (<<) are not accepted in a profile")
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise _Refused("profile.duplicate_key", key, _duplicate_rule(key))
                seen.append(key)  # a list: a key may be unhashable, which the constructor then refuses
            return super().construct_mapping(node, deep=deep)

    return Loader


def parse_profile_text(text: str, origin: str = "profile") -> dict:
    """Parse JSON (or YAML when PyYAML is present) text into a mapping, within the loading bounds."""
    if not isinstance(text, str):
        raise ProfileError([Violation("profile.type", origin, _short(text), "must be JSON or YAML text")])
    if len(text) > MAX_PROFILE_BYTES:
        raise ProfileError([Violation("profile.size", origin, f"<{len(text)} characters>", _SIZE_RULE)])
    # ValueError too: a 5000-digit number is refused by the parsers with it, and must become a
    # violation like any syntax error. A RecursionError only comes from nesting.
    try:
        data = json.loads(text, object_pairs_hook=_json_pairs)
    except _Refused as refused:
        raise ProfileError([Violation(refused.code, origin, refused.value, refused.rule)]) from None
    except RecursionError:
        raise ProfileError([Violation("profile.nesting", origin, _short(text), _NESTING_RULE)]) from None
    except ValueError as json_error:
        data = _parse_yaml(text, origin, json_error)
    _check_shape(data, origin)
    if not isinstance(data, dict):
        raise ProfileError([Violation("profile.type", origin, _short(data), "must be a mapping of profile fields")])
    return data


def _parse_yaml(text, origin, json_error):
    try:
        import yaml  # noqa: PLC0415 - optional: nodes and minimal controllers may lack it
    except ImportError:
        raise ProfileError(
            [Violation("profile.syntax", origin, _short(text), f"is not valid JSON ({json_error})")]
        ) from None
    try:
        return yaml.load(text, Loader=_yaml_loader(yaml))  # a SafeLoader subclass: no arbitrary objects
    except _Refused as refused:
        raise ProfileError([Violation(refused.code, origin, refused.value, refused.rule)]) from None
    except RecursionError:
        raise ProfileError([Violation("profile.nesting", origin, _short(text), _NESTING_RULE)]) from None
    except (yaml.YAMLError, ValueError) as yaml_error:
        first = str(yaml_error).splitlines()[0] if str(yaml_error) else "syntax error"
        raise ProfileError(
            [Violation("profile.syntax", origin, _short(text), f"is neither JSON nor YAML ({_short(first, 200)})")]
        ) from None


def _check_shape(data, origin):
    """Nesting and size bounds, walked without recursion (a dict from a playbook skips the parsers)."""
    stack = [(data, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if depth > MAX_DEPTH:
            raise ProfileError([Violation("profile.nesting", origin, f"{depth} levels", _NESTING_RULE)])
        if nodes > MAX_NODES:
            raise ProfileError([Violation(
                "profile.size", origin, f"more than {MAX_NODES} values", f"must hold at most {MAX_NODES} values"
            )])
        if isinstance(value, dict):
            stack.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend((child, depth + 1) for child in value)
    if isinstance(data, dict) and len(data) > MAX_FIELDS:
        raise ProfileError([Violation(
            "profile.size", origin, f"{len(data)} keys", f"must hold at most {MAX_FIELDS} keys (there are 17 fields)"
        )])


def load_profile_file(path: str) -> dict:
    """Read a profile file: a regular file (never a FIFO or a device) of at most MAX_PROFILE_BYTES."""
    try:
        text = read_regular_bytes(path, MAX_PROFILE_BYTES).decode("utf-8")
    except FileTooLarge:
        rule = f"is larger than {MAX_PROFILE_BYTES} bytes (a profile is a few hundred)"
        raise ProfileError([Violation("profile.size", "path", path, rule)]) from None
    except (OSError, UnicodeDecodeError, NotRegularFile) as error:
        rule = f"cannot be read ({_short(str(error), 200)})"
        raise ProfileError([Violation("profile.file", "path", path, rule)]) from None
    return parse_profile_text(text, origin=_short(str(path), QUOTE_LIMIT))


def _short(value, limit: int = 80):
    text = value if isinstance(value, str) else _shown(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------
# Casting (survey values arrive as strings)


def _cast_int(field, value, violations):
    if isinstance(value, bool):
        violations.append(Violation(f"{field}.type", field, value, "must be an integer, not a boolean"))
        return None
    if isinstance(value, float) and value.is_integer():
        if not -INT_LIMIT < value < INT_LIMIT:
            violations.append(Violation(f"{field}.integer", field, value, INT_RULE))
            return None
        value = int(value)
    if isinstance(value, int):
        if -INT_LIMIT < value < INT_LIMIT:
            return value
        # repr() of a huge int is slow and fails past 4300 digits: show its size instead.
        shown = f"<integer of {value.bit_length()} bits>"
        violations.append(Violation(f"{field}.integer", field, shown, INT_RULE))
        return None
    if isinstance(value, str):
        number = ascii_int(value)
        if number is not None:
            return number
        violations.append(Violation(f"{field}.integer", field, _short(value), INT_RULE))
        return None
    violations.append(Violation(f"{field}.type", field, value, "must be an integer"))
    return None


def _cast_bool(field, value, violations):
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        match = _BOOL_TEXT.fullmatch(value)
        word = match.group(1).lower() if match else ""
        if word in _TRUE + _FALSE:
            return word in _TRUE
        violations.append(Violation(f"{field}.boolean", field, _short(value), BOOL_RULE))
        return None
    violations.append(Violation(f"{field}.type", field, value, "must be a boolean (true or false)"))
    return None


def _cast_host(field, value, violations):
    """An inventory host name: the collection's grammar (ASCII, full match, bounded), blanks around cut."""
    if not isinstance(value, str) or not value.strip(" \t"):
        violations.append(Violation(f"{field}.type", field, value, "must be a non-empty string"))
        return None
    name = value.strip(" \t")
    if names.is_hostname(name) or names.is_name(name):
        return name
    violations.append(Violation(f"{field}.hostname", field, value, HOST_RULE))
    return None


def _cast_str(field, value, violations):
    if isinstance(value, str) and value.strip():
        return value.strip()
    violations.append(Violation(f"{field}.type", field, value, "must be a non-empty string"))
    return None


# --------------------------------------------------------------------------------------------
# Validation


def validate_profile(raw) -> dict:
    """Return the normalized profile, or raise ProfileError listing every violation."""
    if not isinstance(raw, dict):
        raise ProfileError([Violation("profile.type", "profile", _short(raw), "must be a mapping of profile fields")])
    _check_shape(raw, "profile")
    violations: list = []
    profile: dict = {}
    for key in sorted(raw, key=_key_text):
        if key not in KNOWN_FIELDS:
            violations.append(
                Violation(
                    "profile.unknown_field",
                    _short(_key_text(key)),
                    raw[key],
                    f"is not a profile field (known: {', '.join(KNOWN_FIELDS)})",
                )
            )
    for field in REQUIRED_FIELDS:
        if field not in raw or raw[field] is None:
            violations.append(Violation(f"{field}.missing", field, None, "is required"))
    for field in KNOWN_FIELDS:
        if field not in raw or raw[field] is None:
            continue
        value = raw[field]
        if field in INT_FIELDS:
            cast = _cast_int(field, value, violations)
        elif field == "rdma_events":
            cast = _cast_bool(field, value, violations)
        elif field in HOST_FIELDS:
            cast = _cast_host(field, value, violations)
        else:
            cast = _cast_str(field, value, violations)
        if cast is not None:
            profile[field] = cast

    _check_enums(profile, violations)
    _check_gate_bounds(profile, violations)
    mode = profile.get("mode")
    if mode in _MODE_RULES:
        _apply_defaults(mode, profile)
        _MODE_RULES[mode](profile, violations)
    if violations:
        raise ProfileError(violations)
    return {field: profile[field] for field in KNOWN_FIELDS if field in profile}


def _check_enums(p, violations):
    enums = (
        ("source_kind", KINDS, "source_kind.value"),
        ("requester_kind", KINDS, "requester_kind.value"),
        ("transport", TRANSPORTS, "transport.value"),
        ("mode", MODES, "mode.value"),
        ("operation", OPERATIONS, "operation.value"),
    )
    for field, allowed, code in enums:
        if field in p and p[field] not in allowed:
            violations.append(Violation(code, field, p[field], f"must be one of {', '.join(allowed)}"))
            del p[field]
    # Host names are case-insensitive (DNS): 'sim-a' and 'SIM-A' would be one host twice.
    if "source" in p and "requester" in p and names.host_key(p["source"]) == names.host_key(p["requester"]):
        violations.append(
            Violation(
                "requester.distinct", "requester", p["requester"], "must name a different inventory host than source"
            )
        )


def _range(p, violations, field, low, high, code, why):
    if field in p and not low <= p[field] <= high:
        violations.append(Violation(code, field, p[field], f"must be between {low} and {high} ({why})"))
        return False
    return field in p


def _check_gate_bounds(p, violations):
    parents_ok = _range(p, violations, "parents", MIN_PARENTS, MAX_PARENTS, "parents.range", "gate bound")
    payload_ok = _range(
        p, violations, "payload", MIN_PAYLOAD, MAX_PAYLOAD, "payload.range", "gate bound: 1 byte to 32 MiB per parent"
    )
    _range(
        p,
        violations,
        "num_lanes",
        MIN_LANES,
        MAX_LANES,
        "num_lanes.range",
        "gate bound: QPs per peer/context/operation",
    )
    if "block" in p and p["block"] < 1:
        violations.append(Violation("block.range", "block", p["block"], "must be at least 1 byte"))
    if "mask" in p and p["mask"] not in VALID_MASKS:
        violations.append(
            Violation("mask.range", "mask", p["mask"], "must be 1, 2 or 3 (bit i enables rail i; two rails)")
        )
    if parents_ok and payload_ok and isinstance(p.get("block"), int) and p["block"] >= 1:
        _check_wrs_per_round(p, violations)
    if parents_ok and payload_ok:
        backing = backing_per_peer(p["parents"], p["payload"])
        if backing > MAX_BACKING_PER_PEER:
            violations.append(
                Violation(
                    "backing.range",
                    "parents*payload",
                    f"{p['parents']}*{p['payload']}",
                    f"backing per peer {backing} B (parents x (payload + 2 x {GUARD_BYTES} B guards)) "
                    f"exceeds the gate bound of {MAX_BACKING_PER_PEER} B",
                )
            )


def _check_wrs_per_round(p, violations):
    wrs = p["parents"] * -(-p["payload"] // p["block"])
    if wrs > MAX_WRS_PER_ROUND:
        violations.append(
            Violation(
                "wrs.range",
                "parents*ceil(payload/block)",
                f"{p['parents']}*ceil({p['payload']}/{p['block']})",
                f"gives {wrs} payload WRs per round; the gate bound is {MAX_WRS_PER_ROUND} "
                f"(MAX_WRS_PER_ROUND, what the runners and the verifier are sized for): raise block or lower parents",
            )
        )


def _apply_defaults(mode, p):
    if mode in ("installed-host", "installed-rail-accounting", "installed-inflight-dma", "installed-memory-cleanup"):
        p.setdefault("generations", 1)
    if mode == "installed-cleanup-failure":
        p.setdefault("generations", 2)
        p.setdefault("cleanup_kind", "qp")


# Small rule helpers: each appends one violation with a mode-scoped code.


def _code(mode, field, rule):
    return f"{mode.replace('installed-', '')}.{field}.{rule}"


def _forbid(mode, p, violations, field):
    if field in p:
        violations.append(Violation(_code(mode, field, "forbidden"), field, p[field], f"is not allowed in mode {mode}"))


def _require(mode, p, violations, field):
    if field not in p:
        violations.append(Violation(_code(mode, field, "required"), field, None, f"is required in mode {mode}"))
        return False
    return True


def _one_of(mode, p, violations, field, allowed, why=""):
    if field in p and p[field] not in allowed:
        shown = ", ".join(str(a) for a in allowed)
        violations.append(
            Violation(_code(mode, field, "value"), field, p[field], f"must be {shown} in mode {mode}{why}")
        )


def _block_cap(mode, p, violations, cap):
    if "block" in p and p["block"] > cap:
        violations.append(
            Violation(_code(mode, "block", "cap"), "block", p["block"], f"must be at most {cap} B in mode {mode}")
        )


def _payload_within_block(mode, p, violations):
    if "payload" in p and "block" in p and p["payload"] > p["block"]:
        violations.append(
            Violation(
                _code(mode, "payload", "one_slice"),
                "payload",
                p["payload"],
                f"must be <= block ({p['block']}) in mode {mode}: one slice per parent",
            )
        )


def _single_generation(mode, p, violations):
    _one_of(mode, p, violations, "generations", (1,))


def _fault_generations(mode, p, violations):
    if _require(mode, p, violations, "generations"):
        _one_of(mode, p, violations, "generations", (2, 3))
    if _require(mode, p, violations, "fault_role"):
        _one_of(mode, p, violations, "fault_role", FAULT_ROLES)


def _rules_installed_host(p, v):
    mode = "installed-host"
    _single_generation(mode, p, v)
    for field in ("fault_role", "cleanup_kind", "discovery"):
        _forbid(mode, p, v, field)
    _block_cap(mode, p, v, DEFAULT_MAX_BLOCK)


def _rules_rail_accounting(p, v):
    mode = "installed-rail-accounting"
    _single_generation(mode, p, v)
    for field in ("fault_role", "cleanup_kind"):
        _forbid(mode, p, v, field)
    _one_of(mode, p, v, "parents", (RAIL_ACCOUNTING_PARENTS,), " (frozen profile)")
    _one_of(mode, p, v, "payload", (RAIL_ACCOUNTING_PAYLOAD,), " (frozen profile)")
    _one_of(mode, p, v, "block", (RAIL_ACCOUNTING_BLOCK,), " (frozen profile)")
    _one_of(mode, p, v, "num_lanes", (1,), " (frozen profile)")
    _one_of(mode, p, v, "mask", (3,), " (both rails)")
    _one_of(mode, p, v, "discovery", ("auto",))


def _rules_restart(p, v):
    mode = "installed-restart"
    _fault_generations(mode, p, v)
    for field in ("cleanup_kind", "discovery"):
        _forbid(mode, p, v, field)
    _block_cap(mode, p, v, DEFAULT_MAX_BLOCK)


def _rules_interruption(p, v):
    mode = "installed-interruption"
    _fault_generations(mode, p, v)
    for field in ("cleanup_kind", "discovery"):
        _forbid(mode, p, v, field)
    _block_cap(mode, p, v, DEFAULT_MAX_BLOCK)
    _payload_within_block(mode, p, v)


def _rules_lost_completion(p, v):
    mode = "installed-lost-completion"
    _fault_generations(mode, p, v)
    for field in ("cleanup_kind", "discovery"):
        _forbid(mode, p, v, field)
    _block_cap(mode, p, v, DEFAULT_MAX_BLOCK)
    _payload_within_block(mode, p, v)
    _one_of(mode, p, v, "payload", (LOST_COMPLETION_PAYLOAD,))
    _one_of(mode, p, v, "mask", (3,), " (both rails)")
    if "parents" in p and "num_lanes" in p and (p["parents"], p["num_lanes"]) not in LOST_COMPLETION_SHAPES:
        v.append(
            Violation(
                _code(mode, "parents", "shape"),
                "parents,num_lanes",
                f"{p['parents']},{p['num_lanes']}",
                f"must be 8 parents with 1 lane or 16 parents with 3 lanes in mode {mode}",
            )
        )


def _rules_cleanup_failure(p, v):
    mode = "installed-cleanup-failure"
    _one_of(mode, p, v, "generations", (2,))
    _one_of(mode, p, v, "fault_role", ("requester",))
    _require(mode, p, v, "fault_role")
    _forbid(mode, p, v, "discovery")
    _one_of(mode, p, v, "parents", (1,))
    _one_of(mode, p, v, "num_lanes", (1,))
    _one_of(mode, p, v, "mask", (1, 2), " (one rail)")
    _block_cap(mode, p, v, DEFAULT_MAX_BLOCK)
    _payload_within_block(mode, p, v)
    _one_of(mode, p, v, "cleanup_kind", CLEANUP_FAILURE_KINDS)
    if p.get("cleanup_kind") == "channel" and p.get("rdma_events") is False:
        v.append(
            Violation(
                _code(mode, "rdma_events", "channel"),
                "rdma_events",
                False,
                "must be true when cleanup_kind is channel (channel failure needs event progress)",
            )
        )


def _rules_inflight_dma(p, v):
    mode = "installed-inflight-dma"
    _single_generation(mode, p, v)
    for field in ("fault_role", "cleanup_kind", "discovery"):
        _forbid(mode, p, v, field)
    _one_of(mode, p, v, "parents", (1,))
    _one_of(mode, p, v, "num_lanes", (1,))
    _one_of(mode, p, v, "mask", (1, 2), " (one rail)")
    _block_cap(mode, p, v, INFLIGHT_MAX_BLOCK)
    if isinstance(p.get("payload"), int) and 0 < p["payload"] < INFLIGHT_MIN_PAYLOAD:
        v.append(Violation(_code(mode, "payload", "min"), "payload", p["payload"],
                           f"must be at least {INFLIGHT_MIN_PAYLOAD} in mode {mode}: the copy stops part way"))
    if "payload" in p and "block" in p and p["payload"] != p["block"]:
        v.append(
            Violation(
                _code(mode, "payload", "equals_block"),
                "payload",
                p["payload"],
                f"must equal block ({p['block']}) in mode {mode}: exactly one WR",
            )
        )


def _rules_memory_cleanup(p, v):
    mode = "installed-memory-cleanup"
    _single_generation(mode, p, v)
    _forbid(mode, p, v, "discovery")
    _one_of(mode, p, v, "parents", (1,))
    _one_of(mode, p, v, "num_lanes", (1,))
    _one_of(mode, p, v, "mask", (1, 2), " (one rail)")
    _block_cap(mode, p, v, DEFAULT_MAX_BLOCK)
    _payload_within_block(mode, p, v)
    if _require(mode, p, v, "cleanup_kind"):
        _one_of(mode, p, v, "cleanup_kind", MEMORY_CLEANUP_KINDS)
    if _require(mode, p, v, "fault_role"):
        if p.get("cleanup_kind") == "mw":
            _one_of(mode, p, v, "fault_role", ("source",), " (a MW failure is the source's)")
        else:
            _one_of(mode, p, v, "fault_role", FAULT_ROLES)


_MODE_RULES = {
    "installed-host": _rules_installed_host,
    "installed-rail-accounting": _rules_rail_accounting,
    "installed-restart": _rules_restart,
    "installed-interruption": _rules_interruption,
    "installed-lost-completion": _rules_lost_completion,
    "installed-cleanup-failure": _rules_cleanup_failure,
    "installed-inflight-dma": _rules_inflight_dma,
    "installed-memory-cleanup": _rules_memory_cleanup,
}


# --------------------------------------------------------------------------------------------
# Workload derivation


def region_stride(payload: int) -> int:
    """Bytes one parent's region takes in a data MR: guard + payload + guard (docs/content.md)."""
    return payload + 2 * GUARD_BYTES


def backing_per_peer(parents: int, payload: int) -> int:
    return parents * region_stride(payload)


def slice_runs(payload: int, block: int) -> list:
    """A parent is cut into max(1, payload // block) slices, the last taking the rest; in run-length form,
    computed without listing the slices (block 1 of a 6 MiB payload is six million slices):
    [{"bytes": size, "count": n}, ...]."""
    count = max(1, payload // block)
    last = payload - block * (count - 1)
    if count == 1:
        return [{"bytes": last, "count": 1}]
    if last == block:
        return [{"bytes": block, "count": count}]
    return [{"bytes": block, "count": count - 1}, {"bytes": last, "count": 1}]


def expand_runs(runs: list) -> list:
    """The slice sizes a run-length list (the workload's ``slice_sizes``) stands for, one per slice."""
    sizes = []
    for run in runs:
        sizes.extend([run["bytes"]] * run["count"])
    return sizes


def provoked_errors(profile: dict) -> tuple:
    """(error, operation) pairs the mode provokes on purpose; None for a mode not modelled yet."""
    return PROVOKED_ERRORS.get(profile["mode"])


def region_offset(parent: int, payload: int) -> int:
    """Offset of a parent's payload in a data MR: regions of guard + payload + guard, in parent order."""
    return parent * region_stride(payload) + GUARD_BYTES


def enabled_rails(mask: int) -> list:
    return [rail for rail in range(RAIL_COUNT) if mask & (1 << rail)]


def parent_placement(parents: int, mask: int, num_lanes: int) -> list:
    """The placement of docs/runner-contract.md §4: parent p on rail rails[p % R], lane (p // R) % lanes.

    Every runner honours it; the workload carries it (``placement``) with the per-rail and per-lane figures
    derived from it, which the verifier's rules read.
    """
    rails = enabled_rails(mask)
    return [{"parent": p, "rail": rails[p % len(rails)], "lane": (p // len(rails)) % num_lanes} for p in range(parents)]


def derive_workload(profile: dict) -> dict:
    """Expected workload of a *validated* profile (see validate_profile)."""
    payload, block = profile["payload"], profile["block"]
    parents, lanes, mask = profile["parents"], profile["num_lanes"], profile["mask"]
    runs = slice_runs(payload, block)
    slices = sum(run["count"] for run in runs)
    rails = enabled_rails(mask)
    placement = parent_placement(parents, mask, lanes)

    per_rail = {str(r): {"parents": 0, "wrs": 0, "bytes": 0} for r in rails}
    per_lane = {}
    for entry in placement:
        rail_figures = per_rail[str(entry["rail"])]
        rail_figures["parents"] += 1
        rail_figures["wrs"] += slices
        rail_figures["bytes"] += payload
        key = f"{entry['rail']}/{entry['lane']}"
        lane_figures = per_lane.setdefault(
            key, {"rail": entry["rail"], "lane": entry["lane"], "parents": 0, "wrs": 0, "bytes": 0}
        )
        lane_figures["parents"] += 1
        lane_figures["wrs"] += slices
        lane_figures["bytes"] += payload

    generations = profile.get("generations", 1)
    observers = []
    if profile["mode"] in _OBSERVERS:
        tool, role = _OBSERVERS[profile["mode"]]
        if role in ("fault_role", "survivor"):
            fault = profile["fault_role"]
            role = fault if role == "fault_role" else ("requester" if fault == "source" else "source")
        observers.append({"tool": tool, "role": role})
        if tool == "cq_fault":
            observers[-1]["env"] = cq_fault_env(parents * slices)
        if profile["mode"] == "installed-cleanup-failure":
            observers[-1].update(_cleanup_fault(profile, parents * slices))
        if profile["mode"] == "installed-memory-cleanup":
            # docs/memory_cleanup.md: the first dereg_mr / dealloc_mw of the fault role's process fails EIO.
            observers[-1]["env"] = {"ORBITE_UVERBS_FAULT_KIND": profile["cleanup_kind"]}
        if tool == "inflight_fault":
            observers[-1]["env"] = inflight_fault_env(parents * slices, payload)

    workload = {
        "protocol": PROTOCOL,
        "mode": profile["mode"],
        "operation": profile["operation"],
        "progress": "events" if profile["rdma_events"] else "polling",
        "slices_per_parent": slices,
        "slice_sizes": runs,
        "wrs_per_round": parents * slices,
        "bytes_per_round": parents * payload,
        "rails": rails,
        "per_rail": per_rail,
        "per_lane": [per_lane[k] for k in sorted(per_lane)],
        "placement": placement,
        "guard_bytes": GUARD_BYTES,
        "region_stride": region_stride(payload),
        "region_offsets": [region_offset(parent, payload) for parent in range(parents)],
        "backing_per_peer": backing_per_peer(parents, payload),
        "rounds_per_generation": ROUNDS_PER_GENERATION,
        "generations": generations,
        "total_rounds": ROUNDS_PER_GENERATION * generations,
        "qps_per_context_operation": lanes,
        "qp_bound_per_peer_operation": len(rails) * lanes,
        "send_queue_depth": SEND_QUEUE_DEPTH,
        "persistent_mr_contexts": RAIL_COUNT,
        "observers": observers,
        "discovery": profile.get("discovery"),
    }
    if profile["mode"] == "installed-rail-accounting":
        workload["min_outstanding_parents_per_rail_qp"] = RAIL_ACCOUNTING_MIN_OUTSTANDING_PER_RAIL_QP
    return workload


def cq_fault_env(wrs_per_round: int) -> dict:
    """installed-lost-completion (docs/lost_completion.md): the cq_fault observer armed on the requester
    passes every successful payload completion of a generation's rounds and withholds all of the round
    after them, in every generation of the process (a survivor lives through several)."""
    return {"ORBITE_CQ_FAULT_ARMED": "1", "ORBITE_CQ_FAULT_SKIP": str(ROUNDS_PER_GENERATION * wrs_per_round),
            "ORBITE_CQ_FAULT_LIMIT": str(wrs_per_round), "ORBITE_CQ_FAULT_REPEAT": "1"}


def inflight_stall_bytes(payload: int) -> int:
    """installed-inflight-dma: where the interrupted WR's copy stops (bytes landed before the QP goes to ERR): inside
    the payload and off any chunk or page boundary, so a copy cut at the wrong place cannot match."""
    return max(1, min(payload - 1, payload // 2 + 4099))


def inflight_fault_env(wrs_per_round: int, payload: int) -> dict:
    """installed-inflight-dma (docs/inflight_dma.md): the inflight_fault observer armed on the requester passes the
    three healthy rounds' payload WRs and interrupts the next one at ``inflight_stall_bytes``."""
    return {"ORBITE_INFLIGHT_FAULT_ARMED": "1",
            "ORBITE_INFLIGHT_FAULT_SKIP": str(ROUNDS_PER_GENERATION * wrs_per_round),
            "ORBITE_INFLIGHT_FAULT_BYTES": str(inflight_stall_bytes(payload))}


def _cleanup_fault(profile, wrs_per_round):
    """installed-cleanup-failure (docs/cleanup_failure.md): uverbs_fault is loaded into generation 1's requester
    only (the replacement runs the healthy checks), armed for the profile's cleanup kind; the qp selector lets
    the generation's healthy rounds' completions pass and withholds the next one, the cleanup round's."""
    kind = profile["cleanup_kind"]
    env = {"ORBITE_UVERBS_FAULT_KIND": kind}
    if kind in CLEANUP_WITHHELD_KINDS:
        env["ORBITE_UVERBS_FAULT_WITHHOLD_SKIP"] = str(ROUNDS_PER_GENERATION * wrs_per_round)
    if kind in CLEANUP_OWNERS:  # a dependency failure: observed, never injected (docs/cleanup_failure.md)
        env["ORBITE_UVERBS_FAULT_DEPENDENCY"] = "1"
    return {"generation": 1, "env": env}


def _compress(sizes):
    """[1 MiB, 1 MiB, 1 MiB, 1 MiB + 1] -> [{"bytes": 1048576, "count": 3}, {"bytes": 1048577, "count": 1}]."""
    runs = []
    for size in sizes:
        if runs and runs[-1]["bytes"] == size:
            runs[-1]["count"] += 1
        else:
            runs.append({"bytes": size, "count": 1})
    return runs


def load_and_derive(profile=None, path=None, changes=None, reverse_hosts=False):
    """Entry point for modules: a dict, JSON/YAML text, or a file path -> (normalized, workload).

    ``changes`` (a mapping of profile fields) override the loaded profile's before validation: a case
    variant of a shipped profile; ``reverse_hosts`` then swaps its source and requester.
    """
    if path is not None:
        raw = load_profile_file(path)
    elif isinstance(profile, str):
        raw = parse_profile_text(profile)
    else:
        raw = profile
    if changes and isinstance(raw, dict):
        raw = {**raw, **changes}
    if reverse_hosts and isinstance(raw, dict):
        raw = {**raw, "source": raw.get("requester"), "requester": raw.get("source")}
    normalized = validate_profile(raw)
    return normalized, derive_workload(normalized)
