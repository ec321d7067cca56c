#!/bin/sh
# Runs one test command against the torch 2.x venv (scripts/setup-torch.sh):
# DDPRUN_TEST_PYTHON points at its python. Exit 77 (ctest: skipped) when the
# venv is missing or its torch does not import.
#   with_torch2.sh <venv> <command> [args...]
venv=$1
shift
py=$venv/bin/python
if [ ! -x "$py" ] || ! "$py" -c 'import torch' >/dev/null 2>&1; then
  echo "SKIP: no torch 2 venv at $venv (scripts/setup-torch.sh installs it)"
  exit 77
fi
echo "torch2: $(head -n 1 "$venv/ddprun-torch-version.txt" 2>/dev/null) via $py"
DDPRUN_TEST_PYTHON=$py
export DDPRUN_TEST_PYTHON
exec "$@"
