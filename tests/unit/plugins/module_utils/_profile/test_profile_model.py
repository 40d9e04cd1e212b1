"""Profile model: seed workloads, one red check per rule of every mode, and fuzzing."""

import json
import os
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model as pm

MIB = 1 << 20

BASE = {
    "source": "a", "requester": "b", "source_kind": "cpu", "requester_kind": "cpu",
    "transport": "rdma", "operation": "read", "rdma_events": False,
}

# One valid profile per mode; each red check below breaks exactly one rule of one of them.
VALID = {
    "installed-host": dict(BASE, mode="installed-host", parents=16, payload=6291457, block=MIB,
                           num_lanes=3, mask=3),
    "installed-rail-accounting": dict(BASE, mode="installed-rail-accounting", parents=16,
                                      payload=4194305, block=MIB, num_lanes=1, mask=3),
    "installed-restart": dict(BASE, mode="installed-restart", parents=4, payload=3 * MIB, block=MIB,
                              num_lanes=2, mask=3, fault_role="source", generations=2),
    "installed-interruption": dict(BASE, mode="installed-interruption", parents=8, payload=65536,
                                   block=MIB, num_lanes=1, mask=3, fault_role="requester", generations=3),
    "installed-lost-completion": dict(BASE, mode="installed-lost-completion", parents=8, payload=MIB,
                                      block=MIB, num_lanes=1, mask=3, fault_role="requester",
                                      generations=2),
    "installed-cleanup-failure": dict(BASE, mode="installed-cleanup-failure", parents=1, payload=65536,
                                      block=MIB, num_lanes=1, mask=1, fault_role="requester",
                                      generations=2, cleanup_kind="qp"),
    "installed-inflight-dma": dict(BASE, mode="installed-inflight-dma", parents=1, payload=4 * MIB,
                                   block=4 * MIB, num_lanes=1, mask=1),
    "installed-memory-cleanup": dict(BASE, mode="installed-memory-cleanup", parents=1, payload=65536,
                                     block=65536, num_lanes=1, mask=2, fault_role="requester",
                                     cleanup_kind="mr"),
}

DROP = object()

