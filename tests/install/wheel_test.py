"""The wheel end to end (ctest install.wheel, label install).

Builds it (scripts/build-wheel.sh: `pip wheel .` plus auditwheel's tag),
checks the tag against the binaries' glibc symbol versions and the floor,
that both binaries need nothing beyond glibc (readelf -d, ldd), installs it
into a fresh venv (pip, offline, its py-spy dependency from a local
wheelhouse), and with that venv's `ddprun`, on a PATH without a compiler,
runs a torch 2.x DDP script to success and detects its hang; then `ddprun
attach`, run by its path with the venv's bin/ off PATH, reads the Python
stack of a plain hung python process through the venv's py-spy. Interpreters: Debian's /usr/bin/python3 runs this test and makes the
venv; the workers run that venv's python with torch 2.x from TORCH_PYTHON's
(.venv-torch) site-packages on PYTHONPATH, as a user's torch environment.

Skipped (77) when the build tools' venv (.venv-wheel), the wheelhouse with
py-spy's wheel (.wheelhouse or $DDPRUN_WHEELHOUSE; both from
scripts/setup-test.sh) or the torch 2.x venv is missing: this test
downloads nothing.

Usage: wheel_test.py SOURCE_DIR TORCH_PYTHON WORK_DIR
"""
import glob
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
import zipfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Failed, check_glibc_only, finish, max_glibc, run, run_main  # noqa: E402

# The highest glibc the wheel's binaries may need: what the build host
# (Debian 12, glibc 2.36) sets through crt1's __libc_start_main and the
# pthread functions that moved into libc in 2.34 (docs/INSTALL.md).
GLIBC_FLOOR = (2, 34)


