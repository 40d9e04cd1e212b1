# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The collection's one name grammar, for RNIC, run, case, host and registration names."""

import re

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote

__all__ = (
    "HOSTNAME_RULE",
    "NAME_RULE",
    "InvalidName",
    "check_hostname",
    "check_name",
    "host_key",
    "is_hostname",
    "is_name",
    "quote",
)

NAME_MAX = 64  # the {0,63} in _NAME
# ASCII only (re.ASCII), full match, bounded: a trailing newline or a look-alike letter is another
# name, and names become file names (lock files, run directories), so they must be unambiguous.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)
# Host names follow DNS (RFC 1123 labels): what `hostname` may print on a lab node.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*", re.ASCII)
HOSTNAME_MAX = 253

NAME_RULE = f"1..{NAME_MAX} ASCII letters, digits, '.', '_' or '-', starting with a letter or digit"
HOSTNAME_RULE = f"a DNS host name (ASCII labels of letters, digits and '-', at most {HOSTNAME_MAX} characters)"


class InvalidName(OrbiteError):
    """A name that breaks the grammar: names the field, the value (cut) and the rule."""

    code = "name.invalid"


def is_name(value) -> bool:
    return isinstance(value, str) and _NAME.fullmatch(value) is not None and value not in (".", "..")


def check_name(field: str, value) -> str:
    """Return ``value`` if it is a valid name, else raise InvalidName naming ``field``."""
    if not is_name(value):
        raise InvalidName(f"{field}={quote(value)}: must be {NAME_RULE}", field=field)
    return value


def is_hostname(value) -> bool:
    return isinstance(value, str) and len(value) <= HOSTNAME_MAX and _HOSTNAME.fullmatch(value) is not None


def check_hostname(field: str, value) -> str:
    if not is_hostname(value):
        raise InvalidName(f"{field}={quote(value)}: must be {HOSTNAME_RULE}", field=field)
    return value


def host_key(name: str) -> str:
    """What makes two host names one host: DNS names are case-insensitive ('sim-a' and 'SIM-A' are one machine).
    The one rule of host identity, for the profile's two hosts, the fleet's hosts and the verifier's check of the
    host a role ran on (host names are ASCII, so lower() folds nothing else)."""
    return name.lower()
