// The one ISO 8601 UTC time format of ddprun's files and reports:
// "2026-12-05T04:51:07Z", with 3 or 6 fraction digits where a record needs
// them ("...07.123Z" in hang reports, "...07.123456Z" in events.jsonl).
//
// Not gmtime_r/strftime: glibc reads /etc/localtime (tzset) on their first
// call, which is on the path to the first worker, for a UTC time
// that needs no zone.
#pragma once

#include <chrono>
#include <string>

namespace ddprun::base {

// `fraction_digits`: 0, 3 or 6 (anything else is taken as 0).
std::string utc_iso8601(std::chrono::system_clock::time_point t, int fraction_digits = 0);

}  // namespace ddprun::base
