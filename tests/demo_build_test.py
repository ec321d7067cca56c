"""scripts/demo.sh builds only what it runs (ctest demo.build, label demo).

Clones the repository's committed HEAD into a fresh folder, runs the demo's
own build step there (`scripts/demo.sh --build-only`, which runs
scripts/setup.sh: a no-op when the packages are installed) with
DDPRUN_BUILD_DRY_RUN=1, so ninja lists what an empty build folder would
build and builds nothing, and compares that with the full build's list in
the same folder: the demo compiles under half of what the full build does,
links ddprun and train, holds nothing of tests/, bench/ or a fuzzer, and
is a unity build (its compiles are mostly the libraries' batches of
sources: 20 compiles at this writing, for 133 sources; one parse of the shared headers a batch
is what halves the demo's build time, docs/BENCHMARKS.md). Debian's /usr/bin/python3
(stdlib), git, cmake and ninja.

Skipped (77) outside a git checkout or without git, cmake or ninja.

Usage: demo_build_test.py SOURCE_DIR
"""
import os
import re
import shutil
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "install"))
from common import finish, run, run_main  # noqa: E402


def edges(ninja_output):
    """The build edges of a `ninja -n` listing: one "[i/N] description" line each."""
    return re.findall(r"^\[\d+/\d+\] (.*)$", ninja_output, re.M)


def main():
    src = sys.argv[1]
    for tool in ("git", "cmake", "ninja"):
        if not shutil.which(tool):
            print(f"skipped: {tool} is not installed")
            return 77
    if run(["git", "-C", src, "rev-parse", "--is-inside-work-tree"], 60, check=False).returncode != 0:
        print(f"skipped: {src} is not a git checkout")
        return 77
    errors = []
    with tempfile.TemporaryDirectory(prefix="ddprun-demo-") as tmp:
        clone = os.path.join(tmp, "ddprun")
        run(["git", "clone", "--quiet", "--no-hardlinks", src, clone], 300)
        env = {**os.environ, "DDPRUN_BUILD_DRY_RUN": "1"}
        demo = run(["bash", "scripts/demo.sh", "--build-only"], 600, env=env, cwd=clone)
        demo_edges = edges(demo.stdout)
        full = run(["cmake", "--build", "build", "--", "-n"], 300, cwd=clone)
        full_edges = edges(full.stdout)
        compiles = [e for e in demo_edges if e.startswith("Building ")]
        all_compiles = [e for e in full_edges if e.startswith("Building ")]
        print(f"demo.sh's build: {len(compiles)} compiles of the full build's {len(all_compiles)} "
              f"({len(demo_edges)} of {len(full_edges)} edges), configure and dry run {demo.seconds:.1f} s")
        if not all_compiles or len(compiles) * 2 >= len(all_compiles):
            errors.append(f"the demo compiles {len(compiles)} of {len(all_compiles)} sources: not under half")
        for target in ("bin/ddprun", "bin/train"):
            if f"Linking CXX executable {target}" not in demo_edges:
                errors.append(f"the demo's build does not link {target}")
        # A source with its own compile definitions stays out of the batches
        # (CMake's rule): two at this writing, the hook's and stacks'.
        batches = [e for e in compiles if "/Unity/unity_" in e]
        if len(batches) * 2 < len(compiles):
            errors.append(f"the demo's build is not a unity build: {len(batches)} of its "
                          f"{len(compiles)} compiles are batches")
        extra = [e for e in demo_edges if re.search(r"\b(tests|bench)/|_test\b|_tests\b|fuzz", e)]
        if extra:
            errors.append(f"the demo builds {len(extra)} test, bench or fuzz edges: {extra[:5]}")
    finish(errors, f"demo.sh compiles {len(compiles)} of {len(all_compiles)} sources, no tests")


if __name__ == "__main__":
    run_main(main)
