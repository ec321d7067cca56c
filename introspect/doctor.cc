#include "introspect/doctor.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/version.h"

namespace ddprun::introspect {

const char* to_string(Level level) {
  switch (level) {
    case Level::kOk: return "ok";
    case Level::kInfo: return "info";
    case Level::kWarn: return "warn";
    case Level::kFail: return "fail";
  }
  return "?";
}

std::vector<Finding> run_doctor(const DoctorOptions& options) {
  std::vector<Finding> out = check_pci(options);
  for (auto& f : check_system(options)) out.push_back(std::move(f));
  for (auto& f : check_network(options)) out.push_back(std::move(f));
  return out;
}

std::string to_text(const std::vector<Finding>& findings) {
  std::vector<const Finding*> order;
  for (const auto& f : findings) order.push_back(&f);
  // Worst first, the checks' own order within a level.
  std::stable_sort(order.begin(), order.end(),
                   [](const Finding* a, const Finding* b) { return a->level > b->level; });
  std::string out;
  for (const Finding* f : order) {
    std::string tag = to_string(f->level);
    std::transform(tag.begin(), tag.end(), tag.begin(), ::toupper);
    out += fmt::format("[{:<4}] {:<8} {}\n", tag, f->check, f->finding);
    if (!f->fix.empty()) out += fmt::format("{:16}fix: {}\n", "", f->fix);
    if (!f->detail.empty()) {
      std::size_t start = 0;
      while (start < f->detail.size()) {
        const std::size_t end = f->detail.find('\n', start);
        out += fmt::format("{:16}{}\n", "", f->detail.substr(start, end - start));
        if (end == std::string::npos) break;
        start = end + 1;
      }
    }
  }
  return out + fmt::format("checked by ddprun {}\n", base::version());
}

nlohmann::json to_json(const std::vector<Finding>& findings) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& f : findings) {
    nlohmann::json j = {{"check", f.check}, {"level", to_string(f.level)}, {"finding", f.finding}};
    if (!f.fix.empty()) j["fix"] = f.fix;
    if (!f.detail.empty()) j["detail"] = f.detail;
    list.push_back(std::move(j));
  }
  // Which build judged the machine: a pasted report names it.
  return {{"findings", list}, {"failed", exit_status(findings) != 0},
          {"ddprun_version", base::version()}};
}

int exit_status(const std::vector<Finding>& findings) {
  for (const auto& f : findings)
    if (f.level == Level::kFail) return 1;
  return 0;
}

}  // namespace ddprun::introspect