# (mode, changes, expected code). A DROP value removes the field.
RED_CHECKS = [
    # gate-wide fields, types and bounds (checked on the installed-host profile)
    ("installed-host", {"surprise": 1}, "profile.unknown_field"),
    ("installed-host", {"source": DROP}, "source.missing"),
    ("installed-host", {"requester": DROP}, "requester.missing"),
    ("installed-host", {"source_kind": DROP}, "source_kind.missing"),
    ("installed-host", {"requester_kind": DROP}, "requester_kind.missing"),
    ("installed-host", {"transport": DROP}, "transport.missing"),
    ("installed-host", {"mode": DROP}, "mode.missing"),
    ("installed-host", {"operation": DROP}, "operation.missing"),
    ("installed-host", {"rdma_events": DROP}, "rdma_events.missing"),
    ("installed-host", {"parents": DROP}, "parents.missing"),
    ("installed-host", {"payload": DROP}, "payload.missing"),
    ("installed-host", {"block": DROP}, "block.missing"),
    ("installed-host", {"num_lanes": DROP}, "num_lanes.missing"),
    ("installed-host", {"mask": DROP}, "mask.missing"),
    ("installed-host", {"source": ""}, "source.type"),
    ("installed-host", {"requester": 7}, "requester.type"),
    # host names: the collection's grammar (ASCII, full match, bounded)
    ("installed-host", {"source": "sim-a\nsim-b"}, "source.hostname"),
    ("installed-host", {"requester": "sim-\u202eb"}, "requester.hostname"),  # right-to-left override
    ("installed-host", {"parents": [16]}, "parents.type"),
    ("installed-host", {"parents": True}, "parents.type"),
    ("installed-host", {"payload": 1.5}, "payload.type"),
    ("installed-host", {"rdma_events": 2}, "rdma_events.type"),
    # survey text: ASCII digits only, no sign, at most INT_DIGITS_MAX of them; strict booleans
    ("installed-host", {"parents": "many"}, "parents.integer"),
    ("installed-host", {"parents": "\u00b2"}, "parents.integer"),  # superscript two
    ("installed-host", {"payload": "\u0661\u0666"}, "payload.integer"),  # Arabic-Indic 16
    ("installed-host", {"block": "\U0001d7cf\U0001d7d4"}, "block.integer"),  # bold 16
    ("installed-host", {"num_lanes": "+-5"}, "num_lanes.integer"),
    ("installed-host", {"mask": "1" * 5000}, "mask.integer"),
    ("installed-host", {"generations": "-1"}, "generations.integer"),
    ("installed-host", {"parents": "16\n"}, "parents.integer"),
    ("installed-host", {"parents": " 16"}, "parents.integer"),  # a blank is not a digit
    ("installed-host", {"payload": "65536 "}, "payload.integer"),
    ("installed-host", {"block": "\t65536"}, "block.integer"),
    ("installed-host", {"parents": 10**5000}, "parents.integer"),
    ("installed-host", {"payload": 1e300}, "payload.integer"),
    ("installed-host", {"rdma_events": "maybe"}, "rdma_events.boolean"),
    ("installed-host", {"rdma_events": "\uff54rue"}, "rdma_events.boolean"),  # fullwidth t
    ("installed-host", {"source_kind": "gpu"}, "source_kind.value"),
    ("installed-host", {"requester_kind": "cuda"}, "requester_kind.value"),
    ("installed-host", {"transport": "tcp"}, "transport.value"),
    ("installed-host", {"mode": "installed-everything"}, "mode.value"),
    ("installed-host", {"operation": "send"}, "operation.value"),
    ("installed-host", {"requester": "a"}, "requester.distinct"),
    ("installed-host", {"parents": 0}, "parents.range"),
    ("installed-host", {"parents": 33}, "parents.range"),
    ("installed-host", {"payload": 0, "parents": 1}, "payload.range"),
    ("installed-host", {"payload": 32 * MIB + 1, "parents": 1}, "payload.range"),
    ("installed-host", {"num_lanes": 0}, "num_lanes.range"),
    ("installed-host", {"num_lanes": 4}, "num_lanes.range"),
    ("installed-host", {"block": 0}, "block.range"),
    ("installed-host", {"mask": 0}, "mask.range"),
    ("installed-host", {"mask": 4}, "mask.range"),
    ("installed-host", {"parents": 32, "payload": 8 * MIB}, "backing.range"),
    ("installed-host", {"parents": 16, "payload": 2049, "block": 1}, "wrs.range"),
    # installed-host
    ("installed-host", {"generations": 2}, "host.generations.value"),
    ("installed-host", {"fault_role": "source"}, "host.fault_role.forbidden"),
    ("installed-host", {"cleanup_kind": "qp"}, "host.cleanup_kind.forbidden"),
    ("installed-host", {"discovery": "auto"}, "host.discovery.forbidden"),
    ("installed-host", {"block": MIB + 1}, "host.block.cap"),
    # rail accounting (frozen)
    ("installed-rail-accounting", {"generations": 2}, "rail-accounting.generations.value"),
    ("installed-rail-accounting", {"fault_role": "source"}, "rail-accounting.fault_role.forbidden"),
    ("installed-rail-accounting", {"cleanup_kind": "qp"}, "rail-accounting.cleanup_kind.forbidden"),
    ("installed-rail-accounting", {"parents": 15}, "rail-accounting.parents.value"),
    ("installed-rail-accounting", {"payload": 4194304}, "rail-accounting.payload.value"),
    ("installed-rail-accounting", {"block": 65536}, "rail-accounting.block.value"),
    ("installed-rail-accounting", {"num_lanes": 2}, "rail-accounting.num_lanes.value"),
    ("installed-rail-accounting", {"mask": 1}, "rail-accounting.mask.value"),
    ("installed-rail-accounting", {"discovery": "manual"}, "rail-accounting.discovery.value"),
    # restart
    ("installed-restart", {"generations": DROP}, "restart.generations.required"),
    ("installed-restart", {"generations": 1}, "restart.generations.value"),
    ("installed-restart", {"generations": 4}, "restart.generations.value"),
    ("installed-restart", {"fault_role": DROP}, "restart.fault_role.required"),
    ("installed-restart", {"fault_role": "observer"}, "restart.fault_role.value"),
    ("installed-restart", {"cleanup_kind": "qp"}, "restart.cleanup_kind.forbidden"),
    ("installed-restart", {"discovery": "auto"}, "restart.discovery.forbidden"),
    ("installed-restart", {"block": 2 * MIB}, "restart.block.cap"),
    # interruption
    ("installed-interruption", {"generations": DROP}, "interruption.generations.required"),
    ("installed-interruption", {"generations": 1}, "interruption.generations.value"),
    ("installed-interruption", {"fault_role": DROP}, "interruption.fault_role.required"),
    ("installed-interruption", {"fault_role": "both"}, "interruption.fault_role.value"),
    ("installed-interruption", {"cleanup_kind": "qp"}, "interruption.cleanup_kind.forbidden"),
    ("installed-interruption", {"discovery": "auto"}, "interruption.discovery.forbidden"),
    ("installed-interruption", {"block": 2 * MIB}, "interruption.block.cap"),
    ("installed-interruption", {"payload": MIB + 1}, "interruption.payload.one_slice"),
    # lost completion
    ("installed-lost-completion", {"generations": DROP}, "lost-completion.generations.required"),
    ("installed-lost-completion", {"generations": 1}, "lost-completion.generations.value"),
    ("installed-lost-completion", {"fault_role": DROP}, "lost-completion.fault_role.required"),
    ("installed-lost-completion", {"fault_role": "peer"}, "lost-completion.fault_role.value"),
    ("installed-lost-completion", {"cleanup_kind": "qp"}, "lost-completion.cleanup_kind.forbidden"),
    ("installed-lost-completion", {"discovery": "auto"}, "lost-completion.discovery.forbidden"),
    ("installed-lost-completion", {"block": 2 * MIB}, "lost-completion.block.cap"),
    ("installed-lost-completion", {"block": MIB // 2}, "lost-completion.payload.one_slice"),
    ("installed-lost-completion", {"payload": MIB // 2}, "lost-completion.payload.value"),
    ("installed-lost-completion", {"mask": 2}, "lost-completion.mask.value"),
    ("installed-lost-completion", {"parents": 16}, "lost-completion.parents.shape"),
    # cleanup failure
    ("installed-cleanup-failure", {"generations": 3}, "cleanup-failure.generations.value"),
    ("installed-cleanup-failure", {"fault_role": "source"}, "cleanup-failure.fault_role.value"),
    ("installed-cleanup-failure", {"fault_role": DROP}, "cleanup-failure.fault_role.required"),
    ("installed-cleanup-failure", {"discovery": "auto"}, "cleanup-failure.discovery.forbidden"),
    ("installed-cleanup-failure", {"parents": 2}, "cleanup-failure.parents.value"),
    ("installed-cleanup-failure", {"num_lanes": 2}, "cleanup-failure.num_lanes.value"),
    ("installed-cleanup-failure", {"mask": 3}, "cleanup-failure.mask.value"),
    ("installed-cleanup-failure", {"block": 2 * MIB}, "cleanup-failure.block.cap"),
    ("installed-cleanup-failure", {"payload": MIB + 1}, "cleanup-failure.payload.one_slice"),
    ("installed-cleanup-failure", {"cleanup_kind": "mr"}, "cleanup-failure.cleanup_kind.value"),
    ("installed-cleanup-failure", {"cleanup_kind": "channel"}, "cleanup-failure.rdma_events.channel"),
    # in-flight DMA
    ("installed-inflight-dma", {"generations": 2}, "inflight-dma.generations.value"),
    ("installed-inflight-dma", {"fault_role": "source"}, "inflight-dma.fault_role.forbidden"),
    ("installed-inflight-dma", {"cleanup_kind": "qp"}, "inflight-dma.cleanup_kind.forbidden"),
    ("installed-inflight-dma", {"discovery": "auto"}, "inflight-dma.discovery.forbidden"),
    ("installed-inflight-dma", {"parents": 2}, "inflight-dma.parents.value"),
    ("installed-inflight-dma", {"num_lanes": 2}, "inflight-dma.num_lanes.value"),
    ("installed-inflight-dma", {"mask": 3}, "inflight-dma.mask.value"),
    ("installed-inflight-dma", {"block": 32 * MIB, "payload": 32 * MIB}, "inflight-dma.block.cap"),
    ("installed-inflight-dma", {"payload": 4 * MIB - 1}, "inflight-dma.payload.equals_block"),
    ("installed-inflight-dma", {"payload": 1, "block": 1}, "inflight-dma.payload.min"),
    # memory cleanup
    ("installed-memory-cleanup", {"generations": 2}, "memory-cleanup.generations.value"),
    ("installed-memory-cleanup", {"discovery": "auto"}, "memory-cleanup.discovery.forbidden"),
    ("installed-memory-cleanup", {"parents": 2}, "memory-cleanup.parents.value"),
    ("installed-memory-cleanup", {"num_lanes": 3}, "memory-cleanup.num_lanes.value"),
    ("installed-memory-cleanup", {"mask": 3}, "memory-cleanup.mask.value"),
    ("installed-memory-cleanup", {"block": 2 * MIB}, "memory-cleanup.block.cap"),
    ("installed-memory-cleanup", {"payload": 65537}, "memory-cleanup.payload.one_slice"),
    ("installed-memory-cleanup", {"cleanup_kind": DROP}, "memory-cleanup.cleanup_kind.required"),
    ("installed-memory-cleanup", {"cleanup_kind": "qp"}, "memory-cleanup.cleanup_kind.value"),
    ("installed-memory-cleanup", {"fault_role": DROP}, "memory-cleanup.fault_role.required"),
    ("installed-memory-cleanup", {"cleanup_kind": "mw"}, "memory-cleanup.fault_role.value"),
]


def _mutated(mode, changes):
    profile = dict(VALID[mode])
    for key, value in changes.items():
        if value is DROP:
            profile.pop(key, None)
        else:
            profile[key] = value
    return profile


@pytest.mark.parametrize("mode", sorted(VALID))
def test_every_base_profile_is_valid(mode):
    pm.validate_profile(VALID[mode])


def test_every_seed_example_profile_file_is_valid(repo_root):
    files = sorted((repo_root / "profiles").glob("*.json"))
    assert len(files) >= 8
    for path in files:
        pm.load_and_derive(path=str(path))


@pytest.mark.parametrize(("mode", "changes", "code"), RED_CHECKS,
                         ids=[f"{c[2]}:{sorted(c[1])[0]}" for c in RED_CHECKS])
def test_red_check_breaks_exactly_one_rule(mode, changes, code):
    with pytest.raises(pm.ProfileError) as caught:
        pm.validate_profile(_mutated(mode, changes))
    codes = [v.code for v in caught.value.violations]
    assert codes == [code]
    violation = caught.value.violations[0]
    assert violation.field in violation.message
    assert violation.rule in violation.message


SWEEP_VALUES = [DROP, 0, 1, 2, 3, 4, 8, 15, 16, 33, 65536, MIB // 2, MIB, MIB + 1, 4194305, 4 * MIB,
                16 * MIB, 32 * MIB, 32 * MIB + 1, True, False, "auto", "qp", "cq", "channel", "pd", "mr",
                "mw", "source", "requester", "a", "b", "read", "write", "cpu", "rdma", "gpu",
                "16", " 1 ", "\u00b2", "+-5", "1" * 5000, "maybe", 10**13]


def test_every_rule_code_has_a_red_check():
    """Sweep every field of every mode's profile: any code the model emits needs a red check above,
    so a new rule without one fails here."""
    covered = {code for _, _, code in RED_CHECKS}
    emitted = set()
    for mode in VALID:
        for field in pm.KNOWN_FIELDS:
            for value in SWEEP_VALUES:
                try:
                    pm.validate_profile(_mutated(mode, {field: value}))
                except pm.ProfileError as error:
                    emitted |= {v.code for v in error.violations}
    uncovered = {c for c in emitted - covered if not c.endswith(".type")}
    assert not uncovered


def test_all_violations_are_reported_at_once():
    bad = dict(VALID["installed-rail-accounting"], parents=15, mask=1, transport="tcp", extra=1)
    with pytest.raises(pm.ProfileError) as caught:
        pm.validate_profile(bad)
    assert sorted(v.code for v in caught.value.violations) == sorted([
        "profile.unknown_field", "transport.value",
        "rail-accounting.parents.value", "rail-accounting.mask.value"])


def test_survey_strings_are_cast():
    survey = {k: (str(v).lower() if not isinstance(v, str) else v)
              for k, v in VALID["installed-rail-accounting"].items()}
    assert survey["parents"] == "16" and survey["rdma_events"] == "false"
    normalized = pm.validate_profile(survey)
    assert normalized["parents"] == 16 and normalized["rdma_events"] is False
    assert normalized["generations"] == 1


def test_cleanup_failure_defaults_to_qp():
    profile = dict(VALID["installed-cleanup-failure"])
    del profile["cleanup_kind"]
    assert pm.validate_profile(profile)["cleanup_kind"] == "qp"


# --- derived workloads ----------------------------------------------------------------------


def test_rail_accounting_workload_reproduces_the_seed():
    _, workload = pm.load_and_derive(VALID["installed-rail-accounting"])
    assert workload["slices_per_parent"] == 4
    assert workload["slice_sizes"] == [{"bytes": MIB, "count": 3}, {"bytes": MIB + 1, "count": 1}]
    assert workload["wrs_per_round"] == 64
    assert workload["bytes_per_round"] == 67_108_880
    assert workload["rails"] == [0, 1]
    assert {r: f["wrs"] for r, f in workload["per_rail"].items()} == {"0": 32, "1": 32}
    assert workload["min_outstanding_parents_per_rail_qp"] == 2
    assert workload["observers"] == [{"tool": "accounting", "role": "requester"}]
    assert workload["qp_bound_per_peer_operation"] == 2


def test_installed_host_workload_reproduces_the_seed():
    _, workload = pm.load_and_derive(VALID["installed-host"])
    assert workload["wrs_per_round"] == 96
    assert workload["bytes_per_round"] == 100_663_312
    assert workload["qp_bound_per_peer_operation"] == 6
    assert sum(lane["wrs"] for lane in workload["per_lane"]) == 96
    assert workload["observers"] == []
    assert workload["backing_per_peer"] == 16 * (6291457 + 2 * pm.GUARD_BYTES)
    assert workload["total_rounds"] == 3


@pytest.mark.parametrize(("payload", "block", "expected"), [
    (1, MIB, [1]),
    (MIB, MIB, [MIB]),
    (MIB - 1, MIB, [MIB - 1]),
    (2 * MIB - 1, MIB, [2 * MIB - 1]),
    (3 * MIB, MIB, [MIB, MIB, MIB]),
    (4194305, MIB, [MIB, MIB, MIB, MIB + 1]),
])
def test_slicing_rule(payload, block, expected):
    assert pm.expand_runs(pm.slice_runs(payload, block)) == expected
    assert pm.slice_runs(payload, block) == pm._compress(expected)


def _listed_slices(payload, block):
    """The seed's slicing rule written out slice by slice: the oracle of the run-length form."""
    count = max(1, payload // block)
    return [block] * (count - 1) + [payload - block * (count - 1)]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 1 << 22), st.integers(1, 1 << 22))
def test_slice_runs_are_the_slices_counted_without_listing_them(payload, block):
    assert pm.slice_runs(payload, block) == pm._compress(_listed_slices(payload, block))
    assert pm.expand_runs(pm.slice_runs(payload, block)) == _listed_slices(payload, block)


def test_one_rail_mask_puts_everything_on_that_rail():
    _, workload = pm.load_and_derive(VALID["installed-memory-cleanup"])
    assert workload["rails"] == [1]
    assert list(workload["per_rail"]) == ["1"]
    assert workload["observers"] == [{"tool": "uverbs_fault", "role": "requester",
                                      "env": {"ORBITE_UVERBS_FAULT_KIND": "mr"}}]
    assert workload["persistent_mr_contexts"] == 2


def test_restart_generations_multiply_rounds():
    _, workload = pm.load_and_derive(dict(VALID["installed-restart"], generations=3))
    assert workload["total_rounds"] == 9
    assert workload["qp_bound_per_peer_operation"] == 4
    assert "new_qps_per_generation_max" not in workload


@pytest.mark.parametrize(("fault", "survivor"), [("source", "requester"), ("requester", "source")])
def test_restart_loads_accounting_into_the_survivor(fault, survivor):
    _, workload = pm.load_and_derive(dict(VALID["installed-restart"], fault_role=fault))
    assert workload["observers"] == [{"tool": "accounting", "role": survivor}]


@pytest.mark.parametrize(("parents", "lanes"), [(8, 1), (16, 3)])
def test_lost_completion_arms_cq_fault_in_the_requester_for_one_round_per_generation(parents, lanes):
    """docs/lost_completion.md: pass the three rounds' completions, withhold the next round's, again per generation."""
    _, workload = pm.load_and_derive(dict(VALID["installed-lost-completion"], parents=parents, num_lanes=lanes))
    assert workload["observers"] == [{"tool": "cq_fault", "role": "requester", "env": {
        "ORBITE_CQ_FAULT_ARMED": "1", "ORBITE_CQ_FAULT_SKIP": str(3 * parents), "ORBITE_CQ_FAULT_LIMIT": str(parents),
        "ORBITE_CQ_FAULT_REPEAT": "1"}}]
    assert pm.provoked_errors(VALID["installed-lost-completion"]) == (
        ("EpochMismatch", "open_segment"), ("EpochMismatch", "submit"), ("Timeout", "wait"), ("BatchBusy", "free"),
        ("PeerLost", "wait"))


# --- loading ---------------------------------------------------------------------------------


def test_yaml_and_json_text(tmp_path):
    text = "\n".join(f"{k}: {json.dumps(v)}" for k, v in VALID["installed-host"].items())
    normalized, _ = pm.load_and_derive(profile=text)
    assert normalized["parents"] == 16
    path = tmp_path / "p.json"
    path.write_text(json.dumps(VALID["installed-host"]))
    assert pm.load_and_derive(path=str(path))[0] == normalized


@pytest.mark.parametrize(("text", "code"), [
    ("[1, 2]", "profile.type"),
    ("{unclosed", "profile.syntax"),
    ("just words", "profile.type"),
])
def test_bad_text_is_a_typed_error(text, code):
    with pytest.raises(pm.ProfileError) as caught:
        pm.load_and_derive(profile=text)
    assert [v.code for v in caught.value.violations] == [code]


def test_unreadable_file(tmp_path):
    with pytest.raises(pm.ProfileError) as caught:
        pm.load_and_derive(path=str(tmp_path / "absent.json"))
    assert caught.value.violations[0].code == "profile.file"
    assert "absent.json" in str(caught.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children,
                                                                      max_size=5),
    max_leaves=20,
)
field_values = st.none() | st.booleans() | st.integers(-5, 40_000_000) | st.floats() | st.text(max_size=20)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_arbitrary_json_never_raises_anything_but_profile_error(value):
    try:
        normalized = pm.validate_profile(value)
    except pm.ProfileError as error:
        assert error.violations
        json.dumps([v.as_dict() for v in error.violations])
    else:
        pm.derive_workload(normalized)


@settings(max_examples=400, deadline=None)
@given(st.fixed_dictionaries({}, optional={f: field_values for f in pm.KNOWN_FIELDS}),
       st.sampled_from(sorted(VALID)))
def test_arbitrary_field_values_never_raise_anything_but_profile_error(overrides, mode):
    profile = dict(VALID[mode], **overrides)
    try:
        normalized = pm.validate_profile(profile)
    except pm.ProfileError as error:
        assert all(v.code and v.field for v in error.violations)
    else:
        workload = pm.derive_workload(normalized)
        assert workload["backing_per_peer"] <= pm.MAX_BACKING_PER_PEER
        assert workload["wrs_per_round"] == normalized["parents"] * workload["slices_per_parent"]


# --- survey text: strict casting --------------------------------------------------------------



def survey_int(text):
    """The oracle, written without a regex: ASCII digits and nothing else (no blank either), bounded."""
    if 1 <= len(text) <= pm.INT_DIGITS_MAX and all(c in "0123456789" for c in text):
        return int(text)
    return None

int_text = (
    st.text(max_size=30)
    | st.text(alphabet="0123456789+- \t\n_.xe", max_size=20)
    | st.text(alphabet="0123456789", min_size=10, max_size=6000)
    | st.integers(-(10**15), 10**15).map(str)
    | st.integers(0, 40_000_000).map(lambda n: f" {n}\t")
)


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(pm.INT_FIELDS), int_text, st.sampled_from(sorted(VALID)))
@example("parents", "1" * 5000, "installed-host")
@example("mask", "9" * 100_000, "installed-host")
@example("payload", "\u00b2", "installed-host")
@example("block", "+-5", "installed-host")
def test_arbitrary_text_for_an_integer_field_is_cast_strictly(field, text, mode):
    # No time bound here (one flaked on a loaded CI machine): derivation no longer lists the slices
    # (block 1 of 6 MiB was six million), which test_slice_runs_are_the_slices_counted_without_listing_them covers.
    try:
        normalized = pm.validate_profile(dict(VALID[mode], **{field: text}))
    except pm.ProfileError as error:
        codes = {v.code for v in error.violations}
        if survey_int(text) is None:
            assert f"{field}.integer" in codes
            shown = next(v for v in error.violations if v.code == f"{field}.integer")
            assert shown.field == field and shown.rule == pm.INT_RULE
            assert len(shown.message) < 400  # the value is cut
        json.dumps([v.as_dict() for v in error.violations])
    else:
        assert normalized[field] == survey_int(text)
        pm.derive_workload(normalized)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=12) | st.sampled_from(["true", "False", " YES", "off\t", "On", "1", "0", "tru", "1.0"]))
