"""_common.names: the one name grammar (RNIC, run, case, host names) and the host name grammar."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError

VALID_NAMES = [
    "a",
    "7",
    "mlx5_0",
    "sim-a",
    "rxe0",
    "run.2024-05-01T10-00",
    "A" * 64,
    "a..b",  # dots inside a name are fine; only '.' and '..' themselves are directory names
    "case_1-read.events",
]

INVALID_NAMES = [
    "",
    ".",
    "..",
    "/",
    "a/b",
    "../etc",
    "a\n",  # a trailing newline: re.match with $ would let it through
    "\na",
    "a\r",
    " a",
    "a ",
    "a\tb",
    "a\x00",
    "-a",
    "_a",
    ".hidden",
    "A" * 65,
    "²",  # superscript two: str.isdigit() is true for it
    "١٦",  # Arabic-Indic sixteen
    "\U0001d7cf\U0001d7d4",  # mathematical bold digits
    "mlx5_\uff10",  # fullwidth zero
    "\u0455im-a",  # Cyrillic dze, looks like 's'
    "sim\u2010a",  # Unicode hyphen, looks like '-'
    "é",
    "a:b",
    "a*",
    None,
    5,
    b"mlx5_0",
    ["mlx5_0"],
]


@pytest.mark.parametrize("value", VALID_NAMES)
def test_valid_names(value):
    assert names.is_name(value)
    assert names.check_name("rnic", value) == value


@pytest.mark.parametrize("value", INVALID_NAMES, ids=repr)
def test_invalid_names_are_refused_naming_field_value_and_rule(value):
    assert not names.is_name(value)
    with pytest.raises(names.InvalidName) as caught:
        names.check_name("run_id", value)
    error = caught.value
    assert isinstance(error, OrbiteError)
    assert error.code == "name.invalid"
    assert error.details == {"field": "run_id"}
    message = str(error)
    assert message.startswith(f"run_id={names.quote(value)}: must be ")
    assert names.NAME_RULE in message


def test_a_huge_value_is_cut_in_the_message():
    with pytest.raises(names.InvalidName) as caught:
        names.check_name("case", "x/" * 50_000)
    assert len(str(caught.value)) < 400


def test_the_rule_text_matches_the_grammar():
    assert str(names.NAME_MAX) in names.NAME_RULE
    assert names.is_name("a" * names.NAME_MAX) and not names.is_name("a" * (names.NAME_MAX + 1))


VALID_HOSTNAMES = [
    "a",
    "sim-a",
    "node01",
    "node01.lab.example",
    "1node",
    "x" * 63,
    ".".join(["a" * 63] * 3 + ["b" * 61]),  # 253 characters
]

INVALID_HOSTNAMES = [
    "",
    "-a",
    "a-",
    "a..b",
    ".a",
    "a.",
    "a_b",
    "sim-a\n",
    "x" * 64,  # one label longer than 63
    ".".join(["a" * 63] * 3 + ["b" * 62]),  # 254 characters
    "\u0455im-a",
    "node\uff11",
    "a b",
    "a/b",
    None,
    7,
]


@pytest.mark.parametrize("value", VALID_HOSTNAMES, ids=lambda v: repr(v)[:40])
def test_valid_hostnames(value):
    assert names.is_hostname(value)
    assert names.check_hostname("source", value) == value


@pytest.mark.parametrize("value", INVALID_HOSTNAMES, ids=lambda v: repr(v)[:40])
def test_invalid_hostnames_are_refused(value):
    assert not names.is_hostname(value)
    with pytest.raises(names.InvalidName) as caught:
        names.check_hostname("source", value)
    assert caught.value.code == "name.invalid"
    assert str(caught.value).startswith(f"source={names.quote(value)}: must be ")
    assert names.HOSTNAME_RULE in str(caught.value)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=80))
def test_any_accepted_name_is_plain_ascii_and_a_safe_file_name(value):
    if names.is_name(value):
        assert value.isascii() and value.isprintable()
        assert "/" not in value and value not in (".", "..") and not value.startswith((".", "-"))
        assert 1 <= len(value) <= names.NAME_MAX
    else:
        with pytest.raises(names.InvalidName):
            names.check_name("name", value)
