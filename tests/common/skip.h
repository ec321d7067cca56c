// Tests that cannot run here say so instead of passing: SKIP_TEST(reason)
// records the reason and leaves the test case; main_with_skips() then exits
// 77, which ctest (SKIP_RETURN_CODE 77) reports as "Skipped" with the
// reasons in the output. A failure anywhere still fails the run, and so does
// a run whose filters match no test case (a ctest entry's --test-case that
// names nothing would otherwise pass with nothing checked).
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

// Counts the test cases that started (a listener: it only observes).
struct CasesRun : doctest::IReporter {
  explicit CasesRun(const doctest::ContextOptions&) {}
  static int& count() {
    static int n = 0;
    return n;
  }
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++count(); }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

}  // namespace ddprun::testing

// Every test file that includes this header registers the same listener;
// doctest keeps one per name.
REGISTER_LISTENER("ddprun_cases_run", 1, ddprun::testing::CasesRun);

namespace ddprun::testing {

// doctest's main, plus: exit 77 when a test case was skipped and none
// failed; exit 1 when the filters matched no test case.
inline int main_with_skips(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit() || rc != 0) return rc;
  if (CasesRun::count() == 0) {
    std::fprintf(stderr, "no test case matches this run's filters\n");
    return 1;
  }
  if (skip_reasons().empty()) return rc;
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
