// doctest's main; a test case that cannot run here makes the run exit 77
// (ctest: skipped) with the reason (tests/common/skip.h).
#define DOCTEST_CONFIG_IMPLEMENT
#include "tests/common/skip.h"

int main(int argc, char** argv) { return ddprun::testing::main_with_skips(argc, argv); }
