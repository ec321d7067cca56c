"""base/contract.h against the tree (ctest base.contract; python3, stdlib only).

Checks, each failing with the names and places at fault:
  1. every name in base/contract.h appears in docs/CONTRACTS.md, inside
     backquotes, and every variable-like name backquoted there
     (`UPPER_CASE`) is in the header;
  2. C++ outside the header (agent, base, introspect, launcher, observe, rendezvous,
     trainer, watchdog) spells no header name as a string literal: "NAME",
     "/name" or "NAME=value" (the constants are used instead; a sentence
     that mentions a name is not a use of it), and every "DDPRUN_..."
     literal there starts with a header name (no variable of ours is missing
     from the header);
  3. the Python helpers, which cannot include the header, read only
     variables and write only files the header names.
Tests, examples and benches are left out of 2: they are the other side of
the contract (a worker reading RANK), written without ddprun's headers.

Usage: python3 tests/base/contract_test.py SOURCE_DIR
"""
import os
import re
import sys

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../common"))
from check_report import report  # noqa: E402

COMPONENTS = ["agent", "base", "introspect", "launcher", "observe", "rendezvous", "trainer",
              "watchdog"]
PYTHON_HELPERS = ["watchdog/python/ddprun_heartbeat.py", "watchdog/python/ddprun_recovery.py",
                  "introspect/python/sitecustomize.py"]
HEADER = "base/contract.h"
# A literal on a line carrying this marker, or just below one, is not the
# contract's name (e.g. a column title "RANK" in `ddprun status`).
MARKER = "not-a-contract-name"


def header_names(root):
    names = {}
    pattern = re.compile(r'^inline constexpr const char\* (k\w+) = "([^"]+)";')
    with open(os.path.join(root, HEADER)) as f:
        for line in f:
            m = pattern.match(line)
            if m:
                names[m.group(2)] = m.group(1)
            elif re.match(r"^inline constexpr", line):
                raise SystemExit(f"{HEADER}: not in the one-constant-a-line form: {line.strip()}")
    if len(names) < 20:
        raise SystemExit(f"{HEADER}: only {len(names)} names parsed; the test's pattern is stale")
    return names


def check_doc(root, names):
    with open(os.path.join(root, "docs/CONTRACTS.md")) as f:
        doc = f.read()
    spans = re.findall(r"`([^`\n]+)`", doc)
    errors = []
    for value, const in sorted(names.items()):
        if not any(value in s for s in spans):
            errors.append(f"docs/CONTRACTS.md does not name `{value}` ({HEADER}: {const})")
    for s in sorted(set(spans)):
        for token in re.findall(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]\b|^[A-Z]{3,}$", s):
            if token not in names and not token.startswith("PET_"):
                errors.append(f"docs/CONTRACTS.md names `{token}`, which {HEADER} does not define")
    return errors


def cpp_files(root):
    for comp in COMPONENTS:
        for dirpath, _, files in os.walk(os.path.join(root, comp)):
            if "/fuzz" in dirpath or "/python" in dirpath:
                continue
            for name in sorted(files):
                if name.endswith((".cc", ".h")):
                    yield os.path.relpath(os.path.join(dirpath, name), root)


def check_cpp(root, names):
    errors = []
    literal = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
    for rel in cpp_files(root):
        if rel == HEADER:
            continue
        with open(os.path.join(root, rel)) as f:
            lines = f.read().split("\n")
        for n, line in enumerate(lines, 1):
            marked = MARKER in line or (n > 1 and MARKER in lines[n - 2])
            if marked or line.lstrip().startswith("//"):
                continue
            for text in literal.findall(line):
                # "NAME", "/name" (a path's last part) or "NAME=value"
                # (an environment entry; a sentence has spaces).
                bare = text.lstrip("/")
                head = bare.split("=", 1)[0] if " " not in bare else bare
                if head in names:
                    errors.append(f"{rel}:{n}: \"{text}\" spells {names[head]} of {HEADER}")
                elif re.match(r"DDPRUN_[A-Z_]+", text):
                    word = re.match(r"DDPRUN_[A-Z0-9_]*[A-Z0-9]", text).group(0)
                    if word not in names:
                        errors.append(f"{rel}:{n}: \"{text}\": {word} is not in {HEADER}")
    return errors


def check_python(root, names):
    errors = []
    for rel in PYTHON_HELPERS:
        with open(os.path.join(root, rel)) as f:
            text = f.read()
        read = re.findall(r"environ(?:\.get\(|\[)\s*[\"']([^\"']+)[\"']", text)
        if not read:
            errors.append(f"{rel}: reads no environment variable; the test's pattern is stale")
        for var in read:
            if var not in names:
                errors.append(f"{rel}: reads ${var}, which {HEADER} does not define")
        # Files it makes: "<prefix>%d.txt" literals must start with a header name.
        for made in re.findall(r"[\"']([a-z_]+)%d[^\"']*[\"']", text):
            if made not in names:
                errors.append(f"{rel}: writes {made}..., which {HEADER} does not define")
    return errors


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../..")
    names = header_names(root)
    errors = check_doc(root, names) + check_cpp(root, names) + check_python(root, names)
    return report(errors, f"{len(names)} names of {HEADER} match docs/CONTRACTS.md, the C++ "
                          "and the Python helpers")


if __name__ == "__main__":
    sys.exit(main())
