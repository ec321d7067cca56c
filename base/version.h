// The version of ddprun a binary was built from, for `ddprun --version`,
// `ddprun doctor`, hang reports and events.jsonl: a report from a user names
// the build it came from.
//
// The definitions live in one generated source file (base/version.cmake
// writes it at build time, rewriting it only when the version changes), so a
// new commit recompiles that one file; no compile command line carries the
// version (ccache: scripts/ccache-env.sh).
#pragma once

namespace ddprun::base {

// The release, CMake's project(VERSION), e.g. "0.1.0": the wheel's and the
// .deb's version.
const char* package_version();

// The release and the git commit it was built from, when built in a git
// checkout: "0.1.0 (git cb53aa1-dirty)"; else the release alone.
const char* version();

}  // namespace ddprun::base
