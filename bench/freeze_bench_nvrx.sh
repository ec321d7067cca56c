#!/usr/bin/env bash
# The anchor for bench/freeze_bench.py: NVIDIA's nvidia-resiliency-ext 0.7.0
# ft_launcher, CPU-only. Its 0.5-0.7 wheels are tagged cp311/cp312 +
# manylinux_2_39 (only the straggler module is compiled), so pip on Debian 12
# picks 0.4.1; this unpacks 0.7.0's pure-Python package instead. The venv
# borrows torch from an existing torch 2.x venv (a .pth line) rather than
# downloading it again, and gets NVRx's other dependencies from PyPI.
# Usage: bench/freeze_bench_nvrx.sh NEW_VENV TORCH_VENV   (e.g. /tmp/nvrx .venv-torch)
set -euo pipefail
venv=${1:?usage: freeze_bench_nvrx.sh NEW_VENV TORCH_VENV}
torch_venv=$(cd "${2:?usage: freeze_bench_nvrx.sh NEW_VENV TORCH_VENV}" && pwd)
[[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv "$venv"
py=$venv/bin/python
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$torch_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/zz_torch.pth"
"$py" -m pip install --quiet numpy defusedxml 'fastapi>=0.100' 'grpcio>=1.76,<2' 'httpx>=0.24' \
  'nvidia-ml-py>=12.570.86' packaging 'protobuf>=4.22' 'psutil>=6' 'pydantic>=2' 'pydantic-settings>=2' \
  pyyaml 'slowapi>=0.1.9' 'uvicorn>=0.20'
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_39_x86_64 -d "$tmp" nvidia-resiliency-ext==0.7.0
"$py" - "$tmp"/nvidia_resiliency_ext-0.7.0-*.whl "$site" <<'PY'
import sys, zipfile
whl, site = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith(("nvidia_resiliency_ext/", "nvidia_resiliency_ext-0.7.0.dist-info/")):
            z.extract(n, site)
PY
cat >"$venv/bin/ft_launcher" <<X
#!$py
import sys
from nvidia_resiliency_ext.fault_tolerance.launcher import main
sys.exit(main())
X
chmod +x "$venv/bin/ft_launcher"
"$py" -c 'import torch, importlib.metadata as m; print("torch", torch.__version__, "nvidia-resiliency-ext", m.version("nvidia-resiliency-ext"))'