def test_arbitrary_text_for_rdma_events_is_cast_strictly(text):
    word = text.strip(" \t").lower() if text.strip(" \t").isascii() else None
    try:
        normalized = pm.validate_profile(dict(VALID["installed-host"], rdma_events=text))
    except pm.ProfileError as error:
        assert word not in ("true", "yes", "on", "1", "false", "no", "off", "0")
        assert [v.code for v in error.violations] == ["rdma_events.boolean"]
    else:
        assert normalized["rdma_events"] is (word in ("true", "yes", "on", "1"))
        assert word in ("true", "yes", "on", "1", "false", "no", "off", "0")


def test_the_issues_absurd_round_is_refused_naming_the_field_value_and_bound():
    # 32 parents of ~8 MiB with block 1: 268 million WRs a round, inside every other bound.
    payload = 8 * MIB - 2 * pm.GUARD_BYTES
    with pytest.raises(pm.ProfileError) as caught:
        pm.validate_profile(dict(VALID["installed-host"], parents=32, payload=payload, block=1))
    (violation,) = caught.value.violations
    assert (violation.code, violation.field, violation.value) == (
        "wrs.range", "parents*ceil(payload/block)", f"32*ceil({payload}/1)")
    assert f"gives {32 * payload} payload WRs per round" in violation.rule
    assert str(pm.MAX_WRS_PER_ROUND) in violation.rule and "parents*ceil(payload/block)" in violation.message


