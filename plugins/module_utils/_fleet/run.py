# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""A fleet run's directory on the controller (docs/fleet.md):

    <fleet_dir>/fleet.json, fleet-verdict.{json,md}     the whole fleet (or, merged, every slice)
    <fleet_dir>/slices/<slice>/fleet.json, fleet-verdict.{json,md}    one AWX slice
    <fleet_dir>/<fleet_id>-p<k>/                        pair k: an ordinary run directory (run.json,
                                                        cases/, verdict.*), verified by the verifier

The fleet plan and an INCOMPLETE fleet verdict are written before any host is touched, so a fleet (or
a slice) killed at any point leaves a verdict that is not PASS; the final verdict replaces it.
"""

from __future__ import annotations

import json
import os

from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    atomic_write_json,
    read_regular_bytes,
)
from ansible_collections.orbite.qualification.plugins.module_utils._fleet import plan as fleet_plan
from ansible_collections.orbite.qualification.plugins.module_utils._fleet import verdict as fleet_verdict
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import makedirs_private
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import VerdictWriteError, verify_run

PLAN_NAME = "fleet.json"
SLICES = "slices"


def output_dir(fleet_dir, slice_name=None):
    """Where a fleet's (or one slice's) plan and verdict live."""
    if slice_name:
        names.check_name("slice", slice_name)
        return os.path.join(fleet_dir, SLICES, slice_name)
    return fleet_dir


def attach_runs(plan, fleet_dir):
    """Give each pair (and each busy host of each wave) its run ID and run directory."""
    runs = {}
    for pair in plan["pairs"] + plan["elsewhere"]:
        run_id = fleet_plan.pair_run_id(plan["fleet_id"], pair["id"])
        pair.update(run_id=run_id, run_dir=os.path.join(fleet_dir, run_id))
        runs[pair["id"]] = pair
    for slot in plan["slots"]:
        for entry in slot.values():
            entry.update(run_id=runs[entry["pair"]]["run_id"], run_dir=runs[entry["pair"]]["run_dir"])
    return plan


def start(fleet_dir, plan, cases, slice_name=None, check_mode=False):
    """Write the fleet plan and its INCOMPLETE verdict (nothing ran yet); return the output directory."""
    if not os.path.isabs(fleet_dir):
        raise fleet_plan.FleetPlanError(f"fleet_dir={quote(fleet_dir)}: must be an absolute path")
    for number, case_id in enumerate(cases):
        names.check_name(f"cases[{number}]", case_id)
    if not cases and plan["pairs"]:
        raise fleet_plan.FleetPlanError("cases=[]: a fleet runs at least one planned case")
    out = output_dir(fleet_dir, slice_name)
    doc = dict(plan, slice=slice_name or None, fleet_dir=fleet_dir, cases=list(cases))
    if check_mode:
        return out, doc
    makedirs_private(out)
    atomic_write_json(os.path.join(out, PLAN_NAME), doc)
    fleet_verdict.write_fleet_verdict(fleet_verdict.fleet_verdict(doc, cases, {}, final=False), out)
    return out, doc


def read_plan(out):
    path = os.path.join(out, PLAN_NAME)
    try:
        doc = json.loads(read_regular_bytes(path, fleet_verdict.READ_LIMIT))
    except (OSError, OrbiteError, ValueError) as error:
        raise fleet_plan.FleetPlanError(f"{path}: no readable fleet plan ({error})", path=path) from None
    if (doc.get("schema"), doc.get("version")) != fleet_plan.FLEET_PLAN_SCHEMA:
        raise fleet_plan.FleetPlanError(f"{path}: schema {quote(doc.get('schema'))} is not a fleet plan")
    return doc


def verify(out, write=True):
    """Verify every pair's run directory (the verifier writes each pair's verdict) and write the fleet
    verdict; a pair whose run directory holds no plan (its preflight never ran) has no verdict."""
    doc = read_plan(out)
    got = {}
    for pair in doc["pairs"]:
        if os.path.isfile(os.path.join(pair["run_dir"], "run.json")):
            try:
                got[pair["id"]] = verify_run(pair["run_dir"], write=write)
            except VerdictWriteError:
                continue  # the pair's verdict could not be written (a full disk): it has none, never a PASS
    result = fleet_verdict.fleet_verdict(doc, doc["cases"], got, final=True)
    paths = fleet_verdict.write_fleet_verdict(result, out) if write else {}
    return result, paths


def merge(fleet_dir, fleet_id, expected_pairs, expected_slices, cases=None, write=True):
    """Merge the slices' fleet verdicts under ``<fleet_dir>/slices/`` into ``<fleet_dir>/fleet-verdict.*``.

    Every directory under ``slices/`` is a slice; one without a fleet verdict (killed before it wrote
    one) counts as present but missing its verdict. An unreadable verdict is a slice without one."""
    names.check_name("fleet_id", fleet_id)
    if not isinstance(expected_slices, int) or isinstance(expected_slices, bool) or expected_slices < 1:
        raise fleet_plan.FleetPlanError(f"expected_slices={quote(expected_slices)}: must be a whole number >= 1 "
                                        "(the job's slice count)")
    root = os.path.join(fleet_dir, SLICES)
    found = {}
    try:
        entries = sorted(os.listdir(root))
    except FileNotFoundError:
        entries = []
    for name in entries:
        if not os.path.isdir(os.path.join(root, name)):
            continue
        try:
            found[name] = fleet_verdict.read_fleet_verdict(os.path.join(root, name, fleet_verdict.JSON_NAME))
        except fleet_verdict.FleetVerdictError:
            found[name] = None
    result = fleet_verdict.merge_verdicts(fleet_id, expected_pairs, expected_slices, found, cases=cases)
    paths = fleet_verdict.write_fleet_verdict(result, fleet_dir) if write else {}
    return result, paths
