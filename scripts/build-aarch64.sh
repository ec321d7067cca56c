#!/usr/bin/env bash
# Cross-builds ddprun for aarch64 (arm64: Grace Hopper/Blackwell nodes) on an
# x86-64 Debian bookworm, with Debian's cross compiler and the :arm64 dev
# packages (scripts/aarch64-linux-gnu.cmake), and installs qemu-user to run
# what it builds (tests/aarch64). Idempotent; ccache as scripts/build.sh.
#   scripts/build-aarch64.sh              ddprun only (CI: the qemu tests need
#                                         no more), in build-aarch64/
#   scripts/build-aarch64.sh --packages   installs the packages only
#   scripts/build-aarch64.sh --deb        also ddprun-store, the man page and
#                                         dist/ddprun_<version>_arm64.deb
#   scripts/build-aarch64.sh --wheel      the wheel for aarch64 into dist/
#                                         (scripts/build-wheel.sh, cross)
# The last line printed is the path of what was built.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-ddprun}
case $what in
  ddprun | --packages | --deb | --wheel) ;;
  *) echo "usage: $0 [--packages|--deb|--wheel]" >&2; exit 2 ;;
esac

# The launcher's libraries only: the trainer (LibTorch) and the tests are not
# built for aarch64. libcli11-dev and nlohmann-json3-dev are header-only
# (Architecture: all); the others must match the machine's amd64 versions
# (Multi-Arch: same), so both come from the same apt update.
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
  # install-packages.sh updates only when something is missing, and with a
  # new architecture everything :arm64 is.
fi
packages=(
  g++-aarch64-linux-gnu
  libboost-dev:arm64 libspdlog-dev:arm64 libfmt-dev:arm64 libssl-dev:arm64
  libcli11-dev nlohmann-json3-dev
  # Running: qemu-aarch64, and arm64's dynamic loader at the path the
  # binaries name (/lib/ld-linux-aarch64.so.1).
  qemu-user libc6:arm64
  cmake ninja-build ccache help2man
)
bash scripts/install-packages.sh "${packages[@]}"
[[ $what == --packages ]] && exit 0

toolchain=$PWD/scripts/aarch64-linux-gnu.cmake
if [[ $what == --wheel ]]; then
  DDPRUN_WHEEL_ARCH=aarch64 exec bash scripts/build-wheel.sh
fi

dir=build-aarch64
jobs=${DDPRUN_JOBS:-$(nproc)}
source scripts/ccache-env.sh
cmake -S . -B "$dir" -G Ninja --toolchain "$toolchain" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_TESTING=OFF -DDDPRUN_BUILD_TRAINER=OFF -DDDPRUN_WERROR=ON >/dev/null
if [[ $what == ddprun ]]; then
  cmake --build "$dir" -j "$jobs" --target ddprun
  echo "$dir/bin/ddprun"
  exit 0
fi
# The .deb: every installed target (ddprun, ddprun-store, the man page, which
# help2man reads from the aarch64 ddprun under qemu), then the ddprun package
# (ddprun-train needs LibTorch, not built here).
cmake --build "$dir" -j "$jobs"
mkdir -p dist
(cd "$dir" && cpack -G DEB -D CPACK_COMPONENTS_ALL=ddprun >/dev/null)
version=$(sed -n 's/^project(ddprun VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
cp "$dir/ddprun_${version}_arm64.deb" dist/
echo "dist/ddprun_${version}_arm64.deb"
