#!/usr/bin/env bash
# Installs the tools that read a live Python interpreter's stacks from
# outside (watchdog/stack_capture.h: capture_python_stack): py-spy (a static
# binary) and Bloomberg's pystack, and jsonschema for the test that checks
# hang reports against docs/hang_report.schema.json, from PyPI into a small
# virtual environment
# outside the tracked files: .venv-pytools at the repository root (ignored by
# git), or $DDPRUN_PYTOOLS_VENV. ~55 MB. The tests find them there
# (tests/CMakeLists.txt, DDPRUN_PYTOOLS_VENV) and skip without them; a user
# puts either on PATH (`pip install py-spy`) for ddprun to use it.
#
# Idempotent: a venv whose tools run is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${DDPRUN_PYTOOLS_VENV:-$PWD/.venv-pytools}

if "$venv/bin/py-spy" --version >/dev/null 2>&1 && "$venv/bin/pystack" --version >/dev/null 2>&1 &&
   "$venv/bin/python" -c 'import jsonschema' 2>/dev/null; then
  echo "setup-pytools: $("$venv/bin/py-spy" --version), pystack $("$venv/bin/pystack" --version) in $venv"
  exit 0
fi
# Debian's interpreter and its venv module (python3 on PATH may be another one).
if ! dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q "install ok installed"; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq python3-venv
fi
[[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet py-spy jsonschema
# pystack has wheels for x86_64/aarch64 glibc only: its absence is not fatal
# (py-spy is tried first anyway).
"$venv/bin/python" -m pip install --quiet pystack ||
  echo "setup-pytools: pystack did not install; py-spy alone will be used"
echo "setup-pytools: $("$venv/bin/py-spy" --version) in $venv"
