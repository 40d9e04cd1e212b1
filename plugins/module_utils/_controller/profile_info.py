# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The profile_info module's job: validate profiles, derive each case's workload (plugins/modules/profile_info.py)."""

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._profile.model import (
    ProfileError,
    load_and_derive,
)

SPEC = {
    "argument_spec": {
        "profile": {"type": "raw"},
        "path": {"type": "path"},
        "cases": {"type": "list", "elements": "dict", "options": {
            "id": {"type": "str"},
            "profile": {"type": "raw"},
            "path": {"type": "path"},
            "changes": {"type": "dict", "default": {}},
            "reverse_hosts": {"type": "bool", "default": False},
        }, "mutually_exclusive": [("profile", "path")], "required_one_of": [("profile", "path")]},
    },
    "mutually_exclusive": [("profile", "path", "cases")],
    "required_one_of": [("profile", "path", "cases")],
}


def _derive_cases(cases):
    """Each case -> {profile, workload}; every broken case's violations, each naming its case.

    A case is named by its ID, else by its position from 1 (a lone case without an ID is not named).
    """
    derived, violations = [], []
    for position, case in enumerate(cases, start=1):
        name = case.get("id") or (str(position) if len(cases) > 1 else None)
        try:
            profile, workload = load_and_derive(profile=case.get("profile"), path=case.get("path"),
                                                changes=case.get("changes"), reverse_hosts=case.get("reverse_hosts"))
        except ProfileError as error:
            violations.extend(dict(v.as_dict(), **({"case": name} if name else {})) for v in error.violations)
            continue
        derived.append({"profile": profile, "workload": workload})
    return derived, violations


def _cases_message(violations):
    named = [v["case"] for v in violations if "case" in v]
    where = f" in case(s) {', '.join(dict.fromkeys(named))}" if named else ""
    found = "; ".join(f"{v['case']}: {v['message']}" if "case" in v else v["message"] for v in violations)
    return f"invalid qualification profile: {len(violations)} violation(s){where}: {found}"


def run(module):
    if module.params["cases"] is not None:
        derived, violations = _derive_cases(module.params["cases"])
        if violations:
            module.fail_json(msg=_cases_message(violations), code=ProfileError.code, changed=False,
                             violations=violations)
        module.exit_json(changed=False, cases=derived)
    try:
        profile, workload = load_and_derive(profile=module.params["profile"], path=module.params["path"])
    except ProfileError as error:
        fail_from(
            module,
            error,
            prefix=f"invalid qualification profile: {len(error.violations)} violation(s)",
            violations=[v.as_dict() for v in error.violations],
        )
    module.exit_json(changed=False, profile=profile, workload=workload)
