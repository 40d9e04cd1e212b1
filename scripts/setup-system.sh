#!/usr/bin/env bash
# Installs the Debian packages the gate and its tests need, only when running as root and only
# those missing. Without root it lists what is missing and carries on: the tests that need a
# package skip themselves and say so.
set -euo pipefail
# libibverbs1 + ibverbs-providers: rdma-core's own enumeration of the fake hosts (the inventory's
# libibverbs cross-check, through ctypes); python3-pyverbs: its optional port/GID comparison;
# ibverbs-utils, perftest and rdmacm-utils: rdma-core's own clients run against the loopback provider;
# chromium-headless-shell: verdict.html rendered by a real browser (tests/unit/plugins/module_utils/_verify).
wanted=(openssh-server openssh-client libibverbs-dev libibverbs1 ibverbs-providers gcc make python3-pyverbs
        ibverbs-utils perftest rdmacm-utils chromium-headless-shell)
missing=()
for p in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0
if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: not root (or no apt-get); missing system packages: ${missing[*]}" >&2
fi
