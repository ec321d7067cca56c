# Sourced by the build scripts, from the repository root. ccache (the
# compiler launcher when CMake finds it) hashes each compile's command line,
# whose -I and source paths are absolute: a clone in another folder (CI's
# fresh clone of main on this machine) missed every object this machine had
# already built and rebuilt every build folder from nothing, which put CI past
# its 90 minutes. Paths under the repository root are hashed relative to it,
# and the working folder is left out of the hash (the sanitizer builds' -g
# maps it away with -fdebug-prefix-map), so any clone shares one cache.
export CCACHE_BASEDIR=$PWD
export CCACHE_NOHASHDIR=true
