#!/usr/bin/env bash
# Installs the newest PyPI torch (the CUDA wheel: torchrun 2.x, libuv TCPStore,
# and a CUDA LibTorch for scripts/build-cuda.sh) into a virtual environment
# outside the tracked files: .venv-torch at the repository root (ignored by
# git), or $DDPRUN_TORCH_VENV.
#
# Idempotent: a venv whose torch imports is left alone (DDPRUN_TORCH_UPGRADE=1
# moves it to the newest release; DDPRUN_TORCH_VERSION=2.x.y pins one).
# pip's own cache (~/.cache/pip) is kept, so a second venv or a re-install
# downloads nothing. What was installed is written to
# $venv/ddprun-torch-version.txt, which the torch2 tests print.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${DDPRUN_TORCH_VENV:-$PWD/.venv-torch}

# Debian's interpreter and its venv module (python3 on PATH may be another one).
if ! dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q "install ok installed"; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq python3-venv
fi

py="$venv/bin/python"
# python-etcd: torchrun 2.x's etcd backends (etcd-v2, etcd) need it
# (bench/formation_bench.py runs torchrun on etcd).
etcd_client() { "$py" -c 'import etcd' 2>/dev/null || "$py" -m pip install --quiet python-etcd; }
# torchvision: examples/resnet18_finetune.py (tests/examples). Pinned to the
# installed torch so that pip never moves torch to fit it.
vision() {
  "$py" -c 'import torchvision' 2>/dev/null ||
    "$py" -m pip install --quiet torchvision pillow \
      "torch==$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')"
}
if [[ -x $py ]] && "$py" -c 'import torch' 2>/dev/null &&
   [[ -z ${DDPRUN_TORCH_UPGRADE:-} ]] &&
   { [[ -z ${DDPRUN_TORCH_VERSION:-} ]] ||
     "$py" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '${DDPRUN_TORCH_VERSION}')"; }; then
  etcd_client
  vision
  echo "setup-torch: $(head -1 "$venv/ddprun-torch-version.txt" 2>/dev/null || echo present) in $venv"
  exit 0
fi

start=$(date +%s)
[[ -x $py ]] || /usr/bin/python3 -m venv "$venv"
spec=torch${DDPRUN_TORCH_VERSION:+==$DDPRUN_TORCH_VERSION}
# numpy: torch warns at import without it, and the reference script's data path uses it.
"$py" -m pip install --quiet --upgrade "$spec" numpy
etcd_client
vision
"$py" - "$venv/ddprun-torch-version.txt" "$(( $(date +%s) - start ))" <<'PY'
import sys, platform, torch, datetime
with open(sys.argv[1], "w") as f:
    f.write(f"torch {torch.__version__} cuda {torch.version.cuda} nccl "
            f"{'.'.join(map(str, torch.cuda.nccl.version())) if torch.version.cuda else 'none'} "
            f"python {platform.python_version()}\n")
    f.write(f"installed {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC "
            f"in {sys.argv[2]} s\n")
PY
"$py" -m pip freeze >> "$venv/ddprun-torch-version.txt"
echo "setup-torch: $(head -1 "$venv/ddprun-torch-version.txt") in $venv ($(( $(date +%s) - start )) s)"
