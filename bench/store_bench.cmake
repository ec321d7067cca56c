# store_bench: the rendezvous store against c10d::TCPStore (docs/bench/rendezvous.md).
# Only this target links LibTorch, and only when it is installed.
add_executable(store_bench ${CMAKE_CURRENT_LIST_DIR}/store_bench.cc)
target_link_libraries(store_bench PRIVATE ddprun_rendezvous)
find_package(Torch QUIET)
if(Torch_FOUND)
  target_link_libraries(store_bench PRIVATE ${TORCH_LIBRARIES})
  target_compile_definitions(store_bench PRIVATE DDPRUN_HAVE_TORCH)
  target_compile_options(store_bench PRIVATE -Wno-unused-parameter)
endif()
