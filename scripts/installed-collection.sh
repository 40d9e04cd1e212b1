#!/usr/bin/env bash
# Builds the collection tarball and installs it into a collections path of its own, as a user (or
# an execution environment) would get it; prints the installed collection's directory.
# Usage: scripts/installed-collection.sh [DEST]   (default build/installed)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=$(realpath -m "${1:-build/installed}")
galaxy=${ANSIBLE_GALAXY:-.venv/bin/ansible-galaxy}
rm -rf "$dest"
mkdir -p "$dest/tarball"
"$galaxy" collection build --force --output-path "$dest/tarball" . >&2
"$galaxy" collection install --force --offline -p "$dest/collections" "$dest"/tarball/orbite-qualification-*.tar.gz >&2
echo "$dest/collections/ansible_collections/orbite/qualification"
