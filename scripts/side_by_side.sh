#!/usr/bin/env bash
# Runs the given make targets at the same time, each into a log of its own, then prints the logs in the
# order given and fails when any target failed. `make test` uses it for steps that share nothing (ansible-test
# sanity binds no address and runs no lab; molecule's labs are the only ones running then), so their wall time
# overlaps on a machine of few cores instead of adding up.
# Usage: scripts/side_by_side.sh TARGET [TARGET ...]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for target in "$@"; do
  make --no-print-directory "$target" >"$logs/$target.log" 2>&1 &
  pids+=("$!")
  echo "side_by_side: started make $target"
done
failed=()
targets=("$@")
for index in "${!pids[@]}"; do
  target=${targets[$index]}
  if ! wait "${pids[$index]}"; then
    failed+=("$target")
  fi
  echo "==== make $target (done by ${SECONDS} s) ===="
  cat "$logs/$target.log"
done
if ((${#failed[@]})); then
  echo "side_by_side: failed: ${failed[*]}" >&2
  exit 1
fi
