// Tests that cannot run here say so instead of passing: SKIP_TEST(reason)
// records the reason and leaves the test case; main_with_skips() then exits
// 77, which ctest (SKIP_RETURN_CODE 77) reports as "Skipped" with the
// reasons in the output. A failure anywhere still fails the run.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace ddprun::testing {

inline constexpr int kSkipExit = 77;

inline std::vector<std::string>& skip_reasons() {
  static std::vector<std::string> reasons;
  return reasons;
}

// doctest's main, plus: exit 77 when a test case was skipped and none failed.
inline int main_with_skips(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit() || rc != 0 || skip_reasons().empty()) return rc;
  for (const auto& why : skip_reasons()) std::printf("skipped: %s\n", why.c_str());
  return kSkipExit;
}

}  // namespace ddprun::testing

#define SKIP_TEST(reason)                                                 \
  do {                                                                    \
    ::ddprun::testing::skip_reasons().push_back(reason);                  \
    MESSAGE("skipped: " << ::ddprun::testing::skip_reasons().back());     \
    return;                                                               \
  } while (0)