@pytest.mark.parametrize("parents, payload, block", [
    (16, 2048, 1),  # exactly the bound
    (32, 8 * MIB - 2 * pm.GUARD_BYTES, 8192),  # the heaviest round the bounds allow: 32736 WRs, 256 MiB
    (31, 1057, 1),  # 32767
])
def test_a_round_at_or_under_the_wr_bound_is_accepted(parents, payload, block):
    profile = pm.validate_profile(dict(VALID["installed-host"], parents=parents, payload=payload, block=block))
    assert pm.derive_workload(profile)["wrs_per_round"] <= pm.MAX_WRS_PER_ROUND


def test_the_wr_bound_counts_the_partial_last_slice_as_the_runners_do():
    # 1 MiB + 1 B in blocks of 1 KiB: 1024 slices by the model's slicing (the last takes the rest), 1025 under
    # ceil, the count the runners refuse by; the preflight never accepts what a runner would refuse.
    profile = dict(VALID["installed-host"], parents=32, payload=1024 * 1024 + 1, block=1024)
    assert pm.derive_workload(pm.validate_profile(dict(profile, parents=1)))["slices_per_parent"] == 1024
    with pytest.raises(pm.ProfileError) as caught:
        pm.validate_profile(profile)
    assert [v.code for v in caught.value.violations] == ["wrs.range"]


