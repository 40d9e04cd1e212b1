# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The verifier's one registry of codes: every rule with its check, and the run.*, case.* and receipt.* codes.

A rule is registered beside its check with ``@rule(code, group, meaning, applies=..., witness=...)``;
the codes the verdict itself emits (a plan that cannot be read, a case that never ran, a receipt
that cannot be trusted) are registered with ``declare`` in ``rules/plan.py`` and ``rules/receipts.py``.
docs/verifier.md's code table is generated from this registry (scripts/verifier_codes_table.py),
and the verdict reads every finding's group and meaning from it, so a code that is not registered
cannot be reported.

The registry refuses a second registration of a code, an unknown witness, and a mask (``after``)
naming a code that is not an earlier rule (masking needs the other rule's result first).
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.orbite.qualification.plugins.module_utils._common.codes import CODE_RE
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote

# Where a rule's expectation comes from: the witness it trusts. The receipt under test is the
# other side of the comparison. A rule whose only witness is "runner" takes the runner's word for
# its own work (one witness, not two): issue 12 replaces those rules one by one.
WITNESSES = {
    "plan": "the run plan (`run.json`, `case.json`), written by the controller before any node ran",
    "profile": "the profile model (`derive_workload`): the expected figures",
    "inventory": "the discovery inventories read from sysfs around the runner",
    "journal": "the node's lock-supervisor journal",
    "observer": "the observer log written by the preloaded observer library",
    "peer": "the other role's ledger",
    "runner": "the runner's own ledger (its word for its own work)",
    "relay": "the control relay's journal of the rendezvous frames it forwarded and held (installed-interruption)",
    "provider": "the loopback verbs provider's own counters (per process and per device) in the ledgers; only when "
                "the plan loads it (`run.json` artifacts.verbs_library): the system libibverbs has no such counters",
    "gate": "the gate's record of a failed node step (`node-failure.json`)",
    "format": "the documented receipt formats (docs/receipts.md) and the reading bounds",
}
NEEDS = ("ledgers", "observers", "journals", "inventories", "relay", "provider")


class RegistryError(OrbiteError):
    """A rule registration the registry refuses (a programming error, caught by the unit tests)."""

    code = "verifier.registry"


@dataclass(frozen=True)
class Applies:
    """When a code applies, with the label the docs show; ``test(profile, workload)``, None = always."""

    label: str
    test: object = None

    def __call__(self, profile, workload):
        return self.test is None or bool(self.test(profile, workload))


EVERY_CASE = Applies("every case")
EVERY_RUN = Applies("every run")


def applies(label):
    """Decorator: make a ``(profile, workload) -> bool`` predicate an ``Applies`` with a docs label."""

    def wrap(function):
        return Applies(label, function)

    return wrap


@dataclass(frozen=True)
class Rule:
    code: str
    group: str
    meaning: str
    witness: tuple
    applies: Applies = EVERY_CASE
    check: object = None  # CaseReceipts -> [(message, evidence)]; None for a code the verdict emits itself
    needs: tuple = ("ledgers",)  # receipts that must be usable, else the rule is SKIPped
    # Rules reading the same fact through a more derived receipt: when one of these failed, this
    # rule is reported as masked (SKIP), so that one broken fact gives one failing code.
    after: tuple = ()

    def applies_to(self, profile, workload):
        return self.applies(profile, workload)


class Registry:
    def __init__(self):
        self._entries = {}

    def add(self, entry: Rule) -> Rule:
        problems = []
        if not isinstance(entry.code, str) or not CODE_RE.fullmatch(entry.code):
            problems.append(f"code={quote(entry.code)}: must be <group>.<name> in lower case")
        elif entry.code in self._entries:
            problems.append(f"code={entry.code!r}: is already registered ({self._entries[entry.code].meaning!r})")
        if not (isinstance(entry.group, str) and entry.group and isinstance(entry.meaning, str) and entry.meaning):
            problems.append("group and meaning: must be non-empty strings")
        witness = entry.witness if isinstance(entry.witness, tuple) else ()
        unknown = [w for w in witness if w not in WITNESSES]
        if not witness or unknown:
            problems.append(f"witness={quote(entry.witness)}: must be a non-empty tuple of {sorted(WITNESSES)}")
        if not isinstance(entry.applies, Applies):
            problems.append(f"applies={quote(entry.applies)}: must be an Applies (registry.applies)")
        if entry.check is not None:
            if [n for n in entry.needs if n not in NEEDS]:
                problems.append(f"needs={quote(entry.needs)}: must be among {NEEDS}")
            for code in entry.after:
                earlier = self._entries.get(code)
                if earlier is None or earlier.check is None:
                    problems.append(f"after={code!r}: must name a rule registered before this one")
        elif entry.after:
            problems.append("after: only a rule with a check can be masked")
        if problems:
            raise RegistryError(f"cannot register {entry.code!r}: " + "; ".join(problems), code_name=entry.code)
        self._entries[entry.code] = entry
        return entry

    def rule(self, code, group, meaning, *, witness, applies=EVERY_CASE, needs=("ledgers",), after=()):
        """Decorator: register the decorated function as the check of ``code``; returns it unchanged."""

        def register(check):
            self.add(Rule(code, group, meaning, tuple(witness), applies, check, tuple(needs), tuple(after)))
            return check

        return register

    def declare(self, code, group, meaning, *, witness, applies=EVERY_CASE):
        """Register a code the verdict emits itself (no check function)."""
        return self.add(Rule(code, group, meaning, tuple(witness), applies))

    def __getitem__(self, code) -> Rule:
        return self._entries[code]

    def __contains__(self, code):
        return code in self._entries

    def __iter__(self):
        return iter(tuple(self._entries.values()))

    def __len__(self):
        return len(self._entries)

    def codes(self):
        return tuple(self._entries)

    def rules(self):
        """The rules with a check, in registration order (the order they run and are reported in)."""
        return tuple(entry for entry in self._entries.values() if entry.check is not None)


REGISTRY = Registry()
rule = REGISTRY.rule
declare = REGISTRY.declare
