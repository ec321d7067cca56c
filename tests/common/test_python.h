// The Python interpreter that Python-facing tests run workers with.
//
// $DDPRUN_TEST_PYTHON when set (the torch2 ctest label sets it to the torch
// 2.x venv of scripts/setup-torch.sh, see tests/torch2/), else Debian's
// /usr/bin/python3 with python3-torch 1.13. Never `python3` from PATH: that
// one may have no torch at all.
#pragma once

#include <stdlib.h>

#include <string>

namespace ddprun::testing {

inline std::string test_python() {
  const char* py = ::getenv("DDPRUN_TEST_PYTHON");
  return py != nullptr && *py != '\0' ? py : "/usr/bin/python3";
}

}  // namespace ddprun::testing
