"""Runs one example of examples/ under the build tree's ddprun on 2 CPU/gloo
ranks and checks what it promises (label examples; README "Examples").

    examples_test.py <ddprun> <examples folder> <python folder> <venv python> <work> <example>

<example>: from_horovod, resnet18_finetune (each prints one line per rank
saying whether every rank ended with the same parameters: both must say
True), toy_ddp (40 steps to success). The workers run the torch 2.x venv's
python (scripts/setup-torch.sh); exit 77 (skipped) when it, or torchvision
for the fine-tune, is missing. This driver is Debian's /usr/bin/python3,
stdlib only.
"""
import os
import re
import subprocess
import sys

SKIP = 77
CHECKS = {  # example -> (argv after the script, regex each rank's line must match)
    "from_horovod": ([], r"rank (\d)/2 local_rank \d: parameters identical on every rank: True"),
    "resnet18_finetune": (["--steps", "4", "--image-size", "32"],
                          r"rank (\d) fine-tuned 4 steps, heads identical on 2 ranks: True"),
    "toy_ddp": (["ok"], r"rank (\d) done torch 2\."),
}


def main():
    ddprun, examples, python_dir, py, work, name = sys.argv[1:7]
    needs = "import torch" + (", torchvision" if name == "resnet18_finetune" else "")
    if not os.access(py, os.X_OK) or subprocess.run([py, "-c", needs], capture_output=True,
                                                     timeout=300).returncode != 0:
        print(f"SKIP: {py} cannot `{needs}` (scripts/setup-torch.sh installs torch and torchvision)")
        return SKIP
    args, line = CHECKS[name]
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, DDPRUN_PYTHON=py, PYTHONPATH=python_dir)  # `import ddprun` from pkg/python
    argv = [ddprun, "--nproc-per-node=2", "--log-dir=" + work, "--rdzv-id=" + name,
            os.path.join(examples, name + ".py"), *args]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=work)
    except subprocess.TimeoutExpired:
        print(f"FAILED: {name} still running after 600 s")
        return 1
    ranks = sorted(re.findall(line, r.stdout))
    print(r.stdout[-3000:], r.stderr[-3000:], sep="\n")
    if r.returncode != 0 or ranks != ["0", "1"]:
        print(f"FAILED: {name}: exit {r.returncode}, ranks matching {line!r}: {ranks}")
        return 1
    print(f"ok: {name} on 2 ranks (gloo)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
