#!/usr/bin/env bash
# make docs: the collection's HTML docs under build/docs/html. antsibull-docs writes the plugin and role pages from
# the collection as installed in place (.collections), the pages of docs/ are the guide (MyST), and Sphinx builds
# both with every warning kept: the build fails on any warning but a reference into the Ansible docsite, which an
# offline build cannot resolve (no intersphinx here), named below by label.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${DOCS_VENV:-.venv-docs}
out=build/docs
venv=$(realpath -m "$venv")
export PATH="$venv/bin:$PWD/.venv/bin:$PATH" ANSIBLE_COLLECTIONS_PATH="$PWD/.collections"
rm -rf "$out"
mkdir -p "$out" && chmod 0700 "$out"
mkdir -m 0700 "$out/rst"  # antsibull-docs writes only into a directory no one else can write
antsibull-docs collection --use-current --dest-dir "$out/rst" orbite.qualification \
  > "$out/antsibull.log" 2>&1 || { cat "$out/antsibull.log"; exit 1; }
cp docs/site/index.rst "$out/rst/index.rst"
# The guide: docs/ as it is (its pages link to docs/examples/ and ../meta/ by relative path), an index of its pages.
cp -r docs "$out/rst/guide"
rm -rf "$out/rst/guide/site"
cp -r meta "$out/rst/meta"
{
  printf 'Guide\n=====\n\n.. toctree::\n   :maxdepth: 1\n\n'
  for page in docs/*.md; do printf '   %s\n' "$(basename "$page" .md)"; done
} > "$out/rst/guide/index.rst"
sphinx-build -q -b html -c docs/site -w "$out/warnings.txt" "$out/rst" "$out/html" > "$out/sphinx.log" 2>&1 || true
# The Ansible docsite's labels antsibull-docs' pages refer to (resolved by intersphinx on docs.ansible.com).
external="undefined label: '(action_plugins|common_return_values|ansible_configuration_settings|ansible_collections\.ansible\.builtin\.[a-z0-9_]+)'"
own=$(grep 'WARNING\|ERROR' "$out/warnings.txt" | grep -Ev "$external" || true)
if [ -n "$own" ] || [ ! -f "$out/html/index.html" ]; then
  echo "docs: the build warned about the collection's own docs:" >&2
  echo "${own:-no index.html written; see $out/sphinx.log}" >&2
  exit 1
fi
echo "docs: $out/html/index.html ($(find "$out/html" -name '*.html' | wc -l) pages; $(grep -c 'WARNING' "$out/warnings.txt" || true) references into the Ansible docsite left unresolved offline)"
