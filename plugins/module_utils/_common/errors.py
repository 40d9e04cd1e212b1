# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The collection's one error root and one way for a module to fail from it."""

from typing import Any, Dict

# A value quoted in a message is cut to this many characters, so hostile input cannot flood a log.
QUOTE_LIMIT = 200


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """repr() of a value for a message, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class OrbiteError(Exception):
    """Base of every error the collection raises on purpose.

    ``code`` is stable (tests and docs name it); ``details`` are extra facts a module returns
    beside ``msg``. Subclasses set a class-level ``code`` or pass one per instance.
    """

    code = "orbite.error"

    def __init__(self, *args, code: str = "", **details):
        super().__init__(*args)
        if code:
            self.code = code
        self.details: Dict[str, Any] = details


def fail_from(module, exc: BaseException, /, prefix: str = "", **result) -> None:
    """``module.fail_json`` from an error, in the one failure shape: msg, code, details, result.

    ``result`` may hold any key but ``prefix`` (modules return an ``error`` word, for example).
    Anything that is not an OrbiteError (an OSError from the filesystem, say) is reported with a
    code made from its class name, never as a traceback.
    """
    code = getattr(exc, "code", "") if isinstance(exc, OrbiteError) else ""
    if not isinstance(code, str) or not code:
        code = f"os.{type(exc).__name__}" if isinstance(exc, OSError) else f"error.{type(exc).__name__}"
    details = dict(getattr(exc, "details", None) or {})
    details.update(result)
    for reserved in ("msg", "code", "failed", "changed"):
        details.pop(reserved, None)
    message = f"{prefix}: {exc}" if prefix else str(exc)
    module.fail_json(msg=message, code=code, changed=bool(result.get("changed", False)), **details)
