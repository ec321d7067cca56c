// Reading files below a root folder ("/" or a test's fixture tree): small
// text files, PCI devices and their bridges, IOMMU groups. Shared by
// introspect's doctor and the launcher's NUMA binding, so it lives under
// both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::base {

// Contents of root + path, trailing whitespace trimmed; nullopt if unreadable.
std::optional<std::string> read_text(const std::string& root, const std::string& path);
// Raw bytes of root + path (at most max_bytes); empty if unreadable.
std::string read_bytes(const std::string& root, const std::string& path,
                       std::size_t max_bytes = 4096);
// Names in root + path (no "." or ".."), sorted; empty if unreadable.
std::vector<std::string> list_dir(const std::string& root, const std::string& path);

struct PciDevice {
  std::string address;   // "0000:01:00.0"
  std::string sys_path;  // resolved path below root: "/sys/devices/pci0000:00/..."
  uint32_t vendor = 0;
  uint32_t device_class = 0;  // 24-bit class code
  // PCI addresses of the bridges above it, nearest first.
  std::vector<std::string> bridges;
  // sys paths of those bridges, same order.
  std::vector<std::string> bridge_paths;
  std::string iommu_group;       // "" when the device has none
  std::string iommu_group_type;  // DMA, DMA-FQ, identity, ...; "" unknown
};

bool is_gpu(const PciDevice& d);  // display class (0x03) by NVIDIA or AMD
std::vector<PciDevice> pci_devices(const std::string& root);

// PCIe ACS control register of a device's extended capability list, parsed
// from its config space (sysfs returns only 64 bytes to non-root users).
struct AcsControl {
  bool readable = false;  // false: config space shorter than 4 KiB
  bool present = false;   // the device has an ACS capability
  uint16_t control = 0;
  bool request_redirect() const { return control & 0x4; }
  bool completion_redirect() const { return control & 0x8; }
};
AcsControl read_acs(const std::string& root, const std::string& sys_path);

}  // namespace ddprun::base
