#include "base/utc_time.h"

#include <cinttypes>
#include <cstdint>
#include <cstdio>

namespace ddprun::base {

std::string utc_iso8601(std::chrono::system_clock::time_point t, int fraction_digits) {
  const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  const int64_t secs = us >= 0 ? us / 1000000 : (us - 999999) / 1000000;
  const int64_t frac_us = us - secs * 1000000;
  // The civil date from days since 1970-01-01 (H. Hinnant's civil_from_days,
  // exact for the proleptic Gregorian calendar).
  const int64_t day = secs >= 0 ? secs / 86400 : (secs - 86399) / 86400;
  const int64_t sod = secs - day * 86400;
  const int64_t z = day + 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  const int64_t d = doy - (153 * mp + 2) / 5 + 1;
  const int64_t m = mp < 10 ? mp + 3 : mp - 9;
  const int64_t y = yoe + era * 400 + (m <= 2);
  char frac[32] = "";  // sized for any int64 the compiler can imagine (-Wformat-truncation)
  if (fraction_digits == 3) std::snprintf(frac, sizeof frac, ".%03" PRId64, frac_us / 1000);
  if (fraction_digits == 6) std::snprintf(frac, sizeof frac, ".%06" PRId64, frac_us);
  char buf[192];
  std::snprintf(buf, sizeof buf, "%04" PRId64 "-%02" PRId64 "-%02" PRId64 "T%02" PRId64 ":%02" PRId64 ":%02" PRId64 "%sZ",
                y, m, d, sod / 3600, sod / 60 % 60, sod % 60, frac);
  return buf;
}

}  // namespace ddprun::base
