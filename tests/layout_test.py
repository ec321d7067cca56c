"""README.md's layout table against the tree (ctest layout; python3, stdlib).

Every top-level folder git tracks (hidden ones aside) has a row in the
table under "## Layout", no row names a folder that is not there, and every
component with a library (a CMakeLists.txt with add_library) has its tests
in tests/<component>/, as the table says. Skipped (77) outside a git
checkout, where the tracked folders cannot be told from build output.

Usage: python3 tests/layout_test.py SOURCE_DIR
"""
import os
import re
import subprocess
import sys

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "common"))
from check_report import report  # noqa: E402


def tracked_folders(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {p.split("/", 1)[0] for p in out.splitlines() if "/" in p and not p.startswith(".")}


def readme_folders(root):
    with open(os.path.join(root, "README.md")) as f:
        text = f.read()
    m = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        raise SystemExit("README.md has no '## Layout' section")
    rows = re.findall(r"^\| `([^`/]+)/` \|", m.group(1), re.M)
    if not rows:
        raise SystemExit("README.md's layout table has no `folder/` rows; the test's pattern is stale")
    return rows


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    tree = tracked_folders(root)
    if tree is None:
        print("skipped: not a git checkout (or no git), the tracked folders are unknown")
        return 77
    rows = readme_folders(root)
    errors = [f"README.md lists `{d}/` twice" for d in sorted({d for d in rows if rows.count(d) > 1})]
    errors += [f"README.md's layout table lacks `{d}/`" for d in sorted(tree - set(rows))]
    errors += [f"README.md's layout table lists `{d}/`, which is not in the tree"
               for d in sorted(set(rows) - tree)]
    for d in sorted(tree):
        cmake = os.path.join(root, d, "CMakeLists.txt")
        if d != "tests" and os.path.exists(cmake) and "add_library(" in open(cmake).read():
            if not os.path.isdir(os.path.join(root, "tests", d)):
                errors.append(f"component `{d}/` has no tests/{d}/")
    return report(errors, f"the layout table's {len(rows)} folders are the tree's")


if __name__ == "__main__":
    sys.exit(main())
