# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Private to this collection: the options that locate a node's lock supervisor (its run directory)."""


class ModuleDocFragment:
    # Use with the _root fragment: the default run directory lies below O(root).
    DOCUMENTATION = r"""
options:
  run_id:
    description:
      - The qualification run the supervisor serves. It names the supervisor's run directory,
        C(<root>/run/orbite/supervisors/<run_id>).
      - 1 to 64 ASCII letters, digits, C(.), C(_) or C(-), starting with a letter or digit.
    type: str
  run_dir:
    description:
      - The supervisor's private run directory (mode 0700) holding its control socket, journal and
        program copy. Defaults to C(<root>/run/orbite/supervisors/<run_id>).
    type: path
"""
