// The job as Prometheus metrics: one status snapshot (introspect's, the
// reply `ddprun status --json` shows: introspect/control_wire.h) rendered in
// Prometheus's text exposition format 0.0.4, so the exporter and `ddprun
// status` can never disagree.
//
// Names follow Prometheus's conventions: a ddprun_ prefix, base units
// (_seconds, _bytes), counters end in _total, one series per rank labelled
// {rank="N"} (global rank) where a value is a rank's. The agent's own CPU
// and memory use the names every client library gives a process
// (process_cpu_seconds_total, process_resident_memory_bytes). The series
// are listed in docs/observability.md.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddprun::observe {

// The media type of what render_exposition returns.
inline constexpr const char* kExpositionContentType = "text/plain; version=0.0.4; charset=utf-8";

// The exporting process itself (the agent).
struct ProcessSample {
  double cpu_seconds = 0;
  uint64_t resident_bytes = 0;
};

// This process's CPU time and resident memory; nullopt when /proc cannot say.
std::optional<ProcessSample> sample_this_process();

// Families in the order given; a family's samples are contiguous, as the
// format requires. Values that are absent in `status` (no beat yet) give no
// sample rather than a made-up 0.
std::string render_exposition(const nlohmann::json& status,
                              const std::optional<ProcessSample>& self);

// A label value as the format quotes it: backslash, double quote and line
// feed escaped (a run id or host name may hold any of them).
std::string escape_label_value(std::string_view value);

// The text of one sample: name{k="v",...} value. Non-finite values are
// NaN, +Inf, -Inf as Prometheus spells them.
using Labels = std::vector<std::pair<std::string, std::string>>;
std::string sample_line(std::string_view name, const Labels& labels, double value);

}  // namespace ddprun::observe
