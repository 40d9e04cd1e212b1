# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Private to this collection: the attribute texts (check mode, diff mode, platform) every module shares."""


class ModuleDocFragment:
    # Descriptions only: each module states its own support (and details), or adds READ_ONLY below,
    # and adds one of the PLATFORM_* fragments.
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description:
      - Can run with C(--check); it then reports what it would change without changing it.
  diff_mode:
    description:
      - Can return a diff of what it changes (or would change) when run with C(--diff).
  platform:
    description: The target systems the module can act on.
    support: N/A
"""

    # The module only reads: check mode runs it unchanged and there is nothing to diff.
    READ_ONLY = r"""
options: {}
attributes:
  check_mode:
    support: full
    details:
      - The module changes nothing, so check mode runs it as usual.
  diff_mode:
    support: N/A
    details:
      - The module changes nothing.
"""

    # Node side: it reads /sys, /proc or /run below its root, or runs Linux RDMA binaries.
    PLATFORM_LINUX = r"""
options: {}
attributes:
  platform:
    platforms: linux
"""

    # Controller side, run by its action plugin in the task's worker (plugins/plugin_utils/_in_process.py).
    CONTROLLER_ACTION = r"""
options: {}
attributes:
  action:
    description: The module has an action plugin of the same name, which runs on the controller.
    support: full
    details:
      - The action plugin does the module's job in the task's worker process on the controller, with the
        module's argument checks, check mode and results (no module transfer, no new Python); wherever the
        task is delegated, the files it reads and writes are the controller's.
"""

    # Controller side (run with delegate_to localhost): plain files and processes only.
    PLATFORM_POSIX = r"""
options: {}
attributes:
  platform:
    platforms: posix
"""
