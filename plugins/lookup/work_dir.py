# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Lookup: the gate's work directory on the controller (the one default, used by every playbook)."""

DOCUMENTATION = r"""
name: work_dir
author: OrbiTE qualification team (@orbite-qualification)
version_added: 0.2.0
short_description: The controller's work directory of the qualification gate
description:
  - Returns the directory under which the gate writes everything (the simulated lab, the run
    directories with receipts and verdicts), never the collection, the playbook directory or the
    current directory.
  - It is the environment variable E(ORBITE_WORK_DIR) when set, else C($XDG_CACHE_HOME/orbite), else
    C(~/.cache/orbite) of the controller user. Playbooks let C(-e orbite_work_dir=...) override it.
  - Terms, when given, are joined below it (for example V(runs)).
options:
  _terms:
    description: Relative path parts to join below the work directory.
    type: list
    elements: str
    required: false
notes:
  - The value is an absolute path; a relative E(ORBITE_WORK_DIR) or E(XDG_CACHE_HOME) is an error.
"""

EXAMPLES = r"""
- name: Where runs go
  ansible.builtin.debug:
    msg: "{{ lookup('orbite.qualification.work_dir', 'runs') }}"
"""

RETURN = r"""
_raw:
  description: The work directory (or the path below it), one element.
  type: list
  elements: str
  sample: ["/root/.cache/orbite/runs"]
"""

import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase


def default_work_dir(environ=None):
    """ORBITE_WORK_DIR, else $XDG_CACHE_HOME/orbite, else ~/.cache/orbite; absolute or an error."""
    environ = os.environ if environ is None else environ
    chosen = environ.get("ORBITE_WORK_DIR") or ""
    source = "ORBITE_WORK_DIR"
    if not chosen:
        cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        chosen, source = os.path.join(cache, "orbite"), "XDG_CACHE_HOME (or ~/.cache)"
    chosen = os.path.expanduser(chosen)
    if not os.path.isabs(chosen):
        raise AnsibleLookupError(f"work_dir: {source} gives {chosen!r}: must be an absolute path")
    return os.path.normpath(chosen)


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        base = default_work_dir()
        parts = [str(t) for t in (terms or [])]
        for part in parts:
            if os.path.isabs(part) or ".." in part.split("/"):
                raise AnsibleLookupError(f"work_dir: term {part!r}: must be a relative path without '..'")
        return [os.path.join(base, *parts)]