def test_the_runners_refuse_past_the_same_wr_bound_as_the_preflight(repo_root):
    # Each runner keeps its own constant (the verifier and the runners share no code): they must agree.
    sim = (repo_root / "sim" / "orbite_sim" / "case.py").read_text()
    reference = (repo_root / "runners" / "reference" / "src" / "case.rs").read_text()
    assert re.findall(r"^MAX_WRS_PER_ROUND = (\d+)$", sim, re.M) == [str(pm.MAX_WRS_PER_ROUND)]
    assert re.findall(r"^const MAX_WRS_PER_ROUND: i128 = (\d+);$", reference, re.M) == [str(pm.MAX_WRS_PER_ROUND)]
    # ... and count the same way: parents x ceil(payload / block).
    assert "p[\"parents\"] * -(-p[\"payload\"] // p[\"block\"])" in sim
    assert "parents * ((payload + block - 1) / block)" in reference


def test_leading_zeros_are_fine():
    assert pm.validate_profile(dict(VALID["installed-rail-accounting"], parents="00016"))["parents"] == 16


@pytest.mark.parametrize("text", [" 16", "16 ", "\t16"])
def test_blanks_around_the_digits_are_refused_naming_field_value_and_rule(text):
    with pytest.raises(pm.ProfileError) as caught:
        pm.validate_profile(dict(VALID["installed-rail-accounting"], parents=text))
    (violation,) = caught.value.violations
    assert (violation.code, violation.field, violation.value, violation.rule) == (
        "parents.integer", "parents", text, pm.INT_RULE)
    assert "ASCII digits" in pm.INT_RULE


