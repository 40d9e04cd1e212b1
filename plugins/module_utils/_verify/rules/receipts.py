# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The receipt.* codes: a receipt that cannot be trusted as read (emitted by loader.py and reading.py)."""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._verify.reading import (
    MAX_CASE_BYTES,
    MAX_CASE_VALUES,
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    MAX_LOG_BYTES,
    MAX_VALUES,
)
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import declare

_FORMAT = ("format",)

declare("receipt.missing", "receipts", "every receipt the case implies is present", witness=_FORMAT)
declare("receipt.unsafe", "receipts", "every receipt is a regular file inside the run directory (no FIFO, device, "
        "socket or directory; no symlink leading out)", witness=_FORMAT)
declare("receipt.oversize", "receipts", f"every receipt is within its caps ({MAX_DOCUMENT_BYTES >> 20} MiB a JSON "
        f"document, {MAX_LOG_BYTES >> 20} MiB a JSON-lines log, {MAX_VALUES >> 20} Mi JSON values; "
        f"{MAX_CASE_BYTES >> 20} MiB and {MAX_CASE_VALUES >> 20} Mi values a case)", witness=_FORMAT)
declare("receipt.nesting", "receipts", f"no receipt nests deeper than {MAX_DEPTH} levels", witness=_FORMAT)
declare("receipt.malformed", "receipts", "every receipt is readable JSON of the documented kind", witness=_FORMAT)
declare("receipt.schema", "receipts", "every receipt carries the documented schema name and version",
        witness=_FORMAT)
declare("receipt.truncated", "receipts", "no receipt is a checkpoint or cut short", witness=_FORMAT)
declare("receipt.shape", "receipts", "every receipt has the documented fields and types", witness=_FORMAT)
declare("receipt.format", "receipts", "every observer log's name says its format (observer-<tool>.bin: binary "
        "records, .jsonl: JSON lines), and one log per tool", witness=_FORMAT)
