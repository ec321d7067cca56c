#!/usr/bin/env bash
# Installs the Debian packages named as arguments that are not installed yet
# (scripts/setup.sh and scripts/setup-test.sh). Idempotent.
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Recommends included: a fresh machine then matches the one this was tested on.
  apt-get install -y -qq "${missing[@]}"
fi
