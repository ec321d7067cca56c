# rendezvous_scale: simulated nodes on the real rendezvous code
# (docs/BENCHMARKS.md, "Rendezvous at scale"). The simulation is a library:
# tests/rendezvous/rendezvous_scale_test.cc asserts its request count.
add_library(ddprun_rendezvous_sim STATIC ${CMAKE_CURRENT_LIST_DIR}/rendezvous_sim.cc)
target_include_directories(ddprun_rendezvous_sim PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(ddprun_rendezvous_sim PUBLIC ddprun_rendezvous ddprun_base)
add_executable(rendezvous_scale ${CMAKE_CURRENT_LIST_DIR}/rendezvous_scale.cc)
target_link_libraries(rendezvous_scale PRIVATE ddprun_rendezvous_sim)
