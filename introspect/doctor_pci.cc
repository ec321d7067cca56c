// doctor's PCI checks: IOMMU mode, ACS redirect on bridges above the GPUs,
// the GPUs themselves and nvidia-smi's topology matrix.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "introspect/doctor.h"
#include "base/subprocess.h"
#include "base/sysfs.h"

namespace ddprun::introspect {

using namespace base;  // the sysfs readers (base/sysfs.h)

namespace {

bool has_word(const std::string& cmdline, const std::string& word) {
  std::size_t pos = 0;
  while ((pos = cmdline.find(word, pos)) != std::string::npos) {
    const bool start = pos == 0 || cmdline[pos - 1] == ' ';
    const std::size_t end = pos + word.size();
    if (start && (end == cmdline.size() || cmdline[end] == ' ')) return true;
    pos = end;
  }
  return false;
}

std::string env_or(const DoctorOptions& o, const std::string& key) {
  auto it = o.env.find(key);
  return it == o.env.end() ? "" : it->second;
}

Finding iommu_finding(const DoctorOptions& o, const std::vector<PciDevice>& gpus) {
  const std::string cmdline = read_text(o.root, "/proc/cmdline").value_or("");
  const bool passthrough = has_word(cmdline, "iommu=pt") || has_word(cmdline, "iommu.passthrough=1");
  const bool forced_on = has_word(cmdline, "intel_iommu=on") || has_word(cmdline, "amd_iommu=on");
  std::vector<std::string> translated;
  for (const auto& g : gpus) {
    if (g.iommu_group_type.rfind("DMA", 0) == 0) {
      translated.push_back(fmt::format("{} (group {}, {})", g.address, g.iommu_group,
                                       g.iommu_group_type));
    }
  }
  Finding f{"iommu", Level::kOk, "", "", ""};
  if (gpus.empty()) {
    f.level = Level::kInfo;
    f.finding = forced_on && !passthrough
                    ? "no GPU; the IOMMU is on without iommu=pt (kernel command line)"
                    : "no GPU on the PCI bus: nothing to check";
    return f;
  }
  if (translated.empty()) {
    f.finding = passthrough ? "IOMMU in passthrough mode (iommu=pt)"
                            : "the GPUs' DMA is not translated by an IOMMU";
    return f;
  }
  const bool p2p_off = env_or(o, "NCCL_P2P_DISABLE") == "1";
  f.level = gpus.size() > 1 && !p2p_off ? Level::kFail : Level::kWarn;
  f.finding = fmt::format("the IOMMU translates GPU DMA for {}: peer-to-peer copies between "
                          "GPUs go through it and can hang NCCL or freeze the machine{}",
                          fmt::join(translated, ", "), p2p_off ? " (NCCL_P2P_DISABLE=1 is set)" : "");
  f.fix = "boot with iommu=pt (intel_iommu=on iommu=pt, or amd_iommu=on iommu=pt), or run "
          "with NCCL_P2P_DISABLE=1 (slower: copies go through host memory)";
  return f;
}

Finding acs_finding(const DoctorOptions& o, const std::vector<PciDevice>& gpus) {
  Finding f{"acs", Level::kOk, "", "", ""};
  if (gpus.empty()) {
    f.level = Level::kInfo;
    f.finding = "no GPU on the PCI bus: nothing to check";
    return f;
  }
  std::set<std::string> seen;
  std::vector<std::string> redirecting, unreadable;
  for (const auto& g : gpus) {
    for (std::size_t i = 0; i < g.bridges.size(); ++i) {
      if (!seen.insert(g.bridges[i]).second) continue;
      const AcsControl acs = read_acs(o.root, g.bridge_paths[i]);
      if (!acs.readable) {
        unreadable.push_back(g.bridges[i]);
      } else if (acs.present && (acs.request_redirect() || acs.completion_redirect())) {
        redirecting.push_back(fmt::format("{} (ACSCtl {:#06x}, above GPU {})", g.bridges[i],
                                          acs.control, g.address));
      }
    }
  }
  const bool p2p_off = env_or(o, "NCCL_P2P_DISABLE") == "1";
  if (!redirecting.empty()) {
    f.level = gpus.size() > 1 && !p2p_off ? Level::kFail : Level::kWarn;
    f.finding = fmt::format("PCIe ACS redirects peer-to-peer requests on bridge {}: GPU-to-GPU "
                            "copies detour through the root complex and can stall NCCL{}",
                            fmt::join(redirecting, ", "), p2p_off ? " (NCCL_P2P_DISABLE=1 is set)" : "");
    f.fix = "disable ACS on those bridges (BIOS: PCIe ACS off; or as root: setpci -s <bridge> "
            "ECAP_ACS+6.w=0000), or run with NCCL_P2P_DISABLE=1";
  } else if (!unreadable.empty()) {
    f.level = Level::kInfo;
    f.finding = fmt::format("cannot read ACS of bridge {} (PCI extended config space needs root)",
                            fmt::join(unreadable, ", "));
    f.fix = "as root: lspci -vvv | grep ACSCtl (SrcValid+ ReqRedir+ CmpltRedir+ breaks P2P)";
  } else {
    f.finding = "no ACS redirect on the bridges above the GPUs";
  }
  return f;
}

Finding gpu_finding(const DoctorOptions& o, const std::vector<PciDevice>& gpus) {
  Finding f{"gpus", Level::kOk, "", "", ""};
  if (gpus.empty()) {
    f.level = Level::kInfo;
    f.finding = "no GPU on the PCI bus: use the gloo backend (NCCL needs GPUs)";
    return f;
  }
  std::vector<std::string> names;
  for (const auto& g : gpus) names.push_back(g.address);
  f.finding = fmt::format("{} GPU{}: {}", gpus.size(), gpus.size() == 1 ? "" : "s", fmt::join(names, ", "));
  if (o.nvidia_smi.empty() || gpus.size() < 2) return f;
  const base::RunResult r = base::run_bounded(base::ChildSpec{{o.nvidia_smi, "topo", "-m"}, {}, -1, false}, o.tool_timeout);
  if (!r.started) {
    f.finding += "; no topology (" + r.error + ")";
  } else if (r.timed_out) {
    f.level = Level::kWarn;
    f.finding += fmt::format("; nvidia-smi topo -m gave no answer within {} ms",
                             o.tool_timeout.count());
    f.fix = "a slow or hung driver: check `nvidia-smi` and dmesg for Xid errors";
  } else if (r.exit_code != 0) {
    f.level = Level::kWarn;
    f.finding += fmt::format("; nvidia-smi topo -m failed (exit {})", r.exit_code);
    f.fix = "check the driver: nvidia-smi, dmesg | grep -i xid";
  } else {
    // SYS links cross CPU sockets: no P2P there, NCCL falls back to host memory.
    const bool sys = r.output.find(" SYS") != std::string::npos;
    f.finding += sys ? "; some GPU pairs connect only across CPU sockets (SYS): no P2P there"
                     : "; topology read with nvidia-smi topo -m";
    f.fix = "";
    f.detail = r.output;
  }
  return f;
}

}  // namespace

std::vector<Finding> check_pci(const DoctorOptions& o) {
  std::vector<PciDevice> gpus;
  for (auto& d : pci_devices(o.root)) {
    if (is_gpu(d)) gpus.push_back(std::move(d));
  }
  return {iommu_finding(o, gpus), acs_finding(o, gpus), gpu_finding(o, gpus)};
}

}  // namespace ddprun::introspect
