"""The .deb end to end (ctest install.deb, label install).

Packs the build folder with CPack (ddprun and ddprun-train), unpacks both
into a staging root with `dpkg -x`, and runs what was staged: `ddprun
--version`, `man -l` on its page, bash completion of its subcommands and
flags, and `train` under the staged ddprun on the digits it installed
(nothing of the source tree: the staged train's default --data is below the
staging root). Checks that ddprun-train depends on Debian's libtorch and
installs ddprun-train, not a generic /usr/bin/train; the control fields
(maintainer, Recommends: bash-completion); each package's machine-readable
copyright with the Apache-2.0 text; `import ddprun` in a worker of the
staged ddprun (the wheel's package). Then a real dpkg install and remove
into a root of its own (`dpkg --root`, maintainer scripts run with
DPKG_ROOT): a root-run worker writes __pycache__ under /usr/share/ddprun,
and the remove leaves nothing there. Debian's /usr/bin/python3 (stdlib).

Usage: deb_test.py BUILD_DIR WORK_DIR
"""
import glob
import os
import pty
import re
import select
import shutil
import signal
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Failed, finish, run, run_main  # noqa: E402


def zsh_complete(completion_dir, bin_dir, line, key, want):
    """Types `line` then `key` into an interactive zsh on a real pty with the
    staged completion on its fpath; returns (True, screen bytes) once every
    word of `want` has been drawn, (False, screen bytes) at the deadline."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(shutil.which("zsh"), ["zsh", "-f", "-i"],
                  {"PATH": bin_dir + ":/usr/bin:/bin", "TERM": "xterm", "HOME": completion_dir})
    pending = b""  # read, not yet consumed by a match
    seen = b""     # what the last until() looked at

    def until(pattern, seconds=30, strip=None):
        """Reads until pattern matches the unconsumed output (after `strip`
        and without ANSI sequences, when `strip` is given) and consumes it up
        to the match's end. Output that arrived with the match stays for the
        next call: one read often holds a line's output and the next prompt."""
        nonlocal pending, seen
        deadline = time.monotonic() + seconds
        while True:
            text = pending if strip is None else re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", strip + pending)
            m = re.search(pattern, text)
            seen = pending
            if m:
                pending = b"" if strip is not None else pending[m.end():]
                return True
            if time.monotonic() >= deadline:
                return False
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    return False
                if not chunk:
                    return False
                pending += chunk

    try:
        os.write(fd, f"PS1='zsh> '; fpath=({completion_dir} $fpath); autoload -U compinit; "
                     f"compinit -u -D; print RE''ADY\n".encode())
        ok = until(rb"\nREADY") and until(rb"zsh> ")
        os.write(fd, line.encode())
        ok = ok and until(re.escape(line.encode()))
        typed = seen
        os.write(fd, key)
        # A unique match is drawn as the missing suffix after the typed line,
        # a list below it: search the screen without its escape sequences.
        words = b"".join(b"(?=[\\s\\S]*" + re.escape(w.encode()) + b"\\b)" for w in want)
        ok = ok and until(words, strip=typed)
        return ok, seen
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)


MAINTAINER = "ddprun developers <ddprun@users.noreply.github.com>"
DEP5 = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"


def check_control(debs, errors):
    for name, deb in debs.items():
        maintainer = run(["dpkg-deb", "-f", deb, "Maintainer"], 60).stdout.strip()
        if maintainer != MAINTAINER:
            errors.append(f"{name}: Maintainer {maintainer!r}, not {MAINTAINER!r}")
    recommends = run(["dpkg-deb", "-f", debs["ddprun"], "Recommends"], 60).stdout
    if "bash-completion" not in recommends:
        errors.append(f"ddprun recommends {recommends.strip()!r}: no bash-completion")


def check_copyright(root, errors):
    """Each package's /usr/share/doc/<package>/copyright: DEP-5, with the
    license text (its own paragraph, indented) as the repository's LICENSE."""
    for package in ("ddprun", "ddprun-train"):
        path = os.path.join(root, "usr", "share", "doc", package, "copyright")
        if not os.path.isfile(path):
            errors.append(f"{package}: no {path}")
            continue
        with open(path) as f:
            text = f.read()
        lines = text.splitlines()
        if lines[0] != DEP5 or "\nFiles: *\n" not in text or "\nLicense: Apache-2.0\n" not in text:
            errors.append(f"{package}'s copyright is not a DEP-5 file for Apache-2.0:\n{text[:400]}")
        body = re.search(r"\nLicense: Apache-2.0\n((?: .*\n?)+)", text)
        if not body or "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" not in body.group(1):
            errors.append(f"{package}'s copyright lacks the Apache-2.0 text")


