# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The collection's one reader of whole numbers written as text (surveys, sysfs, requests)."""

import re

# Only ASCII decimal digits count: str.isdigit() also takes a superscript two, and int() takes
# Arabic-Indic or mathematical bold digits, '1_0' and signs. The digit bound keeps int() cheap and
# far from Python's 4300-digit limit. Nothing else either: a blank around the digits is not a digit (the rule
# the callers state is "ASCII digits"); a reader of text that ends in a newline (sysfs) strips it itself.
DIGITS_MAX = 12
_DECIMAL = re.compile(r"[0-9]+", re.ASCII)


def ascii_int(text, digits_max: int = DIGITS_MAX):
    """The value of ``text`` if it is 1..digits_max ASCII digits and nothing else, else None."""
    if not isinstance(text, str) or len(text) > digits_max or _DECIMAL.fullmatch(text) is None:
        return None
    return int(text)


def is_ascii_digits(text) -> bool:
    """True for a non-empty run of ASCII digits and nothing else (a sysfs directory name, say)."""
    return isinstance(text, str) and 0 < len(text) <= DIGITS_MAX and text.isascii() and text.isdigit()
