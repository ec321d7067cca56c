# Prints the interpreter that runs it; with an argument, then fails with an
# import error (as a python3 without torch does at `import torch`).
import sys

if len(sys.argv) > 1 and sys.argv[1] == "fail-first":
    import ddprun_no_such_module  # noqa: F401
print("python", sys.executable, flush=True)
if len(sys.argv) > 1 and sys.argv[1] == "fail-after":
    import ddprun_no_such_module  # noqa: F401,F811