def import_in_worker(ddprun, root, work, errors):
    """`import ddprun` in a worker of the staged ddprun: the package file it
    found, which must be the staged one."""
    probe = ("import ddprun, ddprun.recovery; ddprun.beat(); "
             "print('imported', ddprun.__file__)")
    r = run([ddprun, "--nproc-per-node=1", "--log-dir=" + work + "/logs-import", "/usr/bin/python3",
             "-c", probe], 120, cwd=work, check=False)
    found = re.findall(r"imported (\S+)", r.stdout)
    want = os.path.join(root, "usr", "share", "ddprun", "python", "ddprun", "__init__.py")
    if r.returncode != 0 or found != [want]:
        errors.append(f"import ddprun in a worker: exit {r.returncode}, found {found}, want {want}\n"
                      f"{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
        return None
    return found[0]


def check_remove(deb, work, errors):
    """dpkg -i then -r of the ddprun package into a root of its own, a root-run
    worker between them: nothing is left under usr/share/ddprun."""
    if os.geteuid() != 0:
        print("not root: the dpkg install and remove is left out")
        return
    root = os.path.join(work, "dpkg-root")
    admin = os.path.join(root, "var", "lib", "dpkg")
    for sub in ("info", "updates", "triggers"):
        os.makedirs(os.path.join(admin, sub))
    for name in ("status", "available"):
        open(os.path.join(admin, name), "x").close()
    dpkg = ["dpkg", "--root=" + root, "--force-script-chrootless", "--force-depends",
            "--log=" + os.path.join(work, "dpkg.log")]
    run(dpkg + ["-i", deb], 300)
    share = os.path.join(root, "usr", "share", "ddprun")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    r = run([os.path.join(root, "usr", "bin", "ddprun"), "--nproc-per-node=1",
             "--log-dir=" + work + "/logs-remove", "/usr/bin/python3", "-c", "import ddprun"],
            120, env=env, cwd=work, check=False)
    caches = [d for d, _, _ in os.walk(share) if os.path.basename(d) == "__pycache__"]
    if r.returncode != 0 or not caches:
        errors.append(f"the installed ddprun's worker: exit {r.returncode}, __pycache__ {caches} "
                      f"(none: the remove below proves nothing)\n{r.stderr[-1500:]}")
    run(dpkg + ["-r", "ddprun"], 300)
    left = [os.path.join(d, f) for d, _, files in os.walk(share) for f in files + [""]]
    if os.path.exists(share):
        errors.append(f"dpkg -r ddprun left {share}: {left[:10]}")
    else:
        print(f"dpkg -r ddprun removed {share} and the {len(caches)} __pycache__ folder(s) a worker wrote")


def main():
    build, work = sys.argv[1], sys.argv[2]
    for tool in ("cpack", "dpkg-deb", "dpkg-shlibdeps", "man"):
        if not shutil.which(tool):
            print(f"skipped: {tool} is not installed")
            return 77
    if not os.path.exists(os.path.join(build, "bin", "train")):
        print("skipped: this build has no train (no LibTorch): ddprun-train cannot be packed")
        return 77
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    errors = []
    packed = run(["cpack", "-G", "DEB", "-B", work, "--config", os.path.join(build, "CPackConfig.cmake")],
                 900, cwd=work)
    debs = {re.sub(r"_.*", "", os.path.basename(d)): d for d in glob.glob(work + "/*.deb")}
    print(f"cpack: {sorted(os.path.basename(d) for d in debs.values())} in {packed.seconds:.1f} s")
    if set(debs) != {"ddprun", "ddprun-train"}:
        raise Failed(f"cpack made {sorted(debs)}, not ddprun and ddprun-train\n{packed.stdout}")
    depends = run(["dpkg-deb", "-f", debs["ddprun-train"], "Depends"], 60).stdout
    if not re.search(r"\blibtorch\S*", depends) or "ddprun (=" not in depends:
        errors.append(f"ddprun-train depends on {depends.strip()!r}: no libtorch or no ddprun")
    root = os.path.join(work, "root")
    for deb in debs.values():
        run(["dpkg", "-x", deb, root], 120)

    ddprun = os.path.join(root, "usr", "bin", "ddprun")
    version = run([ddprun, "--version"], 60).stdout
    if not re.fullmatch(r"ddprun \d+\.\d+\.\d+( \(git \S+\))?\n", version):
        errors.append(f"staged ddprun --version printed {version!r}")
    page = os.path.join(root, "usr", "share", "man", "man1", "ddprun.1.gz")
    man = run(["man", "-l", page], 60, env={**os.environ, "MANPAGER": "cat", "PAGER": "cat",
                                          "MANWIDTH": "100"}, check=False)
    text = re.sub(r".\x08", "", man.stdout)  # overstrike bold
    for want in ("ddprun status", "--nproc-per-node", "--version", "Exit status"):
        if want not in text:
            errors.append(f"man -l {os.path.basename(page)} (exit {man.returncode}) lacks {want!r}")

    completion = os.path.join(root, "usr", "share", "bash-completion", "completions", "ddprun")
    for words, want in ((["ddprun", "st"], {"status", "stacks"}),
                        (["ddprun", "--nproc-per"], {"--nproc-per-node"}),
                        (["ddprun", "doctor", "--js"], {"--json"})):
        script = (f"source {completion}; COMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}; "
                  "_ddprun; printf '%s\\n' \"${COMPREPLY[@]}\"")
        got = run(["bash", "-c", script], 60, cwd=work,
                  env={**os.environ, "PATH": os.path.dirname(ddprun) + ":" + os.environ["PATH"]}).stdout
        if not want <= set(got.split()):
            errors.append(f"bash completion of {words}: {got.split()}, wanted {sorted(want)}")
    zsh = os.path.join(root, "usr", "share", "zsh", "vendor-completions", "_ddprun")
    if not os.path.isfile(zsh):
        errors.append(f"no zsh completion at {zsh}")
    elif shutil.which("zsh"):  # scripts/setup-test.sh installs it
        # Ctrl-D lists the choices; Tab completes a unique one in place
        # (_gnu_generic reads the staged ddprun's --help).
        for line, key, want in (("ddprun st", b"\x04", ["stacks", "status"]),
                                ("ddprun --nproc-per", b"\t", ["--nproc-per-node"]),
                                ("ddprun doctor --js", b"\t", ["--json"])):
            ok, screen = zsh_complete(os.path.dirname(zsh), os.path.dirname(ddprun), line, key, want)
            if not ok:
                errors.append(f"zsh completion of {line!r}: wanted {want}, screen {screen[-400:]!r}")
    else:
        errors.append("no zsh to try the zsh completion with (scripts/setup-test.sh installs it)")

    check_control(debs, errors)
    check_copyright(root, errors)
    if os.path.exists(os.path.join(root, "usr", "bin", "train")):
        errors.append("ddprun-train installs a generic /usr/bin/train")
    imported = import_in_worker(ddprun, root, work, errors)
    if imported:
        print(f"import ddprun in a worker: {imported}")
    check_remove(debs["ddprun"], work, errors)

    train = os.path.join(root, "usr", "bin", "ddprun-train")
    data = os.path.join(root, "usr", "share", "ddprun", "data", "digits")
    shown = run([train, "--help"], 60).stdout
    if f"--data TEXT={data}" not in shown:
        errors.append(f"staged train's default --data is not {data}:\n{shown[:600]}")
    trained = run([ddprun, "--nproc-per-node=2", "--log-dir=" + work + "/logs", train, "--steps", "20"],
                  300, cwd=work, check=False)
    done = re.findall(r"rank (\d) steps 20 samples_per_s \S+ final_loss \S+ test_acc (\S+)", trained.stdout)
    if trained.returncode != 0 or sorted(r for r, _ in done) != ["0", "1"]:
        errors.append(f"staged train: exit {trained.returncode}\n{trained.stdout[-2000:]}\n{trained.stderr[-2000:]}")
    else:
        print(f"staged train on its installed digits: test_acc {done[0][1]} in {trained.seconds:.1f} s")
    finish(errors, "the .deb's ddprun, man page, completion and train run from a staging root")


if __name__ == "__main__":
    run_main(main)
