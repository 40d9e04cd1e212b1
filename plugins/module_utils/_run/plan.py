# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Lay out a run directory on the controller: run.json and one cases/<id>/case.json per case.

One job, done before any node is touched: the verifier later reads exactly this plan (which cases
must exist, which profile each ran), so it is written atomically and never mixed with another run.

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
    read_regular_bytes,
)
from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote

RUN_SCHEMA = ("orbite.run", 1)
CASE_SCHEMA = ("orbite.case", 1)


class RunPlanError(OrbiteError):
    """Bad input or a run directory that belongs to another run."""

    code = "run_plan.invalid"


DIR_MODE = 0o700
FILE_MODE = 0o600
PLAN_READ_LIMIT = 1 << 20  # an existing run.json is a few hundred bytes


def make_private_dirs(path):
    """Create ``path`` and its missing parents, each 0700 (os.makedirs gives parents 0777 & ~umask)."""
    missing = []
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
            continue  # made meanwhile by someone else: keep its mode
        os.chmod(directory, DIR_MODE)  # the umask may have taken bits we meant to keep (u+rwx)


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
    if os.path.lexists(run_json):
        try:
            existing = json.loads(read_regular_bytes(run_json, PLAN_READ_LIMIT).decode("utf-8"))
        except (OSError, ValueError, RecursionError, OrbiteError) as error:
            raise RunPlanError(f"run_dir={run_dir}: run.json exists but cannot be read ({error})") from None
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
    make_private_dirs(run_dir)
    for case_id, case in per_case.items():
        case_dir = os.path.join(run_dir, "cases", case_id)
        make_private_dirs(case_dir)
        atomic_write_json(os.path.join(case_dir, "case.json"), case, mode=FILE_MODE)
    atomic_write_json(run_json, run, mode=FILE_MODE)  # last: a run.json always describes case dirs that exist
    return True
