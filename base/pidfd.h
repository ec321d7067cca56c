// The one pidfd wait in ddprun: block until a process has exited or a
// deadline passes, without sleeping or polling /proc.
//
// A pidfd becomes readable when its process exits (it is then a zombie if
// nobody reaped it yet). The wait does not reap: the parent decides that.
// Needs Linux 5.3 (pidfd_open); where it is missing the wait reports that
// it could not tell (false) rather than guessing.
#pragma once

#include <sys/types.h>

#include <chrono>

#include "base/scoped_fd.h"

namespace ddprun::base {

// pidfd_open(pid, 0); invalid with errno set when it fails (ESRCH: gone).
ScopedFd open_pidfd(pid_t pid);

// Waits on `fd` for POLLIN until `deadline`; true when it became readable.
// Retries on EINTR; a deadline already passed still checks once.
bool wait_readable(int fd, std::chrono::steady_clock::time_point deadline);

// True once `pid` has exited (or no longer exists); false when the deadline
// passed first or pidfd_open failed for another reason than ESRCH.
bool wait_exited(pid_t pid, std::chrono::steady_clock::time_point deadline);

}  // namespace ddprun::base
