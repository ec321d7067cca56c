// --numa-binding (torchrun 2.x): the CPUs each local rank is bound to,
// computed from the machine's topology under a sysfs root ("/" or a test's
// fixture tree), as torch/numa/binding.py computes them:
//   node          every allowed CPU of the NUMA node of the rank's device
//   socket        every allowed CPU of all NUMA nodes on that node's socket
//   exclusive     the node's physical cores split evenly between the ranks
//                 whose devices share the node (no two ranks share a core)
//   core-complex  one L3-cache group of the node per rank (round robin)
// A rank's device is GPU <local rank> in PCI address order (display-class
// NVIDIA/AMD devices, their numa_node file). Without GPUs, ddprun binds CPU
// workers all the same: local rank r takes NUMA node r mod <nodes>, so ranks
// spread over the nodes (torchrun refuses to bind without accelerators).
// The agent applies each set with sched_setaffinity in the forked child.
#pragma once

#include <set>
#include <string>
#include <vector>

namespace ddprun::launcher {

// Throws UsageError (cli.h) naming --numa-binding and the reason when the
// mode is unknown or the topology cannot honour it.
std::vector<std::vector<int>> numa_cpu_sets(const std::string& mode, int nproc,
                                            const std::string& sys_root,
                                            const std::set<int>& allowed_cpus);

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; empty for anything malformed.
std::set<int> parse_cpu_list(const std::string& text);

}  // namespace ddprun::launcher
