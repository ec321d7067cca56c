"""No raw close(), DIR*, strerror or hand-made time text outside base/ (ctest base.os_layer;
/usr/bin/python3, stdlib only; issue 20).

The components' own sources (agent, introspect, launcher, rendezvous,
trainer, watchdog: every .cc and .h, comments and string literals left out)
go through base/ for these: base::errno_text / describe_error / SystemError
(base/system_error.h) for errno's words, base::list_dir and the procfs
readers (base/procfs.h) for folders, base::ScopedFd for every descriptor
they own. Flagged:
  - strerror( and std::strerror( (gai_strerror, getaddrinfo's own, is not
    errno's);
  - opendir, fdopendir, readdir, closedir and DIR*;
  - ::close( (global), and close(X) whose one argument names a descriptor
    (fd, *_fd, fd_*, sv[N], pipe...): a member's close() of a connection or
    a socket object is not a raw close;
  - gmtime_r, gmtime and strftime: ddprun's one UTC time format is
    base::utc_iso8601 (base/utc_time.h).
Tests and benches may own raw descriptors (they build the situations).

Usage: /usr/bin/python3 tests/base/os_layer_test.py SOURCE_DIR
       /usr/bin/python3 tests/base/os_layer_test.py --planted
(--planted: a file planted with each of them is flagged on each such line,
and the same calls in comments, strings and member calls are not).
"""
import os
import re
import sys
import tempfile

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from check_report import report  # noqa: E402

COMPONENTS = ("agent", "introspect", "launcher", "rendezvous", "trainer", "watchdog")

RULES = [
    (re.compile(r"(?<![\w])(?:std::)?strerror\s*\("), "strerror: say base::errno_text / describe_error"),
    (re.compile(r"(?<![\w])(?:::)?(?:opendir|fdopendir|readdir|closedir)\s*\("),
     "a folder read by hand: base::list_dir (base/procfs.h)"),
    (re.compile(r"(?<![\w])DIR\s*\*"), "DIR*: base::list_dir (base/procfs.h)"),
    (re.compile(r"(?<![\w:])::close\s*\("), "raw ::close(): own the descriptor with base::ScopedFd"),
    (re.compile(r"(?<![\w.>:])close\s*\(\s*(?:\w*fd\w*|\w+\[\d+\]|\w*pipe\w*)\s*\)"),
     "raw close() of a descriptor: base::ScopedFd"),
    (re.compile(r"(?<![\w])(?:std::|::)?(?:gmtime_r|gmtime|strftime)\s*\("),
     "a time formatted by hand: base::utc_iso8601 (base/utc_time.h)"),
]


def strip(text):
    """The C++ with comments and string/char literals blanked, lines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + (m.group(1) if m else "") + '"', i)
            j = n if end < 0 else end + len(m.group(1) if m else "") + 2
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def sources(root):
    for comp in COMPONENTS:
        for dirpath, _, names in os.walk(os.path.join(root, comp)):
            for name in sorted(names):
                if name.endswith((".cc", ".h")):
                    yield os.path.join(dirpath, name)


def check(path, root):
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = strip(f.read()).split("\n")
    rel = os.path.relpath(path, root)
    found = []
    for number, line in enumerate(lines, 1):
        for pattern, why in RULES:
            if pattern.search(line):
                found.append(f"{rel}:{number}: {why}")
    return found


PLANTED = r'''
#include <dirent.h>
void f(int fd) {
  const char* why = strerror(errno);
  DIR* d = opendir("/proc");
  ::close(fd);
  std::strftime(buf, sizeof buf, "%FT%TZ", gmtime_r(&t, &tm));
}
// strerror(errno), ::close(fd) and opendir("/") in a comment
const char* s = "strerror(errno) ::close(fd)";
void Conn::close() { sock.close(ec); return close(); }
'''


def planted():
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "planted.cc")
        with open(path, "w") as f:
            f.write(PLANTED)
        found = check(path, root)
    want = ["planted.cc:4", "planted.cc:5", "planted.cc:5", "planted.cc:6", "planted.cc:7"]
    lines = sorted(e.split(": ")[0] for e in found)
    errors = [] if lines == want else [f"planted file: flagged {found}, wanted lines {want}"]
    return report(errors, "a planted strerror, DIR*/opendir, ::close and strftime are flagged; comments, "
                          "strings and member close() are not")


def main():
    if sys.argv[1:] == ["--planted"]:
        return planted()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    files = sys.argv[2:] or list(sources(root))
    if len(sys.argv) <= 2 and len(files) < 50:
        print(f"the components' sources were not found under {root} ({len(files)} files)")
        return 1
    errors = [e for path in files for e in check(path, root)]
    return report(errors, f"{len(files)} files: no strerror, folder reads, raw close() or hand-made time text outside base/")


if __name__ == "__main__":
    sys.exit(main())
