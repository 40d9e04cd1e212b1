"""The digest rules (rules/digests.py) on hand-built receipts: every red check breaks one fact, as a
clever faulty engine would (ledgers and log kept consistent with each other), and sees its code.

The hand-built observer log holds what the accounting observer would hash: each range's digest made
with the simulated runner's own content implementation, checked by the verifier's (test_content.py
holds both to docs/content.md). Logs are written in both formats by tests/helpers/observer_log.py and
read by the verifier's loader.
"""

import hashlib
import random
import sys

import pytest
from helpers import observer_log
from helpers.paths import REPO

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.case import CaseReceipts
from ansible_collections.orbite.qualification.plugins.module_utils._verify.loader import Receipt, load_observer_log
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import digests

sys.path.insert(0, str(REPO / "sim"))
from orbite_sim import content as sim_content  # the bytes as the runner makes them

G = 4096
PARENTS, PAYLOAD, BLOCK, ROUNDS = 3, 10000, 4096, 3  # 3 slices a parent: 4096, 4096, 1808
STRIDE = PAYLOAD + 2 * G
QPN = 0x1200
CHECKS = {"digests.coverage": digests.check_coverage, "digests.content": digests.check_content,
          "digests.guards": digests.check_guards}


class Run:
    """A hand-built rail-accounting-like run: ledgers (only what the rules read) and the observer's events."""

    def __init__(self, operation="read", rng_seed=7):
        rng = random.Random(rng_seed)
        self.operation = operation
        self.seeds = [rng.getrandbits(64) for _ in range(ROUNDS)]
        self.header = {"schema": "orbite.observer-log", "version": 2, "tool": "accounting", "pid": 4242,
                       "format": "binary", "record_bytes": 80, "digest": "sha256", "guard_bytes": G}
        self.events, self.rounds = [], []
        wr_id = 0
        for number, seed in enumerate(self.seeds, start=1):
            data = sim_content.RoundInput(seed, PARENTS, PAYLOAD)
            wrs = []
            for parent in range(PARENTS):
                for start in range(0, PAYLOAD, BLOCK):
                    wr_id += 1
                    length = min(BLOCK, PAYLOAD - start)
                    key = {"ctx": "0x5000", "cq": "0x6000", "qpn": QPN, "wr_id": wr_id}
                    self.events += [
                        dict(ev="wr", dev="mlx5_0", opcode="RDMA_READ" if operation == "read" else "RDMA_WRITE",
                             bytes=length, **key),
                        dict(ev="cqe", status=0, status_name="IBV_WC_SUCCESS", **key),
                        {"ev": "data", "qpn": QPN, "wr_id": wr_id, "sge": 0, "off": parent * STRIDE + G + start,
                         "len": length, "mr_len": PARENTS * STRIDE, "flags": 0,
                         "sha256": hashlib.sha256(bytes(data.parent(parent)[start:start + length])).hexdigest()}]
                    wrs.append({"qpn": QPN, "wr_id": wr_id, "parent": parent})
            self.rounds.append({"round": number, "wrs": wrs})

    def data(self, wr_id=None):
        found = [e for e in self.events if e["ev"] == "data" and (wr_id is None or e["wr_id"] == wr_id)]
        return found if wr_id is None else found[0]

    def case(self, tmp_path, fmt="binary"):
        path = tmp_path / observer_log.file_name("accounting", fmt)
        summary = {"ev": "summary", "accepted_wrs": 0, "joined": 0, "unjoined": 0, "max_inflight_per_qp": {},
                   "max_outstanding_parents_per_qp": {}}
        path.write_bytes(observer_log.encode([self.header, *self.events, summary], fmt))
        log = load_observer_log(str(path), root=str(tmp_path))
        assert log.ok, log.problem
        profile = {"mode": "installed-rail-accounting", "operation": self.operation, "parents": PARENTS,
                   "payload": PAYLOAD, "block": BLOCK}
        workload = {"generations": 1, "observers": [{"tool": "accounting", "role": "requester"}],
                    "guard_bytes": model.GUARD_BYTES, "region_stride": model.region_stride(PAYLOAD),
                    "backing_per_peer": model.backing_per_peer(PARENTS, PAYLOAD)}
        case = CaseReceipts(case_id="hand", case_dir=str(tmp_path), profile=profile, workload=workload)
        seeds = [{"round": r["round"], "input_seed": s} for r, s in zip(self.rounds, self.seeds)]
        columns = [{key: [wr[key] for wr in r["wrs"]] for key in ("qpn", "wr_id", "parent")} for r in self.rounds]
        case.ledgers[("requester", 1)] = Receipt(str(tmp_path / "requester.json"), data={
            "rounds": [dict(r, input_seed=s["input_seed"], wrs=wrs) for r, s, wrs in zip(self.rounds, seeds, columns)]})
        case.ledgers[("source", 1)] = Receipt(str(tmp_path / "source.json"), data={"rounds": seeds})
        case.observer_logs[("requester", 1, "accounting")] = log
        return case


