// Linked into the wheel's ddprun and ddprun-store only (DDPRUN_SELF_CONTAINED):
// definitions that take the place of two glibc functions newer than the
// wheel's glibc floor (2.34, README "Install"), which the statically linked
// GCC 12 runtime would otherwise need from a glibc as new as the build
// machine's (2.36). A definition in the program wins over libc's at link
// time, so the binaries no longer ask for GLIBC_2.35/2.36 (tests/install).
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

extern "C" {

// libstdc++'s std::random_device (glibc 2.36's arc4random otherwise): the
// kernel's getrandom, as a raw system call (the wrapper is 2.25).
uint32_t arc4random(void) {
  uint32_t v = 0;
  for (;;) {
    const long n = ::syscall(SYS_getrandom, &v, sizeof v, 0);
    if (n == static_cast<long>(sizeof v)) return v;
    if (n < 0 && errno != EINTR) break;
  }
  // getrandom exists since Linux 3.17; without it, urandom.
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t got = ::read(fd, &v, sizeof v);
    ::close(fd);
    if (got == static_cast<ssize_t>(sizeof v)) return v;
  }
  return v;
}

namespace {
struct Lookup {
  uintptr_t pc;
  dl_find_object* out;
  bool found;
};

int find_in(dl_phdr_info* info, size_t, void* arg) {
  auto* q = static_cast<Lookup*>(arg);
  const ElfW(Phdr)* eh = nullptr;
  bool inside = false;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& p = info->dlpi_phdr[i];
    if (p.p_type == PT_GNU_EH_FRAME) eh = &p;
    if (p.p_type != PT_LOAD) continue;
    const uintptr_t start = info->dlpi_addr + p.p_vaddr;
    if (q->pc >= start && q->pc < start + p.p_memsz) inside = true;
    if (start < lo) lo = start;
    if (start + p.p_memsz > hi) hi = start + p.p_memsz;
  }
  if (!inside) return 0;
  q->found = true;
  q->out->dlfo_flags = 0;
  q->out->dlfo_map_start = reinterpret_cast<void*>(lo);
  q->out->dlfo_map_end = reinterpret_cast<void*>(hi);
  q->out->dlfo_link_map = nullptr;  // libgcc's unwinder does not read it
  q->out->dlfo_eh_frame = eh ? reinterpret_cast<void*>(info->dlpi_addr + eh->p_vaddr) : nullptr;
  return 1;
}
}  // namespace

// libgcc's unwinder (exceptions) finds a frame's unwind tables with glibc
// 2.35's _dl_find_object; the same answer from dl_iterate_phdr (2.2.5),
// which is how libgcc did it before.
int _dl_find_object(void* pc, dl_find_object* result) {
  Lookup q{reinterpret_cast<uintptr_t>(pc), result, false};
  dl_iterate_phdr(find_in, &q);
  return q.found ? 0 : -1;
}

}  // extern "C"
