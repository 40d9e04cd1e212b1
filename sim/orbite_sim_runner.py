#!/usr/bin/env python3
"""Simulated OrbiTE engine runner (orbite-installed-host-v4); see docs/runner-contract.md.

Deploy the ``sim/`` directory as files and run ``python3 orbite_sim_runner.py --case C --output D``.
Stdlib only, Python >= 3.9.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from orbite_sim.runner import main  # imported after the path set-up above

if __name__ == "__main__":
    sys.exit(main())