def test_a_huge_value_is_named_not_printed():
    with pytest.raises(pm.ProfileError) as caught:
        pm.validate_profile(dict(VALID["installed-host"], parents=10**5000, surprise=[10**5000]))
    messages = [v.message for v in caught.value.violations]
    assert any("<integer of 16610 bits>" in m for m in messages)
    assert all(len(m) < 600 for m in messages)
    json.dumps([v.as_dict() for v in caught.value.violations])


@pytest.mark.parametrize(
    "text",
    [
        '{"parents": ' + "1" * 5000 + "}",  # past Python's int digit limit
        "parents: " + "1" * 5000,
    ],
    ids=["json-5000-digits", "yaml-5000-digits"],
)
def test_text_the_parsers_refuse_is_a_syntax_violation(text):
    with pytest.raises(pm.ProfileError) as caught:
        pm.load_and_derive(profile=text)
    assert [v.code for v in caught.value.violations] == ["profile.syntax"]
    assert len(str(caught.value)) < 600



# --- hostile input (issue 13): bounded loading, every refusal a coded violation -----------------

from helpers import bounded  # noqa: E402 - the section's own helper

# The classic "billion laughs": 9 levels of 9 aliases, about 340 bytes, 9**9 strings once expanded.
ALIAS_BOMB = "a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")
)

