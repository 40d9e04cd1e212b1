#!/usr/bin/env bash
# Installs the Debian packages the gate and its tests need, only when running as root and only
# those missing. Without root it lists what is missing and carries on: the tests that need a
# package skip themselves and say so.
set -euo pipefail
# python3-pyverbs: the inventory's optional verbs cross-check (its "no RDMA subsystem" path is tested).
wanted=(openssh-server openssh-client libibverbs-dev gcc make python3-pyverbs)
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
