# CMake toolchain file: ddprun for aarch64 (arm64) Linux, cross-built on an
# x86-64 Debian with its cross compiler (g++-aarch64-linux-gnu) and the :arm64
# dev packages (scripts/build-aarch64.sh installs both). Debian's multiarch
# layout needs no sysroot: arm64 libraries and CMake package files live in
# /usr/lib/aarch64-linux-gnu, headers are shared in /usr/include, and
# CMAKE_LIBRARY_ARCHITECTURE keeps find_* off the x86-64 ones.
#   cmake -S . -B build-aarch64 --toolchain scripts/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Build-time programs (help2man, python3, git) are the machine's own.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# pkg-config (FindOpenSSL asks it first) reads the arm64 .pc files only:
# the machine's own point at /usr/lib/x86_64-linux-gnu, whose libssl.a the
# aarch64 linker refuses.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
# Programs built here run under qemu-user with libc6:arm64's loader
# (/lib/ld-linux-aarch64.so.1). Not `-L /usr/aarch64-linux-gnu`: that loader
# is the cross toolchain's glibc (libc6-arm64-cross, 2.36-8cross1), and it
# finds libc.so.6 through the machine's ld.so.cache in libc6:arm64 (2.36-9+deb12u*);
# the mixed pair spins forever in the first pthread_create.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
