#!/usr/bin/env bash
# Runs the rail-accounting gate (with discovery) and one installed-interruption case (the restart flow with its
# control relay, three generations) on a throw-away local sim lab with the OLDEST supported ansible-core
# (meta/runtime.yml says >= 2.17), from its own venv, so a construct that only newer ansible-core understands
# fails here and not in a lab.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${COMPAT_VENV:-.venv-ansible-2.17}
if [[ ! -x $venv/bin/ansible-playbook ]]; then
  "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet -r meta/ee-requirements.txt "ansible-core>=2.17,<2.18" "cryptography<51"
fi
export ANSIBLE_CONFIG=$PWD/ansible.cfg PATH=$PWD/$venv/bin:$PATH
# A throw-away work directory: the lab and the run directory derive from it.
work=$(mktemp -d)
export ORBITE_WORK_DIR=$work
cleanup() {
  ansible-playbook playbooks/sim_lab.yml -e sim_lab_state=absent >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
echo "compat: $(ansible --version | sed -n 1p)"
ansible-playbook playbooks/sim_lab.yml >"$work/lab.log" 2>&1 || { cat "$work/lab.log"; exit 1; }
# --check first: the preflight-then-stop path must hold on the oldest ansible-core too.
if ! ansible-playbook --check -i inventories/sim playbooks/rail_accounting.yml >"$work/check.log" 2>&1 \
     || ! grep -q "check mode: preflight passed" "$work/check.log"; then
  tail -40 "$work/check.log"
  echo "compat: --check failed with the oldest supported ansible-core" >&2
  exit 1
fi
# One playbook run on the lab, its log shown only when it fails: gate <label> <log name> <ansible-playbook args...>
gate() {
  local label=$1 log=$work/$2; shift 2
  if ansible-playbook -i inventories/sim "$@" >"$log" 2>&1; then
    echo "compat: $label verdict PASS with $(ansible --version | sed -n 1p)"
  else
    tail -40 "$log"
    echo "compat: $label failed with the oldest supported ansible-core" >&2
    exit 1
  fi
}
# One case (the other differs in operation and progress mode only, which ansible-core does not see).
gate "rail_accounting (discovery)" gate.log playbooks/rail_accounting.yml \
  -e orbite_profile_file=rail_accounting_discovery.json -e orbite_case_only=write-events
# The restart flow's generations (generation 1, then each later one's kill and replacement, keyed by the plan's
# words) and the relay: the requester is the fault role, its replacements reach the source through the relay.
gate "interruption (requester-g3-read-polling)" restart.log playbooks/interruption.yml \
  -e orbite_case_only=requester-g3-read-polling