def failing(case):
    """{code: [messages]} of the digest rules that find something."""
    found = {code: [message for message, _where in check(case)] for code, check in CHECKS.items()}
    return {code: messages for code, messages in found.items() if messages}


@pytest.mark.parametrize("fmt", ["binary", "json"])
@pytest.mark.parametrize("operation", ["read", "write"])
def test_healthy_receipts_pass(tmp_path, fmt, operation):
    assert failing(Run(operation).case(tmp_path, fmt)) == {}


def test_guards_apply_to_read_with_the_accounting_observer_only():
    workload = {"observers": [{"tool": "accounting", "role": "requester"}]}
    assert digests.read_with_accounting({"operation": "read"}, workload)
    assert not digests.read_with_accounting({"operation": "write"}, workload)
    assert not digests.read_with_accounting({"operation": "read"}, {"observers": []})
    # installed-restart's accounting watches the survivor's stale attempts, not the rounds' bytes
    assert not digests.read_with_accounting({"operation": "read", "mode": "installed-restart"}, workload)


# --- coverage -------------------------------------------------------------------------------------


def _shift(run, wr_ids, by):
    for wr_id in wr_ids:
        run.data(wr_id)["off"] += by


COVERAGE = {
    "a range never hashed": (lambda r: r.events.remove(r.data(5)), "range(s) witness"),
    "a range hashed twice": (lambda r: r.events.append(dict(r.data(5))), "range(s) witness"),
    # parent 0 of round 1: slices 2 and 3 moved 5 bytes down: an overlap, and the last 5 bytes unseen
    "a range overlapping the one before it": (lambda r: _shift(r, (2, 3), -5), "overlaps the range before it"),
    "a range in the guard": (lambda r: _shift(r, (4,), -5), "is not inside one parent's payload"),
    "a range in an MR of another size": (lambda r: r.data(5).update(mr_len=PARENTS * STRIDE + 1), "is in an MR of"),
    "a range the observer could not hash (no MR)": (lambda r: r.data(5).update(flags=4, sha256=None),
                                                    "its lkey named no MR"),
    "a range outside its MR": (lambda r: r.data(5).update(flags=8, sha256=None), "outside its MR"),
    "a data event of a WR the ledger does not list": (lambda r: r.events.append(dict(r.data(5), wr_id=999)),
                                                      "of WRs the ledger does not list"),
    "no digests taken": (lambda r: r.header.update(digest=None), "took no digests"),
    # a WR ID the ledger lists, but on another QP: the WR-ID-only join checks the QPN (_rounds_of)
    "a data event of a listed WR ID on another QP": (lambda r: r.events.append(dict(r.data(5), qpn=QPN + 1)),
                                                     "of WRs the ledger does not list"),
}


@pytest.mark.parametrize("name", sorted(COVERAGE))
def test_coverage_red_checks(tmp_path, name):
    change, words = COVERAGE[name]
    run = Run()
    change(run)
    found = failing(run.case(tmp_path))
    assert list(found) == ["digests.coverage"], found
    assert any(words in message for message in found["digests.coverage"]), found


def _ids_per_qp(run):
    """Each round on a QP of its own, WR IDs counted from 1 on every QP: WR IDs repeat across the ledger."""
    renumber = {}
    for index, rnd in enumerate(run.rounds):
        for number, wr in enumerate(rnd["wrs"], start=1):
            renumber[wr["wr_id"]] = (QPN + index, number)
            wr["qpn"], wr["wr_id"] = renumber[wr["wr_id"]]
    for event in run.events:
        event["qpn"], event["wr_id"] = renumber[event["wr_id"]]


@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_wr_ids_repeating_across_qps_are_joined_by_qpn_and_wr_id(tmp_path, fmt):
    run = Run()
    _ids_per_qp(run)
    assert failing(run.case(tmp_path, fmt)) == {}  # each range in its own round: every seed's content matches
    _swap_rounds(run)  # the WR list puts round 1's (QPN, WR ID)s under round 2 and back: seen by the content
    assert list(failing(run.case(tmp_path, fmt))) == ["digests.content"]


