// ddprun doctor: a pre-flight check of the machine-level causes of
// multi-GPU freezes and NCCL/Gloo hangs, each reported as a finding with a
// fix. Checks (in order):
//   iommu     IOMMU in translated (DMA) mode for the GPUs' groups, and
//             IOMMU on the kernel command line without iommu=pt
//   acs       PCIe ACS P2P Request/Completion Redirect on bridges above GPUs
//             (with the IOMMU, peer-to-peer copies go through the root
//             complex and can stall or freeze the box)
//   gpus      NVIDIA GPUs on the PCI bus; `nvidia-smi topo -m` when present
//   shm       /dev/shm size (64 MiB in a default container)
//   memlock   locked-memory limit (RDMA/InfiniBand needs unlimited)
//   nofile    open-file limit
//   ifname    NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME name existing interfaces
//   hostname  the host name mapped to a loopback address in /etc/hosts (the
//             multi-node Gloo pitfall)
//   port      a port this job would use (--port; none by default: ddprun
//             picks a free MASTER_PORT) is free to bind
//   clock     local clock synchronized; skew with the rendezvous host (SNTP)
//
// Everything is read below `root` (/sys, /proc), so tests point it at a
// fixture tree; only the port and clock checks touch the real network.
// Nothing waits longer than its deadline: the whole run stays under a second.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ddprun::introspect {

enum class Level { kOk, kInfo, kWarn, kFail };
const char* to_string(Level level);

struct Finding {
  std::string check;    // short id: "iommu", "acs", "shm", ...
  Level level = Level::kOk;
  std::string finding;  // what was seen, one line
  std::string fix;      // what to do about it; empty when nothing
  std::string detail;   // more lines (nvidia-smi's matrix); may be empty
};

struct DoctorOptions {
  // Where /sys and /proc are read from ("/" on a real machine).
  std::string root = "/";
  // The variables the workers would get (NCCL_*, GLOO_*): the launcher's
  // environment.
  std::map<std::string, std::string> env;
  // nvidia-smi to run for the topology; empty: never run it. Only run when
  // a GPU is found on the PCI bus.
  std::string nvidia_smi = "nvidia-smi";
  // Limit for nvidia-smi; a slow driver answer is reported, not waited for.
  std::chrono::milliseconds tool_timeout{800};
  // A port this job would bind here, checked to be free (0: none). Not
  // 29500 by default: ddprun reserves a free MASTER_PORT itself.
  int port = 0;
  // host:port of the rendezvous (MASTER_ADDR); empty: no skew check.
  std::string endpoint;
  // Port of the SNTP query to the endpoint's host (123; tests use their own).
  int ntp_port = 123;
  // How long the SNTP query waits for an answer.
  std::chrono::milliseconds ntp_timeout{300};
};

std::vector<Finding> run_doctor(const DoctorOptions& options);

// The parts, for tests and for run_doctor.
std::vector<Finding> check_pci(const DoctorOptions& options);      // iommu, acs, gpus
std::vector<Finding> check_system(const DoctorOptions& options);   // shm, memlock, nofile
std::vector<Finding> check_network(const DoctorOptions& options);  // ifname, hostname, port, clock

// "[FAIL] acs: ...\n       fix: ..." lines, worst first.
std::string to_text(const std::vector<Finding>& findings);
nlohmann::json to_json(const std::vector<Finding>& findings);
// 0 when nothing failed, 1 when a check failed (warnings do not count).
int exit_status(const std::vector<Finding>& findings);

}  // namespace ddprun::introspect
