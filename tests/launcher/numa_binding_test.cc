// --numa-binding: CPU sets from fixture sysfs trees (every mode, with and
// without GPUs), and a real ddprun run whose workers read their own
// affinity from /proc/self/status.
#include <doctest/doctest.h>
#include <sched.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "launcher/cli.h"
#include "launcher/numa_binding.h"
#include "tests/agent/ddprun_process.h"
#include "tests/common/temp_dir.h"

using namespace ddprun::launcher;
using ddprun::testing::TempDir;
namespace fs = std::filesystem;

namespace {

void put(const std::string& root, const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(root + path).parent_path());
  std::ofstream(root + path) << text << "\n";
}

// 12 CPUs, 2 hyperthreads a core: node 0 (CPUs 0-3) and node 1 (4-7) on
// socket 0, node 2 (8-11) on socket 1; each node has two L3 groups.
void machine(const std::string& root) {
  const char* lists[] = {"0-3", "4-7", "8-11"};
  for (int n = 0; n < 3; ++n) put(root, "/sys/devices/system/node/node" + std::to_string(n) + "/cpulist", lists[n]);
  put(root, "/sys/devices/system/node/possible", "0-2");
  for (int c = 0; c < 12; ++c) {
    const std::string cpu = "/sys/devices/system/cpu/cpu" + std::to_string(c);
    const int core = c & ~1, ccx = c & ~1;
    put(root, cpu + "/topology/physical_package_id", c < 8 ? "0" : "1");
    put(root, cpu + "/topology/thread_siblings_list", std::to_string(core) + "-" + std::to_string(core + 1));
    put(root, cpu + "/cache/index2/level", "2");
    put(root, cpu + "/cache/index2/shared_cpu_list", std::to_string(c));
    put(root, cpu + "/cache/index3/level", "3");
    put(root, cpu + "/cache/index3/shared_cpu_list", std::to_string(ccx) + "-" + std::to_string(ccx + 1));
  }
}

void gpu(const std::string& root, const std::string& addr, int node) {
  const std::string dev = "/sys/devices/pci0000:00/" + addr;
  put(root, dev + "/vendor", "0x10de");
  put(root, dev + "/class", "0x030200");
  put(root, dev + "/numa_node", std::to_string(node));
  fs::create_directories(root + "/sys/bus/pci/devices");
  fs::create_symlink("../../../devices/pci0000:00/" + addr, root + "/sys/bus/pci/devices/" + addr);
}

std::set<int> all(int n) {
  std::set<int> s;
  for (int c = 0; c < n; ++c) s.insert(c);
  return s;
}

using Sets = std::vector<std::vector<int>>;

}  // namespace

TEST_CASE("numa binding without GPUs: local ranks spread over the NUMA nodes") {
  TempDir tmp;
  machine(tmp.path());
  CHECK(numa_cpu_sets("node", 4, tmp.path(), all(12)) ==
        Sets{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {0, 1, 2, 3}});
  CHECK(numa_cpu_sets("socket", 3, tmp.path(), all(12)) ==
        Sets{{0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11}});
  // Ranks 0 and 3 share node 0: its two physical cores, one each.
  CHECK(numa_cpu_sets("exclusive", 4, tmp.path(), all(12)) ==
        Sets{{0, 1}, {4, 5, 6, 7}, {8, 9, 10, 11}, {2, 3}});
  CHECK(numa_cpu_sets("core-complex", 4, tmp.path(), all(12)) ==
        Sets{{0, 1}, {4, 5}, {8, 9}, {2, 3}});
  // CPUs outside ddprun's own affinity are never handed out.
  CHECK(numa_cpu_sets("node", 1, tmp.path(), {1, 2, 5}) == Sets{{1, 2}});
}

TEST_CASE("numa binding with GPUs: each rank follows its GPU's node") {
  TempDir tmp;
  machine(tmp.path());
  gpu(tmp.path(), "0000:41:00.0", 2);
  gpu(tmp.path(), "0000:01:00.0", 1);
  gpu(tmp.path(), "0000:02:00.0", 1);
  // PCI order: 01 and 02 on node 1, 41 on node 2.
  CHECK(numa_cpu_sets("node", 3, tmp.path(), all(12)) ==
        Sets{{4, 5, 6, 7}, {4, 5, 6, 7}, {8, 9, 10, 11}});
  CHECK(numa_cpu_sets("exclusive", 3, tmp.path(), all(12)) ==
        Sets{{4, 5}, {6, 7}, {8, 9, 10, 11}});
  CHECK(numa_cpu_sets("socket", 1, tmp.path(), all(12)) == Sets{{0, 1, 2, 3, 4, 5, 6, 7}});
  CHECK_THROWS_WITH_AS(numa_cpu_sets("node", 4, tmp.path(), all(12)),
                       "--numa-binding=node: local rank 3 has no GPU (3 found)", UsageError);
  // Three ranks on a node of two cores cannot each own one.
  gpu(tmp.path(), "0000:03:00.0", 1);
  gpu(tmp.path(), "0000:04:00.0", 1);
  CHECK_THROWS_WITH_AS(numa_cpu_sets("exclusive", 4, tmp.path(), all(12)),
                       "--numa-binding=exclusive: NUMA node 1 has 2 physical cores for 4 local ranks",
                       UsageError);
}

TEST_CASE("cpu lists parse as the kernel writes them") {
  CHECK(parse_cpu_list("0-3,8,10-11") == std::set<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(parse_cpu_list("5") == std::set<int>{5});
  CHECK(parse_cpu_list("3-1").empty());
  CHECK(parse_cpu_list("x").empty());
}

TEST_CASE("ddprun --numa-binding binds each worker before it starts") {
  cpu_set_t mask;
  REQUIRE(sched_getaffinity(0, sizeof mask, &mask) == 0);
  std::set<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) allowed.insert(c);
  for (const char* mode : {"node", "exclusive", "core-complex"}) {
    CAPTURE(mode);
    Sets want;
    try {
      want = numa_cpu_sets(mode, 2, "/", allowed);
    } catch (const UsageError& e) {
      MESSAGE("this machine cannot take --numa-binding=" << mode << ": " << e.what());
      continue;
    }
    auto r = ddprun::testing::run_ddprun({"--nproc-per-node=2", std::string("--numa-binding=") + mode,
                                          "/bin/grep", "Cpus_allowed_list", "/proc/self/status"});
    INFO(r.err);
    REQUIRE(r.status == 0);
    for (int lr = 0; lr < 2; ++lr) {
      std::smatch m;
      std::string out = r.out;
      REQUIRE(std::regex_search(out, m, std::regex("\\[default" + std::to_string(lr) +
                                                   "\\]:Cpus_allowed_list:\\s*(\\S+)")));
      std::set<int> got = parse_cpu_list(m[1]);
      CHECK(std::vector<int>(got.begin(), got.end()) == want[lr]);
    }
  }
}
