"""Helpers of the install tests (wheel_test.py, deb_test.py): commands with
deadlines, ELF dependency checks. Debian's /usr/bin/python3, stdlib only."""
import os
import re
import subprocess
import sys
import time

# The libraries a self-contained binary may need: glibc's own.
GLIBC_LIBS = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
              "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}


class Failed(Exception):
    pass


def run(argv, timeout, env=None, cwd=None, check=True):
    """Runs argv to its end within timeout seconds; returns the CompletedProcess."""
    start = time.monotonic()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        raise Failed(f"{argv[0]}: still running after {timeout} s: {e.stderr}") from None
    r.seconds = time.monotonic() - start
    if check and r.returncode != 0:
        raise Failed(f"{' '.join(argv)}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def needed(binary):
    """DT_NEEDED entries (readelf -d)."""
    out = run(["readelf", "-d", binary], 60).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def ldd_libs(binary):
    """The libraries ldd resolves (names only)."""
    out = run(["ldd", binary], 60).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip() and "vdso" not in line}


def max_glibc(binary):
    """The highest GLIBC_x.y symbol version the binary needs (objdump -T), as a tuple."""
    out = run(["objdump", "-T", binary], 60).stdout
    versions = {tuple(int(p) for p in v.split(".")) for v in re.findall(r"\bGLIBC_(\d+\.\d+(?:\.\d+)?)\b", out)}
    return max(versions)


def check_glibc_only(binary, errors):
    name = os.path.basename(binary)
    extra = [lib for lib in needed(binary) if lib not in GLIBC_LIBS]
    if extra:
        errors.append(f"{name}: needs {extra} beyond glibc (readelf -d)")
    extra = [lib for lib in ldd_libs(binary) if os.path.basename(lib) not in GLIBC_LIBS]
    if extra:
        errors.append(f"{name}: ldd resolves {extra} beyond glibc")


def finish(errors, ok_line):
    for e in errors:
        print("ERROR:", e)
    if errors:
        print(f"FAILED: {len(errors)} problem(s)")
        sys.exit(1)
    print("ok: " + ok_line)
    sys.exit(0)


def run_main(main):
    """Exits with main()'s status; a Failed is one FAILED line and status 1."""
    try:
        sys.exit(main())
    except Failed as e:
        print("FAILED:", e)
        sys.exit(1)
