# store_attack_bench: the hostile suite's attacks against ddprun-store and
# c10d's TCPStore (docs/BENCHMARKS.md, "Store under attack"). No LibTorch:
# it speaks TCPStore's protocol itself and runs its server through Python.
add_executable(store_attack_bench ${CMAKE_CURRENT_LIST_DIR}/store_attack_bench.cc)
target_link_libraries(store_attack_bench PRIVATE ddprun_rendezvous)
target_compile_definitions(store_attack_bench PRIVATE
  DDPRUN_STORE_BIN="$<TARGET_FILE:ddprun-store>"
  BENCH_DIR="${CMAKE_CURRENT_LIST_DIR}"
  SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_dependencies(store_attack_bench ddprun-store)
