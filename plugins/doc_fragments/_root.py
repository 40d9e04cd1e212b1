# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Private to this collection: the O(root) option of the modules that read a host below a root."""


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  root:
    description:
      - The host root every host path is read (or written) below, such as C(<root>/sys),
        C(<root>/proc) and C(<root>/run/orbite).
      - V(/) on a real node; a fake host's directory in the simulated lab
        (RV(orbite.qualification.sim_host#module:host.orbite_root)).
    type: path
    default: /
"""
