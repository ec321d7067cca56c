// The one system-call error type, and the one place the tree turns an errno
// into words. A failed call becomes SystemError once, where it failed: the
// call, the file, socket or process it was about, and errno; callers that
// branch on the cause use kind() (or error()), never the message's text.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace ddprun::base {

// errno's text (strerror_r: safe from any thread), e.g. "No such file or
// directory". Every other file says base::errno_text, never strerror.
std::string errno_text(int err);

// "call target: text", or "call: text" with no target: the one wording.
std::string describe_error(std::string_view call, std::string_view target, int err);

// What callers branch on; `other` for the rest (error() still has errno).
enum class ErrorKind {
  other,
  not_found,      // ENOENT, ESRCH
  exists,         // EEXIST
  permission,     // EACCES, EPERM
  in_use,         // EADDRINUSE, EBUSY
  link_refused,   // ELOOP, EMLINK: O_NOFOLLOW met a link
  no_space,       // ENOSPC, EDQUOT
  timed_out,      // ETIMEDOUT
  interrupted,    // EINTR
};
ErrorKind error_kind(int err);

class SystemError : public std::runtime_error {
 public:
  // The message is describe_error(call, target, err).
  SystemError(std::string call, std::string target, int err);
  // A message of the caller's own wording (it already names the culprit).
  SystemError(const std::string& message, int err) : std::runtime_error(message), error_(err) {}

  int error() const { return error_; }
  ErrorKind kind() const { return error_kind(error_); }
  const std::string& call() const { return call_; }
  const std::string& target() const { return target_; }

 private:
  int error_ = 0;
  std::string call_;
  std::string target_;
};

[[noreturn]] void throw_system_error(std::string_view call, std::string_view target, int err);

}  // namespace ddprun::base
