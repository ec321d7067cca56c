#include "agent/error_file.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ddprun::agent {
namespace {

std::string as_text(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_null()) return "";
  return j.dump();
}

}  // namespace

std::optional<ErrorReport> read_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream buf;
  buf << in.rdbuf();
  std::string text = buf.str();
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return std::nullopt;
  ErrorReport report;
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("message")) {
    report.message = "unreadable error file " + path + " (not torch's error JSON)";
    return report;
  }
  const auto& m = j["message"];
  if (m.is_object()) {
    report.message = m.contains("message") ? as_text(m["message"]) : m.dump();
    if (m.contains("extraInfo") && m["extraInfo"].is_object()) {
      const auto& extra = m["extraInfo"];
      if (extra.contains("py_callstack")) report.traceback = as_text(extra["py_callstack"]);
      if (extra.contains("timestamp")) report.timestamp = as_text(extra["timestamp"]);
    }
  } else {
    report.message = as_text(m);
  }
  return report;
}

}  // namespace ddprun::agent
