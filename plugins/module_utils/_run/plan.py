# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Lay out a run directory on the controller: run.json and one cases/<id>/case.json per case.

One job, done before any node is touched: the verifier later reads exactly this plan (which cases
must exist, which profile each ran), so it is written atomically and never mixed with another run.
"""

from __future__ import annotations

import json
import os

from ansible_collections.orbite.qualification.plugins.module_utils._common.files import atomic_write_json
from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError

RUN_SCHEMA = ("orbite.run", 1)
CASE_SCHEMA = ("orbite.case", 1)


class RunPlanError(OrbiteError):
    """Bad input or a run directory that belongs to another run."""

    code = "run_plan.invalid"


def _atomic_json(path, data):
    atomic_write_json(path, data, mode=0o644)


def plan_documents(run_id, cases, allow_dirty=False, runner_kind="sim", defects=()):
    """run.json and each case.json, checked: case ids unique and path-safe, each with a profile."""
    if not names.is_name(run_id):  # it names the run directory (an AWX survey may send anything)
        raise RunPlanError(f"run_id={names.quote(run_id)}: must be {names.NAME_RULE}")
    seen = set()
    for index, case in enumerate(cases):
        case_id = case.get("id") if isinstance(case, dict) else None
        if not names.is_name(case_id):
            raise RunPlanError(f"cases[{index}].id={names.quote(case_id)}: must be {names.NAME_RULE}")
        if case_id in seen:
            raise RunPlanError(f"cases[{index}].id={case_id!r}: must be unique in the run")
        if not isinstance(case.get("profile"), dict):
            raise RunPlanError(f"cases[{index}].profile: must be the validated profile (a mapping)")
        seen.add(case_id)
    run = {"schema": RUN_SCHEMA[0], "version": RUN_SCHEMA[1], "run_id": run_id,
           "cases": [c["id"] for c in cases], "allow_dirty": bool(allow_dirty), "runner_kind": runner_kind,
           "defects": list(defects)}
    per_case = {c["id"]: {"schema": CASE_SCHEMA[0], "version": CASE_SCHEMA[1], "case_id": c["id"],
                          "profile": c["profile"],
                          "hosts": {"source": c["profile"].get("source"), "requester": c["profile"].get("requester")}}
                for c in cases}
    return run, per_case


def write_plan(run_dir, run_id, cases, check_mode=False, **options):
    """Write the plan; returns changed. Refuses a directory holding another run's plan."""
    run, per_case = plan_documents(run_id, cases, **options)
    run_json = os.path.join(run_dir, "run.json")
    if os.path.exists(run_json):
        try:
            with open(run_json, encoding="utf-8") as handle:
                existing = json.load(handle)
        except (OSError, ValueError) as error:
            raise RunPlanError(f"run_dir={run_dir}: run.json exists but cannot be read ({error})") from None
        if existing.get("run_id") != run_id:
            raise RunPlanError(f"run_dir={run_dir}: holds run {existing.get('run_id')!r}, not {run_id!r}; "
                               "receipts of two runs must never mix")
        if existing == run:
            return False
    if check_mode:
        return True
    for case_id, case in per_case.items():
        case_dir = os.path.join(run_dir, "cases", case_id)
        os.makedirs(case_dir, mode=0o755, exist_ok=True)
        _atomic_json(os.path.join(case_dir, "case.json"), case)
    _atomic_json(run_json, run)  # last: a run.json always describes case dirs that exist
    return True
