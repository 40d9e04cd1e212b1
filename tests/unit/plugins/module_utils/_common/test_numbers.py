"""The one reader of whole numbers written as text, and the places that use it."""

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._common.numbers import ascii_int, is_ascii_digits
from ansible_collections.orbite.qualification.plugins.module_utils._inventory.discovery import (
    DiscoveryExpectError,
    _pin,
)
from ansible_collections.orbite.qualification.plugins.module_utils._inventory.sysfs import FieldError, parse_int
from ansible_collections.orbite.qualification.plugins.module_utils._node.daemon import RequestError, signal_number

# superscript two, Arabic-Indic sixteen, mathematical bold sixteen
NOT_NUMBERS = ["\u00b2", "\u0661\u0666", "\U0001d7cf\U0001d7d4", "+-5", "-1", "+5", "1_0", "1e3", "", " ",
               "16\n", "9" * 13, "9" * 5000, None, 3.0]
# Blanks are not digits (issue 32): the rule every caller states is "ASCII digits".
BLANKED = [" 16", "16 ", "\t16", " 16\t", "1 6", "\u00a016"]


@pytest.mark.parametrize("text, value", [("0", 0), ("16", 16), ("007", 7), ("9" * 12, int("9" * 12))])
def test_ascii_digits_are_read(text, value):
    assert ascii_int(text) == value


@pytest.mark.parametrize("text", NOT_NUMBERS + BLANKED)
def test_everything_else_is_not_a_number(text):
    assert ascii_int(text) is None


@pytest.mark.parametrize(
    "name, ok", [("0", True), ("12", True), ("\u00b2", False), ("\u0661", False), ("1 ", False), ("", False)]
)
def test_directory_names(name, ok):
    assert is_ascii_digits(name) is ok


@pytest.mark.parametrize("text", ["\u00b2", "\u0661\u0666", "+-5", *BLANKED])
def test_users_refuse_unicode_digits_and_blanks(text):
    with pytest.raises(RequestError):
        signal_number(text)
    with pytest.raises(DiscoveryExpectError):
        _pin(text)
    with pytest.raises(FieldError):
        parse_int(text)


def test_users_still_read_ascii():
    assert signal_number("9") == 9 and _pin("3") == 3 and parse_int("42") == 42