_LOAD_IN_CHILD = """
from ansible_collections.orbite.qualification.plugins.module_utils._profile import model as pm
text = sys.stdin.read() if sys.argv[1] == "-" else None
try:
    pm.load_and_derive(profile=text) if text is not None else pm.load_and_derive(path=sys.argv[1])
    print(json.dumps("valid"))
except pm.ProfileError as error:
    print(json.dumps({"codes": [v.code for v in error.violations], "message": str(error),
                      "violations": [v.as_dict() for v in error.violations]}))
"""


def _codes(call):
    with pytest.raises(pm.ProfileError) as caught:
        call()
    return [v.code for v in caught.value.violations], caught.value


def test_alias_bomb_is_refused_before_it_expands():
    assert len(ALIAS_BOMB) < 400
    run = bounded.run_bounded(
        _LOAD_IN_CHILD.replace("sys.stdin.read()", repr(ALIAS_BOMB)), memory=256 << 20, timeout=30, args=["-"]
    )
    assert not run.hung and run.returncode == 0, run.explain()
    assert run.result["codes"] == ["profile.yaml_alias"]
    assert len(run.result["message"]) < 400


@pytest.mark.parametrize("text", [
    "source: &h sim-a\nrequester: *h\n",
    "base: &b {mode: installed-host}\nother: *b\n",
    "<<: {mode: installed-host}\nsource: a\n",  # a merge key without an alias
])
def test_yaml_aliases_and_merge_keys_are_refused(text):
    codes, _ = _codes(lambda: pm.load_and_derive(profile=text))
    assert codes == ["profile.yaml_alias"]