def test_a_hole_is_named(tmp_path):
    run = Run()
    run.data(1)["len"] -= 5  # parent 0's bytes 4091..4095 never witnessed; round 1 total short by 5 ...
    run.data(4)["len"] += 5  # ... made up by parent 1's first range running into its second
    run.data(4)["sha256"] = "00" * 32
    found = failing(run.case(tmp_path))["digests.coverage"]
    assert any("leaves bytes 4091..4095 unseen" in m for m in found) and any("overlaps" in m for m in found)


# --- content --------------------------------------------------------------------------------------


def _digest(seed, parent, start, length):
    return hashlib.sha256(bytes(sim_content.RoundInput(seed, PARENTS, PAYLOAD).parent(parent)[start:start + length]
                                )).hexdigest()


def _remake(run, round_index, seed=None, parent_map=None):
    """Rewrite one round's digests as the bytes of ``seed`` (default: the round's own), each parent's taken
    from ``parent_map[parent]``'s window."""
    for wr in run.rounds[round_index]["wrs"]:
        data = run.data(wr["wr_id"])
        parent, start = (data["off"] - G) // STRIDE, (data["off"] - G) % STRIDE
        source = (parent_map or {}).get(parent, parent)
        data["sha256"] = _digest(seed if seed is not None else run.seeds[round_index], source, start, data["len"])


def _swap_rounds(run):
    run.rounds[0]["wrs"], run.rounds[1]["wrs"] = run.rounds[1]["wrs"], run.rounds[0]["wrs"]


CONTENT = {
    "one byte differs": (lambda r: r.data(5).update(sha256=f"{int(r.data(5)['sha256'], 16) ^ 1:064x}"), "round 1: 1"),
    # both ledgers say the seed the bytes are not of
    "the ledgers' seed is not the bytes'": (lambda r: r.seeds.__setitem__(1, r.seeds[1] ^ 1), "round 2: 9"),
    # round 2 delivers round 1's bytes again, under round 2's fresh seed
    "stale bytes under a fresh seed": (lambda r: _remake(r, 1, seed=r.seeds[0]), "round 2: 9"),
    # parents 0 and 1 of round 3 landed in each other's regions
    "parents swapped": (lambda r: _remake(r, 2, parent_map={0: 1, 1: 0}), "round 3: 6"),
    # the WR list puts round 1's WRs under round 2 and back
    "rounds swapped in the WR list": (_swap_rounds, "round 1: 9"),
    "a seed out of range": (lambda r: r.seeds.__setitem__(0, -1), "not a 64-bit unsigned integer"),
}


@pytest.mark.parametrize("fmt", ["binary", "json"])
@pytest.mark.parametrize("name", sorted(CONTENT))
def test_content_red_checks(tmp_path, name, fmt):
    change, words = CONTENT[name]
    run = Run()
    change(run)
    found = failing(run.case(tmp_path, fmt))
    assert list(found) == ["digests.content"], found
    assert any(words in message for message in found["digests.content"]), found


def test_write_content_is_checked_too(tmp_path):
    run = Run("write")
    run.data(7)["sha256"] = "ab" * 32
    assert list(failing(run.case(tmp_path))) == ["digests.content"]


# --- guards ---------------------------------------------------------------------------------------


def test_a_leading_or_trailing_guard_changed_in_flight(tmp_path):
    run = Run()
    run.data(4)["flags"] = 1  # parent 1's first range: its leading guard changed
    run.data(12)["flags"] = 2  # round 2 parent 0's last range: its trailing guard changed
    found = failing(run.case(tmp_path))
    assert list(found) == ["digests.guards"]
    assert "round 1 parent 1 leading, round 2 parent 0 trailing" in found["digests.guards"][0]


def test_windows_next_to_other_ranges_are_not_guards(tmp_path):
    run = Run()
    run.data(2)["flags"] = 3  # the middle range: both windows are its neighbours' payload
    run.data(1)["flags"] = 2  # the first range's trailing window: the second range
    run.data(3)["flags"] = 1  # the last range's leading window: the second range
    assert failing(run.case(tmp_path)) == {}


def test_guard_windows_of_another_size_than_documented(tmp_path):
    run = Run()
    run.header["guard_bytes"] = 2048
    found = failing(run.case(tmp_path))
    assert list(found) == ["digests.guards"] and "the documented guard is 4096 B" in found["digests.guards"][0]
