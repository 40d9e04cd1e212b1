# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The collection's errors as a filter's failure: the one place a filter turns an OrbiteError into Ansible's.

Private to the collection. Light on purpose: Ansible imports every filter file of the collection to find any one
filter, in each task's worker.
"""

from __future__ import annotations

from contextlib import contextmanager

from ansible.errors import AnsibleFilterError
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError


@contextmanager
def filter_errors():
    """Re-raise an OrbiteError inside the block as AnsibleFilterError "<code>: <message>", without the traceback
    of the collection's code (the message names the field, the value and the rule)."""
    try:
        yield
    except OrbiteError as error:
        raise AnsibleFilterError(f"{error.code}: {error}") from None
