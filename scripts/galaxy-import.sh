#!/usr/bin/env bash
# galaxy-importer, the check Galaxy and Automation Hub run on an uploaded tarball, on the one `make
# build-collection` built, from the publishing checks' venv (it brings its own ansible-lint, flake8 and ansible-core).
# Usage: scripts/galaxy-import.sh               (make test) the tarball fails on the missing repository URL only,
#                                               and rebuilt naming a stand-in URL it imports whole
#        scripts/galaxy-import.sh URL           (make release REPOSITORY=URL) build/release/<tarball> naming URL,
#                                               which must import whole: the tarball to publish
# Known warnings, and why each stays: docs/publishing.md (scripts/galaxy_import.py checks them).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${PUBLISH_VENV:-.venv-publish}  # made by make (scripts/publish-requirements.txt)
version=$(sed -n 's/^version: *//p' galaxy.yml)
tarball=build/orbite-qualification-$version.tar.gz
import=("$venv/bin/python" scripts/galaxy_import.py)
if (($#)); then
  exec "${import[@]}" release "$1" "$tarball" build/release
fi
"${import[@]}" check "$tarball"
# The URL the release step is given: .invalid names no real host (RFC 2606).
stand_in=$(mktemp -d)
trap 'rm -rf "$stand_in"' EXIT
"${import[@]}" release https://example.invalid/orbite/qualification "$tarball" "$stand_in"
