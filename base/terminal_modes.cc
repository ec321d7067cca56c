#include "base/terminal_modes.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <utility>

namespace ddprun::base {
namespace {

int set_modes(int fd, const termios& t) {
  // SIGTTOU blocked: should the terminal have changed hands anyway, the
  // call fails or passes, but never stops ddprun with the terminal raw.
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGTTOU);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  int rc;
  do rc = tcsetattr(fd, TCSADRAIN, &t);
  while (rc != 0 && errno == EINTR);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return rc;
}

}  // namespace

RawTerminal::RawTerminal(RawTerminal&& other) noexcept
    : fd_(other.fd_), raw_(std::exchange(other.raw_, false)), saved_(other.saved_) {}

termios RawTerminal::raw_modes(const termios& modes) {
  termios t = modes;
  t.c_lflag &= ~(ICANON | ECHO | ECHONL | IEXTEN);  // Ctrl-V goes to readline too
  t.c_iflag &= ~(ICRNL | INLCR | IGNCR | ISTRIP);    // Enter stays '\r', as readline expects
  t.c_cc[VMIN] = 1;
  t.c_cc[VTIME] = 0;
  return t;
}

bool RawTerminal::enter() {
  if (raw_) return true;
  if (tcgetpgrp(fd_) != getpgrp()) return false;  // background (or no terminal)
  termios now;
  if (tcgetattr(fd_, &now) != 0) return false;
  if (set_modes(fd_, raw_modes(now)) != 0) return false;
  saved_ = now;
  raw_ = true;
  return true;
}

bool RawTerminal::own_modes(termios& out) const {
  if (raw_) {
    out = saved_;
    return true;
  }
  return tcgetattr(fd_, &out) == 0;
}

void RawTerminal::leave() {
  if (!raw_) return;
  raw_ = false;
  (void)set_modes(fd_, saved_);
}

}  // namespace ddprun::base