def _text(profile, fmt):
    if fmt == "json":
        return json.dumps(profile)
    return "".join(f"{k}: {json.dumps(v)}\n" for k, v in profile.items())


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_a_key_given_twice_is_refused_not_last_wins(fmt):
    text = _text(VALID["installed-host"], fmt)
    twice = text[:-1] + ', "mode": "installed-restart"}' if fmt == "json" else text + "mode: installed-restart\n"
    codes, error = _codes(lambda: pm.load_and_derive(profile=twice))
    assert codes == ["profile.duplicate_key"]
    assert error.violations[0].value == "mode" and "'mode' appears twice" in error.violations[0].rule


def test_a_duplicate_key_in_a_file_is_refused(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(VALID["installed-host"])[:-1] + ', "parents": 1}')
    assert _codes(lambda: pm.load_and_derive(path=str(path)))[0] == ["profile.duplicate_key"]


@pytest.mark.parametrize(("make", "code"), [
    (lambda: '{"mode": ' + "[" * 1000 + "]" * 1000 + "}", "profile.nesting"),  # JSON, 1000 levels
    (lambda: "mode: " + "[" * 1000 + "]" * 1000 + "\n", "profile.nesting"),  # YAML flow, 1000 levels
    (lambda: "".join(" " * i + f"k{i}:\n" for i in range(200)), "profile.nesting"),  # YAML block
    (lambda: "[" * 50_000, "profile.nesting"),  # unclosed, past the recursion limit
    (lambda: "[" * 100_000, "profile.size"),
    (lambda: json.dumps(dict(VALID["installed-host"], pad="x" * pm.MAX_PROFILE_BYTES)), "profile.size"),
])
def test_nesting_and_size_are_bounded(make, code):
    # How fast each is refused is measured by bench/bench_profile_bounds.py, not bounded here.
    codes, error = _codes(lambda: pm.load_and_derive(profile=make()))
    assert codes == [code] and len(str(error)) < 600


def test_a_deep_mapping_from_a_playbook_is_a_nesting_violation():
    value = []
    for _ in range(1000):
        value = [value]
    codes, _ = _codes(lambda: pm.validate_profile(dict(VALID["installed-host"], source=value)))
    assert codes == ["profile.nesting"]


def test_a_mapping_with_100k_keys_is_one_size_violation():
    profile = dict(VALID["installed-host"], **{f"k{i}": i for i in range(100_000)})
    codes, error = _codes(lambda: pm.validate_profile(profile))
    assert codes == ["profile.size"] and len(str(error)) < 600


@pytest.mark.parametrize("name", [
    "sim\x00a", "sim-a\n", "sim-a\nsim-b", "sim-\u202eb", "x" * 100_000, "sim a", "../sim-a", "s\u0456m-a",
])
def test_host_names_follow_the_name_grammar(name):
    codes, error = _codes(lambda: pm.validate_profile(dict(VALID["installed-host"], source=name)))
    assert codes == ["source.hostname"]
    violation = error.violations[0]
    assert violation.rule == pm.HOST_RULE and len(violation.message) < 600
    assert len(json.dumps(violation.as_dict())) < 1200  # the value is cut, in the message and the field


@pytest.mark.parametrize(("given", "kept"), [
    (" sim-a\t", "sim-a"), ("node_7", "node_7"), ("h1.lab.example", "h1.lab.example"),
])
def test_inventory_host_names_are_accepted(given, kept):
    assert pm.validate_profile(dict(VALID["installed-host"], source=given))["source"] == kept


def test_host_names_differing_only_by_case_are_one_host():
    codes, _ = _codes(lambda: pm.validate_profile(dict(VALID["installed-host"], source="SIM-A", requester="sim-a")))
    assert codes == ["requester.distinct"]


def test_violation_values_are_cut():
    codes, error = _codes(lambda: pm.validate_profile(dict(VALID["installed-host"], surprise="z" * 100_000)))
    assert codes == ["profile.unknown_field"]
    value = error.violations[0].as_dict()["value"]
    assert isinstance(value, str) and len(value) <= 200


def test_a_fifo_profile_file_is_refused_not_a_hang(tmp_path):
    fifo = tmp_path / "profile.json"
    os.mkfifo(fifo)
    run = bounded.run_bounded(_LOAD_IN_CHILD, timeout=20, args=[fifo])
    assert not run.hung and run.returncode == 0, run.explain()
    assert run.result["codes"] == ["profile.file"] and "is a FIFO" in run.result["message"]


def test_a_huge_profile_file_is_refused(tmp_path):
    path = tmp_path / "p.yml"
    path.write_text("# padding\n" * 10_000)
    codes, _ = _codes(lambda: pm.load_and_derive(path=str(path)))
    assert codes == ["profile.size"]
