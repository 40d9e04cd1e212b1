#!/usr/bin/env bash
# The main job on the simulated lab. Until the lab and the gate playbooks exist, it runs the
# preflight of the frozen rail-accounting profile and prints the derived workload.
set -euo pipefail
cd "$(dirname "$0")/.."
exec ansible-playbook playbooks/preflight.yml -e orbite_profile_file=profiles/rail_accounting.json "$@"
