// doctor's limits checks: /dev/shm size, locked-memory and open-file limits.
#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <sstream>

#include "introspect/doctor.h"
#include "base/sysfs.h"

namespace ddprun::introspect {

using namespace base;  // the sysfs readers (base/sysfs.h)

namespace {

constexpr uint64_t kMiB = 1024 * 1024;
constexpr uint64_t kGiB = 1024 * kMiB;
// Below this, NCCL's shared-memory transport and DataLoader workers fail
// (bus error, "unhandled system error"); Docker's default is 64 MiB.
constexpr uint64_t kMinShm = 1 * kGiB;
constexpr uint64_t kMinOpenFiles = 65536;

std::string bytes_text(uint64_t b) {
  if (b >= kGiB) return fmt::format("{:.1f} GiB", static_cast<double>(b) / kGiB);
  if (b >= kMiB) return fmt::format("{} MiB", b / kMiB);
  return fmt::format("{} KiB", b / 1024);
}

// tmpfs size= values: bytes, or a k/m/g suffix; "%" (of RAM) needs meminfo.
std::optional<uint64_t> parse_size(const std::string& v, uint64_t mem_total) {
  if (v.empty()) return std::nullopt;
  try {
    std::size_t used = 0;
    const double n = std::stod(v, &used);
    const std::string unit = v.substr(used);
    if (unit.empty()) return static_cast<uint64_t>(n);
    switch (unit[0]) {
      case 'k': case 'K': return static_cast<uint64_t>(n * 1024);
      case 'm': case 'M': return static_cast<uint64_t>(n * kMiB);
      case 'g': case 'G': return static_cast<uint64_t>(n * kGiB);
      case '%': return mem_total ? std::optional<uint64_t>(mem_total * n / 100) : std::nullopt;
    }
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

uint64_t mem_total(const std::string& root) {
  std::istringstream in(read_text(root, "/proc/meminfo").value_or(""));
  std::string key;
  uint64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemTotal:") return kb * 1024;
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

Finding shm_finding(const DoctorOptions& o) {
  Finding f{"shm", Level::kOk, "", "", ""};
  std::istringstream mounts(read_text(o.root, "/proc/mounts").value_or(""));
  std::string line;
  std::optional<std::string> opts;
  std::string fstype;
  while (std::getline(mounts, line)) {
    std::istringstream l(line);
    std::string dev, dir, type, options;
    l >> dev >> dir >> type >> options;
    if (dir == "/dev/shm") opts = options, fstype = type;  // the last mount wins
  }
  const char* fix = "give the container more: docker run --shm-size=16g (or --ipc=host); "
                    "Kubernetes: an emptyDir with medium: Memory at /dev/shm";
  if (!opts) {
    f.level = Level::kFail;
    f.finding = "/dev/shm is not mounted: NCCL's shared-memory transport and DataLoader "
                "workers need it";
    f.fix = fix;
    return f;
  }
  // tmpfs without size= gets half of RAM.
  const uint64_t ram = mem_total(o.root);
  std::optional<uint64_t> size;
  std::istringstream parts(*opts);
  std::string opt;
  while (std::getline(parts, opt, ',')) {
    if (opt.rfind("size=", 0) == 0) size = parse_size(opt.substr(5), ram);
  }
  if (!size && fstype == "tmpfs" && ram) size = ram / 2;
  if (!size) {
    f.level = Level::kInfo;
    f.finding = "/dev/shm size unknown (" + fstype + " " + *opts + ")";
    return f;
  }
  if (*size < kMinShm) {
    f.level = Level::kFail;
    f.finding = fmt::format("/dev/shm is only {}: NCCL (\"unhandled system error\") and "
                            "DataLoader workers (\"bus error\") run out of it",
                            bytes_text(*size));
    f.fix = fix;
  } else {
    f.finding = "/dev/shm is " + bytes_text(*size);
  }
  return f;
}

struct Limit {
  std::optional<uint64_t> soft;  // nullopt: unlimited
  std::optional<uint64_t> hard;
  bool found = false;
};

Limit read_limit(const std::string& root, const std::string& name) {
  Limit lim;
  std::istringstream in(read_text(root, "/proc/self/limits").value_or(""));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0) continue;
    std::istringstream rest(line.substr(name.size()));
    std::string soft, hard;
    rest >> soft >> hard;
    auto value = [](const std::string& s) -> std::optional<uint64_t> {
      if (s == "unlimited") return std::nullopt;
      try {
        return std::stoull(s);
      } catch (const std::exception&) {
        return 0;
      }
    };
    lim.soft = value(soft);
    lim.hard = value(hard);
    lim.found = true;
  }
  return lim;
}

Finding memlock_finding(const DoctorOptions& o) {
  Finding f{"memlock", Level::kOk, "", "", ""};
  const Limit lim = read_limit(o.root, "Max locked memory");
  const bool rdma = !list_dir(o.root, "/sys/class/infiniband").empty();
  if (!lim.found) {
    f.level = Level::kInfo;
    f.finding = "locked-memory limit unknown (no /proc/self/limits)";
    return f;
  }
  if (!lim.soft) {
    f.finding = "locked memory: unlimited";
    return f;
  }
  f.finding = "locked memory limited to " + bytes_text(*lim.soft);
  if (rdma) {
    f.level = Level::kFail;
    f.finding += ": NCCL over InfiniBand/RoCE cannot register its buffers";
    f.fix = "ulimit -l unlimited (limits.conf: * - memlock unlimited; docker: "
            "--ulimit memlock=-1)";
  } else {
    f.level = Level::kInfo;
    f.finding += " (no RDMA device, so it does not matter)";
  }
  return f;
}

Finding nofile_finding(const DoctorOptions& o) {
  Finding f{"nofile", Level::kOk, "", "", ""};
  const Limit lim = read_limit(o.root, "Max open files");
  if (!lim.found) {
    f.level = Level::kInfo;
    f.finding = "open-file limit unknown (no /proc/self/limits)";
    return f;
  }
  const std::string soft = lim.soft ? std::to_string(*lim.soft) : "unlimited";
  f.finding = "open files: " + soft;
  if (lim.soft && *lim.soft < kMinOpenFiles) {
    f.level = Level::kWarn;
    f.finding += fmt::format(" (below {}): DataLoader workers sharing tensors and NCCL's "
                             "sockets can hit \"Too many open files\"",
                             kMinOpenFiles);
    if (lim.hard && *lim.hard < kMinOpenFiles) {
      f.fix = "raise the hard limit (limits.conf: * - nofile 1048576; docker: --ulimit "
              "nofile=1048576), then ulimit -n 1048576";
    } else {
      f.fix = fmt::format("ulimit -n {}",
                          lim.hard ? std::min<uint64_t>(*lim.hard, 1048576) : 1048576);
    }
  }
  return f;
}

}  // namespace

std::vector<Finding> check_system(const DoctorOptions& o) {
  return {shm_finding(o), memlock_finding(o), nofile_finding(o)};
}

}  // namespace ddprun::introspect
