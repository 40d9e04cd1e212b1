# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Which process each (role, generation) ledger is, and how it must end, from the profile alone.

Every mode but installed-restart runs one process per role and generation, each ending at its own
exit. In installed-restart (docs/restart.md) the survivor (the role that is not ``fault_role``) is
one process started in generation 1 and living through every generation; the fault role is a new
process per generation, and each of them but the last is SIGKILLed by its supervisor at the
generation's restart point. The ledger of every nonfinal generation is written at that point
(status ``idle``); only the last generation's ledgers record an exit and a teardown.
"""

from __future__ import annotations

RESTART_MODE = "installed-restart"
# installed-interruption (docs/interruption.md) runs the same roles: one survivor, a fault role killed
# and replaced per generation, with an authorization held before each kill.
INTERRUPTION_MODE = "installed-interruption"
# installed-lost-completion (docs/lost_completion.md) too, with one round's completions withheld before each kill.
LOST_MODE = "installed-lost-completion"
# installed-cleanup-failure (docs/cleanup_failure.md) too: generation 1's requester is killed with a native
# destroy failed and its objects quarantined, the replacement runs the stale-authority and healthy checks.
CLEANUP_MODE = "installed-cleanup-failure"
RESTART_MODES = (RESTART_MODE, INTERRUPTION_MODE, LOST_MODE, CLEANUP_MODE)
# The control relay's defect switches (docs/runner-contract.md section 7): the plan names them with the
# runners', the relay's journal records them.
RELAY_SWITCHES = ("leak_grant",)
SIGKILL = 9


def restart_roles(profile):
    """(fault role, survivor role) of an installed-restart or installed-interruption profile, else None."""
    if profile.get("mode") not in RESTART_MODES:
        return None
    fault = profile["fault_role"]
    return fault, ("requester" if fault == "source" else "source")


def generations(profile):
    return profile.get("generations", 1) if restart_roles(profile) else 1


def process_generation(profile, role, generation):
    """The generation whose runner start serves ``role`` in ``generation`` (the survivor's: 1)."""
    roles = restart_roles(profile)
    return 1 if roles is not None and role == roles[1] else generation


def dependency_cleanup(profile):
    """installed-cleanup-failure with a dependency kind (cq, channel, pd): a destroy that fails EBUSY by itself."""
    return profile.get("mode") == CLEANUP_MODE and profile.get("cleanup_kind", "qp") in ("cq", "channel", "pd")


def ends_idle(profile, generation):
    """True when the ledgers of ``generation`` end at a restart point (status idle, no exit, no teardown)."""
    return restart_roles(profile) is not None and generation < generations(profile)


def killed(profile, role, generation):
    """True when the runner of (role, generation) is to be SIGKILLed at the generation's restart point."""
    roles = restart_roles(profile)
    return roles is not None and role == roles[0] and generation < generations(profile)


def observer_loaded(observer, role, generation):
    """True when the workload's ``observer`` is preloaded into the runner of (role, generation): an observer
    scoped to one generation (installed-cleanup-failure's uverbs_fault: generation 1) only there."""
    return observer["role"] == role and observer.get("generation", generation) == generation


def expected_kills(profile):
    """[(role, generation)] of the runners the supervisors must SIGKILL, in order."""
    roles = restart_roles(profile)
    return [(roles[0], g) for g in range(1, generations(profile))] if roles else []


def restart_section(ledger, key):
    """The ledger's ``restart.<key>`` object (interruption, lost, cleanup, recovery), or None."""
    restart = ledger.get("restart")
    value = restart.get(key) if isinstance(restart, dict) else None
    return value if isinstance(value, dict) else None


def fault_round(case):
    """The round after a generation's healthy ones, where each restart-roles mode injects its fault."""
    return case.workload["rounds_per_generation"] + 1


def nonfinal_generations(case):
    """The generations that end at a restart point."""
    return [g for g in case.generations() if ends_idle(case.profile, g)]
