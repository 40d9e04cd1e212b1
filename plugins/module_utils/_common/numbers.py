# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The collection's one reader of whole numbers written as text (surveys, sysfs, requests)."""

import re

# Only ASCII decimal digits count: str.isdigit() also takes a superscript two, and int() takes
# Arabic-Indic or mathematical bold digits, '1_0' and signs. The digit bound keeps int() cheap and
# far from Python's 4300-digit limit.
DIGITS_MAX = 12
_DECIMAL = re.compile(r"[ \t]*([0-9]+)[ \t]*", re.ASCII)


def ascii_int(text, digits_max: int = DIGITS_MAX):
    """The value of ``text`` if it is 1..digits_max ASCII digits (spaces or tabs around allowed), else None."""
    if not isinstance(text, str) or len(text) > digits_max + 64:
        return None
    match = _DECIMAL.fullmatch(text)
    if match is None or len(match.group(1)) > digits_max:
        return None
    return int(match.group(1))


def is_ascii_digits(text) -> bool:
    """True for a non-empty run of ASCII digits and nothing else (a sysfs directory name, say)."""
    return isinstance(text, str) and 0 < len(text) <= DIGITS_MAX and text.isascii() and text.isdigit()