def main():
    src, torch_python, work = sys.argv[1], sys.argv[2], sys.argv[3]
    wheel_venv = os.environ.get("DDPRUN_WHEEL_VENV", os.path.join(src, ".venv-wheel"))
    if not os.path.exists(os.path.join(wheel_venv, "bin", "auditwheel")):
        print(f"skipped: no wheel build tools in {wheel_venv} (scripts/setup-test.sh installs them)")
        return 77
    wheelhouse = os.environ.get("DDPRUN_WHEELHOUSE", os.path.join(src, ".wheelhouse"))
    if not glob.glob(os.path.join(wheelhouse, "py_spy-*.whl")):
        print(f"skipped: no py-spy wheel in {wheelhouse} (scripts/setup-test.sh downloads it)")
        return 77
    if not os.access(torch_python, os.X_OK):
        print(f"skipped: no torch 2.x python at {torch_python} (scripts/setup-torch.sh)")
        return 77
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    errors = []

    built = run(["bash", os.path.join(src, "scripts", "build-wheel.sh")], 1500, cwd=src)
    wheel = os.path.join(src, built.stdout.strip().splitlines()[-1])
    print(f"built {os.path.basename(wheel)} in {built.seconds:.1f} s")
    tag = re.search(r"-py3-none-(manylinux_(\d+)_(\d+)_\w+)\.whl$", wheel)
    if not tag:
        raise Failed(f"{wheel}: not a py3-none-manylinux wheel")
    shown = run([os.path.join(wheel_venv, "bin", "auditwheel"), "show", wheel], 120).stdout
    if f'"{tag.group(1)}"' not in shown:
        errors.append(f"auditwheel show does not confirm {tag.group(1)}:\n{shown}")

    unpacked = os.path.join(work, "unpacked")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(unpacked)
        names = z.namelist()
    for name in ("ddprun", "ddprun-store"):
        scripts = [n for n in names if n.endswith(f".data/scripts/{name}")]
        if len(scripts) != 1:
            errors.append(f"the wheel has no scripts/{name}: {names}")
            continue
        binary = os.path.join(unpacked, scripts[0])
        check_glibc_only(binary, errors)
        top = max_glibc(binary)
        print(f"{name}: highest GLIBC_ {'.'.join(map(str, top))} (floor {'.'.join(map(str, GLIBC_FLOOR))})")
        if top > GLIBC_FLOOR:
            errors.append(f"{name} needs GLIBC_{'.'.join(map(str, top))}, above the floor")
        if top > (int(tag.group(2)), int(tag.group(3))):
            errors.append(f"{name} needs GLIBC_{'.'.join(map(str, top))}, above its tag {tag.group(1)}")

    venv = os.path.join(work, "venv")
    run(["/usr/bin/python3", "-m", "venv", venv], 300)
    # With its dependencies (py-spy), from the wheelhouse only: offline.
    installed = run([os.path.join(venv, "bin", "pip"), "install", "--no-index", "--find-links", wheelhouse,
                     "--quiet", wheel], 300)
    print(f"pip install took {installed.seconds:.1f} s")
    if not os.access(os.path.join(venv, "bin", "py-spy"), os.X_OK):
        errors.append("pip install of the wheel put no py-spy in the venv's bin/")
    # Only the venv's bin: no cc, gcc, g++, clang, make (Debian's live in /usr/bin).
    env = {"PATH": os.path.join(venv, "bin"), "HOME": work, "LANG": "C.UTF-8"}
    for tool in ("cc", "gcc", "g++", "c++", "clang", "make", "cmake"):
        if shutil.which(tool, path=env["PATH"]):
            errors.append(f"the test's PATH has a compiler tool: {tool}")
    ddprun = shutil.which("ddprun", path=env["PATH"])
    if ddprun != os.path.join(venv, "bin", "ddprun"):
        raise Failed(f"ddprun on the venv's PATH is {ddprun}")
    with open(ddprun, "rb") as f:
        if f.read(4) != b"\x7fELF":
            errors.append(f"{ddprun} is not the binary itself (a wrapper script?)")
    version = run([ddprun, "--version"], 60, env=env).stdout
    if not re.fullmatch(r"ddprun \d+\.\d+\.\d+( \(git \S+\))?\n", version):
        errors.append(f"ddprun --version printed {version!r}")
    py = os.path.join(venv, "bin", "python")
    probe = run([py, "-c", "import ddprun, ddprun_heartbeat, ddprun.recovery, os; "
                 "print(ddprun.__version__); print(os.path.isfile(os.path.join("
                 "ddprun.bootstrap_dir(), 'ddprun_autobeat.py'))); print(ddprun.executable())"],
                60, env=env).stdout.split()
    if probe[1:] != ["True", ddprun] or probe[0] not in version:
        errors.append(f"the ddprun package: {probe} (version line {version!r})")

    torch_site = run([torch_python, "-c", "import os, torch; print(os.path.dirname(os.path.dirname("
                      "torch.__file__)))"], 120).stdout.strip()
    env.update({"PYTHONPATH": torch_site, "DDPRUN_PYTHON": py})
    script = os.path.join(src, "examples", "toy_ddp.py")  # docs/GETTING_STARTED.md
    ok = run([ddprun, "--nproc-per-node=2", "--log-dir=" + work + "/logs", "--rdzv-id=ok", script, "ok"],
             300, env=env, cwd=work, check=False)
    print(f"DDP run: exit {ok.returncode} in {ok.seconds:.1f} s")
    done = re.findall(r"rank (\d) done torch (2\.\S+)", ok.stdout)
    if ok.returncode != 0 or sorted(r for r, _ in done) != ["0", "1"]:
        errors.append(f"the DDP run: exit {ok.returncode}\n{ok.stdout[-2000:]}\n{ok.stderr[-2000:]}")
    else:
        print(f"workers ran torch {done[0][1]}")

    hang = run([ddprun, "--nproc-per-node=2", "--heartbeat-timeout=3", "--max-restarts=0",
                "--log-dir=" + work + "/logs", "--rdzv-id=hang", script, "hang"],
               300, env=env, cwd=work, check=False)
    print(f"hang run: exit {hang.returncode} in {hang.seconds:.1f} s")
    # The run's folder is logs/hang_<suffix>/ (--rdzv-id plus a unique part).
    reports = [os.path.join(d, "hang_report.json") for d, _, files in os.walk(work + "/logs")
               if "hang_report.json" in files and os.path.relpath(d, work + "/logs").startswith("hang_")]
    if hang.returncode != 124 or "Hang detected" not in hang.stderr or len(reports) != 1:
        errors.append(f"the hang run: exit {hang.returncode}, reports {reports}\n{hang.stderr[-2000:]}")
    else:
        with open(reports[0]) as f:
            report = json.load(f)
        # Both ranks stop at step 9 (rank 0 in the all-reduce rank 1 never
        # joins): either may be named; what matters is that it was caught.
        if report["kind"] != "heartbeat_timeout" or report["ddprun_version"] not in version:
            errors.append(f"hang report: kind {report['kind']}, version {report['ddprun_version']}")
        else:
            print(f"hang caught: {report['kind']}, culprit rank {report['culprit_rank']}")
    attach_uninstrumented(ddprun, py, work, errors)
    finish(errors, f"{os.path.basename(wheel)}: glibc only, DDP run, hang detection and attach's "
           "Python stack from a fresh venv")


