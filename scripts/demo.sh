#!/usr/bin/env bash
# The main job on the simulated lab: create the local fake hosts, run the rail-accounting gate
# (READ/polling and WRITE/events) on them, say where the verdict is and how to run the whole gate
# (playbooks/qualification.yml, not run here: it takes the sum of every mode playbook's time). Everything is written
# under the work directory (ORBITE_WORK_DIR, default $XDG_CACHE_HOME/orbite or ~/.cache/orbite),
# never into the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
# Pinned here with the playbooks' own default, so the verdict is found where they wrote it.
export ORBITE_WORK_DIR=${ORBITE_WORK_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/orbite}
ansible-playbook playbooks/sim_lab.yml
status=0
ansible-playbook -i inventories/sim playbooks/rail_accounting.yml "$@" || status=$?
latest=$(ls -td "$ORBITE_WORK_DIR"/runs/*/ 2>/dev/null | head -1)
if [[ -n $latest ]]; then
  echo
  echo "verdict: ${latest}verdict.md (JSON: ${latest}verdict.json, JUnit: ${latest}verdict.xml)"
  head -5 "${latest}verdict.md" 2>/dev/null || true
fi
echo
echo "the whole gate (every mode's frozen cases, one run and one verdict; docs/qualification.md):"
echo "  ansible-playbook -i inventories/sim playbooks/qualification.yml    (--check: plan only)"
exit $status
