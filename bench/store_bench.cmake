# store_bench: the rendezvous store against c10d::TCPStore (docs/BENCHMARKS.md).
# The TCPStore side is a library of its own that links LibTorch privately, so
# LibTorch's include folders (and the wheel's fmt, which breaks Debian's
# spdlog) reach only store_bench_tcpstore.cc. LibTorch is optional: Debian's
# 1.13 in build/, the torch 2.x wheel's in build-cuda/.
add_library(store_bench_tcpstore STATIC ${CMAKE_CURRENT_LIST_DIR}/store_bench_tcpstore.cc)
target_include_directories(store_bench_tcpstore PRIVATE ${PROJECT_SOURCE_DIR})
if(NOT Torch_FOUND)  # found already at the top when the trainer is built
  find_package(Torch QUIET)
endif()
if(Torch_FOUND)
  target_link_libraries(store_bench_tcpstore PRIVATE ${TORCH_LIBRARIES})
  target_compile_definitions(store_bench_tcpstore PRIVATE DDPRUN_HAVE_TORCH)
  target_compile_options(store_bench_tcpstore PRIVATE -Wno-unused-parameter)
  # A CUDA LibTorch needs the NCCL it was built against (the wheel's, which
  # scripts/build-cuda.sh passes as NCCL_LIBRARY), not an older toolkit one.
  if(NCCL_LIBRARY)
    target_link_libraries(store_bench_tcpstore PRIVATE ${NCCL_LIBRARY})
  endif()
endif()
add_executable(store_bench ${CMAKE_CURRENT_LIST_DIR}/store_bench.cc)
target_link_libraries(store_bench PRIVATE ddprun_rendezvous store_bench_tcpstore)