# A job ddprun did not start: no ddprun module, no faulthandler; the line
# number is asserted below.
STUCK_JOB = """import sys


def stuck_here():
    print("ready", flush=True)
    return sys.stdin.read()  # line 6: blocks, no CPU, no I/O


stuck_here()
"""


def attach_uninstrumented(ddprun, py, work, errors):
    """`ddprun attach` by its path, the venv's bin/ not on PATH (nor any
    py-spy or pystack): Python frames must come from the py-spy pip put
    beside ddprun (stack_capture.cc looks there first)."""
    script = os.path.join(work, "stuck_job.py")
    with open(script, "w") as f:
        f.write(STUCK_JOB)
    path = ":".join(d for d in ("/usr/bin", "/bin")
                    if not any(os.path.exists(os.path.join(d, t)) for t in ("py-spy", "pystack")))
    env = {"PATH": path, "HOME": work, "LANG": "C.UTF-8"}
    job = subprocess.Popen([py, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=work)
    try:
        if not select.select([job.stdout], [], [], 60)[0] or job.stdout.readline() != b"ready\n":
            raise Failed("the plain python job did not print ready within 60 s")
        reports = os.path.join(work, "attach")
        os.mkdir(reports, 0o700)
        r = run([ddprun, "attach", str(job.pid), "--silence-timeout", "2", "--on-hang", "kill",
                 "--kill-grace", "5", "--report-dir", reports], 120, env=env, check=False)
        print(f"attach: exit {r.returncode} in {r.seconds:.1f} s")
        frame = "stuck_here (stuck_job.py:6)"  # py-spy's "function (file:line)"
        report = os.path.join(reports, "hang_report.json")
        stacks = []
        if os.path.exists(report):
            with open(report) as f:
                stacks = [s["text"] for s in json.load(f)["stacks"] if s["method"] == "py-spy"]
        if (r.returncode != 1 or "--- Python, every thread (py-spy) ---" not in r.stdout
                or frame not in r.stdout or len(stacks) != 1 or frame not in stacks[0]):
            errors.append(f"attach (PATH={path}): exit {r.returncode}, py-spy stacks {stacks}\n"
                          f"{r.stdout[-3000:]}\n{r.stderr[-2000:]}")
        else:
            print(f"attach read {frame} through the venv's py-spy")
        try:
            job.wait(30)  # --on-hang kill ends it
        except subprocess.TimeoutExpired:
            errors.append(f"attach --on-hang kill left the job (pid {job.pid}) running")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


if __name__ == "__main__":
    run_main(main)
