"""The end of a tree-checking test script (tests/base/contract_test.py,
tests/layout_test.py): each problem on a line of its own, then the verdict
and the exit status for ctest."""


def report(errors, ok_line):
    for e in errors:
        print(e)
    if errors:
        print(f"FAILED: {len(errors)} problem(s)")
        return 1
    print("ok: " + ok_line)
    return 0
