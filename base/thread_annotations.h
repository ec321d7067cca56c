// Clang's thread-safety annotations (-Wthread-safety): which mutex guards a
// member, which a function needs held, which a function takes. Checked by
// the clang build (CMake option DDPRUN_THREAD_SAFETY); no-ops under GCC.
// Lock through base/mutex.h: libstdc++'s std::mutex carries no
// annotations, so the analysis cannot see it taken.
#pragma once

#if defined(__clang__)
#define DDPRUN_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define DDPRUN_THREAD_ANNOTATION(x)
#endif

// A type that is a lock (base::Mutex).
#define CAPABILITY(name) DDPRUN_THREAD_ANNOTATION(capability(name))
// An RAII type that holds a lock for its lifetime (base::MutexLock).
#define SCOPED_CAPABILITY DDPRUN_THREAD_ANNOTATION(scoped_lockable)
// A member read or written only with `mu` held.
#define GUARDED_BY(mu) DDPRUN_THREAD_ANNOTATION(guarded_by(mu))
// A pointer member whose pointee is read or written only with `mu` held.
#define PT_GUARDED_BY(mu) DDPRUN_THREAD_ANNOTATION(pt_guarded_by(mu))
// A function called with the locks held (and returning with them held).
#define REQUIRES(...) DDPRUN_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// A function called without the locks held (it takes them itself).
#define EXCLUDES(...) DDPRUN_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// A function that takes / releases the locks (no argument: `this`).
#define ACQUIRE(...) DDPRUN_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) DDPRUN_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
// A function the analysis is not to check: say why where it is used.
#define NO_THREAD_SAFETY_ANALYSIS DDPRUN_THREAD_ANNOTATION(no_thread_safety_analysis)
