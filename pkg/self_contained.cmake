# DDPRUN_SELF_CONTAINED: ddprun and ddprun-store (the wheel's and the build
# tree's) need nothing but glibc at run time (tests/install/wheel_test.py checks with readelf -d).
#  - libstdc++ and libgcc linked statically (GCC's -static-lib* options);
#  - OpenSSL from Debian's libssl.a/libcrypto.a (libssl-dev ships both);
#  - spdlog and fmt header-only: Debian ships no static archive of either,
#    and its spdlog::spdlog_header_only target still links the shared libfmt,
#    so spdlog::spdlog is defined here as headers with fmt's header-only
#    target. Every component keeps linking spdlog::spdlog unchanged.
set(OPENSSL_USE_STATIC_LIBS TRUE)
find_package(OpenSSL REQUIRED)
find_package(fmt REQUIRED)
find_path(DDPRUN_SPDLOG_INCLUDE_DIR spdlog/spdlog.h REQUIRED)
add_library(spdlog::spdlog INTERFACE IMPORTED)
set_target_properties(spdlog::spdlog PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES ${DDPRUN_SPDLOG_INCLUDE_DIR}
  INTERFACE_COMPILE_DEFINITIONS SPDLOG_FMT_EXTERNAL
  INTERFACE_LINK_LIBRARIES "Threads::Threads;fmt::fmt-header-only")
# libcrypto.a calls dlopen (engines, providers) and pthreads.
set_property(TARGET OpenSSL::Crypto APPEND PROPERTY INTERFACE_LINK_LIBRARIES ${CMAKE_DL_LIBS} Threads::Threads)
# Only the two programs (pkg/CMakeLists.txt): the trainer and the tests link
# LibTorch or nothing shipped, and a second, static libstdc++ beside
# LibTorch's shared one would split exceptions and locales between them.
set(DDPRUN_STATIC_RUNTIME_OPTIONS -static-libstdc++ -static-libgcc)
