# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Node-side modules' jobs: each file is one module's SPEC (AnsibleModule's keyword arguments) and run(module).

The module's main() runs the job under AnsibleModule; the action plugin of the same name runs it in one lean
Python on the node (plugins/plugin_utils/_node_step.py, entry.py here), so a node step costs no AnsiballZ.
Stdlib only, as everything that runs on a node.
"""
