#include "launcher/numa_binding.h"

#include <algorithm>
#include <cstdlib>
#include <map>

#include "base/sysfs.h"
#include "launcher/cli.h"

namespace ddprun::launcher {
namespace {

using base::read_text;

[[noreturn]] void refuse(const std::string& mode, const std::string& why) {
  throw UsageError("--numa-binding=" + mode + ": " + why);
}

int read_int(const std::string& root, const std::string& path, int fallback) {
  auto text = read_text(root, path);
  if (!text || text->empty()) return fallback;
  char* end = nullptr;
  long v = std::strtol(text->c_str(), &end, 10);
  return *end == '\0' ? static_cast<int>(v) : fallback;
}

// The smallest CPU of a sysfs CPU list: the group's name.
int group_of(const std::string& root, const std::string& path, int cpu) {
  std::set<int> cpus = parse_cpu_list(read_text(root, path).value_or(""));
  return cpus.empty() ? cpu : *cpus.begin();
}

// The largest cache level's shared CPUs (index3 on most machines).
int cache_group_of(const std::string& root, int cpu) {
  const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cache";
  int best_level = -1, group = cpu;
  for (const std::string& index : base::list_dir(root, dir)) {
    if (index.rfind("index", 0) != 0) continue;
    const int level = read_int(root, dir + "/" + index + "/level", -1);
    if (level > best_level) {
      best_level = level;
      group = group_of(root, dir + "/" + index + "/shared_cpu_list", cpu);
    }
  }
  return group;
}

}  // namespace

std::set<int> parse_cpu_list(const std::string& text) {
  std::set<int> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? text.size() : comma + 1;
    if (item.empty()) continue;
    char* end = nullptr;
    const long a = std::strtol(item.c_str(), &end, 10);
    long b = a;
    if (*end == '-') b = std::strtol(end + 1, &end, 10);
    if (*end != '\0' || a < 0 || b < a || b > 65535) return {};
    for (long c = a; c <= b; ++c) out.insert(static_cast<int>(c));
  }
  return out;
}

std::vector<std::vector<int>> numa_cpu_sets(const std::string& mode, int nproc,
                                            const std::string& root,
                                            const std::set<int>& allowed) {
  if (mode != "node" && mode != "socket" && mode != "exclusive" && mode != "core-complex")
    refuse(mode, "expected node, socket, exclusive or core-complex");
  // NUMA nodes and their allowed CPUs.
  std::map<int, std::set<int>> node_cpus;
  for (const std::string& name : base::list_dir(root, "/sys/devices/system/node")) {
    if (name.rfind("node", 0) != 0 || name.size() == 4) continue;
    const int node = std::atoi(name.c_str() + 4);
    std::set<int> cpus;
    for (int c : parse_cpu_list(read_text(root, "/sys/devices/system/node/" + name + "/cpulist")
                                    .value_or("")))
      if (allowed.count(c)) cpus.insert(c);
    if (!cpus.empty()) node_cpus[node] = cpus;
  }
  if (node_cpus.empty()) {
    // No NUMA support in the kernel: one node of every allowed CPU.
    node_cpus[0] = allowed;
  }
  // Each local rank's device and its node.
  std::vector<int> gpu_nodes;
  for (const auto& d : base::pci_devices(root)) {
    if (!base::is_gpu(d)) continue;
    const int node = read_int(root, d.sys_path + "/numa_node", -1);
    gpu_nodes.push_back(node_cpus.count(node) ? node : node_cpus.begin()->first);
  }
  std::vector<int> rank_node(nproc);
  for (int r = 0; r < nproc; ++r) {
    if (!gpu_nodes.empty()) {
      if (r >= static_cast<int>(gpu_nodes.size()))
        refuse(mode, "local rank " + std::to_string(r) + " has no GPU (" +
                         std::to_string(gpu_nodes.size()) + " found)");
      rank_node[r] = gpu_nodes[r];
    } else {
      rank_node[r] = std::next(node_cpus.begin(), r % node_cpus.size())->first;
    }
  }
  std::vector<std::vector<int>> sets(nproc);
  for (int r = 0; r < nproc; ++r) {
    const int node = rank_node[r];
    const std::set<int>& cpus = node_cpus[node];
    // This rank's place among the ranks sharing its node.
    int peers = 0, index = 0;
    for (int q = 0; q < nproc; ++q) {
      if (rank_node[q] != node) continue;
      if (q < r) ++index;
      ++peers;
    }
    std::set<int> chosen;
    if (mode == "node") {
      chosen = cpus;
    } else if (mode == "socket") {
      auto socket_of = [&](int cpu) {
        return read_int(root, "/sys/devices/system/cpu/cpu" + std::to_string(cpu) +
                                  "/topology/physical_package_id", 0);
      };
      const int socket = socket_of(*cpus.begin());
      for (const auto& [n, c] : node_cpus)
        if (socket_of(*c.begin()) == socket) chosen.insert(c.begin(), c.end());
    } else if (mode == "exclusive") {
      std::map<int, std::vector<int>> cores;  // first sibling -> its CPUs
      for (int c : cpus)
        cores[group_of(root, "/sys/devices/system/cpu/cpu" + std::to_string(c) +
                                 "/topology/thread_siblings_list", c)].push_back(c);
      const int n = static_cast<int>(cores.size());
      if (n < peers)
        refuse(mode, "NUMA node " + std::to_string(node) + " has " + std::to_string(n) +
                         " physical cores for " + std::to_string(peers) + " local ranks");
      const int per = n / peers, extra = n % peers;
      const int start = index * per + std::min(index, extra);
      const int end = start + per + (index < extra ? 1 : 0);
      auto it = std::next(cores.begin(), start);
      for (int k = start; k < end; ++k, ++it) chosen.insert(it->second.begin(), it->second.end());
    } else {
      std::map<int, std::set<int>> caches;  // first CPU -> CPUs sharing the last-level cache
      for (int c : cpus) caches[cache_group_of(root, c)].insert(c);
      std::vector<std::set<int>> order;
      for (auto& [first, c] : caches) order.push_back(c);
      // Bigger groups first, then lower CPUs (torch's order).
      std::stable_sort(order.begin(), order.end(),
                       [](const auto& a, const auto& b) { return a.size() > b.size(); });
      chosen = order[index % order.size()];
    }
    sets[r].assign(chosen.begin(), chosen.end());
  }
  return sets;
}

}  // namespace ddprun::launcher
