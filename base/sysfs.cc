#include "base/sysfs.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "base/procfs.h"

namespace ddprun::base {

namespace fs = std::filesystem;

namespace {

std::string under_root(const std::string& root, const std::string& path) {
  if (root.empty() || root == "/") return path;
  return (root.back() == '/' ? root.substr(0, root.size() - 1) : root) + path;
}

bool is_pci_address(const std::string& name) {
  static const std::regex re("[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]");
  return std::regex_match(name, re);
}

uint32_t hex(const std::optional<std::string>& s) {
  if (!s) return 0;
  try {
    return static_cast<uint32_t>(std::stoul(*s, nullptr, 16));
  } catch (const std::exception&) {
    return 0;
  }
}

// Turns an absolute path from fs::canonical back into one below the root.
std::string strip_root(const std::string& root, const std::string& path) {
  if (root.empty() || root == "/") return path;
  std::error_code ec;
  const std::string r = fs::canonical(root, ec).string();
  if (!ec && path.compare(0, r.size(), r) == 0) return path.substr(r.size());
  return path;
}

}  // namespace

std::optional<std::string> read_text(const std::string& root, const std::string& path) {
  std::ifstream in(under_root(root, path));
  if (!in) return std::nullopt;
  std::ostringstream out;
  out << in.rdbuf();
  std::string s = out.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  return s;
}

std::string read_bytes(const std::string& root, const std::string& path, std::size_t max_bytes) {
  std::ifstream in(under_root(root, path), std::ios::binary);
  if (!in) return {};
  std::string s(max_bytes, '\0');
  in.read(s.data(), static_cast<std::streamsize>(max_bytes));
  s.resize(static_cast<std::size_t>(in.gcount()));
  return s;
}

std::vector<std::string> list_dir(const std::string& root, const std::string& path) {
  std::vector<std::string> out;
  for (auto& e : list_dir_or_empty(under_root(root, path))) out.push_back(std::move(e.name));
  std::sort(out.begin(), out.end());
  return out;
}

bool is_gpu(const PciDevice& d) {
  const bool display = (d.device_class >> 16) == 0x03;
  return display && (d.vendor == 0x10de || d.vendor == 0x1002);
}

std::vector<PciDevice> pci_devices(const std::string& root) {
  std::vector<PciDevice> out;
  for (const auto& addr : list_dir(root, "/sys/bus/pci/devices")) {
    PciDevice d;
    d.address = addr;
    std::error_code ec;
    const auto real = fs::canonical(under_root(root, "/sys/bus/pci/devices/" + addr), ec);
    if (ec) continue;
    d.sys_path = strip_root(root, real.string());
    d.vendor = hex(read_text(root, d.sys_path + "/vendor"));
    d.device_class = hex(read_text(root, d.sys_path + "/class"));
    // The bridges are the PCI-addressed folders above the device.
    for (fs::path p = fs::path(d.sys_path).parent_path(); p.has_filename();
         p = p.parent_path()) {
      const std::string name = p.filename().string();
      if (!is_pci_address(name)) break;
      d.bridges.push_back(name);
      d.bridge_paths.push_back(p.string());
    }
    const auto group = fs::canonical(under_root(root, d.sys_path + "/iommu_group"), ec);
    if (!ec) {
      d.iommu_group = group.filename().string();
      d.iommu_group_type =
          read_text(root, "/sys/kernel/iommu_groups/" + d.iommu_group + "/type").value_or("");
    }
    out.push_back(std::move(d));
  }
  return out;
}

AcsControl read_acs(const std::string& root, const std::string& sys_path) {
  AcsControl acs;
  const std::string cfg = read_bytes(root, sys_path + "/config", 4096);
  if (cfg.size() < 0x104) return acs;
  acs.readable = true;
  auto u16 = [&](std::size_t off) {
    return static_cast<uint16_t>(static_cast<uint8_t>(cfg[off]) |
                                 (static_cast<uint8_t>(cfg[off + 1]) << 8));
  };
  auto u32 = [&](std::size_t off) {
    return static_cast<uint32_t>(u16(off)) | (static_cast<uint32_t>(u16(off + 2)) << 16);
  };
  // Extended capabilities: a chain of 32-bit headers from 0x100,
  // [15:0] id, [19:16] version, [31:20] next offset. ACS is id 0x000d; its
  // control register is the 16 bits at +6.
  std::size_t off = 0x100;
  for (int hops = 0; off >= 0x100 && off + 8 <= cfg.size() && hops < 64; ++hops) {
    const uint32_t header = u32(off);
    if (header == 0 || header == 0xffffffff) break;
    if ((header & 0xffff) == 0x000d) {
      acs.present = true;
      acs.control = u16(off + 6);
      break;
    }
    off = header >> 20;
  }
  return acs;
}

}  // namespace ddprun::base
