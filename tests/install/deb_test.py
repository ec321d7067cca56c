"""The .deb end to end (ctest install.deb, label install).

Packs the build folder with CPack (ddprun and ddprun-train), unpacks both
into a staging root with `dpkg -x`, and runs what was staged: `ddprun
--version`, `man -l` on its page, bash completion of its subcommands and
flags, and `train` under the staged ddprun on the digits it installed
(nothing of the source tree: the staged train's default --data is below the
staging root). Checks that ddprun-train depends on Debian's libtorch.
Debian's /usr/bin/python3 (stdlib).

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
from common import Failed, finish, run  # noqa: E402


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

    train = os.path.join(root, "usr", "bin", "train")
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
    try:
        sys.exit(main())
    except Failed as e:
        print("FAILED:", e)
        sys.exit(1)
