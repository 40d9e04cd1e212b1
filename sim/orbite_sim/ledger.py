# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The ledger document (docs/receipts.md section 1) and atomic writes of it and of ready.json."""

import json
import os
import time

from . import PROTOCOL, RUNNER_NAME, RUNNER_VERSION


def write_json_atomic(path, obj):
    """Write ``obj`` to ``path`` so a reader sees the old file or the whole new one, never a part."""
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(obj, handle, separators=(",", ":"))
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


# A round's WRs are written as columns (docs/receipts.md 1.6): one list per WR field, in post order.
WR_COLUMNS = ("wr_id", "parent", "slice", "rail", "lane", "qpn", "context", "cq", "opcode", "bytes", "local_offset",
              "remote_offset", "status", "posted_seq", "completed_seq")


def wr_columns(wrs):
    """{column: [value of each WR]} of WR records (dicts), in their order."""
    return {name: [wr[name] for wr in wrs] for name in WR_COLUMNS}


class Ledger:
    def __init__(self, path, case=None, defects=()):
        self.path = path
        self.doc = {
            "schema": "orbite.runner-ledger",
            "version": 1,
            "protocol": PROTOCOL,
            "status": "running",
            "exit_code": None,
            "runner": {"kind": "sim", "name": RUNNER_NAME, "version": RUNNER_VERSION, "defects": list(defects)},
            "pid": os.getpid(),
            "started_at": time.time(),
            "finished_at": None,
            "errors": [],
        }
        if case is not None:
            self.doc.update(_case_fields(case))

    def checkpoint(self):
        write_json_atomic(self.path, self.doc)

    def idle(self):
        """The restart point: this generation's ledger is final, the process lives on (status 'idle')."""
        self.finish("idle", None)

    def finish(self, status, exit_code):
        self.doc["status"] = status
        self.doc["exit_code"] = exit_code
        self.doc["finished_at"] = time.time()
        self.checkpoint()


def _case_fields(case):
    profile = case["profile"]
    return {
        "run_id": case["run_id"],
        "role": case["role"],
        "generation": case["generation"],
        "mode": profile["mode"],
        "operation": profile["operation"],
        "rdma_events": profile["rdma_events"],
        "progress": "events" if profile["rdma_events"] else "polling",
        "hostname": None,
        "boot_id": None,
        "root": case["root"],
        "epoch": None,
        "peer_epoch": None,
        "registration_id": case["registration_id"],
        "peer_registration_id": case.get("peer_registration_id"),
        "service_address": None,
        "verbs_library": None,
        "peer_address": case.get("peer_address") if case["role"] == "requester" else None,
        "profile": profile,
        "workload": None,
        "rails": [],
        "discovery": None,
        "contexts": [],
        "qps": [],
        "rounds": [],
        "teardown": None,
        "totals": None,
        # installed-restart only (docs/restart.md): this generation's restart facts.
        "restart": None,
    }
