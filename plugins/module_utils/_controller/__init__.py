# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Controller-side modules' jobs: each file is one module's SPEC (AnsibleModule's keyword arguments) and run(module).

The module's main() runs the job under AnsibleModule; the action plugin of the same name runs it in the task's
worker (plugins/plugin_utils/_in_process.py), so a controller step costs no AnsiballZ and no new Python.
"""
