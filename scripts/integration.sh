#!/usr/bin/env bash
# Runs the ansible-test integration targets (tests/integration/targets) against the built and
# installed collection, on the controller, with the venv's Python; exits non-zero if any fails.
# Usage: scripts/integration.sh [ansible-test integration arguments, e.g. a target name]
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
venv_bin=$(realpath "${VENV:-.venv}/bin")
python_version=$("$venv_bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# Installed outside the checkout: ansible-test lists a collection's files with git when it finds a
# .git above it, and the checkout's git ignores build/, so under it ansible-test sees no targets.
work=$(mktemp -d "${TMPDIR:-/tmp}/orbite-integration.XXXXXX")
keep=0
trap 'if [ "$keep" = 0 ]; then rm -rf "$work"; else echo "integration: kept $work" >&2; fi' EXIT

installed=$(ANSIBLE_GALAXY="$venv_bin/ansible-galaxy" bash scripts/installed-collection.sh "$work")
# The targets run from the installed copy; should the tarball ever leave tests/ out, copy them in.
if [ ! -d "$installed/tests/integration/targets" ]; then
  mkdir -p "$installed/tests"
  cp -R "$repo/tests/integration" "$installed/tests/"
  cp "$repo/tests/config.yml" "$installed/tests/"
fi

# ansible-test makes its own configuration and collections path: nothing of the checkout's leaks in.
unset ANSIBLE_CONFIG ANSIBLE_COLLECTIONS_PATH ANSIBLE_COLLECTIONS_PATHS
export PATH="$venv_bin:$PATH"
echo "integration: ansible-test integration on $installed (Python $python_version)"
status=0
(cd "$installed" && "$venv_bin/ansible-test" integration --local --python "$python_version" --color no "$@") || status=$?
if [ "$status" != 0 ]; then
  keep=1
  echo "integration: FAILED (exit $status); output under $installed/tests/output" >&2
fi
exit "$status"
