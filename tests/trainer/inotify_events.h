// A folder's inotify events read until one is the awaited one or a deadline
// passes, for the checkpoint tests that must act at one moment of a write
// (a file complete, a temporary one begun): an event, not a polled folder
// or a sleep, tells them the moment has come.
#pragma once

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace ddprun::trainer::testing {

// Hands each event of the inotify descriptor `watch` (its mask, and the
// name within the watched folder, "" for the folder itself) to `awaited`;
// true once `awaited` returns true, false when `deadline` passes first.
inline bool until_event(int watch, std::chrono::steady_clock::time_point deadline,
                        const std::function<bool(uint32_t mask, const std::string& name)>& awaited) {
  while (std::chrono::steady_clock::now() < deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{watch, POLLIN, 0};
    if (::poll(&p, 1, int(std::max<long long>(1, left.count()))) <= 0) continue;
    alignas(inotify_event) char buf[4096];
    const ssize_t n = ::read(watch, buf, sizeof(buf));
    for (ssize_t off = 0; off < n;) {
      const auto* ev = reinterpret_cast<const inotify_event*>(buf + off);
      if (awaited(ev->mask, ev->len > 0 ? ev->name : "")) return true;
      off += ssize_t(sizeof(inotify_event) + ev->len);
    }
  }
  return false;
}

}  // namespace ddprun::trainer::testing
