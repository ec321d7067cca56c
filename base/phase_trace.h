// Phase marks for benchmarks of a job's formation (bench/agents_scale.py):
// with $DDPRUN_PHASE_TRACE naming a file (read by the launcher
// only, passed in agent::Options::phase_trace), the agent appends one line a
// phase it reaches, "<pid> <CLOCK_MONOTONIC ns> <phase>[ <detail>]", in one
// O_APPEND write, so the lines of many agents sharing one file never mix.
// An empty path is off and costs nothing. A mark that cannot be written is
// dropped: a trace never stops a job. Thread-safe (no state).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ddprun::base {

// CLOCK_MONOTONIC in nanoseconds: the clock of the marks (and of the bench
// workers' own records, and of events.jsonl's monotonic_s).
int64_t monotonic_ns();

// Appends "<pid> <at_ns> <phase>[ <detail>]\n" to `path`; nothing when
// `path` is empty.
void mark_phase(const std::string& path, std::string_view phase, std::string_view detail = {},
                int64_t at_ns = monotonic_ns());

}  // namespace ddprun::base
