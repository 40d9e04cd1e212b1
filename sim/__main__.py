# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Entry point of the simulated runner, run as ``python3 orbite-sim-runner.pyz`` (deployed) or ``python3 sim``.

Both put this directory first on sys.path, so the ``orbite_sim`` package imports as is.
"""

import sys

from orbite_sim.runner import main

if __name__ == "__main__":
    sys.exit(main())
