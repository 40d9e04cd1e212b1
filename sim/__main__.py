"""Entry point when the simulated runner is deployed as one zipapp file (python3 orbite-sim-runner.pyz)."""

import sys

from orbite_sim.runner import main

if __name__ == "__main__":
    sys.exit(main())
