#!/usr/bin/env bash
# Builds ddprun with one sanitizer and runs the test suite under it.
#   scripts/test-sanitizer.sh thread|address [CTEST_ARGS...]
# thread:  ThreadSanitizer, everything except the trainer (LibTorch is not
#          built with TSan, so its own threads would be reported), in build-tsan/
# address: AddressSanitizer + UndefinedBehaviorSanitizer, everything, in build-asan/
# Any report fails the test that produced it (halt_on_error / abort_on_error).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/test-sanitizer.sh thread|address [ctest args]}
shift
case $kind in
  thread)
    dir=build-tsan
    bash scripts/build.sh "$dir" -DDDPRUN_SANITIZE=thread -DDDPRUN_BUILD_TRAINER=OFF -DDDPRUN_WERROR=ON
    export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
    ;;
  address)
    dir=build-asan
    bash scripts/build.sh "$dir" -DDDPRUN_SANITIZE=address -DDDPRUN_WERROR=ON
    export ASAN_OPTIONS="abort_on_error=1 ${ASAN_OPTIONS:-}"
    export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 ${UBSAN_OPTIONS:-}"
    ;;
  *) echo "test-sanitizer.sh: unknown sanitizer '$kind' (thread or address)" >&2; exit 2 ;;
esac
cd "$dir"
ctest --output-on-failure --timeout 900 -j "${DDPRUN_TEST_JOBS:-2}" "$@"
